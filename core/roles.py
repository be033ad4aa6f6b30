"""The role that needs no tenant, and the scope a page is shown in.

A platform administrator is a staff user and may do everything; tenant
users' roles come from their memberships (``tenants.models.Membership``,
looked up by ``tenants.access``, which builds on this module). Every view
asks first (after healthchecks' ``_get_check_for_user``): pages of the
platform with ``@platform_admin_required``, pages of a tenant through
``tenants.access``.
"""

from functools import wraps

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied

PLATFORM_ADMIN = "platform administrator"


def is_platform_admin(user) -> bool:
    return bool(user.is_authenticated and user.is_active and user.is_staff)


def platform_admin_required(view):
    """Anonymous users go to the login page; signed-in users who are not
    platform administrators get 403."""

    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        if not is_platform_admin(request.user):
            raise PermissionDenied("Only platform administrators may open this page")
        return view(request, *args, **kwargs)

    return wrapper


def remember_scope(request, tenant, slug: str, role: str, rw: bool) -> None:
    """The tenant the page is about, the user's role in it and whether they
    may change it: read by ``console.context_processors`` for the top bar and
    the sidebar."""
    request.current_tenant = tenant
    request.current_slug = slug
    request.current_role = role
    request.current_rw = rw
