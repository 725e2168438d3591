"""The job-type cache never holds a row an uncommitted transaction created or read (issue 21 finding 2).

A first enqueue of a type inside ``atomic()`` that rolls back created the type's row and cached its id;
another process then created a different type: on SQLite it got the same id, so the next enqueue of
the first type was stored as the other type (the wrong handler ran); on PostgreSQL the next enqueues
failed with IntegrityError until the cache expired.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from django.db import transaction

from django_sqlqueue import jobtypes
from django_sqlqueue.handlers import registry
from django_sqlqueue.models import Job, JobType
from tests import procutil

REPO = Path(__file__).resolve().parent.parent
FIRST, OTHER = "cache.First", "cache.Other"


class Boom(Exception):
    pass


@pytest.fixture
def handlers():
    for name in (FIRST, OTHER):
        registry.register(name, lambda job: None)
    yield
    for name in (FIRST, OTHER):
        registry.unregister(name)


def create_type_in_another_process(name: str) -> int:
    code = ("from django_sqlqueue.models import JobType; "
            f"print(JobType.objects.create(name={name!r}).pk)")
    done = subprocess.run([sys.executable, "manage.py", "shell", "-c", code], cwd=REPO, env=procutil.test_db_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_first_enqueue_leaves_nothing_in_the_cache(handlers) -> None:
    with pytest.raises(Boom), transaction.atomic():
        Job.objects.enqueue(FIRST, {})
        raise Boom
    assert not JobType.objects.filter(name=FIRST).exists()
    create_type_in_another_process(OTHER)  # SQLite hands it the rolled-back id
    job = Job.objects.enqueue(FIRST, {})  # PostgreSQL: an IntegrityError here while the bad id was cached
    assert Job.objects.select_related("job_type").get(pk=job.pk).job_type.name == FIRST


@pytest.mark.django_db(transaction=True)
def test_a_type_read_inside_a_transaction_is_cached_when_it_commits(handlers) -> None:
    with transaction.atomic():
        Job.objects.enqueue(FIRST, {})
        assert (jobtypes._by_name.get(("default", FIRST))) is None  # not before the commit
    info = jobtypes._by_name[("default", FIRST)][1]
    assert info.id == JobType.objects.get(name=FIRST).pk


@pytest.mark.django_db(transaction=True)
def test_a_committed_type_is_refreshed_at_once_inside_a_later_transaction(handlers) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    Job.objects.enqueue(FIRST, {})  # autocommit: the row is committed and cached
    key = ("default", FIRST)
    jobtypes._by_name[key] = (0.0, jobtypes._by_name[key][1])  # expired
    with transaction.atomic(), CaptureQueriesContext(connection) as ctx:
        jobtypes.get_type(FIRST, using="default")
        jobtypes.get_type(FIRST, using="default")  # served from the cache refreshed by the first
    assert len([q for q in ctx.captured_queries if "jobtype" in q["sql"].lower()]) == 1


@pytest.mark.django_db
def test_a_claim_filtered_by_many_types_reads_the_uncached_ones_in_one_statement() -> None:
    """A worker that serves a subset of the types (some type in the table has no handler in its code)
    claims with a filter of the types it serves; once the cache expired, each of them was one read
    before the claim (30 served types: 30 statements per claim of an idle slot). Now one read."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    names = [f"served.t{i}" for i in range(12)]
    JobType.objects.bulk_create([JobType(name=n) for n in names])
    job = Job.objects.enqueue("served.t7")
    jobtypes.clear_cache()
    qn = connection.ops.quote_name
    column = f"{qn(JobType._meta.db_table)}.{qn('description')}"  # in whole rows' reads only
    with CaptureQueriesContext(connection) as queries:
        _completed, claimed = Job.objects.complete_and_claim([], "filtered", 1, types=names)
    assert [j.pk for j in claimed] == [job.pk]
    type_reads = [q["sql"] for q in queries if column in q["sql"]]
    assert len(type_reads) == 1, type_reads
    assert jobtypes.type_ids(names, using="default") == tuple(JobType.objects.get(name=n).pk for n in names)
    with pytest.raises(jobtypes.UnknownJobType):
        jobtypes.type_ids(["served.t1", "served.nope"], using="default")


@pytest.mark.django_db(transaction=True)  # a worker reads outside a transaction (the cache keeps committed rows)
def test_a_filtered_workers_type_refresh_is_one_read_and_its_claim_then_reads_no_type() -> None:
    """The served types' refresh (every 10 s in a worker that serves a subset of the types) read the
    names, then the claim read the limited ids and the served rows: three statements before each claim
    of an idle slot. The refresh now reads whole rows once and fills the cache (a limit included)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_sqlqueue.worker import serving

    names = [f"refresh.t{i}" for i in range(6)]
    JobType.objects.bulk_create([JobType(name=n) for n in names])
    JobType.objects.filter(name="refresh.t3").update(concurrency_limit=2)
    job = Job.objects.enqueue("refresh.t1")
    for name in names[:3]:
        registry.register(name, lambda job: None)
    try:
        serving.resolve("default")  # the first refresh (it also learns which names are no task here)
        jobtypes.clear_cache()  # the cache expired, as it has before each claim of an idle slot
        table = connection.ops.quote_name(JobType._meta.db_table)
        with CaptureQueriesContext(connection) as queries:
            found = serving.resolve("default")
            assert found.filtered and set(found.handled) >= set(names[:3]) and "refresh.t3" in found.unhandled
            _completed, claimed = Job.objects.complete_and_claim([], "filtered", 1, types=list(found.claim_types))
        assert [j.pk for j in claimed] == [job.pk]
        # reads whose first FROM is the type table (the claim's own statement reads it in a subquery)
        type_reads = [q["sql"] for q in queries
                      if q["sql"].startswith("SELECT") and q["sql"].partition(" FROM ")[2].startswith(table)]
        assert len(type_reads) == 1, "\n".join(sql[:160] for sql in type_reads)
        assert jobtypes.limited_type_ids("default") == {JobType.objects.get(name="refresh.t3").pk}
    finally:
        for name in names[:3]:
            registry.unregister(name)
