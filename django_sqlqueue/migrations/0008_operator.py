"""Issue 18 (the operator's view):

- the "Can view sensitive job data" permission (the admin masks sensitive payload keys and subtype
  fields for users without it) -- options only, no schema change;
- on PostgreSQL, a GIN index (jsonb_path_ops) on the payload, for the admin's payload search by JSON
  containment. Other vendors have no such index: the dialect returns no DDL and nothing is created.
"""

from typing import Any

from django.db import migrations

PAYLOAD_INDEX = "sqlqueue_job_payload_gin"


def create_payload_index(apps: Any, schema_editor: Any) -> None:
    from django_sqlqueue.dialects import get_dialect

    job = apps.get_model("django_sqlqueue", "Job")
    sql = get_dialect(schema_editor.connection).payload_index_sql(
        job._meta.db_table, job._meta.get_field("payload").column, PAYLOAD_INDEX)
    if sql:
        schema_editor.execute(sql)


def drop_payload_index(apps: Any, schema_editor: Any) -> None:
    from django_sqlqueue.dialects import get_dialect

    if get_dialect(schema_editor.connection).payload_containment_indexed:
        schema_editor.execute(f"DROP INDEX IF EXISTS {schema_editor.connection.ops.quote_name(PAYLOAD_INDEX)}")


class Migration(migrations.Migration):

    dependencies = [
        ("django_sqlqueue", "0007_jobtype_policy"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="job",
            options={
                "ordering": ["-id"],
                "permissions": [
                    ("retry_job", "Can retry jobs"),
                    ("cancel_job", "Can cancel or terminate jobs"),
                    ("reschedule_job", "Can reschedule jobs and reset attempts"),
                    ("pause_job", "Can pause and resume jobs"),
                    ("view_sensitive_job", "Can view sensitive job data"),
                ],
                "verbose_name": "job",
            },
        ),
        migrations.RunPython(create_payload_index, drop_payload_index, elidable=False),
    ]
