"""Metrics history and alarms.

``metrics_sample`` is a contract with brokerd (like ``console_auditevent``):
every node writes one row per minute for itself (``tenant = ""``) and one per
tenant it served, and adds the same figures into the hour's row, with plain
SQL (brokerd/metrics/history.py). It prunes its own rows: minutes after 7
days, hours after 90 days. The console only reads them.
"""

from django.db import models


class Sample(models.Model):
    class Resolution(models.TextChoices):
        MINUTE = "m", "minute"
        HOUR = "h", "hour"

    resolution = models.CharField(max_length=1, choices=Resolution.choices)
    at = models.DateTimeField(help_text="start of the minute or hour (UTC)")
    node = models.CharField(max_length=64)
    tenant = models.CharField(max_length=64, blank=True, help_text='"" = the whole node')
    connections = models.IntegerField(default=0, help_text="most connections at once in the period")
    connects = models.BigIntegerField(default=0)
    messages_in = models.BigIntegerField(default=0)
    messages_out = models.BigIntegerField(default=0)
    bytes_in = models.BigIntegerField(default=0)
    bytes_out = models.BigIntegerField(default=0)
    dropped = models.BigIntegerField(default=0, help_text="messages dropped for any reason")
    rejected = models.BigIntegerField(default=0, help_text="ACL denials, quota refusals, auth failures")

    class Meta:
        db_table = "metrics_sample"
        constraints = [models.UniqueConstraint(fields=["resolution", "at", "node", "tenant"],
                                               name="metrics_sample_once")]
        indexes = [models.Index(fields=["resolution", "tenant", "at"], name="metrics_sample_series")]

    def __str__(self):
        return f"{self.node}/{self.tenant or '*'} {self.resolution} {self.at:%Y-%m-%d %H:%M}"


class Alarm(models.Model):
    """A condition the console's metrics hub watches (``metrics.core.AlarmRules``):
    raised when it starts, cleared (``cleared_at``) when it ends; cleared
    alarms stay as history. At most one alarm per kind and subject is open,
    so two console processes watching the same cluster do not raise it twice."""

    class Kind(models.TextChoices):
        QUOTA = "quota", "tenant near a quota"
        NODE_DOWN = "node_down", "node down"
        DROPS = "drops", "drops rising"
        RULE_DROPS = "rule_drops", "rule actions dropped"

    kind = models.CharField(max_length=16, choices=Kind.choices)
    subject = models.CharField(max_length=200, help_text='node id, tenant slug or "slug:quota_field"')
    tenant = models.ForeignKey("tenants.Tenant", null=True, blank=True, on_delete=models.CASCADE,
                               related_name="alarms")
    tenant_slug = models.CharField(max_length=64, blank=True,
                                   help_text="also for tenants without a console row (the anonymous one)")
    message = models.TextField()
    raised_at = models.DateTimeField()
    cleared_at = models.DateTimeField(null=True, blank=True)
    dismissed_by = models.CharField(max_length=150, blank=True,
                                    help_text="the administrator who cleared it by hand (a node that left for good)")

    class Meta:
        db_table = "metrics_alarm"
        ordering = ["-raised_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["kind", "subject"], condition=models.Q(cleared_at__isnull=True),
                                               name="metrics_alarm_open_once")]
        indexes = [models.Index(fields=["cleared_at", "kind"], name="metrics_alarm_open"),
                   models.Index(fields=["tenant_slug", "raised_at"], name="metrics_alarm_tenant")]

    def __str__(self):
        return f"{self.kind} {self.subject} ({'open' if self.cleared_at is None else 'cleared'})"

    @property
    def is_open(self) -> bool:
        return self.cleared_at is None
