"""Writes to the console's own tables (members and API tokens); like
``tenants.services`` they raise ``ServiceError`` with a message for users."""

from django.contrib.auth import get_user_model, password_validation
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from tenants.errors import Conflict, ServiceError

from .models import ApiToken, Membership


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


def issue_token(name: str, scope: str, created_by=None) -> tuple[ApiToken, str]:
    name = name.strip()
    if not name:
        raise ServiceError("name: a token needs a name")
    if scope not in ApiToken.Scope.values:
        raise ServiceError("scope must be read or write")
    if ApiToken.objects.filter(name=name).exists():
        raise Conflict(f"name: a token named {name!r} already exists")
    try:
        with transaction.atomic():
            return ApiToken.issue(name, scope, created_by=created_by)
    except IntegrityError:
        raise Conflict(f"name: a token named {name!r} already exists")


def revoke_token(token: ApiToken) -> ApiToken:
    """brokerd re-reads the table every few seconds and then refuses the token."""
    if token.revoked:
        raise ServiceError(f"token {token.name!r} is already revoked")
    token.revoked = True
    token.revoked_at = timezone.now()
    token.save(update_fields=["revoked", "revoked_at"])
    return token
