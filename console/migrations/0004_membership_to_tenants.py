"""Membership moves to the ``tenants`` app (issue 17), next to the Tenant it
points at: only Django's idea of which app owns it changes. The table stays
``console_membership`` with its rows, so nothing is done to the database but
one row of ``django_content_type``, which follows the model (and its
permissions with it)."""

from django.db import migrations


def _move_content_type(apps, frm, to, model):
    ContentType = apps.get_model("contenttypes", "ContentType")
    if not ContentType.objects.filter(app_label=to, model=model).exists():
        ContentType.objects.filter(app_label=frm, model=model).update(app_label=to)


def forwards(apps, schema_editor):
    _move_content_type(apps, "console", "tenants", "membership")


def backwards(apps, schema_editor):
    _move_content_type(apps, "tenants", "console", "membership")


class Migration(migrations.Migration):

    dependencies = [
        ("console", "0003_auditevent_to_core"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="Membership")],
            database_operations=[],
        ),
        migrations.RunPython(forwards, backwards),
    ]
