"""supertune: fine-tune and pre-train Hugging Face causal language models on HPC clusters.

Importing the package is cheap (no torch); the heavy parts are imported by the modules that use them.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
