"""How many jobs a slot claims at once: adaptive by default, bounded by time.

A claim, and the commit that records a batch's successes, cost the same for one job as for fifty.
Short jobs therefore drain several times faster when a slot claims many at once, but a batch is
also a promise: its jobs are Processing under this slot and wait their turn while the slot runs the
ones before them. A fixed large batch is right only when every job is short; a fixed batch of one
wastes most of the slot's time on commits when they are.

:class:`BatchSizer` picks the size per claim (``--batch auto``, the default):

- it starts at 1 and doubles after each claim that came back full (the queue had more), up to
  ``SQLQUEUE['BATCH_MAX']``; a claim that came back short (the queue is nearly empty) sets it to
  what was there, so a trickle of jobs is claimed one by one by whichever slot is free;
- it never asks for more jobs than fit in ``SQLQUEUE['BATCH_SECONDS']`` at the slot's recent pace
  (a moving average of seconds per job): slow jobs are claimed one or two at a time;
- when a batch runs over that time anyway (a job much slower than its neighbours), the worker hands
  the batch's unstarted jobs back to Pending (their attempt is not spent, their history row is
  removed) so other slots can take them, and the next batch is sized by the new pace.

``--batch N`` fixes the size at N and turns both bounds off: the slot runs every job it claimed.
"""

from __future__ import annotations

import time

#: Weight of the newest batch in the seconds-per-job average.
PACE_WEIGHT = 0.5


class BatchSizer:
    """The size of the next claim, learned from the batches before it (one per worker slot)."""

    def __init__(self, fixed: int | None, max_size: int, budget_seconds: float) -> None:
        if fixed is not None and fixed < 1:
            raise ValueError(f"a fixed batch size must be at least 1, got {fixed!r}")
        self.fixed = fixed
        self.max_size = max(1, max_size)
        self.budget = budget_seconds
        self.size = fixed or 1
        #: Seconds per job, averaged over recent batches (None until a job has run).
        self.pace: float | None = None

    @property
    def adaptive(self) -> bool:
        return self.fixed is None

    def next_size(self) -> int:
        return self.size

    def over_budget(self, batch_started: float, now: float | None = None) -> bool:
        """Has the batch that started at ``batch_started`` (``time.monotonic()``) used up its time?"""
        if not self.adaptive:
            return False
        return (time.monotonic() if now is None else now) - batch_started > self.budget

    def record(self, asked: int, claimed: int, ran: int, seconds: float) -> None:
        """Learn from a finished batch: ``asked`` for, ``claimed`` got, ``ran`` of them in ``seconds``."""
        if not self.adaptive:
            return
        if ran > 0:
            pace = max(seconds, 0.0) / ran
            self.pace = pace if self.pace is None else PACE_WEIGHT * pace + (1 - PACE_WEIGHT) * self.pace
        fits = self.max_size
        if self.pace is not None and self.pace > 0:
            fits = max(1, min(self.max_size, int(self.budget / self.pace)))
        if ran < claimed:  # handed the rest back: the pace says how many fit next time
            self.size = fits
        elif claimed >= asked:  # the queue had at least as many: ask for more, as far as time allows
            self.size = max(1, min(asked * 2, fits))
        else:  # the queue is nearly empty: take what is there, and let other slots share a trickle
            self.size = max(1, min(claimed, fits))


__all__ = ["BatchSizer"]
