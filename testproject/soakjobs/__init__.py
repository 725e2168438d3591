"""Soak-test handlers and their side-effect table (test-only; used by bench/soak.py and tests/test_soak.py)."""
