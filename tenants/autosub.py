"""A tenant's auto-subscribe rules: on every CONNECT of a matching device,
brokerd subscribes the client to the rule's filter as if it had subscribed.

The filter is validated like an ACL rule's (``tenants.acl.topic_error``:
brokerd's own topic validation, ``{device}``/``{client_id}`` placeholders
filling whole levels, no ``$share/``); the device pattern is a device-name
glob like the ACL's (empty: every client of the tenant, anonymous ones
included). Every change writes the policy snapshot and one audit row in one
transaction; the nodes apply it to the next CONNECT (poll ~0.5 s).
"""

from django.db import transaction
from django.db.models import Max

from core import audit

from . import policy_snapshot
from .acl import topic_error
from .errors import NotFound, ServiceError
from .models import AutoSubscription, Tenant

MAX_PER_TENANT = 100


def doc(a: AutoSubscription) -> dict:
    return policy_snapshot.autosub_json(a)


def _audit(action: str, pk, tenant: Tenant, before, after, request=None, actor=None) -> None:
    audit.record(request, action, "autosub", pk, tenant=tenant, before=before, after=after,
                 actor=actor if actor is not None or request is not None else "manage.py")


def auto_subscriptions(tenant: Tenant):
    return tenant.auto_subscriptions.order_by("position", "id")


def get(tenant: Tenant, pk: int) -> AutoSubscription:
    a = tenant.auto_subscriptions.filter(pk=pk).first()
    if a is None:
        raise NotFound(f"tenant {tenant.slug!r} has no auto-subscription {pk}")
    return a


def check(filt, qos, device_pattern, retain_handling) -> None:
    if not isinstance(filt, str):
        raise ServiceError("the topic filter must be text")
    if len(filt) > 1024:
        raise ServiceError("the topic filter is longer than 1024 characters")
    error = topic_error(filt)
    if error is not None:
        raise ServiceError(error)
    if filt.startswith("$"):
        raise ServiceError(f"invalid topic filter {filt!r}: auto-subscriptions cannot reach $ topics")
    if qos not in (0, 1, 2) or isinstance(qos, bool):
        raise ServiceError(f"QoS is 0, 1 or 2, not {qos!r}")
    if retain_handling not in (0, 1, 2) or isinstance(retain_handling, bool):
        raise ServiceError(f"retain handling is 0, 1 or 2, not {retain_handling!r}")
    if not isinstance(device_pattern, str) or len(device_pattern) > 128:
        raise ServiceError("the device pattern is text of at most 128 characters")


@transaction.atomic
def add(tenant: Tenant, *, filter: str, qos: int = 0, device_pattern: str = "", no_local: bool = False,
        retain_as_published: bool = False, retain_handling: int = 0, request=None,
        actor=None) -> AutoSubscription:
    device_pattern = device_pattern or ""
    check(filter, qos, device_pattern, retain_handling)
    if tenant.auto_subscriptions.count() >= MAX_PER_TENANT:
        raise ServiceError(f"a tenant has at most {MAX_PER_TENANT} auto-subscriptions")
    top = tenant.auto_subscriptions.aggregate(m=Max("position"))["m"]
    a = AutoSubscription.objects.create(
        tenant=tenant, filter=filter, qos=qos, device_pattern=device_pattern, no_local=bool(no_local),
        retain_as_published=bool(retain_as_published), retain_handling=retain_handling,
        position=0 if top is None else top + 1)
    policy_snapshot.publish(tenant)
    _audit("autosub.create", a.pk, tenant, None, doc(a), request, actor)
    return a


@transaction.atomic
def delete(a: AutoSubscription, request=None, actor=None) -> None:
    before, tenant, pk = doc(a), a.tenant, a.pk
    a.delete()
    policy_snapshot.publish(tenant)
    _audit("autosub.delete", pk, tenant, before, None, request, actor)
