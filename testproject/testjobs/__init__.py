"""Job types used by the test suite and the benchmarks (handlers live in jobs.py)."""
