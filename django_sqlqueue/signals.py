"""Django signals the worker sends, for users who hook in metrics or auditing.

Every signal is sent with ``sender`` = the :class:`django_sqlqueue.worker.Worker` class and these
keyword arguments (receivers should accept ``**kwargs`` so that later additions do not break them):

- ``job_claimed(job, worker)``: a job was claimed by ``worker`` (the slot name) and is about to run;
  sent once per attempt, at the job's turn (a job of a batch handed back before its turn is sent when
  it is claimed again and runs).
- ``job_succeeded(job, worker, response, duration)``: the job is Completed; ``duration`` in seconds.
- ``job_retried(job, worker, error, duration)``: the attempt failed (exception, timeout or an explicit
  :class:`~django_sqlqueue.runner.Retry`) and the job is Error, due again at ``job.scheduled_for``.
- ``job_failed(job, worker, error, duration)``: the job is Failed (attempts exhausted or not retryable).
- ``job_cancelled(job, worker, reason, duration)``: the handler cancelled the job
  (:class:`~django_sqlqueue.runner.Cancel`).

Signals are sent with ``send_robust``: a receiver that raises is logged and does not disturb the worker.
They run in the worker's slot process, on its main thread, between jobs: keep receivers fast.
"""

from __future__ import annotations

from django.dispatch import Signal

job_claimed = Signal()
job_succeeded = Signal()
job_retried = Signal()
job_failed = Signal()
job_cancelled = Signal()

__all__ = ["job_cancelled", "job_claimed", "job_failed", "job_retried", "job_succeeded"]
