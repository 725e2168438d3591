"""Global concurrency and rate limits (docs/limits.md): the limits on the job type, the job's
concurrency key, the permit table the claim takes its semaphore rows from, and the index of the claim's
limited branch. On SQL Server the permit table's lock escalation is off, as the job table's is (0004):
a table lock is the one lock READPAST cannot skip.
"""

import django.core.validators
import django.db.models.deletion
import django_sqlqueue.limits
from django.db import migrations, models


PERMIT = "django_sqlqueue_limitpermit"


def no_lock_escalation(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor == "microsoft":
        schema_editor.execute(f"ALTER TABLE {connection.ops.quote_name(PERMIT)} SET (LOCK_ESCALATION = DISABLE)")


class Migration(migrations.Migration):

    dependencies = [
        ('django_sqlqueue', '0010_tracing_and_attempt_step'),
    ]

    operations = [
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
        migrations.AddField(
            model_name='job',
            name='concurrency_key',
            field=models.CharField(blank=True, db_default='', default='', editable=False, max_length=200),
        ),
        migrations.AddField(
            model_name='jobtype',
            name='concurrency_limit',
            field=models.PositiveSmallIntegerField(blank=True, help_text='At most this many jobs of the type (per concurrency key) run at once across all workers. Blank: no limit.', null=True, validators=[django.core.validators.MinValueValidator(1), django.core.validators.MaxValueValidator(1000)]),
        ),
        migrations.AddField(
            model_name='jobtype',
            name='rate_limit',
            field=models.CharField(blank=True, default='', help_text='At most N job starts per period across all workers (per concurrency key), e.g. "10/s", "100/m", "500/h". Blank: no limit.', max_length=32, validators=[django_sqlqueue.limits.validate_rate_limit]),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('status_id__in', [1, 2, 3])), fields=['job_type', 'concurrency_key', '-priority', 'scheduled_for', 'id'], name='sqlqueue_job_limited'),
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
        migrations.RunPython(no_lock_escalation, migrations.RunPython.noop),
    ]
