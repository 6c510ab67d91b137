"""The token store: documents tokenized once, offline, into memory-mapped shards with a manifest.

`supertune prepare` writes a store (`supertune.store.writer`); training with `data.store=DIR`
reads it (`supertune.store.reader`) after checking it (`supertune.store.verify`). The format is
described in docs/store.md and in `supertune.store.manifest`. Import the submodules directly:
this package imports nothing heavy.
"""
