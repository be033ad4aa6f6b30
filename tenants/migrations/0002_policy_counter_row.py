"""The single PolicyCounter row (id 1) that policy versions come from."""

from django.db import migrations


def create_counter(apps, schema_editor):
    apps.get_model("tenants", "PolicyCounter").objects.get_or_create(pk=1, defaults={"value": 0})


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0001_initial"),
    ]

    operations = [
        migrations.RunPython(create_counter, migrations.RunPython.noop),
    ]
