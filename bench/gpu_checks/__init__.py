"""The parts of bench/gpu.py: the machine and its packages, the runs, the checks and the report."""
