"""Weight files: safetensors read tensor by tensor (memory-mapped, a slice of rows at a time),
written in shards whose tensors are computed after the header, and their dtypes (numpy, no torch).

Used by averaging and by training's final model (output.dtype). Import the submodules directly.
"""
