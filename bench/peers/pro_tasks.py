"""procrastinate tasks for the comparison (PostgreSQL only; loaded through PROCRASTINATE_IMPORT_PATHS)."""

from __future__ import annotations

from procrastinate.contrib.django import app

from .latency import record


@app.task(name="bench_noop")
def noop() -> None:
    return None


@app.task(name="bench_latency")
def latency(t: float) -> None:
    record(t)
