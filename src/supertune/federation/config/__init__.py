"""A federation's settings: the schema (typed, a docstring under every key), reading and checking a
federation YAML all at once, the embedded default federation, every site's run config resolved up
front, the executors' records (which executor refuses and checks what, and how it is started),
durations as `round_deadline` writes them, the LoRA modes a federation's sites are in, and buffered
rounds' staleness weights (`staleness`) and checks (`buffered`).

The lowest floor of the federation: it reads nothing of a federation directory's state."""
