from django.db import migrations, models
import django.db.models.deletion


class Migration(migrations.Migration):

    dependencies = [
        ("django_sqlqueue", "0010_tracing_and_attempt_step"),
    ]

    operations = [
        migrations.CreateModel(
            name="CancelRequest",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("attempt_num", models.PositiveIntegerField()),
                ("requested_at", models.DateTimeField()),
                ("requested_by", models.CharField(blank=True, default="", max_length=200)),
                ("reason", models.CharField(blank=True, default="", max_length=1000)),
                ("job", models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE,
                                          related_name="cancel_requests", to="django_sqlqueue.job")),
            ],
            options={
                "verbose_name": "cancel request",
                "ordering": ["job_id", "attempt_num"],
                "constraints": [models.UniqueConstraint(fields=("job", "attempt_num"), name="sqlqueue_cancel_attempt")],
            },
        ),
    ]
