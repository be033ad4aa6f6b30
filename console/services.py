"""Writes to the console's own table of API tokens; like ``tenants.services``
they raise ``ServiceError`` with a message for users."""

from django.db import IntegrityError, transaction
from django.utils import timezone

from tenants.errors import Conflict, ServiceError

from .models import ApiToken


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
