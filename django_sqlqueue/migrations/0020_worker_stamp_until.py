from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_sqlqueue', '0019_throughput_rollup'),
    ]

    operations = [
        migrations.AddField(
            model_name='worker',
            name='stamp_until',
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
    ]
