"""Worker incarnations, and what each worker serves.

Incarnations: each registration of a worker name gets a random id, stamped on the jobs it
claims, so that a paused process and its same-name replacement never take each other's jobs.

On SQL Server the reclaim's "own leftovers" seek (``sqlqueue_job_processing_worker``) also covers the
new column, so a job of the live incarnation is rejected from the index entry (with UPDLOCK a row read
from the table and rejected would stay locked to the end of the claim). Written out here, as 0004 does.
"""

from django.db import migrations, models

JOB = "django_sqlqueue_job"
INDEX = "sqlqueue_job_processing_worker"
KEYS = "[worker]"
INCLUDE = "[lease_expires_at], [priority], [scheduled_for], [queue], [type_id], [attempt_num], [max_attempts]"


def _worker_index(schema_editor, include: str) -> None:
    connection = schema_editor.connection
    if connection.vendor != "microsoft":
        return
    qn = connection.ops.quote_name
    schema_editor.execute(f"DROP INDEX IF EXISTS {qn(INDEX)} ON {qn(JOB)}")
    schema_editor.execute(f"CREATE INDEX {qn(INDEX)} ON {qn(JOB)} ({KEYS}) INCLUDE ({include}) WHERE [status_id] = 2")


def cover_incarnation(apps, schema_editor):
    _worker_index(schema_editor, INCLUDE + ", [incarnation]")


def uncover_incarnation(apps, schema_editor):
    _worker_index(schema_editor, INCLUDE)


class Migration(migrations.Migration):

    dependencies = [
        ('django_sqlqueue', '0004_sqlserver'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='incarnation',
            field=models.CharField(blank=True, db_default='', default='', editable=False, max_length=32),
        ),
        migrations.AddField(
            model_name='worker',
            name='incarnation',
            field=models.CharField(blank=True, db_default='', default='', editable=False, max_length=32),
        ),
        migrations.AddField(
            model_name='worker',
            name='queues',
            field=models.JSONField(blank=True, default=list, editable=False),
        ),
        migrations.AddField(
            model_name='worker',
            name='types',
            field=models.JSONField(blank=True, default=list, editable=False),
        ),
        migrations.AddField(
            model_name='worker',
            name='process',
            field=models.CharField(blank=True, db_default='', default='', editable=False, max_length=120),
        ),
        migrations.RunPython(cover_incarnation, uncover_incarnation, elidable=False),
    ]
