"""What the layout needs on every page: the user's role, their tenants and
the tenant of the current page (set by ``core.roles.remember_scope``)."""

from django.utils.functional import SimpleLazyObject

from core.roles import PLATFORM_ADMIN, is_platform_admin
from metrics.models import Alarm
from tenants.access import user_tenants
from tenants.models import Tenant

NAV_TENANTS = 50


def console(request):
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    admin = is_platform_admin(user)
    tenant = getattr(request, "current_tenant", None)
    slug = getattr(request, "current_slug", None)
    role = getattr(request, "current_role", None)
    if role is None:
        role = PLATFORM_ADMIN if admin else "tenant user"
    return {
        "is_platform_admin": admin,
        "nav_tenant": tenant,
        "nav_slug": slug,
        "nav_role": role,
        "nav_rw": getattr(request, "current_rw", admin),
        # the top bar's tenant switch: a platform administrator's first 50 tenants (then a link to the list)
        "nav_tenants": SimpleLazyObject(lambda: list(Tenant.objects.only("slug", "name")[:NAV_TENANTS]) if admin
                                        else list(user_tenants(user)[:NAV_TENANTS])),
        "nav_more_tenants": NAV_TENANTS,
        # open alarms: the sidebar's badges (callables: counted only when a template shows them)
        "nav_alarms": (lambda: Alarm.objects.filter(cleared_at__isnull=True).count()) if admin else 0,
        "nav_tenant_alarms": (lambda: Alarm.objects.filter(cleared_at__isnull=True, tenant_slug=slug).count())
        if slug else 0,
    }
