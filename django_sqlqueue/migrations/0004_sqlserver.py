"""SQL Server only (every step is a no-op elsewhere):

1. The job's JSON columns take any JSON value: mssql-django's ``ISJSON(col) = 1`` check refuses scalars,
   so it is replaced by the check :class:`~django_sqlqueue.fields.JSONValueField` declares.
2. The claim's indexes cover its predicates (INCLUDE), and the reclaim branches get a filtered index of
   their own, so that every branch of the claim is a seek and rejects rows from the index entry: with
   UPDLOCK a row read and rejected stays locked to the end of the claim.
3. Lock escalation is off for the job table: a table lock is the one lock READPAST cannot skip.

The index definitions are written out here, not imported, so that this migration means the same
thing whatever the code becomes. See docs/sqlserver.md.
"""

from django.db import migrations

import django_sqlqueue.fields

JOB = "django_sqlqueue_job"
JSON_COLUMNS = ("payload", "response")
# (name, keys, included columns, filter): status ids are literals, as the claim's own predicates are.
COVERED = (
    ("sqlqueue_job_claim", "[priority] DESC, [scheduled_for], [id]",
     "[queue], [type_id], [attempt_num], [max_attempts]", "[status_id] IN (1, 3)"),
    ("sqlqueue_job_processing", "[lease_expires_at], [worker]",
     "[priority], [scheduled_for], [queue], [type_id], [attempt_num], [max_attempts]", "[status_id] = 2"),
    ("sqlqueue_job_processing_worker", "[worker]",
     "[lease_expires_at], [priority], [scheduled_for], [queue], [type_id], [attempt_num], [max_attempts]",
     "[status_id] = 2"),
)
PLAIN = (  # what 0001 created, for the way back
    ("sqlqueue_job_claim", "[priority] DESC, [scheduled_for], [id]", "", "[status_id] IN (1, 3)"),
    ("sqlqueue_job_processing", "[lease_expires_at], [worker]", "", "[status_id] = 2"),
)


def _json_checks(schema_editor, strict: bool) -> None:
    connection = schema_editor.connection
    if connection.vendor != "microsoft":
        return
    qn = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT cc.name, c.name, cc.definition FROM sys.check_constraints AS cc "
            "LEFT JOIN sys.columns AS c ON c.object_id = cc.parent_object_id AND c.column_id = cc.parent_column_id "
            "WHERE cc.parent_object_id = OBJECT_ID(%s)", [JOB])
        found = cursor.fetchall()
    for column in JSON_COLUMNS:
        for name, on_column, definition in found:
            if "ISJSON" in (definition or "").upper() and (on_column == column or f"[{column}]" in definition):
                schema_editor.execute(f"ALTER TABLE {qn(JOB)} DROP CONSTRAINT {qn(name)}")
        check = (f"(ISJSON({qn(column)}) = 1)" if strict
                 else django_sqlqueue.fields.json_value_check(qn(column)))
        schema_editor.execute(f"ALTER TABLE {qn(JOB)} ADD CONSTRAINT {qn(f'sqlqueue_job_{column}_json')} CHECK {check}")


def any_json_value(apps, schema_editor):
    _json_checks(schema_editor, strict=False)


def objects_and_arrays_only(apps, schema_editor):
    _json_checks(schema_editor, strict=True)


def _indexes(schema_editor, wanted, drop) -> None:
    connection = schema_editor.connection
    if connection.vendor != "microsoft":
        return
    qn = connection.ops.quote_name
    for name in drop:
        schema_editor.execute(f"DROP INDEX IF EXISTS {qn(name)} ON {qn(JOB)}")
    for name, keys, include, where in wanted:
        include_sql = f" INCLUDE ({include})" if include else ""
        schema_editor.execute(f"CREATE INDEX {qn(name)} ON {qn(JOB)} ({keys}){include_sql} WHERE {where}")


def covering_indexes(apps, schema_editor):
    _indexes(schema_editor, COVERED, [name for name, *_ in PLAIN])
    if schema_editor.connection.vendor == "microsoft":
        schema_editor.execute(f"ALTER TABLE {schema_editor.connection.ops.quote_name(JOB)} SET (LOCK_ESCALATION = DISABLE)")


def plain_indexes(apps, schema_editor):
    _indexes(schema_editor, PLAIN, [name for name, *_ in COVERED])
    if schema_editor.connection.vendor == "microsoft":
        schema_editor.execute(f"ALTER TABLE {schema_editor.connection.ops.quote_name(JOB)} SET (LOCK_ESCALATION = TABLE)")


class Migration(migrations.Migration):

    dependencies = [
        ('django_sqlqueue', '0003_admin_indexes'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            # No column changes anywhere: only SQL Server's check constraint differs.
            database_operations=[migrations.RunPython(any_json_value, objects_and_arrays_only, elidable=False)],
            state_operations=[
                migrations.AlterField(
                    model_name='job',
                    name='payload',
                    field=django_sqlqueue.fields.JSONValueField(blank=True, default=dict),
                ),
                migrations.AlterField(
                    model_name='job',
                    name='response',
                    field=django_sqlqueue.fields.JSONValueField(blank=True, null=True),
                ),
            ],
        ),
        migrations.RunPython(covering_indexes, plain_indexes, elidable=False),
    ]
