"""Retry backoff: exponential in the attempt number, capped, with jitter so retries do not stampede."""

from __future__ import annotations

import random

from ..conf import get_settings
from ..jobtypes import TypeInfo


def backoff_seconds(attempt_num: int, info: TypeInfo, *, rng: random.Random | None = None) -> float:
    """Seconds to wait after failed attempt ``attempt_num`` (1-based) of a job of type ``info``.

    ``base * 2 ** (attempt_num - 1)``, capped at the type's maximum, then moved by up to
    +/- ``BACKOFF_JITTER`` of itself (never below zero, never above the cap).
    """
    exponent = max(0, attempt_num - 1)
    raw = info.backoff_base_seconds * (2 ** min(exponent, 62))
    capped = min(info.backoff_max_seconds, raw)
    jitter = get_settings().BACKOFF_JITTER
    factor = 1.0 + (rng or random).uniform(-jitter, jitter)
    return max(0.0, min(info.backoff_max_seconds, capped * factor))
