"""AuditEvent moves to the ``core`` app (issue 17): only Django's idea of
which app owns it changes. The table stays ``console_auditevent`` with its
rows (brokerd writes it by that name), so nothing is done to the database
but one row of ``django_content_type``, which follows the model (and its
permissions with it)."""

from django.db import migrations


def _move_content_type(apps, frm, to, model):
    ContentType = apps.get_model("contenttypes", "ContentType")
    if not ContentType.objects.filter(app_label=to, model=model).exists():
        ContentType.objects.filter(app_label=frm, model=model).update(app_label=to)


def forwards(apps, schema_editor):
    _move_content_type(apps, "console", "core", "auditevent")


def backwards(apps, schema_editor):
    _move_content_type(apps, "core", "console", "auditevent")


class Migration(migrations.Migration):

    dependencies = [
        ("console", "0002_login_failure"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="AuditEvent")],
            database_operations=[],
        ),
        migrations.RunPython(forwards, backwards),
    ]
