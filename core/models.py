"""The ground floor's one table: the audit log, which brokerd writes too.

``console_auditevent`` (the table keeps the name it was born with in the
``console`` app; brokerd writes it with plain SQL, ``brokerd.tenancy.source``
and ``brokerd.admin.server``): ``at, actor, source ("console"|"api"|"cli"),
action, object_type, object_id, tenant, before, after (JSON text or NULL),
remote_addr``.
"""

from django.db import models


class AuditEvent(models.Model):
    class Source(models.TextChoices):
        CONSOLE = "console"
        API = "api"
        CLI = "cli"

    at = models.DateTimeField(db_index=True)
    actor = models.CharField(max_length=200)
    source = models.CharField(max_length=16, choices=Source.choices)
    action = models.CharField(max_length=100, db_index=True)
    object_type = models.CharField(max_length=50)
    object_id = models.CharField(max_length=300)
    tenant = models.CharField(max_length=63, null=True, blank=True, db_index=True)
    before = models.TextField(null=True, blank=True)
    after = models.TextField(null=True, blank=True)
    remote_addr = models.CharField(max_length=64, null=True, blank=True)

    class Meta:
        db_table = "console_auditevent"
        ordering = ["-at", "-id"]

    def __str__(self):
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor} {self.action} {self.object_type} {self.object_id}"
