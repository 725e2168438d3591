"""Soak producer: one process that enqueues its share of the soak's jobs and writes a manifest.

Started by ``bench/soak.py`` (``python -m bench.soak_produce ...`` from the repository root, with
``SQLQUEUE_DATABASE_URL`` and ``DJANGO_SETTINGS_MODULE`` in the environment). It:

1. waits for the orchestrator's "go" file, so all producers start together;
2. enqueues every dedupe key of the run, one ``enqueue`` call per key in its own shuffled order: every
   other producer does the same at the same moment, so each key is enqueued ``--producers`` times in a
   race (the ``soak.Dedupe`` type is paused meanwhile, so the first job of a key cannot finish before
   the last enqueue of that key arrives);
3. writes ``dedupe-done-<index>`` and enqueues the rest in batches of random size (1 = ``enqueue``,
   more = ``enqueue_many``), a share delayed a few seconds, flaky, slow or always failing, pausing while
   more than ``--max-backlog`` jobs are Pending (so production lasts through the chaos);
4. appends one JSON line per job to ``manifest-<index>.jsonl`` (sequence number, job id, type, key) as
   soon as its batch has committed, and a final summary line.

A lost connection (the PostgreSQL restart) makes the commit of the batch in flight ambiguous: the
producer reconnects and looks the batch up by its marker (``payload["b"]``) before trying again, so no
batch is enqueued twice and none is skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MAX_TRIES = 120  # per batch; with the capped backoff below, about four minutes of outage at most


def plan(args: argparse.Namespace) -> list[dict[str, Any]]:
    """This producer's non-dedupe jobs, deterministic for (seed, index)."""
    rng = random.Random(f"{args.seed}:{args.index}")
    jobs = []
    for seq in range(args.calls):
        r = rng.random()
        spec: dict[str, Any] = {"s": seq}
        if r < args.fail_share:
            spec["t"] = "soak.AlwaysFail"
        else:
            spec["t"] = "soak.Tx" if rng.random() < 0.5 else "soak.NonTx"
            if rng.random() < args.flaky_share:
                spec["fail"] = rng.choice((1, 2))
        if rng.random() < args.slow_share:
            spec["sleep"] = rng.randint(20, 150)
        if rng.random() < args.delayed_share:
            spec["delay"] = round(rng.uniform(1.0, args.delay_max), 3)
        jobs.append(spec)
    return jobs


def batches(jobs: list[dict[str, Any]], rng: random.Random) -> list[list[dict[str, Any]]]:
    out, i = [], 0
    while i < len(jobs):
        size = 1 if rng.random() < 0.15 else rng.randint(2, 100)
        out.append(jobs[i:i + size])
        i += size
    return out


