"""Tenants, their console users (Membership) and what a broker enforces for them.

Write through ``tenants.services`` only: every change a broker enforces is
published, in the same transaction, as the tenant's row of
``tenants_policysnapshot`` — the one table brokerd reads (see
``tenants.policy_snapshot``).

Credentials hold ``sha256$<hex>`` of a server-generated 256-bit secret, never
the secret: such a secret cannot be brute-forced, so a fast hash is safe, while
a password KDF (PBKDF2/bcrypt/argon2, made for low-entropy human passwords)
would make a reconnect storm CPU-bound on the broker. See ``tenants.hashing``.
"""

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from . import limits
from .fields import LineListField
from .validators import (
    DEVICE_NAME_MAX,
    SYS_PARTS,
    validate_device_name,
    validate_device_pattern,
    validate_email_list,
    validate_fingerprint,
    validate_rule_topic,
    validate_slug,
    validate_sys_parts,
)


class Tenant(models.Model):
    class Status(models.TextChoices):
        ACTIVE = "active"
        SUSPENDED = "suspended"

    class DefaultAcl(models.TextChoices):
        ALLOW = "allow"
        DENY = "deny"

    # The first part of MQTT usernames ``TENANT/DEVICE``; immutable, since it
    # also keys the tenant's policy snapshot. "default" is the anonymous tenant.
    slug = models.CharField(max_length=63, unique=True, validators=[validate_slug])
    name = models.CharField(max_length=200, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACTIVE)
    contact_emails = LineListField(validators=[validate_email_list])
    default_acl = models.CharField(max_length=8, choices=DefaultAcl.choices, default=DefaultAcl.DENY)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # set when the slug was a deleted tenant's: the usage log keys rows by slug, so rows before this
    # instant are that tenant's, and this one's reports leave them out (spark_reports.services)
    usage_since = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self):
        return self.slug

    @property
    def is_anonymous(self) -> bool:
        """The tenant brokerd puts clients without a user name in (ANONYMOUS_TENANT)."""
        return bool(settings.ANONYMOUS_TENANT) and self.slug == settings.ANONYMOUS_TENANT


class Membership(models.Model):
    """A console user's role in one tenant. Platform administrators are staff
    users (``is_staff``) and need no membership (``core.roles``).

    The table keeps the name it was born with in the ``console`` app."""

    class Role(models.TextChoices):
        ADMIN = "admin", "tenant administrator"
        VIEWER = "viewer", "tenant viewer"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=8, choices=Role.choices, default=Role.VIEWER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "console_membership"
        ordering = ["tenant_id", "user_id"]
        constraints = [models.UniqueConstraint(fields=["user", "tenant"], name="console_membership_unique")]

    def __str__(self):
        return f"{self.user} is {self.get_role_display()} of {self.tenant}"


class Device(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="devices")
    name = models.CharField(max_length=DEVICE_NAME_MAX, validators=[validate_device_name])
    description = models.TextField(blank=True)
    enabled = models.BooleanField(default=True)
    # SHA-256 of the DER client certificate, lowercase hex; unique when set.
    cert_fingerprint = models.CharField(
        max_length=64, unique=True, null=True, blank=True, validators=[validate_fingerprint]
    )
    cert_cn = models.CharField(max_length=255, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant_id", "name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="tenants_device_unique_name")]

    def __str__(self):
        return f"{self.tenant.slug}/{self.name}"


