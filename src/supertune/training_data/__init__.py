"""The datasets a training run consumes: the data section of a run config turned into packed or
padded blocks (documents kept apart when asked), from documents or from a token store.

Above the token store and the model's tokenizer, which it reads. Import the submodules directly
(`supertune.training_data.pipeline`): this package imports nothing heavy.
"""
