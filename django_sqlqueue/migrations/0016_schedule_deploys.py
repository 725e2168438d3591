"""The versions of SQLQUEUE["SCHEDULES"] that syncs have seen (issue 31, item 1): a sync from an older
deploy's worker never undoes a newer deploy's schedules (see django_sqlqueue.schedules.sync_schedules)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_sqlqueue", "0015_maintenance_lease")]

    operations = [
        migrations.CreateModel(
            name="ScheduleDeploy",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("fingerprint", models.CharField(max_length=64, unique=True)),
                ("first_seen_at", models.DateTimeField()),
                ("seen_at", models.DateTimeField()),
            ],
            options={"verbose_name": "schedule settings version"},
        ),
    ]
