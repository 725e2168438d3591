"""Workflows: the Waiting status, job dependencies, batches (docs/workflows.md)."""

import django.db.models.deletion
from django.db import migrations, models

# Frozen copy, as in 0002_seed_statuses.
STATUSES = [(10, "Waiting")]


def seed(apps, schema_editor):
    QueueStatus = apps.get_model("django_sqlqueue", "QueueStatus")
    db = schema_editor.connection.alias
    for pk, name in STATUSES:
        QueueStatus.objects.using(db).update_or_create(id=pk, defaults={"name": name})


def unseed(apps, schema_editor):
    QueueStatus = apps.get_model("django_sqlqueue", "QueueStatus")
    QueueStatus.objects.using(schema_editor.connection.alias).filter(id__in=[pk for pk, _ in STATUSES]).delete()


class Migration(migrations.Migration):

    dependencies = [
        ('django_sqlqueue', '0011_cancel_running'),
    ]

    operations = [
        migrations.CreateModel(
            name='JobDependency',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('on_failure', models.CharField(choices=[('cancel', 'cancel the dependent'), ('run', 'run the dependent anyway')], default='cancel', max_length=10)),
            ],
            options={
                'verbose_name': 'job dependency',
                'verbose_name_plural': 'job dependencies',
            },
        ),
        migrations.AddField(
            model_name='job',
            name='has_dependents',
            field=models.BooleanField(blank=True, editable=False, null=True),
        ),
        migrations.CreateModel(
            name='Batch',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('description', models.CharField(blank=True, default='', max_length=200)),
                ('on_success', models.JSONField(blank=True, null=True)),
                ('on_failure', models.JSONField(blank=True, null=True)),
                ('on_finish', models.JSONField(blank=True, null=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('closed_at', models.DateTimeField(blank=True, null=True)),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('succeeded', models.BooleanField(blank=True, null=True)),
                ('callback_ids', models.JSONField(blank=True, default=list)),
            ],
            options={
                'verbose_name': 'batch',
                'verbose_name_plural': 'batches',
                'ordering': ['-id'],
                'indexes': [models.Index(condition=models.Q(('finished_at__isnull', True)), fields=['closed_at'], name='sqlqueue_batch_unfinished')],
            },
        ),
        migrations.AddField(
            model_name='job',
            name='batch',
            field=models.ForeignKey(blank=True, db_index=False, editable=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='members', to='django_sqlqueue.batch'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('batch__isnull', False)), fields=['batch', 'status'], name='sqlqueue_job_batch'),
        ),
        migrations.AddField(
            model_name='jobdependency',
            name='depends_on',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='dependents', to='django_sqlqueue.job'),
        ),
        migrations.AddField(
            model_name='jobdependency',
            name='job',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='dependencies', to='django_sqlqueue.job'),
        ),
        migrations.AddIndex(
            model_name='jobdependency',
            index=models.Index(fields=['depends_on'], name='sqlqueue_dependency_on'),
        ),
        migrations.AddConstraint(
            model_name='jobdependency',
            constraint=models.UniqueConstraint(fields=('job', 'depends_on'), name='sqlqueue_dependency_unique'),
        ),
        migrations.RunPython(seed, unseed),
    ]
