"""Bounds on the job type settings (issue 21): validators for the admin, check constraints in the database.

A lease of 0 s let two workers run the same job; a backoff of 1e10 s made every retry unrecordable; a
name holding a newline forged log lines. Rows already out of bounds are brought within them first
(the same values the workers would now use when reading them), otherwise adding the constraints would
fail on a database that has them.
"""

import math

import django.core.validators
from django.db import migrations, models

import django_sqlqueue.bounds

#: Field -> (smallest, largest) allowed; the constants of django_sqlqueue.bounds at the time of writing.
BOUNDS = {
    "max_attempts": (1, None),
    "timeout_seconds": (1, None),
    "lease_seconds": (1, None),
    "backoff_base_seconds": (0, 31536000),
    "backoff_max_seconds": (0, 31536000),
}


def clamp_rows(apps, schema_editor):
    """Bring every job type's settings within BOUNDS (NaN becomes blank: the SQLQUEUE default)."""
    JobType = apps.get_model("django_sqlqueue", "JobType")
    db = schema_editor.connection.alias
    for row in JobType.objects.using(db).values("pk", *BOUNDS):
        changes = {}
        for field, (low, high) in BOUNDS.items():
            value = row[field]
            if value is None:
                continue
            if isinstance(value, float) and math.isnan(value):
                changes[field] = None
            elif value < low:
                changes[field] = low
            elif high is not None and value > high:
                changes[field] = high
        if changes:
            JobType.objects.using(db).filter(pk=row["pk"]).update(**changes)


def _at_least(field, minimum):
    return models.Q((f"{field}__isnull", True), (f"{field}__gte", minimum), _connector="OR")


def _between(field, minimum, maximum):
    return models.Q((f"{field}__isnull", True), models.Q((f"{field}__gte", minimum), (f"{field}__lte", maximum)),
                    _connector="OR")


class Migration(migrations.Migration):

    dependencies = [
        ("django_sqlqueue", "0005_incarnation"),
    ]

    operations = [
        migrations.AlterField(
            model_name="jobtype",
            name="name",
            field=models.CharField(max_length=200, unique=True,
                                   validators=[django_sqlqueue.bounds.validate_type_name]),
        ),
        migrations.AlterField(
            model_name="jobtype",
            name="max_attempts",
            field=models.PositiveSmallIntegerField(
                blank=True, null=True, validators=[django.core.validators.MinValueValidator(1)],
                help_text="At least 1. Blank: SQLQUEUE['MAX_ATTEMPTS'] (3 unless set)."),
        ),
        migrations.AlterField(
            model_name="jobtype",
            name="backoff_base_seconds",
            field=models.FloatField(
                blank=True, null=True, validators=[django_sqlqueue.bounds.FiniteRange(0, 31536000)],
                help_text="0 to 31536000 (a year). Blank: SQLQUEUE['BACKOFF_BASE_SECONDS']."),
        ),
        migrations.AlterField(
            model_name="jobtype",
            name="backoff_max_seconds",
            field=models.FloatField(
                blank=True, null=True, validators=[django_sqlqueue.bounds.FiniteRange(0, 31536000)],
                help_text="0 to 31536000 (a year). Blank: SQLQUEUE['BACKOFF_MAX_SECONDS']."),
        ),
        migrations.AlterField(
            model_name="jobtype",
            name="timeout_seconds",
            field=models.PositiveIntegerField(
                blank=True, null=True, validators=[django.core.validators.MinValueValidator(1)],
                help_text="At least 1. Blank: SQLQUEUE['TIMEOUT_SECONDS']."),
        ),
        migrations.AlterField(
            model_name="jobtype",
            name="lease_seconds",
            field=models.PositiveIntegerField(
                blank=True, null=True, validators=[django.core.validators.MinValueValidator(1)],
                help_text="At least 1; renewed every third of it while the job runs. "
                          "Blank: SQLQUEUE['LEASE_SECONDS']."),
        ),
        migrations.RunPython(clamp_rows, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="jobtype",
            constraint=models.CheckConstraint(condition=_at_least("max_attempts", 1),
                                              name="sqlqueue_jobtype_max_attempts"),
        ),
        migrations.AddConstraint(
            model_name="jobtype",
            constraint=models.CheckConstraint(condition=_at_least("timeout_seconds", 1),
                                              name="sqlqueue_jobtype_timeout"),
        ),
        migrations.AddConstraint(
            model_name="jobtype",
            constraint=models.CheckConstraint(condition=_at_least("lease_seconds", 1), name="sqlqueue_jobtype_lease"),
        ),
        migrations.AddConstraint(
            model_name="jobtype",
            constraint=models.CheckConstraint(condition=_between("backoff_base_seconds", 0, 31536000),
                                              name="sqlqueue_jobtype_backoff_base"),
        ),
        migrations.AddConstraint(
            model_name="jobtype",
            constraint=models.CheckConstraint(condition=_between("backoff_max_seconds", 0, 31536000),
                                              name="sqlqueue_jobtype_backoff_max"),
        ),
    ]
