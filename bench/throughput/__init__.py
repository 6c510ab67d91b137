"""Helpers of bench/train_throughput.py: shared settings, preparation, arms, measurements, report."""
