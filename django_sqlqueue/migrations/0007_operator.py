"""Issue 18: the "Can view sensitive job data" permission (the admin masks sensitive payload keys and
subtype fields for users without it). Options only: no schema change."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("django_sqlqueue", "0006_jobtype_limits"),
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
    ]
