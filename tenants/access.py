"""Who may see and change what in a tenant: every tenant page asks here
first (after healthchecks' ``_get_check_for_user``), built on ``core.roles``.

Roles: a platform administrator is a staff user and may do everything; a
tenant administrator (``Membership`` role "admin") reads and changes one
tenant; a tenant viewer reads it. A tenant the user has no membership of does
not exist for them: 404, never 403, so guessing slugs tells nothing. A viewer
trying to change something, or a tenant user on a platform-only page, gets
403. Objects inside a tenant are looked up through it, so another tenant's id
is a 404 too.
"""

from django.core.exceptions import PermissionDenied
from django.http import Http404

from core.roles import PLATFORM_ADMIN, is_platform_admin, remember_scope

from .models import AclRule, Credential, Device, Membership, Rule, Tenant


def user_tenants(user):
    """The tenants ``user`` may open, by slug."""
    if is_platform_admin(user):
        return Tenant.objects.order_by("slug")
    if not user.is_authenticated:
        return Tenant.objects.none()
    return Tenant.objects.filter(memberships__user=user).order_by("slug")


def membership_of(user, tenant) -> Membership | None:
    if not user.is_authenticated:
        return None
    return Membership.objects.filter(user=user, tenant=tenant).first()


def get_tenant_for_user(request, slug: str, write: bool = False) -> tuple[Tenant, bool]:
    """``(tenant, rw)``: Http404 when the user may not see the tenant,
    PermissionDenied when ``write`` and the user may only read it."""
    user = request.user
    tenant = Tenant.objects.filter(slug=slug).first()
    if tenant is None:
        raise Http404("No such tenant")
    if is_platform_admin(user):
        role, rw = PLATFORM_ADMIN, True
    else:
        membership = membership_of(user, tenant)
        if membership is None:
            raise Http404("No such tenant")
        role, rw = membership.get_role_display(), membership.role == Membership.Role.ADMIN
    remember_scope(request, tenant, tenant.slug, role, rw)
    if write and not rw:
        raise PermissionDenied("Viewers cannot change this tenant")
    return tenant, rw


def get_live_scope_for_user(request, slug: str, write: bool = False) -> tuple[Tenant | None, bool]:
    """The tenant of the live pages (clients, retained messages, publish):
    platform administrators may open any tenant brokerd knows, also one
    without a console row (the anonymous tenant "default"), so the tenant
    returned may be None for them; everyone else as ``get_tenant_for_user``."""
    if is_platform_admin(request.user):
        tenant = Tenant.objects.filter(slug=slug).first()
        remember_scope(request, tenant, slug, PLATFORM_ADMIN, True)
        return tenant, True
    return get_tenant_for_user(request, slug, write)


def get_device_for_user(request, slug: str, name: str, write: bool = False) -> tuple[Device, bool]:
    tenant, rw = get_tenant_for_user(request, slug, write)
    device = tenant.devices.filter(name=name).first()
    if device is None:
        raise Http404("No such device")
    device.tenant = tenant
    return device, rw


def get_credential_for_user(request, slug: str, name: str, credential_id: int,
                            write: bool = False) -> tuple[Credential, bool]:
    device, rw = get_device_for_user(request, slug, name, write)
    credential = device.credentials.filter(pk=credential_id).first()
    if credential is None:
        raise Http404("No such credential")
    credential.device = device
    return credential, rw


def get_rule_for_user(request, slug: str, rule_id: int, write: bool = False) -> tuple[AclRule, bool]:
    tenant, rw = get_tenant_for_user(request, slug, write)
    rule = AclRule.objects.filter(tenant=tenant, pk=rule_id).select_related("device").first()
    if rule is None:
        raise Http404("No such ACL rule")
    rule.tenant = tenant
    return rule, rw


def get_processing_rule_for_user(request, slug: str, rule_id: int, write: bool = False) -> tuple[Rule, bool]:
    """One of the tenant's rules of the rule engine (not an ACL rule)."""
    tenant, rw = get_tenant_for_user(request, slug, write)
    rule = Rule.objects.filter(tenant=tenant, pk=rule_id).first()
    if rule is None:
        raise Http404("No such rule")
    rule.tenant = tenant
    return rule, rw


def get_membership_for_user(request, slug: str, membership_id: int, write: bool = False):
    tenant, rw = get_tenant_for_user(request, slug, write)
    membership = Membership.objects.filter(tenant=tenant, pk=membership_id).select_related("user").first()
    if membership is None:
        raise Http404("No such member")
    return membership, rw


def tenant_admin_or_platform(request, tenant) -> None:
    """PermissionDenied unless a platform administrator or an admin of ``tenant``
    (for the pages viewers may not even read, such as the tenant's audit log)."""
    if is_platform_admin(request.user):
        return
    membership = membership_of(request.user, tenant)
    if membership is None or membership.role != Membership.Role.ADMIN:
        raise PermissionDenied("Only the tenant's administrators may open this page")
