"""The soak's side-effect table: one row per handler execution that got as far as its side effect.

No foreign key to the job: a side effect must survive whatever happens to the job row, and the
insert must not lock the job row (the transactional handler locks it itself, through ``modify``).
"""

from __future__ import annotations

from django.db import models


class SideEffect(models.Model):
    TRANSACTIONAL = "tx"
    NON_TRANSACTIONAL = "nontx"

    job_id = models.BigIntegerField(db_index=True)
    attempt_num = models.PositiveIntegerField()
    #: "tx": written in the same transaction as the job's completion (exactly once if the queue is
    #: right); "nontx": written and committed before the worker records the outcome (at least once).
    kind = models.CharField(max_length=8)
    worker = models.CharField(max_length=200)
    pid = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)
    #: ``time.time()`` when the handler run that wrote it started: [started, created_at] is the run's
    #: live span, so two processes' spans of one job that overlap are a live double run.
    started = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["job_id", "id"]

    def __str__(self) -> str:
        return f"{self.kind} effect of job {self.job_id} attempt {self.attempt_num}"
