"""Soak verification: everything is checked from the database and the producers' manifests.

Each check has a name, passes or fails, and carries its numbers and a few example job ids. The checks
(see docs/soak.md for why each one matters):

- ``producers``: every producer exited 0 and its manifest holds every job it planned.
- ``no_lost``: every job id a producer was given exists; ``no_strays``: every soak job in the table was
  given to a producer (no batch enqueued twice by a retry after a lost connection).
- ``finished``: every job is Completed, except the always-failing type, which is Failed after its
  maximum attempts.
- ``history``: each job's JobAttempt rows are numbered exactly 1..attempt_num; the last one is closed
  with the job's final status; earlier ones are closed as Error or were never closed (a killed or lost
  attempt).
- ``tx_exactly_once``: each transactional job has exactly one side effect, written by its completing
  attempt.
- ``nontx_explained``: each non-transactional job has one side effect from its completing attempt, and
  every extra one comes from an attempt whose history row was never closed; no attempt number
  appears twice (that would be a re-run the history cannot explain).
- ``transient``: no job failed more often, by plan, than its payload said.
- ``dedupe``: one job per key, and every enqueue of a key was answered with that job.
- ``workers``: the worker sent SIGTERM exited 0, every worker exited 0 at the end, none died on its own.
- ``no_crashes``: no traceback in any worker log, and no slot died except those the chaos killed.
- ``chaos``: the kills, the database restart and the SIGTERM the run asked for all happened.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.db.models import Q

EXAMPLES = 8


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""
    examples: list[Any] = field(default_factory=list)

    def line(self) -> str:
        mark = "PASS" if self.ok else "FAIL"
        ex = f" e.g. {self.examples[:EXAMPLES]}" if self.examples and not self.ok else ""
        return f"  [{mark}] {self.name}: {self.detail}{ex}"


def load_manifests(workdir: Path, producers: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(job entries, summaries) of every producer's manifest."""
    entries: list[dict[str, Any]] = []
    summaries: list[dict[str, Any]] = []
    for i in range(producers):
        path = workdir / f"manifest-{i}.jsonl"
        if not path.exists():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            if row.get("done"):
                summaries.append({"producer": i, **row})
            else:
                entries.append({"producer": i, **row})
    return entries, summaries


