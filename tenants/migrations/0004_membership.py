"""Membership, moved here from ``console`` (issue 17). Its table,
``console_membership``, was made by ``console.0001_initial`` and keeps its
name and rows: this migration only tells Django that ``tenants`` owns the
model now (hence the dependency on the console app's migration that let it
go: migration history, not an import)."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("tenants", "0003_own_quota"),
        ("console", "0004_membership_to_tenants"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="Membership",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False,
                                                   verbose_name="ID")),
                        ("role", models.CharField(choices=[("admin", "tenant administrator"),
                                                           ("viewer", "tenant viewer")],
                                                  default="viewer", max_length=8)),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        ("tenant", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE,
                                                     related_name="memberships", to="tenants.tenant")),
                        ("user", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE,
                                                   related_name="memberships", to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        "db_table": "console_membership",
                        "ordering": ["tenant_id", "user_id"],
                        "constraints": [models.UniqueConstraint(fields=("user", "tenant"),
                                                                name="console_membership_unique")],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
