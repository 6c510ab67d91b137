"""Evaluation (loss, perplexity) and generation from trained models."""
