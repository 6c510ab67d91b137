"""Documents: raw text read from local files, a cached hub dataset or the embedded corpus, and
encoded into token ids (prompt template, fast tokenizer, one batch per thread).

Below the token store (which writes what this reads) and below the training datasets. Import the
submodules directly (`supertune.documents.sources`): this package imports nothing heavy.
"""
