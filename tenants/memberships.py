"""Writes of the tenants' members: who may use the console for a tenant,
and with which role. Like ``tenants.services`` they raise ``ServiceError``
with a message for users.

The rule: a tenant that has an administrator keeps one. The last one can be
neither demoted nor removed (``LastAdministrator``); platform administrators
are no exception. Each change of a tenant's members takes the tenant's row
lock first and reads the member's role again under it, so two
administrators demoting each other at the same moment cannot both pass the
check (on PostgreSQL; SQLite serialises writers anyway).
"""

from django.contrib.auth import get_user_model, password_validation
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from .errors import Conflict, LastAdministrator, NotFound, ServiceError
from .models import Membership, Tenant

LAST_ADMIN = ("{user} is the last administrator of {tenant}: make another member an administrator "
              "first. A tenant always keeps at least one.")


@transaction.atomic
def add_member(tenant, *, username: str, email: str = "", password: str = "", role: str,
               allow_existing: bool = False) -> Membership:
    """Make ``username`` a member of ``tenant`` with ``role``: a new console user
    with ``password``, or (``allow_existing``, for platform administrators) an
    existing user, whose password stays as it is."""
    User = get_user_model()
    if role not in Membership.Role.values:
        raise ServiceError(f"role must be one of {', '.join(Membership.Role.values)}")
    username = username.strip()
    if not username:
        raise ServiceError("username: a username is required")
    user = User.objects.filter(username=username).first()
    if user is not None:
        if not allow_existing:
            raise Conflict(f"username: the username {username!r} is taken")
        if password:
            raise ServiceError("password: that user already exists: leave the password blank to add them")
        if Membership.objects.filter(user=user, tenant=tenant).exists():
            raise Conflict(f"{username} is already a member of {tenant.slug}")
    else:
        if not password:
            raise ServiceError("password: a new user needs an initial password")
        user = User(username=username, email=email.strip())
        try:
            password_validation.validate_password(password, user)
        except ValidationError as e:
            raise ServiceError("password: " + " ".join(e.messages))
        user.set_password(password)
        user.save()
    try:
        with transaction.atomic():
            return Membership.objects.create(user=user, tenant=tenant, role=role)
    except IntegrityError:
        raise Conflict(f"{username} is already a member of {tenant.slug}")


def is_last_admin(membership: Membership) -> bool:
    """Is ``membership`` the tenant's only administrator?"""
    return membership.role == Membership.Role.ADMIN and not Membership.objects.filter(
        tenant_id=membership.tenant_id, role=Membership.Role.ADMIN).exclude(pk=membership.pk).exists()


def _lock_members(membership: Membership) -> None:
    """Serialise membership changes of one tenant (its row lock), then re-read
    ``membership``'s role (NotFound if it went meanwhile). Inside a transaction."""
    Tenant.objects.select_for_update().filter(pk=membership.tenant_id).first()
    try:
        membership.refresh_from_db(fields=["role"])
    except Membership.DoesNotExist:
        raise NotFound("No such member")


def _refuse_last_admin(membership: Membership) -> None:
    if is_last_admin(membership):
        raise LastAdministrator(LAST_ADMIN.format(user=membership.user.get_username(),
                                                  tenant=membership.tenant.slug))


@transaction.atomic
def change_role(membership: Membership, role: str) -> str:
    """Give ``membership`` ``role``; -> the role it had (as read under the
    lock). LastAdministrator when that would demote the tenant's last
    administrator."""
    if role not in Membership.Role.values:
        raise ServiceError(f"role must be one of {', '.join(Membership.Role.values)}")
    _lock_members(membership)
    if role != Membership.Role.ADMIN:
        _refuse_last_admin(membership)
    previous = membership.role
    membership.role = role
    membership.save(update_fields=["role"])
    return previous


@transaction.atomic
def remove_member(membership: Membership) -> None:
    """End the membership (the user account stays); LastAdministrator when it
    is the tenant's last administrator. ``membership`` keeps the role it was
    removed with (read under the lock)."""
    _lock_members(membership)
    _refuse_last_admin(membership)
    membership.delete()
