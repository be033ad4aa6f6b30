"""Writes of the tenants' members: who may use the console for a tenant,
and with which role. Like ``tenants.services`` they raise ``ServiceError``
with a message for users."""

from django.contrib.auth import get_user_model, password_validation
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from .errors import Conflict, ServiceError
from .models import Membership


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


def set_member_role(membership: Membership, role: str) -> Membership:
    if role not in Membership.Role.values:
        raise ServiceError(f"role must be one of {', '.join(Membership.Role.values)}")
    membership.role = role
    membership.save(update_fields=["role"])
    return membership


def remove_member(membership: Membership) -> None:
    """End the membership (the user account stays)."""
    membership.delete()