class Producer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.workdir = Path(args.workdir)
        self.manifest = open(self.workdir / f"manifest-{args.index}.jsonl", "a", encoding="utf-8")  # noqa: SIM115
        self.retries = 0
        self.ambiguous = 0  # batches whose commit was unknown after a lost connection
        self.errors: dict[str, int] = {}
        self.throttled = 0.0  # seconds spent waiting for the backlog to shrink

    def write(self, row: dict[str, Any]) -> None:
        self.manifest.write(json.dumps(row, separators=(",", ":")) + "\n")

    def retrying(self, what: Callable[[], Any], committed: Callable[[], Any] | None = None) -> Any:
        """Run ``what``; on a database error reconnect, ask ``committed`` whether it went in, retry."""
        from django.db import DatabaseError, connection

        delay = 0.05
        for _ in range(MAX_TRIES):
            try:
                return what()
            except DatabaseError as exc:
                kind = f"{type(exc).__name__}: {' '.join(str(exc).split())[:80]}"
                self.errors[kind] = self.errors.get(kind, 0) + 1
                self.retries += 1
                try:
                    connection.close()
                except Exception:
                    pass
                time.sleep(delay)
                delay = min(2.0, delay * 2)
                if committed is not None:
                    try:
                        found = committed()
                    except DatabaseError:
                        continue  # still down: retry the check before retrying the write
                    if found is not None:
                        self.ambiguous += 1
                        return found
        raise SystemExit(f"producer {self.args.index}: gave up after {MAX_TRIES} tries")

    def run(self) -> None:
        from django_sqlqueue.models import Job
        from django_sqlqueue.queue import JobSpec
        from django_sqlqueue.states import Status

        a = self.args
        rng = random.Random(f"{a.seed}:{a.index}:order")
        deadline = time.monotonic() + 120
        while not (self.workdir / "go").exists():
            if time.monotonic() > deadline:
                raise SystemExit("no go signal within 120 s")
            time.sleep(0.01)
        started = time.monotonic()

        # Phase 1: every key, racing the other producers.
        keys = list(range(a.keys))
        rng.shuffle(keys)
        for k in keys:
            key = f"{a.run}:k{k}"
            job = self.retrying(lambda key=key, k=k: Job.objects.enqueue(
                "soak.Dedupe", {"r": a.run, "p": a.index, "k": k}, dedupe_key=key))
            self.write({"k": key, "id": job.pk, "t": "soak.Dedupe"})
        self.manifest.flush()
        (self.workdir / f"dedupe-done-{a.index}").touch()
        dedupe_seconds = time.monotonic() - started

        # Phase 2: the rest, in batches, held back while the backlog is deep (so that production goes on
        # through the chaos instead of finishing in the first seconds).
        next_check = 0.0
        for number, batch in enumerate(batches(plan(a), rng)):
            while a.max_backlog and time.monotonic() >= next_check:
                backlog = self.retrying(lambda: Job.objects.filter(status_id=Status.PENDING).count())
                if backlog <= a.max_backlog:
                    next_check = time.monotonic() + 0.25
                    break
                self.throttled += 0.2
                time.sleep(0.2)
            marker = f"{a.run}:{a.index}:{number}"
            specs = []
            for spec in batch:
                payload = {"r": a.run, "p": a.index, "s": spec["s"], "b": marker}
                for opt in ("fail", "sleep"):
                    if opt in spec:
                        payload[opt] = spec[opt]
                specs.append(JobSpec(spec["t"], payload, delay=spec.get("delay")))

            def enqueue(specs: list[JobSpec] = specs) -> list[tuple[int, int]]:
                if len(specs) == 1:
                    job = Job.objects.enqueue(specs[0].job_type, specs[0].payload, delay=specs[0].delay)
                    return [(job.payload["s"], job.pk)]
                return [(job.payload["s"], job.pk) for job in Job.objects.enqueue_many(specs)]

            def committed(marker: str = marker, n: int = len(specs)) -> list[tuple[int, int]] | None:
                rows = list(Job.objects.filter(payload__b=marker).values_list("payload", "id"))
                if not rows:
                    return None
                if len(rows) != n:
                    raise SystemExit(f"batch {marker}: {len(rows)} of {n} rows committed (partial commit!)")
                return [(p["s"], pk) for p, pk in rows]

            by_seq = dict(self.retrying(enqueue, committed))
            for spec in batch:
                self.write({"s": spec["s"], "id": by_seq[spec["s"]], "t": spec["t"], "b": marker})
            self.manifest.flush()
            if a.pause_ms:
                time.sleep(rng.uniform(0, a.pause_ms) / 1000)
        self.write({"done": True, "keys": a.keys, "calls": a.calls, "retries": self.retries,
                    "ambiguous": self.ambiguous, "errors": self.errors, "throttled": round(self.throttled, 1),
                    "dedupe_seconds": round(dedupe_seconds, 3), "seconds": round(time.monotonic() - started, 3)})
        self.manifest.close()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", required=True)
    p.add_argument("--run", required=True)
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--seed", required=True)
    p.add_argument("--calls", type=int, required=True, help="non-dedupe jobs of this producer")
    p.add_argument("--keys", type=int, required=True, help="dedupe keys (every producer enqueues each)")
    p.add_argument("--fail-share", type=float, default=0.02)
    p.add_argument("--flaky-share", type=float, default=0.08)
    p.add_argument("--slow-share", type=float, default=0.05)
    p.add_argument("--delayed-share", type=float, default=0.10)
    p.add_argument("--delay-max", type=float, default=15.0)
    p.add_argument("--max-backlog", type=int, default=0, help="wait while more Pending jobs than this (0: never)")
    p.add_argument("--pause-ms", type=float, default=0.0, help="random pause up to this long between batches")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    import django

    django.setup()
    Producer(args).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
