"""SQL Server only (every step is a no-op elsewhere), issue 29: what a busy server does to the claim.

1. Every claim index INCLUDEs ``version``: the claim carries the token of each row it picked into its
   UPDATE (``WHERE j.version = picked.version``), read from the index entry, with no key lookup (and
   no U lock on the base row) per candidate (``sqlqueue_job_processing_worker`` keeps 0005's
   ``incarnation``, which the ``mine`` branch tests).
2. ``sqlqueue_job_claim_queue``: the due branch of a worker that names its queues seeks (queue, claim
   order) per queue instead of walking other queues' due jobs in the claim index.
3. ``sqlqueue_permit_free`` on the permit table: (held_until, id), so that the limited claim's
   ``TOP (1) ... ORDER BY held_until, id`` is an ordered seek that stops at the first usable permit.
4. Lock escalation off for the history table as well (0004 and 0013 did the job and permit tables):
   a purge's or claim's history writes must never take a table lock that blocks every claim's INSERT.

The definitions are written out here, not imported, so that this migration means the same thing
whatever the code becomes. See docs/sqlserver.md.
"""

from django.db import migrations

JOB = "django_sqlqueue_job"
PERMIT = "django_sqlqueue_limitpermit"
ATTEMPT = "django_sqlqueue_jobattempt"
CLAIMABLE = "[status_id] IN (1, 3) AND [limited] = 0"
PROCESSING = "[status_id] = 2"
LIMITED = "[status_id] IN (1, 2, 3) AND [limited] = 1"

# (table, name, keys, included columns, filter)
FORWARD = (
    (JOB, "sqlqueue_job_claim", "[priority] DESC, [scheduled_for], [id]",
     "[queue], [type_id], [attempt_num], [max_attempts], [version]", CLAIMABLE),
    (JOB, "sqlqueue_job_claim_queue", "[queue], [priority] DESC, [scheduled_for], [id]",
     "[type_id], [attempt_num], [max_attempts], [version]", CLAIMABLE),
    (JOB, "sqlqueue_job_processing", "[lease_expires_at], [worker]",
     "[priority], [scheduled_for], [queue], [type_id], [attempt_num], [max_attempts], [version]", PROCESSING),
    (JOB, "sqlqueue_job_processing_worker", "[worker]",
     "[lease_expires_at], [priority], [scheduled_for], [queue], [type_id], [attempt_num], [max_attempts], "
     "[version], [incarnation]", PROCESSING),
    (JOB, "sqlqueue_job_limited", "[type_id], [concurrency_key], [priority] DESC, [scheduled_for], [id]",
     "[queue], [status_id], [attempt_num], [max_attempts], [lease_expires_at], [version]", LIMITED),
    (PERMIT, "sqlqueue_permit_free", "[held_until], [id]", "[job_type_id], [key], [hold_seconds]", ""),
)
# What 0004, 0005 and 0013 left, for the way back.
BACKWARD = (
    (JOB, "sqlqueue_job_claim", "[priority] DESC, [scheduled_for], [id]",
     "[queue], [type_id], [attempt_num], [max_attempts]", CLAIMABLE),
    (JOB, "sqlqueue_job_processing", "[lease_expires_at], [worker]",
     "[priority], [scheduled_for], [queue], [type_id], [attempt_num], [max_attempts]", PROCESSING),
    (JOB, "sqlqueue_job_processing_worker", "[worker]",
     "[lease_expires_at], [priority], [scheduled_for], [queue], [type_id], [attempt_num], [max_attempts], "
     "[incarnation]", PROCESSING),
    (JOB, "sqlqueue_job_limited", "[type_id], [concurrency_key], [priority] DESC, [scheduled_for], [id]",
     "[queue], [status_id], [attempt_num], [max_attempts], [lease_expires_at]", LIMITED),
)
ONLY_FORWARD = (("sqlqueue_job_claim_queue", JOB), ("sqlqueue_permit_free", PERMIT))


def _create(schema_editor, indexes) -> None:
    qn = schema_editor.connection.ops.quote_name
    for table, name, keys, include, where in indexes:
        schema_editor.execute(f"DROP INDEX IF EXISTS {qn(name)} ON {qn(table)}")
        where_sql = f" WHERE {where}" if where else ""
        schema_editor.execute(f"CREATE INDEX {qn(name)} ON {qn(table)} ({keys}) INCLUDE ({include}){where_sql}")


def forward(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "microsoft":
        return
    _create(schema_editor, FORWARD)
    schema_editor.execute(f"ALTER TABLE {connection.ops.quote_name(ATTEMPT)} SET (LOCK_ESCALATION = DISABLE)")


def backward(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "microsoft":
        return
    qn = connection.ops.quote_name
    for name, table in ONLY_FORWARD:
        schema_editor.execute(f"DROP INDEX IF EXISTS {qn(name)} ON {qn(table)}")
    _create(schema_editor, BACKWARD)
    schema_editor.execute(f"ALTER TABLE {qn(ATTEMPT)} SET (LOCK_ESCALATION = TABLE)")


class Migration(migrations.Migration):

    dependencies = [
        ('django_sqlqueue', '0013_limits'),
    ]

    operations = [
        migrations.RunPython(forward, backward, elidable=False),
    ]
