"""Pickup latency probe: a job carries the wall-clock time it was enqueued; its handler appends
``now - then`` (seconds) to ``BENCH_LATENCY_FILE``. Same clock, same code path for every system."""

from __future__ import annotations

import os
import time


def record(enqueued_at: float) -> None:
    path = os.environ.get("BENCH_LATENCY_FILE")
    if path:
        line = f"{time.time() - float(enqueued_at):.6f}\n"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())  # one short O_APPEND write: lines never interleave
        finally:
            os.close(fd)
