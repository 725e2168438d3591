"""``manage.py sqlqueue_demo``: the README's first command (``bash scripts/demo.sh`` runs it).

Migrates the database (the SQLite file ``db.sqlite3`` unless ``SQLQUEUE_DATABASE_URL`` says otherwise),
enqueues a mix of sample jobs from the notifications example, drains them with
``run_queue_worker --burst`` in a subprocess (again while a retry or a scheduled job becomes due within
the time limit), and prints what happened to each job and a per-status summary.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.management import call_command, get_commands
from django.core.management.base import BaseCommand, CommandError
from django.db import connections
from django.tasks import DEFAULT_TASK_BACKEND_ALIAS, task_backends
from django.utils import timezone

from django_sqlqueue import Status
from django_sqlqueue.models import Job, JobAttempt
from django_sqlqueue.states import CLAIMABLE, FINISHED
from django_sqlqueue.tasks import SqlQueueBackend
from testproject.notifications.models import Outbox
from testproject.notifications.services import request_password_reset

#: What each sample is expected to end as (the demo exits 1 if one does not).
EXPECTED = {"Failed": {"webhook, always fails"}}


#: The command the demo's closing hint prints (tests/test_demo_hint.py runs it and fetches the CSS).
RUNSERVER_HINT = "python manage.py runserver --insecure"


class Command(BaseCommand):
    help = ("Demo: migrate, enqueue sample jobs, run `run_queue_worker --burst`, print a per-status "
            "summary. Takes well under a minute.")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--concurrency", type=int, default=2, help="worker slots (default 2)")
        parser.add_argument("--schedule-in", type=float, default=3.0, metavar="SECONDS",
                            help="how far ahead the scheduled sample is (default 3)")
        parser.add_argument("--log-level", default="WARNING",
                            help="run_queue_worker's log level (default WARNING: failed attempts only)")
        parser.add_argument("--time-limit", type=float, default=45.0, metavar="SECONDS",
                            help="give up waiting for the jobs after this long (default 45)")

    def handle(self, *args: Any, **options: Any) -> None:
        started = time.monotonic()
        if "run_queue_worker" not in get_commands():
            raise CommandError("run_queue_worker is not available: is django_sqlqueue in INSTALLED_APPS?")
        db = connections["default"].settings_dict
        self.step(f"1. migrate ({db['ENGINE'].rsplit('.', 1)[-1]} {db['NAME']})")
        call_command("migrate", interactive=False, verbosity=0)

        self.step("2. enqueue sample jobs")
        samples = self.enqueue_samples(options["schedule_in"])
        for label, job in samples:
            when = ""
            if job.scheduled_for > timezone.now() + timedelta(seconds=0.5):
                when = f", due in {(job.scheduled_for - timezone.now()).total_seconds():.0f} s"
            self.stdout.write(f"   job {job.pk:>5}  {job.job_type.name:<48} {label}{when}")

        self.step(f"3. run_queue_worker --burst --concurrency {options['concurrency']}")
        ids = [job.pk for _, job in samples]
        self.wait_due = options["schedule_in"] + 5.0  # the scheduled sample, plus retries (backoff <= 5 s)
        self.log_level = options["log_level"]
        self.stdout.write(f"   (with --wait-due {self.wait_due:g} --log-level {self.log_level})")
        # The time limit counts from here, as its help says: the jobs' time, not migrate's. Counted from
        # the start, a migrate slowed by a busy machine (over TDS at load 8: most of the 45 s) left the
        # worker too little time, and the scheduled-ahead sample was still Pending when it was stopped.
        rounds = self.drain(ids, options["concurrency"], time.monotonic() + options["time_limit"])

        self.step("4. what happened")
        ok = self.report(samples, rounds, time.monotonic() - started)
        if not ok:
            raise CommandError("some sample jobs did not end as expected (see above)")

    # ----- steps ------------------------------------------------------------------------------------
    def step(self, text: str) -> None:
        self.stdout.write(self.style.MIGRATE_HEADING(text))

    def enqueue_samples(self, schedule_in: float) -> list[tuple[str, Job]]:
        samples: list[tuple[str, Job]] = [
            ("password reset, e-mail + SMS, Send fails once",
             request_password_reset(user_id=1001, username="alice", email="alice@example.com",
                                    phone="+44 20 7946 0001", fail_send_attempts=1)),
            ("password reset, e-mail only",
             request_password_reset(user_id=1002, username="bob", email="bob@example.com")),
            ("digest, fails once then succeeds",
             Job.objects.enqueue("SendDigest", {"email": "carol@example.com", "items": 5, "fail_attempts": 1})),
            ("digest",
             Job.objects.enqueue("SendDigest", {"email": "dave@example.com", "items": 2})),
            ("webhook, always fails",
             Job.objects.enqueue("DeliverWebhook", {"url": "https://hooks.example.invalid/orders"})),
            ("digest, scheduled ahead",
             Job.objects.enqueue("SendDigest", {"email": "erin@example.com", "items": 1}, delay=schedule_in)),
        ]
        # default_task_backend is a proxy (its type is django.utils.connection's): ask the backend itself.
        if isinstance(task_backends[DEFAULT_TASK_BACKEND_ALIAS], SqlQueueBackend):
            from testproject.notifications.tasks import send_welcome_email

            result = send_welcome_email.enqueue(1003, "frank@example.com")
            samples.append(("Django @task (TASKS backend)", Job.objects.get(pk=int(result.id))))
        else:
            self.stdout.write("   (TASKS is not set to django_sqlqueue.tasks.SqlQueueBackend: no @task sample)")
        return [(label, Job.objects.select_related("job_type").get(pk=job.pk)) for label, job in samples]

    def drain(self, ids: list[int], concurrency: int, deadline: float) -> int:
        """Run burst workers until every sample finished or the deadline passed; return how many rounds."""
        manage = os.path.join(settings.BASE_DIR, "manage.py")
        # --wait-due: keep draining while a retry or the scheduled sample becomes due within that many
        # seconds, so that one worker run usually finishes everything; the loop below is the fallback.
        wait_due = max(1.0, min(self.wait_due, deadline - time.monotonic()))
        command = [sys.executable, manage, "run_queue_worker", "--burst", "--concurrency", str(concurrency),
                   "--wait-due", f"{wait_due:g}", "--log-level", self.log_level]
        rounds = 0
        while True:
            rounds += 1
            left = max(1.0, deadline - time.monotonic())
            try:
                proc = subprocess.run(command, timeout=left, check=False)
            except subprocess.TimeoutExpired:
                self.stdout.write(self.style.WARNING("   worker still busy at the time limit; stopped it"))
                return rounds
            if proc.returncode != 0:
                raise CommandError(f"run_queue_worker exited with status {proc.returncode}")
            pending = Job.objects.filter(pk__in=ids).exclude(status_id__in=FINISHED)
            if not pending.exists():
                return rounds
            due = pending.filter(status_id__in=CLAIMABLE).order_by("scheduled_for").first()
            if due is None:
                self.stdout.write(self.style.WARNING("   jobs left that no worker will claim (paused?)"))
                return rounds
            wait = (due.scheduled_for - timezone.now()).total_seconds()
            if time.monotonic() + max(wait, 0) >= deadline:
                self.stdout.write(self.style.WARNING(f"   next job due in {wait:.1f} s: past the time limit"))
                return rounds
            if wait > 0:
                self.stdout.write(f"   waiting {wait:.1f} s for job {due.pk} (retry or scheduled), then again")
                time.sleep(wait + 0.05)

    def report(self, samples: list[tuple[str, Job]], rounds: int, elapsed: float) -> bool:
        ok = True
        counts: dict[str, int] = {}
        self.stdout.write(f"   {'job':>5}  {'status':<10} {'tries':>5}  {'step':<8} sample")
        for label, job in samples:
            job = Job.objects.get(pk=job.pk)
            status = job.state.label
            counts[status] = counts.get(status, 0) + 1
            expected = next((s for s, labels in EXPECTED.items() if label in labels), "Completed")
            mark = "" if status == expected else self.style.ERROR(f"  <- expected {expected}")
            ok = ok and status == expected
            self.stdout.write(f"   {job.pk:>5}  {status:<10} {job.attempt_num:>5}  {job.step or '-':<8} {label}{mark}")
            history = JobAttempt.objects.filter(job=job).order_by("attempt_num")
            for attempt in history:
                if attempt.error:
                    last = attempt.error.strip().splitlines()[-1]
                    last = re.sub(r"^(?:\w+\.)+(?=\w+: )", "", last)  # drop the exception's module path
                    if len(last) > 100:
                        last = last[:99] + "..."
                    self.stdout.write(f"   {'':>5}  attempt {attempt.attempt_num} by {attempt.worker}: {last}")
        self.step("   per-status summary")
        for status in Status:
            if counts.get(status.label):
                self.stdout.write(f"   {status.label:<12} {counts[status.label]}")
        rows = list(Outbox.objects.filter(job_id__in=[j.pk for _, j in samples]).values_list("job_id", "channel"))
        duplicates = len(rows) - len(set(rows))
        ok = ok and duplicates == 0
        self.stdout.write(f"   outbox rows written: {len(rows)}, duplicates after retries: {duplicates}")
        self.stdout.write(f"   worker rounds: {rounds}; total time {elapsed:.1f} s")
        # --insecure: runserver serves the admin's CSS and JavaScript although DEBUG is off (the example's
        # default); without it the admin renders unstyled. For a local look only, never in production.
        self.stdout.write(f"   Browse it: python manage.py createsuperuser && {RUNSERVER_HINT}, "
                          "then http://127.0.0.1:8000/admin/")
        return ok
