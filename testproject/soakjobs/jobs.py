"""Soak handlers (autodiscovered: this is the app's ``jobs`` module). Names start with ``soak.``.

Payload keys: ``fail`` (the first N attempts raise: a transient failure), ``sleep`` (milliseconds the
handler works before its side effect, so that chaos kills land mid-handler too); ``soak.NonTx`` also
takes ``sleep_after`` (milliseconds between its side effect and its return, for tests) and
``returned_marker`` (tests: a file it creates as the last thing before it returns).

- ``soak.Tx`` and ``soak.Dedupe``: the side effect and the job's completion commit in ONE transaction.
  The queue runs the handler and records its outcome in separate transactions, so the handler
  completes its own job through the public API (``Job.objects.complete`` with the token the claim gave
  it) inside ``transaction.atomic()``. A worker killed before that commit leaves neither; a worker whose
  lease was taken over meanwhile gets ``StaleJob`` and rolls its side effect back. So each job's effect
  must exist exactly once. The worker's own completion afterwards is then refused as stale (logged as
  ``job_result_refused``), which is harmless.
- ``soak.NonTx``: the side effect is committed on its own before the handler returns, outside the job's
  transaction: a kill between the two re-runs it (at least once). Each extra run must be explained by an
  attempt that never finished in the history table.
- ``soak.AlwaysFail``: raises in every attempt; ends Failed after ``max_attempts`` (3).
"""

from __future__ import annotations

import os
import time
from typing import Any

from django.db import transaction

import django_sqlqueue as sqlqueue
from django_sqlqueue.models import Job
from django_sqlqueue.worker.runner import JobContext, Retry

from .models import SideEffect

#: Job type settings for the soak: short leases (a killed worker's jobs come back within seconds),
#: fast retries, and attempts to spare for the chaos (each kill can cost a job an attempt).
TYPE_OPTIONS: dict[str, Any] = {
    "max_attempts": 25,
    "lease_seconds": 5,
    "timeout_seconds": 60,
    "backoff_base_seconds": 0.2,
    "backoff_max_seconds": 2.0,
}
ALWAYS_FAIL_OPTIONS: dict[str, Any] = {**TYPE_OPTIONS, "max_attempts": 3}
TX_TYPES = ("soak.Tx", "soak.Dedupe")
NONTX_TYPES = ("soak.NonTx",)
FAIL_TYPES = ("soak.AlwaysFail",)
ALL_TYPES = (*TX_TYPES, *NONTX_TYPES, *FAIL_TYPES)


class TransientError(ConnectionError):
    """A planned transient failure (the next attempt succeeds)."""


def _prelude(job: JobContext) -> dict[str, Any]:
    job.started = time.time()
    payload = job.payload if isinstance(job.payload, dict) else {}
    if job.attempt_num <= int(payload.get("fail", 0)):
        raise TransientError(f"planned transient failure {job.attempt_num} of {payload['fail']}")
    if payload.get("sleep"):
        time.sleep(float(payload["sleep"]) / 1000)
    return payload


def _effect(job: JobContext, kind: str, using: str) -> SideEffect:
    # A well-behaved handler looks before a side effect: after a pause its lease may be someone else's.
    if job.should_stop():
        raise Retry("told to stop before the side effect")
    return SideEffect.objects.using(using).create(
        job_id=job.pk, attempt_num=job.attempt_num, kind=kind, worker=job.worker, pid=os.getpid(),
        started=job.started)


def _transactional(job: JobContext) -> Any:
    _prelude(job)
    using = job.job._state.db or "default"
    with transaction.atomic(using=using):
        effect = _effect(job, SideEffect.TRANSACTIONAL, using)
        response = {"effect": effect.pk, "attempt": job.attempt_num}
        # Same transaction as the effect: commits with it or not at all; StaleJob (lease lost to
        # another worker) rolls the effect back.
        Job.objects.complete(job.job, response=response, using=using)
    return response


@sqlqueue.handler("soak.Tx", description="Soak: transactional side effect (exactly once)", **TYPE_OPTIONS)
def soak_tx(job: JobContext) -> Any:
    return _transactional(job)


@sqlqueue.handler("soak.Dedupe", description="Soak: deduplicated, transactional side effect", **TYPE_OPTIONS)
def soak_dedupe(job: JobContext) -> Any:
    return _transactional(job)


@sqlqueue.handler("soak.NonTx", description="Soak: side effect outside the job's transaction (at least once)",
                  **TYPE_OPTIONS)
def soak_nontx(job: JobContext) -> Any:
    _prelude(job)
    using = job.job._state.db or "default"
    effect = _effect(job, SideEffect.NON_TRANSACTIONAL, using)  # autocommit: durable before the outcome
    if job.payload.get("sleep_after"):  # tests: a window between the side effect and the outcome
        time.sleep(float(job.payload["sleep_after"]) / 1000)
    if job.payload.get("returned_marker"):  # tests: the handler is returning now
        open(job.payload["returned_marker"], "a").close()
    return {"effect": effect.pk, "attempt": job.attempt_num}


@sqlqueue.handler("soak.AlwaysFail", description="Soak: fails in every attempt", **ALWAYS_FAIL_OPTIONS)
def soak_always_fail(job: JobContext) -> Any:
    _prelude(job)
    raise RuntimeError(f"soak.AlwaysFail: attempt {job.attempt_num} fails, as planned")
