"""Global concurrency and rate limits (docs/limits.md): the limits on the job type, the job's
concurrency key and ``limited`` flag, the permit table the claim takes its semaphore rows from, and the
indexes: the claim index leaves limited jobs out (a deep limited backlog costs the ordinary claim
nothing), and the limited branch seeks its own.

SQL Server only (no-ops elsewhere), as in 0004: both job indexes are made covering (INCLUDE), so every
branch rejects rows from the index entry, and the permit table's lock escalation is off (a table lock
is the one lock READPAST cannot skip). The index definitions are written out, not imported.
"""

import django.core.validators
import django.db.models.deletion
import django_sqlqueue.bounds
from django.db import migrations, models


JOB = "django_sqlqueue_job"
PERMIT = "django_sqlqueue_limitpermit"
CLAIM = ("sqlqueue_job_claim", "[priority] DESC, [scheduled_for], [id]",
         "[queue], [type_id], [attempt_num], [max_attempts]")
LIMITED = ("sqlqueue_job_limited", "[type_id], [concurrency_key], [priority] DESC, [scheduled_for], [id]",
           "[queue], [status_id], [attempt_num], [max_attempts], [lease_expires_at]")


def _create(schema_editor, name, keys, include, where):
    qn = schema_editor.connection.ops.quote_name
    schema_editor.execute(f"DROP INDEX IF EXISTS {qn(name)} ON {qn(JOB)}")
    schema_editor.execute(f"CREATE INDEX {qn(name)} ON {qn(JOB)} ({keys}) INCLUDE ({include}) WHERE {where}")


def sqlserver_forward(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "microsoft":
        return
    _create(schema_editor, *CLAIM, "[status_id] IN (1, 3) AND [limited] = 0")
    _create(schema_editor, *LIMITED, "[status_id] IN (1, 2, 3) AND [limited] = 1")
    schema_editor.execute(f"ALTER TABLE {connection.ops.quote_name(PERMIT)} SET (LOCK_ESCALATION = DISABLE)")


def sqlserver_backward(apps, schema_editor):
    if schema_editor.connection.vendor != "microsoft":
        return
    _create(schema_editor, *CLAIM, "[status_id] IN (1, 3)")


class Migration(migrations.Migration):

    dependencies = [
        ('django_sqlqueue', '0012_workflows'),
    ]

    operations = [
        # Undone last when migrating back: the claim index covering again, as 0004 made it.
        migrations.RunPython(migrations.RunPython.noop, sqlserver_backward),
        migrations.CreateModel(
            name='LimitPermit',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('key', models.CharField(blank=True, default='', max_length=200)),
                ('kind', models.PositiveSmallIntegerField(choices=[(1, 'concurrency'), (2, 'rate')])),
                ('slot', models.PositiveSmallIntegerField()),
                ('hold_seconds', models.FloatField(blank=True, null=True)),
                ('job_id', models.BigIntegerField(blank=True, null=True)),
                ('held_until', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'verbose_name': 'limit permit',
                'ordering': ['job_type_id', 'key', 'kind', 'slot'],
            },
        ),
        migrations.RemoveIndex(
            model_name='job',
            name='sqlqueue_job_claim',
        ),
        migrations.AddField(
            model_name='job',
            name='concurrency_key',
            field=models.CharField(blank=True, db_default='', default='', editable=False, max_length=200),
        ),
        migrations.AddField(
            model_name='job',
            name='limited',
            field=models.BooleanField(db_default=False, default=False, editable=False),
        ),
        migrations.AddField(
            model_name='jobtype',
            name='concurrency_limit',
            field=models.PositiveSmallIntegerField(blank=True, help_text='At most this many jobs of the type (per concurrency key) run at once across all workers. Blank: no limit.', null=True, validators=[django.core.validators.MinValueValidator(1), django.core.validators.MaxValueValidator(1000)]),
        ),
        migrations.AddField(
            model_name='jobtype',
            name='rate_limit',
            field=models.CharField(blank=True, default='', help_text='At most N job starts per period across all workers (per concurrency key), e.g. "10/s", "100/m", "500/h". Blank: no limit.', max_length=32, validators=[django_sqlqueue.bounds.validate_rate_limit]),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('limited', False), ('status_id__in', [1, 3])), fields=['-priority', 'scheduled_for', 'id'], name='sqlqueue_job_claim'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('limited', True), ('status_id__in', [1, 2, 3])), fields=['job_type', 'concurrency_key', '-priority', 'scheduled_for', 'id'], name='sqlqueue_job_limited'),
        ),
        migrations.AddConstraint(
            model_name='jobtype',
            constraint=models.CheckConstraint(condition=models.Q(('concurrency_limit__isnull', True), models.Q(('concurrency_limit__gte', 1), ('concurrency_limit__lte', 1000)), _connector='OR'), name='sqlqueue_jobtype_concurrency_limit'),
        ),
        migrations.AddField(
            model_name='limitpermit',
            name='job_type',
            field=models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='django_sqlqueue.jobtype'),
        ),
        migrations.AddIndex(
            model_name='limitpermit',
            index=models.Index(condition=models.Q(('job_id__isnull', False)), fields=['job_id'], name='sqlqueue_permit_job'),
        ),
        migrations.AddConstraint(
            model_name='limitpermit',
            constraint=models.UniqueConstraint(fields=('job_type', 'key', 'kind', 'slot'), name='sqlqueue_permit_slot'),
        ),
        migrations.RunPython(sqlserver_forward, migrations.RunPython.noop),
    ]