class Credential(models.Model):
    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="credentials")
    label = models.CharField(max_length=100, blank=True)
    secret_hash = models.CharField(max_length=80)  # "sha256$" + 64 hex; never the secret
    enabled = models.BooleanField(default=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # When the current secret was issued: at creation, then at each rotation.
    last_rotated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["device_id", "id"]

    def __str__(self):
        return f"credential {self.pk} of {self.device}"

    def usable(self, now) -> bool:
        return self.enabled and (self.expires_at is None or self.expires_at > now)


class AclRule(models.Model):
    class Who(models.TextChoices):
        ALL = "all"
        DEVICE = "device"
        PATTERN = "pattern"

    class Action(models.TextChoices):
        PUBLISH = "publish"
        SUBSCRIBE = "subscribe"
        BOTH = "both"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="acl_rules")
    # 1..N within the tenant, kept contiguous by the services; first match wins.
    position = models.PositiveIntegerField()
    who = models.CharField(max_length=8, choices=Who.choices, default=Who.ALL)
    # Deleting a device deletes the rules written for it alone.
    device = models.ForeignKey(
        Device, on_delete=models.CASCADE, null=True, blank=True, related_name="acl_rules"
    )
    device_pattern = models.CharField(
        max_length=DEVICE_NAME_MAX, blank=True, validators=[validate_device_pattern]
    )
    action = models.CharField(max_length=10, choices=Action.choices)
    topic = models.CharField(max_length=1024, validators=[validate_rule_topic])
    allow = models.BooleanField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant_id", "position", "id"]
        indexes = [models.Index(fields=["tenant", "position"], name="tenants_acl_tenant_pos")]

    def __str__(self):
        verb = "allow" if self.allow else "deny"
        return f"{self.name} (position {self.position}): {verb} {self.action} {self.topic}"

    @property
    def name(self) -> str:
        """What the console, the audit log and ``manage.py acl`` call the rule: its
        id, which stays when rules move (its position says when it is evaluated)."""
        return f"ACL rule {self.pk}"

    def clean(self):
        """``who`` decides which of ``device`` and ``device_pattern`` is set."""
        errors = {}
        if self.who == self.Who.DEVICE:
            if self.device_id is None:
                errors["device"] = "a rule for one device needs that device"
            elif self.device.tenant_id != self.tenant_id:
                errors["device"] = "the device belongs to another tenant"
        elif self.device_id is not None:
            errors["device"] = f"a rule for {self.who!r} takes no device"
        if self.who == self.Who.PATTERN:
            if not self.device_pattern:
                errors["device_pattern"] = "a pattern rule needs a device pattern"
        elif self.device_pattern:
            errors["device_pattern"] = f"a rule for {self.who!r} takes no device pattern"
        if errors:
            raise ValidationError(errors)


def _limit_field(help_text):
    return models.PositiveBigIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)], help_text=help_text
    )


class Quota(models.Model):
    """A tenant's limits; None means unlimited. Field names: ``limits.QUOTA_FIELDS``."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="quota")
    max_connections = _limit_field("concurrent connections of the tenant")
    connect_rate = _limit_field("connects per second, whole tenant")
    client_msgs_in = _limit_field("messages per second from one client")
    client_bytes_in = _limit_field("bytes per second from one client")
    client_msgs_out = _limit_field("messages per second to one client")
    client_bytes_out = _limit_field("bytes per second to one client")
    tenant_msgs_in = _limit_field("messages per second from the tenant's clients")
    tenant_bytes_in = _limit_field("bytes per second from the tenant's clients")
    tenant_msgs_out = _limit_field("messages per second to the tenant's clients")
    tenant_bytes_out = _limit_field("bytes per second to the tenant's clients")
    max_subscriptions = _limit_field("subscriptions per client")
    max_queued = _limit_field("queued messages per session")
    max_retained = _limit_field("retained messages of the tenant")
    max_payload = _limit_field("payload bytes")
    max_session_expiry = _limit_field("session expiry seconds")
    max_delayed = _limit_field("delayed messages ($delayed/...) of the tenant waiting to be published")
    max_devices = _limit_field("devices of the tenant")

    def __str__(self):
        return f"quota of {self.tenant}"

    def as_dict(self) -> dict:
        return {f: getattr(self, f) for f in limits.QUOTA_FIELDS}

    def effective(self, field: str, node_limit: int | None) -> int | None:
        """The limit that applies: this quota's and the node's, whichever is smaller."""
        if field not in limits.QUOTA_FIELDS:
            raise ValueError(f"unknown quota field {field!r}")
        return limits.effective_limit(node_limit, getattr(self, field))


class OwnQuota(models.Model):
    """The limits a tenant chose for itself, within its ``Quota`` (the
    ceilings the administrators set): a tenant may lower a limit, never raise
    it. What brokerd enforces is the smaller of the two, field by field
    (``effective``), so lowering a ceiling below a tenant's own value takes
    effect at once. Made on first use; None means "the ceiling"."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="own_quota")
    max_connections = _limit_field(Quota.max_connections.field.help_text)
    connect_rate = _limit_field(Quota.connect_rate.field.help_text)
    client_msgs_in = _limit_field(Quota.client_msgs_in.field.help_text)
    client_bytes_in = _limit_field(Quota.client_bytes_in.field.help_text)
    client_msgs_out = _limit_field(Quota.client_msgs_out.field.help_text)
    client_bytes_out = _limit_field(Quota.client_bytes_out.field.help_text)
    tenant_msgs_in = _limit_field(Quota.tenant_msgs_in.field.help_text)
    tenant_bytes_in = _limit_field(Quota.tenant_bytes_in.field.help_text)
    tenant_msgs_out = _limit_field(Quota.tenant_msgs_out.field.help_text)
    tenant_bytes_out = _limit_field(Quota.tenant_bytes_out.field.help_text)
    max_subscriptions = _limit_field(Quota.max_subscriptions.field.help_text)
    max_queued = _limit_field(Quota.max_queued.field.help_text)
    max_retained = _limit_field(Quota.max_retained.field.help_text)
    max_payload = _limit_field(Quota.max_payload.field.help_text)
    max_session_expiry = _limit_field(Quota.max_session_expiry.field.help_text)
    max_delayed = _limit_field(Quota.max_delayed.field.help_text)
    max_devices = _limit_field(Quota.max_devices.field.help_text)

    def __str__(self):
        return f"own limits of {self.tenant}"

    def as_dict(self) -> dict:
        return {f: getattr(self, f) for f in limits.QUOTA_FIELDS}


