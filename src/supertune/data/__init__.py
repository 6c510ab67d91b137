"""Training data: sources, templates, tokenization, packing and padding.

Import the submodules directly (`supertune.data.pipeline`): this package stays light because the
config layer, which the CLI loads for `--help`, uses `supertune.data.formats`.
"""
