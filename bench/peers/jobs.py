"""django-sqlqueue handlers for the comparison (autodiscovered: this is the app's ``jobs`` module)."""

from __future__ import annotations

from typing import Any

import django_sqlqueue as sqlqueue

from .latency import record


@sqlqueue.handler("bench.Noop")
def noop(job: Any) -> None:
    return None


@sqlqueue.handler("bench.Latency")
def latency(job: Any) -> None:
    record(job.payload["t"])
