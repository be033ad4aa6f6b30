"""The console's own tables: the admin API's tokens and the failed logins
the throttle counts.

``console_apitoken`` is a contract with brokerd, which reads it with plain SQL
(``brokerd.tenancy.source``): ``id, name, token_hash ("sha256$<hex>"), scope
("read"|"write"), revoked (bool)``. The secret is shown once when made and
never stored; brokerd reloads the table every few seconds, so a revoked token
stops working within that time on every node. (The audit log, the other
table brokerd uses, is ``core.models.AuditEvent``; who may do what in a
tenant is ``tenants.models.Membership``.)
"""

import hashlib
import secrets

from django.conf import settings
from django.db import models

TOKEN_PREFIX = "bkd_"


def hash_token(secret: str) -> str:
    return "sha256$" + hashlib.sha256(secret.encode()).hexdigest()


class ApiToken(models.Model):
    class Scope(models.TextChoices):
        READ = "read", "read only"
        WRITE = "write", "read and write"

    name = models.CharField(max_length=100, unique=True)
    token_hash = models.CharField(max_length=80, unique=True)
    scope = models.CharField(max_length=8, choices=Scope.choices, default=Scope.READ)
    revoked = models.BooleanField(default=False)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "console_apitoken"
        ordering = ["name"]

    def __str__(self):
        return self.name

    @classmethod
    def issue(cls, name: str, scope: str, created_by=None) -> tuple["ApiToken", str]:
        """A new token and its secret (to be shown once)."""
        secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
        token = cls.objects.create(name=name, scope=scope, token_hash=hash_token(secret), created_by=created_by)
        return token, secret


class LoginFailure(models.Model):
    """One failed console login: the throttle counts these per username and per
    address over ``LOGIN_FAILURE_WINDOW`` (see ``console.throttle``). In the
    database, so every console process sees the same count."""

    username = models.CharField(max_length=150, db_index=True)
    remote_addr = models.CharField(max_length=64, db_index=True)
    at = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self):
        return f"failed login for {self.username!r} from {self.remote_addr} at {self.at:%Y-%m-%d %H:%M:%S}"
