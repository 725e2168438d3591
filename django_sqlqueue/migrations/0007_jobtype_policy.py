# JobType.code_options (issue 20 item 1) and JobType.is_task (issue 21 finding 11).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_sqlqueue', '0006_jobtype_limits'),
    ]

    operations = [
        migrations.AddField(
            model_name='jobtype',
            name='code_options',
            field=models.JSONField(blank=True, default=dict, editable=False),
        ),
        migrations.AddField(
            model_name='jobtype',
            name='is_task',
            field=models.BooleanField(default=False, editable=False),
        ),
    ]
