"""The partial / filtered indexes' own predicates, written into queries as literals.

SQL Server matches a filtered index only when the query's predicate is the same literal at compile time
(SQLite likewise for a partial index), and Django would send ``status_id = @P1`` / ``error > @P1`` as
parameters, so those indexes would be kept up to date and never read. The admin's filters and dashboard,
:mod:`.health` and :mod:`.metrics` build their index-served conditions from here; this module sits below
all of them (it imports only the models, the states and the dialects).
"""

from __future__ import annotations

import datetime

from django.db import connections
from django.db.models import BooleanField, Q
from django.db.models.expressions import RawSQL

from ..states import CLAIMABLE, Status, sql_list


def index_predicate(using: str, column: str, sql: str) -> Q:
    """``<job table>.<column> <sql>`` written into the query as text, for a partial/filtered index's own
    predicate. ``sql`` holds code constants only (status ids from :mod:`.states`, an empty string), never
    input; names come from model meta through ``quote_name``.
    """
    from django.apps import apps

    Job = apps.get_model("django_sqlqueue", "Job")  # the dialects sit below models.py: no import of it
    qn = connections[using].ops.quote_name
    field = Job._meta.get_field(column)
    return Q(RawSQL(f"{qn(Job._meta.db_table)}.{qn(field.column)} {sql}", [], output_field=BooleanField()))


def overdue(using: str, now: datetime.datetime) -> Q:
    """Claimable and due: the claim index's own status list, as a literal."""
    return index_predicate(using, "status", f"IN ({sql_list(CLAIMABLE)})") & Q(scheduled_for__lte=now)


def claim_index_rows(using: str) -> Q:
    """Claimable jobs of types without a limit: sqlqueue_job_claim's whole predicate, as literals (with the
    status list alone, the planner cannot use that index: it also requires ``limited`` false)."""
    from . import get_dialect

    false = get_dialect(connections[using]).false_literal
    return index_predicate(using, "status", f"IN ({sql_list(CLAIMABLE)})") & index_predicate(using, "limited", f"= {false}")


def limited_index_rows(using: str) -> Q:
    """Jobs of limited types that wait or run: sqlqueue_job_limited's whole predicate, as literals."""
    from . import get_dialect

    true = get_dialect(connections[using]).true_literal
    return (index_predicate(using, "status", f"IN ({sql_list(CLAIMABLE | {Status.PROCESSING})})")
            & index_predicate(using, "limited", f"= {true}"))


def lease_expired(using: str, now: datetime.datetime) -> Q:
    """Processing with an expired lease: sqlqueue_job_processing's own predicate, as a literal."""
    return index_predicate(using, "status", f"= {int(Status.PROCESSING)}") & Q(lease_expires_at__lt=now)


def has_error(using: str) -> Q:
    """Jobs with error text: ``error > ''``, the predicate of the partial index sqlqueue_job_has_error
    (rather than ``NOT error = ''``, a form SQL Server does not accept in a filtered index)."""
    from . import get_dialect

    return index_predicate(using, "error", f"> {get_dialect(connections[using]).empty_string}")
