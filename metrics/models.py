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
