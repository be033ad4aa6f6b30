from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("spark_reports", "0002_telemetry_kind"),
    ]

    operations = [
        migrations.AddField(
            model_name="reportrun",
            name="heartbeat_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
