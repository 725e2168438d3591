"""The maintenance lease (worker/maintenance.py): one row per kind of fleet-wide work, held by the worker
that runs it. No row is created here: the first worker to look inserts it (and again if it is deleted)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_sqlqueue', '0014_sqlserver_locking'),
    ]

    operations = [
        migrations.CreateModel(
            name='MaintenanceLease',
            fields=[
                ('name', models.CharField(max_length=50, primary_key=True, serialize=False)),
                ('holder', models.CharField(blank=True, default='', max_length=200)),
                ('expires_at', models.DateTimeField()),
            ],
            options={
                'verbose_name': 'maintenance lease',
            },
        ),
    ]
