"""Training checkpoints that describe themselves: a manifest of every file, an atomic publish step,
a `latest` pointer, and the choice of the checkpoint a run resumes from."""
