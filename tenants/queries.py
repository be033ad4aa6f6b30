"""Reads of the tenants app, for views, commands and services.

``get_*`` raise ``NotFound`` (a ``ServiceError``) with a user-facing message.
"""

from django.conf import settings
from django.db import connection
from django.db.models import Count, Q

from . import limits, policy_snapshot
from .errors import NotFound
from .models import AclRule, Credential, Device, Membership, OwnQuota, Quota, SystemTopicSetting, Tenant


def tenants():
    """All tenants by slug, each with ``device_count``."""
    return Tenant.objects.annotate(device_count=Count("devices")).order_by("slug")


def search_tenants(qs, q: str = "", status: str = ""):
    """``qs`` (tenants) narrowed to those whose slug, name or contact emails
    contain ``q`` and whose status is ``status`` (either may be empty)."""
    if q:
        qs = qs.filter(Q(slug__icontains=q) | Q(name__icontains=q) | Q(contact_emails__icontains=q))
    if status:
        qs = qs.filter(status=status)
    return qs


def platform_numbers() -> dict:
    """What the console's database holds, for the platform overview."""
    return {
        "tenants": Tenant.objects.count(),
        "tenants_active": Tenant.objects.filter(status=Tenant.Status.ACTIVE).count(),
        "tenants_suspended": Tenant.objects.filter(status=Tenant.Status.SUSPENDED).count(),
        "devices": Device.objects.count(),
        "devices_enabled": Device.objects.filter(enabled=True).count(),
        "credentials": Credential.objects.count(),
        "acl_rules": AclRule.objects.count(),
        "users": Membership.objects.values("user").distinct().count(),
        # counted among the tenants above, and named: the tenant of anonymous clients
        "anonymous_tenant": Tenant.objects.filter(slug=settings.ANONYMOUS_TENANT).values_list("slug", flat=True)
        .first() if settings.ANONYMOUS_TENANT else None,
    }


def tenant_numbers(tenant: Tenant) -> dict:
    """What the tenant holds, for its overview."""
    return {
        "devices": tenant.devices.count(),
        "devices_enabled": tenant.devices.filter(enabled=True).count(),
        "credentials": Credential.objects.filter(device__tenant=tenant).count(),
        "acl_rules": tenant.acl_rules.count(),
        "members": tenant.memberships.count(),
    }


def tenant_contents(tenant: Tenant) -> dict:
    """What deleting the tenant deletes with it."""
    return {
        "devices": tenant.devices.count(),
        "credentials": Credential.objects.filter(device__tenant=tenant).count(),
        "acl_rules": tenant.acl_rules.count(),
        "members": tenant.memberships.count(),
    }


def device_contents(device: Device) -> dict:
    """What deleting the device deletes with it."""
    return {"credentials": device.credentials.count(), "acl_rules": device.acl_rules.count()}


def get_tenant(slug: str) -> Tenant:
    tenant = Tenant.objects.filter(slug=slug).first()
    if tenant is None:
        raise NotFound(f"unknown tenant {slug!r}")
    return tenant


def devices(tenant: Tenant):
    """The tenant's devices by name, each with ``credential_count`` and
    ``enabled_credential_count``."""
    return tenant.devices.annotate(
        credential_count=Count("credentials"),
        enabled_credential_count=Count("credentials", filter=Q(credentials__enabled=True)),
    ).order_by("name")


def search_devices(qs, q: str = ""):
    """``qs`` (devices) narrowed to those whose name or description contain ``q``."""
    if q:
        qs = qs.filter(Q(name__icontains=q) | Q(description__icontains=q))
    return qs


def get_device(tenant: Tenant, name: str) -> Device:
    device = tenant.devices.filter(name=name).first()
    if device is None:
        raise NotFound(f"unknown device {tenant.slug}/{name}")
    return device


def credentials(device: Device):
    return device.credentials.order_by("id")


def get_credential(device: Device, credential_id: int) -> Credential:
    credential = device.credentials.filter(pk=credential_id).first()
    if credential is None:
        raise NotFound(f"device {device} has no credential {credential_id}")
    return credential


def acl_rules(tenant: Tenant):
    """The tenant's rules in evaluation order (position, then id)."""
    return AclRule.objects.filter(tenant=tenant).select_related("device").order_by("position", "id")


def allows_nothing(tenant: Tenant) -> bool:
    """No device of the tenant may publish or subscribe anything: the default
    is deny and no rule allows (a new tenant's state)."""
    return tenant.default_acl == Tenant.DefaultAcl.DENY and not tenant.acl_rules.filter(allow=True).exists()


def get_acl_rule(tenant: Tenant, rule_id: int) -> AclRule:
    rule = acl_rules(tenant).filter(pk=rule_id).first()
    if rule is None:
        raise NotFound(f"tenant {tenant.slug!r} has no ACL rule {rule_id}")
    return rule


def quota(tenant: Tenant) -> Quota:
    return Quota.objects.get(tenant=tenant)


def own_quota(tenant: Tenant) -> OwnQuota:
    """The tenant's own limits; all unset, and not saved, until the tenant
    first sets one (``services.update_own_quota``): reading them -- a page a
    viewer opens, a request refused -- writes nothing."""
    return OwnQuota.objects.filter(tenant=tenant).first() or OwnQuota(tenant=tenant)


def effective_quota(tenant: Tenant) -> dict:
    """What brokerd enforces: the ceiling and the tenant's own limit, whichever is smaller."""
    ceiling = Quota.objects.get(tenant=tenant).as_dict()
    own = OwnQuota.objects.filter(tenant=tenant).first()
    own = own.as_dict() if own is not None else {}
    return {f: limits.effective_limit(ceiling[f], own.get(f)) for f in limits.QUOTA_FIELDS}


def system_topics(tenant: Tenant) -> SystemTopicSetting:
    return SystemTopicSetting.objects.get(tenant=tenant)


def policy(slug: str) -> dict | None:
    """The tenant's published policy snapshot document (None if never published)."""
    return policy_snapshot.load(slug)


def policy_changes(since: int) -> list[tuple[str, int, str]]:
    """``(tenant_slug, version, data)`` rows newer than ``since``: brokerd's
    query, word for word."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT tenant_slug, version, data FROM tenants_policysnapshot "
            "WHERE version > %s ORDER BY version",
            [since],
        )
        return list(cur.fetchall())
