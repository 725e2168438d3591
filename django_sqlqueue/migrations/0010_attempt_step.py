"""Each history row says which step its attempt was at (the admin's attempt history shows it).

A plain AddField with a database default: existing rows read as no step (empty), as they were shown.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_sqlqueue', '0009_schedules'),
    ]

    operations = [
        migrations.AddField(
            model_name='jobattempt',
            name='step',
            field=models.CharField(blank=True, db_default='', default='', max_length=100),
        ),
    ]