def _all_sys_parts():
    return list(SYS_PARTS)


class SystemTopicSetting(models.Model):
    """The tenant's ``$SYS`` topics: whether, how often and which parts."""

    MAX_INTERVAL = 86400

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="system_topics")
    enabled = models.BooleanField(default=True)
    interval = models.PositiveIntegerField(
        default=10, validators=[MinValueValidator(1), MaxValueValidator(MAX_INTERVAL)]
    )
    parts = LineListField(default=_all_sys_parts, validators=[validate_sys_parts])

    def __str__(self):
        return f"$SYS settings of {self.tenant}"


class PolicyCounter(models.Model):
    """One row (id 1): the last policy version handed out. Bumped with
    ``UPDATE ... SET value = value + 1 WHERE id = 1`` inside each publishing
    transaction, whose row lock orders versions by commit on PostgreSQL."""

    value = models.BigIntegerField(default=0)


class DevicePolicy(models.Model):
    """The contract with brokerd, device by device: one row per device name a tenant has had.

    brokerd polls ``SELECT tenant_slug, incarnation, name, version, data FROM tenants_devicepolicy
    WHERE version > ? ORDER BY version`` beside the tenants' snapshots (one counter numbers both);
    ``data`` is the device's entry (``tenants.policy_snapshot``), NULL once the device
    is deleted. ``incarnation``: the tenant's id (a slug deleted and made again is another tenant;
    a deleted tenant's rows are deleted with it). A change of one device writes its row alone: the
    tenant's snapshot, whole, was written and read again by every node at each device change."""

    tenant_slug = models.CharField(max_length=63)
    incarnation = models.BigIntegerField()
    name = models.CharField(max_length=DEVICE_NAME_MAX)
    version = models.BigIntegerField(db_index=True)
    data = models.TextField(null=True)

    class Meta:
        db_table = "tenants_devicepolicy"
        constraints = [models.UniqueConstraint(fields=["tenant_slug", "name"], name="devicepolicy_one_per_name")]


class PolicySnapshot(models.Model):
    """The contract with brokerd: one row per tenant slug ever seen.

    brokerd polls ``SELECT tenant_slug, version, data FROM
    tenants_policysnapshot WHERE version > ? ORDER BY version``; ``data`` is
    the JSON document built by ``tenants.policy_snapshot``. Not a foreign key: the row
    outlives its tenant (status "deleted").
    """

    tenant_slug = models.CharField(max_length=63, unique=True)
    version = models.BigIntegerField(db_index=True)
    data = models.TextField()

    class Meta:
        db_table = "tenants_policysnapshot"

    def __str__(self):
        return f"policy of {self.tenant_slug} v{self.version}"


class Rule(models.Model):
    """A tenant's rule: an SQL-like statement over its messages and client
    events, and what to do with each output row (``brokerd/rules/``)."""

    class Action(models.TextChoices):
        REPUBLISH = "republish"
        WEBHOOK = "webhook"
        STORE = "store"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="rules")
    sql = models.TextField()
    action = models.CharField(max_length=16, choices=Action.choices)
    config = models.JSONField(default=dict)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tenant_id", "id"]

    def __str__(self):
        return f"rule {self.pk} ({self.action}{'' if self.enabled else ', disabled'})"


class AutoSubscription(models.Model):
    """A tenant's auto-subscribe rule: on every CONNECT of a device matching
    ``device_pattern`` (a device-name glob; empty: every client) brokerd
    subscribes the client to ``filter`` (``{device}``/``{client_id}``
    placeholders as in the ACL) as if it had sent the SUBSCRIBE itself."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="auto_subscriptions")
    device_pattern = models.CharField(max_length=128, blank=True, default="")
    filter = models.CharField(max_length=1024)
    qos = models.PositiveSmallIntegerField(default=0)
    no_local = models.BooleanField(default=False)
    retain_as_published = models.BooleanField(default=False)
    retain_handling = models.PositiveSmallIntegerField(default=0)
    position = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant_id", "position", "id"]

    def __str__(self):
        return f"auto-subscription {self.pk} ({self.filter} qos {self.qos})"
