"""The peer-comparison Django project used by bench/compare.py (settings, tasks, handlers).

Loaded only by the benchmark (in its own virtualenv with the ``bench`` extra), never by the tests.
"""