def verify(*, run: str, workdir: Path, producers: int, planned_calls: int, producer_codes: list[int | None],
           worker_events: dict[str, Any], chaos: dict[str, Any], chaos_wanted: dict[str, Any],
           numbers: dict[str, Any]) -> list[Check]:
    """Run every check; fill ``numbers`` with what the report prints."""
    from django_sqlqueue.models import Job, JobAttempt, JobType
    from django_sqlqueue.states import Status
    from testproject.soakjobs.jobs import ALL_TYPES, FAIL_TYPES, NONTX_TYPES, TX_TYPES
    from testproject.soakjobs.models import SideEffect

    checks: list[Check] = []
    entries, summaries = load_manifests(workdir, producers)
    types = dict(JobType.objects.filter(name__in=ALL_TYPES).values_list("id", "name"))
    type_ids = list(types)

    # ----- producers and manifests -------------------------------------------------------------------
    bad_codes = [i for i, c in enumerate(producer_codes) if c != 0]
    checks.append(Check("producers", not bad_codes and len(entries) == planned_calls and len(summaries) == producers,
                        f"{producers} producers, exit codes {producer_codes}, {len(entries)} of {planned_calls} "
                        f"enqueue calls answered", bad_codes))
    numbers["enqueue_calls"] = len(entries)
    numbers["producer_retries"] = sum(s.get("retries", 0) for s in summaries)
    numbers["producer_ambiguous_commits"] = sum(s.get("ambiguous", 0) for s in summaries)
    errors: Counter[str] = Counter()
    for s in summaries:
        errors.update(s.get("errors", {}))
    numbers["producer_errors"] = dict(errors.most_common(5))
    numbers["producer_seconds"] = max((s.get("seconds", 0) for s in summaries), default=0)
    numbers["producer_throttled_seconds"] = max((s.get("throttled", 0) for s in summaries), default=0)
    numbers["dedupe_phase_seconds"] = max((s.get("dedupe_seconds", 0) for s in summaries), default=0)

    # ----- what the database holds -------------------------------------------------------------------
    jobs: dict[int, dict[str, Any]] = {}
    run_filter = Q(payload__r=run)
    for pk, type_id, status, attempt, key, payload in (
            Job.objects.filter(job_type_id__in=type_ids).filter(run_filter)
            .values_list("id", "job_type_id", "status_id", "attempt_num", "dedupe_key", "payload").iterator(2000)):
        jobs[pk] = {"type": types[type_id], "status": status, "attempt": attempt, "key": key,
                    "fail": int((payload or {}).get("fail", 0)), "p": (payload or {}).get("p"),
                    "s": (payload or {}).get("s")}
    attempts: dict[int, list[tuple[int, bool, int | None, str]]] = defaultdict(list)
    for job_id, num, finished, outcome, error in (
            JobAttempt.objects.filter(job__job_type_id__in=type_ids)
            .values_list("job_id", "attempt_num", "finished_at", "outcome_id", "error").iterator(5000)):
        if job_id in jobs:
            lines = [x for x in error.strip().splitlines() if x and not x[0].isspace()]
            last = (lines or [""])[-1][:100]
            attempts[job_id].append((num, finished is not None, outcome, last))
    effects: dict[int, list[tuple[int, str]]] = defaultdict(list)
    spans: dict[int, list[tuple[float, float, int]]] = defaultdict(list)
    for job_id, num, kind, started, created, pid in SideEffect.objects.values_list(
            "job_id", "attempt_num", "kind", "started", "created_at", "pid").iterator(5000):
        if job_id in jobs:
            effects[job_id].append((num, kind))
            if started is not None:
                spans[job_id].append((started, created.timestamp(), pid))

    by_type = Counter(j["type"] for j in jobs.values())
    numbers["jobs"] = len(jobs)
    numbers["jobs_by_type"] = dict(sorted(by_type.items()))
    numbers["delayed_jobs"] = None  # filled by the orchestrator from the plan
    numbers["attempt_rows"] = sum(len(v) for v in attempts.values())
    numbers["side_effects"] = sum(len(v) for v in effects.values())

    # ----- lost / strays ------------------------------------------------------------------------------
    given = {e["id"] for e in entries}
    lost = sorted(given - set(jobs))
    strays = sorted(set(jobs) - given)
    checks.append(Check("no_lost", not lost, f"{len(given)} distinct jobs given to producers, {len(lost)} missing",
                        lost))
    per_seq = Counter((j["p"], j["s"]) for j in jobs.values() if j["s"] is not None)
    twice = sorted(k for k, n in per_seq.items() if n > 1)
    checks.append(Check("no_strays", not strays and not twice,
                        f"{len(strays)} jobs no producer was given, {len(twice)} enqueued twice", strays or twice))

    # ----- final states ---------------------------------------------------------------------------------
    wrong = []
    status_count: Counter[str] = Counter()
    for pk, j in jobs.items():
        status_count[Status(j["status"]).label] += 1
        want = Status.FAILED if j["type"] in FAIL_TYPES else Status.COMPLETED
        if j["status"] != want:
            wrong.append((pk, j["type"], Status(j["status"]).label))
    numbers["final_status"] = dict(sorted(status_count.items()))
    checks.append(Check("finished", not wrong, f"{dict(sorted(status_count.items()))}; {len(wrong)} not in their "
                        f"expected final state", wrong))

    always = [pk for pk, j in jobs.items() if j["type"] in FAIL_TYPES]
    short = [pk for pk in always if jobs[pk]["attempt"] != 3]
    checks.append(Check("always_fail", not short,
                        f"{len(always)} always-failing jobs, {len(always) - len(short)} Failed after exactly 3 "
                        f"attempts", short))

    # ----- history --------------------------------------------------------------------------------------
    bad_history = []
    open_rows = 0
    open_jobs = 0
    unplanned: Counter[str] = Counter()
    refunded = 0
    for pk, j in jobs.items():
        rows = sorted(attempts.get(pk, []))
        # A claim whose reply was lost is handed back with its attempt refunded: its row is kept, closed
        # as Pending ("claim reply lost"), and the next claim opens a row under the same number.
        lost_replies = [r for r in rows if r[1] and r[2] == Status.PENDING and r[3].startswith("claim reply lost")]
        refunded += len(lost_replies)
        rows = [r for r in rows if r not in lost_replies]
        nums = [r[0] for r in rows]
        if nums != list(range(1, j["attempt"] + 1)):
            bad_history.append((pk, "numbers", nums, j["attempt"]))
            continue
        if not rows:
            bad_history.append((pk, "no attempts", j["attempt"]))
            continue
        last = rows[-1]
        if not last[1] or last[2] != j["status"]:
            bad_history.append((pk, "last attempt", last[:3], j["status"]))
        opened = 0
        for num, finished, outcome, error in rows[:-1]:
            if not finished:
                opened += 1
            elif outcome != Status.ERROR:
                bad_history.append((pk, "earlier attempt", num, outcome))
            elif "planned transient failure" not in error and j["type"] not in FAIL_TYPES:
                unplanned[error] += 1
        open_rows += opened
        open_jobs += bool(opened)
    checks.append(Check("history", not bad_history,
                        f"{numbers['attempt_rows']} attempt rows match attempt_num on every job; {open_rows} "
                        f"attempts never closed (killed or lost) on {open_jobs} jobs", bad_history))
    numbers["killed_attempts"] = open_rows
    numbers["claim_replies_lost"] = refunded
    numbers["jobs_with_killed_attempts"] = open_jobs
    numbers["unplanned_errors"] = dict(unplanned.most_common(5))

    # ----- side effects ---------------------------------------------------------------------------------
    tx_bad = []
    tx_jobs = [pk for pk, j in jobs.items() if j["type"] in TX_TYPES]
    for pk in tx_jobs:
        eff = effects.get(pk, [])
        if [e for e in eff if e[1] != "tx"] or len(eff) != 1 or eff[0][0] != jobs[pk]["attempt"]:
            tx_bad.append((pk, sorted(eff), jobs[pk]["attempt"]))
    checks.append(Check("tx_exactly_once", not tx_bad,
                        f"{len(tx_jobs)} transactional jobs, {len(tx_jobs) - len(tx_bad)} with exactly one side "
                        f"effect from their completing attempt", tx_bad))

    nontx_bad = []
    reruns = 0
    rerun_jobs = 0
    nontx_jobs = [pk for pk, j in jobs.items() if j["type"] in NONTX_TYPES]
    for pk in nontx_jobs:
        eff = sorted(e[0] for e in effects.get(pk, []))
        final = jobs[pk]["attempt"]
        open_nums = {num for num, finished, _, _ in attempts.get(pk, []) if not finished}
        dup = [n for n, c in Counter(eff).items() if c > 1]
        unexplained = [n for n in eff if n != final and n not in open_nums]
        if eff.count(final) != 1 or dup or unexplained:
            nontx_bad.append((pk, eff, final, sorted(open_nums)))
        if len(eff) > 1:
            reruns += len(eff) - 1
            rerun_jobs += 1
    numbers["nontx_reruns"] = reruns
    checks.append(Check("nontx_explained", not nontx_bad,
                        f"{len(nontx_jobs)} non-transactional jobs, {reruns} re-runs on {rerun_jobs} jobs, "
                        f"{len(nontx_bad)} not explained by a never-closed attempt "
                        f"(examples: job, effect attempts, final attempt, never-closed attempts)", nontx_bad))

    # ----- live double runs: two processes inside one job's handler at the same time ---------------------
    live_doubles = []
    for pk, runs in spans.items():
        runs.sort()
        for (_s1, end1, pid1), (start2, _e2, pid2) in zip(runs, runs[1:], strict=False):
            if pid1 != pid2 and start2 < end1:
                live_doubles.append((pk, pid1, pid2, round(end1 - start2, 3)))
    numbers["live_double_runs"] = len(live_doubles)
    checks.append(Check("no_live_double_runs", not live_doubles,
                        f"{sum(len(r) for r in spans.values())} handler runs with a side effect, "
                        f"{len(live_doubles)} of them overlapping another process's run of the same job "
                        f"(examples: job, pids, seconds of overlap)", live_doubles))

    # ----- planned transient failures -------------------------------------------------------------------
    flaky = [pk for pk, j in jobs.items() if j["fail"]]
    over = []
    planned_errors = 0
    for pk in flaky:
        n = sum(1 for _, finished, outcome, err in attempts.get(pk, [])
                if finished and outcome == Status.ERROR and "planned transient failure" in err)
        planned_errors += n
        if n > jobs[pk]["fail"]:
            over.append((pk, n, jobs[pk]["fail"]))
    checks.append(Check("transient", not over,
                        f"{len(flaky)} jobs planned to fail once or twice, {planned_errors} planned failures "
                        f"recorded, none over plan" if not over else f"{len(over)} failed more than planned", over))

    # ----- dedupe ---------------------------------------------------------------------------------------
    answers: dict[str, set[int]] = defaultdict(set)
    calls: Counter[str] = Counter()
    for e in entries:
        if e.get("k"):
            answers[e["k"]].add(e["id"])
            calls[e["k"]] += 1
    in_db: dict[str, list[int]] = defaultdict(list)
    for pk, j in jobs.items():
        if j["key"]:
            in_db[j["key"]].append(pk)
    dd_bad = [k for k in answers if len(answers[k]) != 1 or sorted(in_db.get(k, [])) != sorted(answers[k])]
    dd_bad += [k for k in in_db if k not in answers]
    checks.append(Check("dedupe", not dd_bad and all(c == producers for c in calls.values()),
                        f"{sum(calls.values())} enqueues of {len(answers)} keys ({producers} racing per key) -> "
                        f"{sum(len(v) for v in in_db.values())} jobs; {len(dd_bad)} keys wrong", dd_bad))
    numbers["dedupe_keys"] = len(answers)
    numbers["dedupe_calls"] = sum(calls.values())

    # ----- workers and chaos ----------------------------------------------------------------------------
    crashed = worker_events.get("crashed", [])
    bad_exit = worker_events.get("bad_final_exit", [])
    term = chaos.get("sigterm")
    term_ok = term is None or term.get("exit") == 0
    checks.append(Check("workers", not crashed and not bad_exit and term_ok,
                        f"SIGTERM'd worker exit {term.get('exit') if term else '-'} after "
                        f"{term.get('seconds') if term else '-'} s; {len(crashed)} died on their own; "
                        f"{worker_events.get('final_stopped', 0)} stopped with exit 0 at the end, "
                        f"{len(bad_exit)} did not", crashed + bad_exit))
    crashes = worker_events.get("crashes", {})
    died = worker_events.get("slot_died", 0)
    checks.append(Check("no_crashes", not crashes and died == chaos.get("slot_kills", 0),
                        f"{sum(crashes.values())} tracebacks in the worker logs; {died} slot deaths seen by the "
                        f"supervisors for {chaos.get('slot_kills', 0)} slots killed on purpose",
                        [*sorted(crashes.items(), key=lambda kv: -kv[1]), *worker_events.get("slot_lines", [])[:8]]
                        if crashes or died != chaos.get("slot_kills", 0) else []))
    missing = []
    if chaos.get("kills", 0) < chaos_wanted.get("min_kills", 0):
        missing.append(f"kills {chaos.get('kills', 0)} < {chaos_wanted['min_kills']}")
    if chaos_wanted.get("db_restart") and not chaos.get("db_restart"):
        missing.append("no database restart")
    if chaos_wanted.get("sigterm") and not term:
        missing.append("no SIGTERM")
    cuts = chaos.get("reply_cuts") or {}
    if chaos_wanted.get("reply_cuts") and not cuts.get("cut"):
        missing.append("no claim reply was lost")
    starve = chaos.get("starve")
    if chaos_wanted.get("starve") and not (starve and starve.get("heartbeats_cut")):
        missing.append("no connection starvation (or no heartbeat connection to cut)")
    twin = chaos.get("pause_twin")
    if chaos_wanted.get("pause_twin") and not twin:
        missing.append("no pause + same-name twin")
    elif twin and twin.get("exit") != 1:
        missing.append(f"the paused worker {twin.get('worker')} exited {twin.get('exit')} after resuming, not 1 "
                       f"(replaced)")
    checks.append(Check("chaos", not missing,
                        f"{chaos.get('kills', 0)} kill -9 ({chaos.get('worker_kills', 0)} whole workers: "
                        f"{chaos.get('same_name', 0)} restarted under the same name, {chaos.get('new_name', 0)} "
                        f"under a new one; {chaos.get('slot_kills', 0)} single slots), database restart: "
                        f"{chaos.get('db_restart', {}).get('seconds', '-') if chaos.get('db_restart') else 'no'}"
                        f"{' s' if chaos.get('db_restart') else ''}, SIGTERM: {'yes' if term else 'no'}, pause + twin: "
                        f"{'exit ' + str(twin.get('exit')) if twin else 'no'}, claim replies lost: {cuts.get('cut', 0)} "
                        f"({numbers.get('claim_replies_lost', 0)} jobs handed back), starvation: "
                        f"{str(starve.get('heartbeats_cut')) + ' heartbeats cut' if starve else 'no'}",
                        missing))
    return checks
