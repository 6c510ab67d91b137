"""Helpers of bench/average.py: the input models and the arms."""
