"""Seed the QueueStatus vocabulary from django_sqlqueue.states (ids are code constants)."""

from django.db import migrations

# Frozen copy: a migration must not change meaning when the code changes later.
STATUSES = [
    (1, "Pending"),
    (2, "Processing"),
    (3, "Error"),
    (4, "Failed"),
    (5, "Completed"),
    (6, "Cancelled"),
    (7, "Paused"),
    (8, "Terminated"),
    (9, "PartiallyCompleted"),
]


def seed(apps, schema_editor):
    QueueStatus = apps.get_model("django_sqlqueue", "QueueStatus")
    db = schema_editor.connection.alias
    for pk, name in STATUSES:
        QueueStatus.objects.using(db).update_or_create(id=pk, defaults={"name": name})


def unseed(apps, schema_editor):
    QueueStatus = apps.get_model("django_sqlqueue", "QueueStatus")
    QueueStatus.objects.using(schema_editor.connection.alias).filter(id__in=[pk for pk, _ in STATUSES]).delete()


class Migration(migrations.Migration):
    dependencies = [("django_sqlqueue", "0001_initial")]
    operations = [migrations.RunPython(seed, unseed)]
