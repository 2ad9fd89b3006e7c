"""corral's benchmarks: ``make bench`` (``python -m bench``) runs every ``bench/bench_*.py``."""
