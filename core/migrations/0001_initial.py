"""AuditEvent, moved here from ``console`` (issue 17). Its table,
``console_auditevent``, was made by ``console.0001_initial`` and keeps its
name and rows (brokerd writes it by that name): this migration only tells
Django that ``core`` owns the model now. Hence its one dependency on the
console app: migration history, not an import."""

from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ("console", "0003_auditevent_to_core"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="AuditEvent",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False,
                                                   verbose_name="ID")),
                        ("at", models.DateTimeField(db_index=True)),
                        ("actor", models.CharField(max_length=200)),
                        ("source", models.CharField(choices=[("console", "Console"), ("api", "Api"),
                                                             ("cli", "Cli")], max_length=16)),
                        ("action", models.CharField(db_index=True, max_length=100)),
                        ("object_type", models.CharField(max_length=50)),
                        ("object_id", models.CharField(max_length=300)),
                        ("tenant", models.CharField(blank=True, db_index=True, max_length=63, null=True)),
                        ("before", models.TextField(blank=True, null=True)),
                        ("after", models.TextField(blank=True, null=True)),
                        ("remote_addr", models.CharField(blank=True, max_length=64, null=True)),
                    ],
                    options={
                        "db_table": "console_auditevent",
                        "ordering": ["-at", "-id"],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
