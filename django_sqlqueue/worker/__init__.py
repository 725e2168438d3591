"""The worker wing: what ``run_queue_worker`` runs.

Floors, top to bottom (each imports only the floors below it; ``lint-imports`` checks this):
``supervisor`` (slot processes, restarts, timeouts, its database thread) -> ``slots`` (what runs inside
a slot process) -> ``loop`` (one slot's claim -> run -> record loop) -> ``recorder``, ``heartbeat``,
``runner``, ``batch_size``, ``wakeup`` -> ``support`` -> ``contract`` (config, counters, exit codes).
"""
