"""The status vocabulary, its classification, and every pair of the transition table."""

from __future__ import annotations

import itertools

import pytest

from django_sqlqueue.models import QueueStatus
from django_sqlqueue.states import (
    CLAIMABLE,
    DEDUPE_SCOPE,
    EDITABLE,
    FINISHED,
    TRANSITIONS,
    UNFINISHED,
    Status,
    can_transition,
    sql_list,
)

# The table, written out independently of states.py: (from, to) pairs that are allowed.
S = Status
EXPECTED_ALLOWED = {
    (S.PENDING, S.PROCESSING), (S.PENDING, S.CANCELLED), (S.PENDING, S.PAUSED), (S.PENDING, S.TERMINATED),
    (S.PROCESSING, S.PROCESSING), (S.PROCESSING, S.PENDING), (S.PROCESSING, S.ERROR), (S.PROCESSING, S.FAILED),
    (S.PROCESSING, S.COMPLETED), (S.PROCESSING, S.CANCELLED), (S.PROCESSING, S.TERMINATED),
    (S.PROCESSING, S.PARTIALLY_COMPLETED),
    (S.ERROR, S.PROCESSING), (S.ERROR, S.PENDING), (S.ERROR, S.FAILED), (S.ERROR, S.CANCELLED),
    (S.ERROR, S.PAUSED), (S.ERROR, S.TERMINATED),
    (S.FAILED, S.PENDING),
    (S.CANCELLED, S.PENDING),
    (S.PAUSED, S.PENDING), (S.PAUSED, S.CANCELLED), (S.PAUSED, S.TERMINATED),
    (S.PARTIALLY_COMPLETED, S.PENDING),
    (S.WAITING, S.PENDING), (S.WAITING, S.CANCELLED), (S.WAITING, S.TERMINATED),
}


@pytest.mark.parametrize(("current", "new"), list(itertools.product(Status, Status)))
def test_every_pair_is_allowed_or_refused_as_written(current: Status, new: Status) -> None:
    assert can_transition(current, new) is ((current, new) in EXPECTED_ALLOWED)


def test_table_covers_every_status() -> None:
    assert set(TRANSITIONS) == set(Status)


def test_classification() -> None:
    assert CLAIMABLE == {S.PENDING, S.ERROR}
    assert FINISHED == {S.FAILED, S.COMPLETED, S.CANCELLED, S.TERMINATED, S.PARTIALLY_COMPLETED}
    assert UNFINISHED == {S.PENDING, S.PROCESSING, S.ERROR, S.PAUSED, S.WAITING}
    assert DEDUPE_SCOPE == UNFINISHED - {S.WAITING}
    assert CLAIMABLE <= UNFINISHED and not (FINISHED & UNFINISHED)
    assert S.COMPLETED not in EDITABLE and S.PROCESSING in EDITABLE
    # Terminal statuses cannot move on, except an operator's retry back to Pending.
    for status in FINISHED:
        assert TRANSITIONS[status] <= {S.PENDING}


def test_labels_round_trip_and_sql_list() -> None:
    for status in Status:
        assert Status.from_label(status.label) is status
    assert Status.from_label("partially completed") is S.PARTIALLY_COMPLETED
    with pytest.raises(ValueError, match="unknown status"):
        Status.from_label("Done")
    assert sql_list(CLAIMABLE) == "1, 3"


@pytest.mark.django_db
def test_vocabulary_table_is_seeded_from_the_enum() -> None:
    """The data migration itself writes the vocabulary (the suite's autouse fixture seeds it too, so the
    table is emptied first and only the migration's function fills it)."""
    import importlib
    from types import SimpleNamespace

    from django.apps import apps
    from django.db import connection

    QueueStatus.objects.all().delete()
    for name in ("0002_seed_statuses", "0012_workflows"):
        migration = importlib.import_module(f"django_sqlqueue.migrations.{name}")
        migration.seed(apps, SimpleNamespace(connection=connection))
    assert dict(QueueStatus.objects.values_list("id", "name")) == {int(s): s.label for s in Status}
