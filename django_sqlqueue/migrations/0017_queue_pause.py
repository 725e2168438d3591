"""Queue pause (issue 27): a row per paused queue; the claim passes over the jobs of a queue that has one."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_sqlqueue", "0016_schedule_deploys")]

    operations = [
        migrations.CreateModel(
            name="QueuePause",
            fields=[
                ("queue", models.CharField(max_length=100, primary_key=True, serialize=False)),
                ("paused_at", models.DateTimeField()),
                ("paused_by", models.CharField(blank=True, default="", max_length=200)),
                ("reason", models.CharField(blank=True, default="", max_length=500)),
            ],
            options={"verbose_name": "paused queue", "ordering": ["queue"]},
        ),
    ]
