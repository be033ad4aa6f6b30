"""Transactional writes of the tenants app, and the decisions brokerd makes.

Every function that changes something a broker enforces runs in one
transaction that ends by rebuilding the tenant's policy snapshot
(``tenants.policy_snapshot.publish``) -- or, for a change of devices only, those
devices' rows (``publish_devices``) -- so brokerd sees the change, and only the
committed change, under a new version. Invalid input raises ``ServiceError``
(``NotFound``, ``Conflict``) with a one-line message meant for users; nothing
is written then.

Secrets: ``create_credential``, ``rotate_credential`` and
``provision_device`` return the new secret; it is shown once and only its
hash is stored (see ``tenants.hashing`` for why a fast hash is right here).
"""

import datetime as dt
from typing import NamedTuple

from django.conf import settings
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from . import acl, hashing, limits, policy_snapshot, queries
from .errors import Conflict, NotFound, ServiceError
from .models import AclRule, Credential, Device, OwnQuota, Quota, SystemTopicSetting, Tenant
from .validators import SYS_PARTS, normalize_fingerprint


class _Unset:
    def __repr__(self):
        return "UNSET"


UNSET = _Unset()  # "leave as it is" for optional keyword arguments


def _message(error: ValidationError) -> str:
    if not hasattr(error, "error_dict"):
        return "; ".join(error.messages)
    parts = []
    for field, messages in error.message_dict.items():
        for m in messages:
            parts.append(m if field == NON_FIELD_ERRORS else f"{field}: {m}")
    return "; ".join(parts)


def _clean(obj, **kwargs):
    """``full_clean`` with its errors as one ServiceError."""
    try:
        obj.full_clean(**kwargs)
    except ValidationError as e:
        raise ServiceError(_message(e))


def _save(obj, conflict: str, **kwargs):
    """``save``, turning a unique-constraint race into Conflict."""
    try:
        with transaction.atomic():
            obj.save(**kwargs)
    except IntegrityError:
        raise Conflict(conflict)


def _check_bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise ServiceError(f"{name} must be true or false")
    return value


def _check_datetime(name: str, value: dt.datetime | None) -> dt.datetime | None:
    if value is not None and (not isinstance(value, dt.datetime) or timezone.is_naive(value)):
        raise ServiceError(f"{name} must be a timezone-aware datetime")
    return value


# ---------------------------------------------------------------- tenants


def _emails(value) -> list[str]:
    if isinstance(value, str):
        value = [value]
    out = []
    for email in value:
        if not isinstance(email, str):
            raise ServiceError(f"contact email {email!r} is not a string")
        email = email.strip()
        if email and email not in out:
            out.append(email)
    return out


def _clean_tenant(tenant: Tenant):
    _clean(tenant, validate_unique=False)


@transaction.atomic
def create_tenant(slug: str, *, name: str = "", contact_emails=(), default_acl: str = "deny") -> Tenant:
    """A new active tenant with an unlimited quota and default $SYS settings."""
    tenant = Tenant(
        slug=slug, name=name or slug, contact_emails=_emails(contact_emails), default_acl=default_acl
    )
    _clean_tenant(tenant)
    if Tenant.objects.filter(slug=slug).exists():
        raise Conflict(f"tenant {slug!r} already exists")
    if (policy_snapshot.load(slug) or {}).get("status") == "deleted":
        tenant.usage_since = timezone.now()     # the usage rows of the slug until now are the deleted tenant's
    _save(tenant, f"tenant {slug!r} already exists")
    Quota.objects.create(tenant=tenant)
    SystemTopicSetting.objects.create(tenant=tenant)
    policy_snapshot.publish(tenant)
    return tenant


ANONYMOUS_NAME = "Anonymous clients"


def ensure_anonymous_tenant(slug: str) -> tuple[Tenant | None, bool]:
    """The tenant of clients without a user name (brokerd ``--allow-anonymous
    --anonymous-tenant SLUG``) as a real tenant: -> (tenant, created); (None,
    False) when ``slug`` is empty. Made with default ACL *allow* and no quota,
    the open policy brokerd applies to that tenant while it has no row, so
    nothing changes for its clients; from then on its ACL rules, quotas and
    $SYS settings are the console's (suspending it refuses anonymous clients).
    A tenant of that slug made by hand is kept as it is."""
    if not slug:
        return None, False
    tenant = Tenant.objects.filter(slug=slug).first()
    if tenant is not None:
        return tenant, False
    try:
        return create_tenant(slug, name=ANONYMOUS_NAME, default_acl=Tenant.DefaultAcl.ALLOW), True
    except Conflict:          # made by another process at the same moment
        return Tenant.objects.get(slug=slug), False


@transaction.atomic
def update_tenant(tenant: Tenant, *, name=UNSET, contact_emails=UNSET, default_acl=UNSET) -> Tenant:
    """Change a tenant's name, contacts or default ACL (the slug never changes)."""
    if name is not UNSET:
        tenant.name = name or tenant.slug
    if contact_emails is not UNSET:
        tenant.contact_emails = _emails(contact_emails)
    if default_acl is not UNSET:
        tenant.default_acl = default_acl
    _clean_tenant(tenant)
    tenant.save()
    policy_snapshot.publish(tenant)
    return tenant


def _set_status(tenant: Tenant, status: str) -> Tenant:
    tenant.status = status
    tenant.save(update_fields=["status", "updated_at"])
    policy_snapshot.publish(tenant)
    return tenant


@transaction.atomic
def suspend_tenant(tenant: Tenant) -> Tenant:
    """Refuse the tenant's devices (brokerd decides what happens to connected ones)."""
    return _set_status(tenant, Tenant.Status.SUSPENDED)


@transaction.atomic
def resume_tenant(tenant: Tenant) -> Tenant:
    return _set_status(tenant, Tenant.Status.ACTIVE)


@transaction.atomic
def delete_tenant(tenant: Tenant) -> None:
    """Delete the tenant and everything it owns; its snapshot row stays, "deleted"."""
    slug = tenant.slug
    _lock_tenant(tenant)             # (its rows go before its own: a rule added meanwhile waits, not deadlocks)
    tenant.delete()
    policy_snapshot.publish_deleted(slug)


# ---------------------------------------------------------------- devices


def _lock_tenant(tenant: Tenant) -> None:
    """The tenant's row lock, taken before a change writes anything: changes that count (the device
    quota) or renumber (the ACL rules) one tenant's rows go one at a time -- two renumberings at once
    each locked some of the rules' rows and waited for the others' (PostgreSQL: deadlock detected)."""
    Tenant.objects.select_for_update().filter(pk=tenant.pk).exists()


def _room_for_devices(tenant: Tenant, adding: int) -> None:
    """The tenant's ``max_devices`` quota (its ceiling, or its own lower limit) leaves room for
    ``adding`` more devices; its row is locked first, so two changes at once cannot both take the last."""
    _lock_tenant(tenant)
    limit = queries.effective_quota(tenant)["max_devices"]
    if limit is None:
        return
    have = tenant.devices.count()
    if have + adding > limit:
        raise ServiceError(f"the tenant's quota allows {limit:,} device{'s' if limit != 1 else ''} and it has {have:,}"
                           + (f": {adding:,} more do not fit" if adding > 1 else ""))


def _new_device(tenant, name, description, enabled, cert_fingerprint, cert_cn) -> Device:
    device = Device(
        tenant=tenant, name=name, description=description, enabled=_check_bool("enabled", enabled)
    )
    _set_cert(device, cert_fingerprint, cert_cn)
    _clean(device, validate_unique=False, validate_constraints=False)
    if tenant.devices.filter(name=name).exists():
        raise Conflict(f"device {tenant.slug}/{name} already exists")
    _check_cert_free(device)
    _save(device, f"device {tenant.slug}/{name} or its certificate fingerprint already exists")
    return device


def _set_cert(device: Device, cert_fingerprint, cert_cn):
    if cert_fingerprint is not UNSET:
        device.cert_fingerprint = normalize_fingerprint(cert_fingerprint)
    if cert_cn is not UNSET:
        device.cert_cn = (cert_cn or "").strip() or None


def _check_cert_free(device: Device):
    """A certificate's fingerprint and its CN each name one device across tenants: the listeners' CA
    is every tenant's, so a CN two devices named would let the holder of either certificate in as the
    other device (brokerd lets a CN named twice identify neither). Another tenant's device is not
    named (its tenant's administrators would learn who holds a certificate)."""
    for field, what in (("cert_fingerprint", "certificate fingerprint"), ("cert_cn", "certificate CN")):
        value = getattr(device, field)
        if not value:
            continue
        other = Device.objects.filter(**{field: value}).exclude(pk=device.pk).first()
        if other is None:
            continue
        if other.tenant_id == device.tenant_id:
            raise Conflict(f"{what} already belongs to device {other}")
        raise Conflict(f"{what} already in use by a device of another tenant")


@transaction.atomic
def create_device(
    tenant: Tenant,
    name: str,
    *,
    description: str = "",
    enabled: bool = True,
    cert_fingerprint: str | None = None,
    cert_cn: str | None = None,
) -> Device:
    """A device without credentials (it may authenticate by certificate)."""
    _room_for_devices(tenant, 1)
    device = _new_device(tenant, name, description, enabled, cert_fingerprint, cert_cn)
    policy_snapshot.publish_devices(tenant, [device.name])
    return device


@transaction.atomic
def provision_device(
    tenant: Tenant,
    name: str,
    *,
    description: str = "",
    enabled: bool = True,
    cert_fingerprint: str | None = None,
    cert_cn: str | None = None,
    label: str = "",
    expires_at=None,
) -> tuple[Device, Credential, str]:
    """A device and its first credential in one change: ``(device, credential,
    secret)``, the secret shown once and never stored."""
    _room_for_devices(tenant, 1)
    device = _new_device(tenant, name, description, enabled, cert_fingerprint, cert_cn)
    credential, secret = _new_credential(device, label, expires_at, True)
    policy_snapshot.publish_devices(tenant, [device.name])
    return device, credential, secret


def provision_devices(tenant: Tenant, rows, *, label: str = "") -> list[tuple[Device, Credential, str]]:
    """Many devices, each with its first credential, in one change (``manage.py devices import``, the
    console's *Import devices*): ``rows`` of ``{"name", "cert_fingerprint", "cert_cn", "description"}``
    (only ``name`` needed); -> ``[(device, credential, secret)]`` in their order. All or none: the first
    row refused (a name taken, in the tenant or twice in ``rows``, a certificate another device names,
    an invalid field) refuses them all, its error saying which row (counted from 1). Checked and
    written in bulk (one by one, 2 ms a device: 100,000 took minutes), and their rows written under
    one version, from what was made (``policy_snapshot.publish_devices``).
    ``check_device_rows`` then ``create_checked_devices``."""
    return create_checked_devices(tenant, check_device_rows(tenant, rows, label=label))


class CheckedDevices(NamedTuple):
    """Rows of devices checked on their own and against each other (``check_device_rows``)."""
    devices: list
    label: str
    rows_of_names: dict     # name -> its row
    cert_rows: dict         # (field, value) -> its row


def check_device_rows(tenant: Tenant, rows, *, label: str = "") -> CheckedDevices:
    """Each row's fields, and the rows against each other, without the database: outside the
    transaction that writes them (SQLite has one writer at a time: the check of 100,000 rows held it
    ~30 s, every other tenant's change waiting, then failing, meanwhile)."""
    if len(label) > 100:
        raise ServiceError("label: at most 100 characters")
    devices, seen = [], {}
    cert_rows: dict[tuple[str, str], int] = {}
    for i, row in enumerate(rows, 1):
        name = row["name"]
        try:
            device = Device(tenant=tenant, name=name, description=row.get("description") or "", enabled=True)
            _set_cert(device, row.get("cert_fingerprint") or None, row.get("cert_cn") or None)
            for field in ("description", "cert_cn"):    # the forms' check (PostgreSQL's text holds no NUL)
                if "\x00" in (getattr(device, field) or ""):
                    raise ServiceError(f"{field}: null characters are not allowed")
            # the tenant is not checked again for each row (a query a device: 100,000 of them)
            _clean(device, exclude=["tenant"], validate_unique=False, validate_constraints=False)
            if name in seen:
                raise Conflict(f"device {tenant.slug}/{name} already exists")
            for field, what in (("cert_fingerprint", "certificate fingerprint"), ("cert_cn", "certificate CN")):
                value = getattr(device, field)
                if value and (field, value) in cert_rows:
                    raise Conflict(f"{what} already belongs to row {cert_rows[field, value]}")
                if value:
                    cert_rows[field, value] = i
        except ServiceError as exc:
            raise type(exc)(f"row {i} ({name!r}): {exc}") from exc
        seen[name] = i
        devices.append(device)
    return CheckedDevices(devices, label, seen, cert_rows)


@transaction.atomic
def create_checked_devices(tenant: Tenant, checked: CheckedDevices) -> list[tuple[Device, Credential, str]]:
    """The devices ``check_device_rows`` passed, against the quota and what is stored, written."""
    devices, seen, cert_rows, label = checked.devices, checked.rows_of_names, checked.cert_rows, checked.label
    _room_for_devices(tenant, len(devices))
    # against what is stored: the first row (in the file's order) that collides is the one named
    names = list(seen)
    taken = set()
    for k in range(0, len(names), 500):
        taken.update(Device.objects.filter(tenant=tenant, name__in=names[k:k + 500]).values_list("name", flat=True))
    clashes = {seen[n]: Conflict(f"device {tenant.slug}/{n} already exists") for n in taken}
    for field, what in (("cert_fingerprint", "certificate fingerprint"), ("cert_cn", "certificate CN")):
        values = [v for f, v in cert_rows if f == field]
        for k in range(0, len(values), 500):
            for value, other_tenant, other in Device.objects.filter(**{f"{field}__in": values[k:k + 500]}).values_list(
                    field, "tenant_id", "name"):
                i = cert_rows[field, value]
                if i not in clashes:
                    clashes[i] = Conflict(f"{what} already belongs to device {tenant.slug}/{other}"
                                          if other_tenant == tenant.pk else
                                          f"{what} already in use by a device of another tenant")
    if clashes:
        i = min(clashes)
        raise type(clashes[i])(f"row {i} ({devices[i - 1].name!r}): {clashes[i]}")
    try:
        with transaction.atomic():
            Device.objects.bulk_create(devices, batch_size=1000)
    except IntegrityError:
        raise Conflict("a device of the file, or its certificate, was created meanwhile: nothing was made") from None
    now = timezone.now()
    made, credentials = [], []
    for device in devices:
        secret = hashing.generate_secret()
        credential = Credential(device=device, label=label, secret_hash=hashing.hash_secret(secret), enabled=True,
                                last_rotated_at=now)
        credentials.append(credential)
        made.append((device, credential, secret))
    Credential.objects.bulk_create(credentials, batch_size=1000)
    if made:
        entries = None
        if all(credential.pk is not None for _, credential, _ in made):     # (ids back from the bulk insert)
            entries = {device.name: policy_snapshot.device_entry(
                device.enabled, device.cert_fingerprint, device.cert_cn,
                [policy_snapshot.credential_entry(credential.pk, credential.secret_hash, True, None)])
                for device, credential, _ in made}
        policy_snapshot.publish_devices(tenant, [device.name for device, _, _ in made], entries)
    return made


@transaction.atomic
def update_device(device: Device, *, description=UNSET, cert_fingerprint=UNSET, cert_cn=UNSET) -> Device:
    """Change a device's description or certificate (its name never changes)."""
    if description is not UNSET:
        device.description = description
    _set_cert(device, cert_fingerprint, cert_cn)
    _clean(device, validate_unique=False, validate_constraints=False)
    _check_cert_free(device)
    _save(device, "certificate fingerprint already in use")
    policy_snapshot.publish_devices(device.tenant, [device.name])
    return device


def _set_device_enabled(device: Device, enabled: bool) -> Device:
    device.enabled = enabled
    device.save(update_fields=["enabled"])
    policy_snapshot.publish_devices(device.tenant, [device.name])
    return device


@transaction.atomic
def disable_device(device: Device) -> Device:
    return _set_device_enabled(device, False)


@transaction.atomic
def enable_device(device: Device) -> Device:
    return _set_device_enabled(device, True)


@transaction.atomic
def delete_device(device: Device) -> None:
    """Delete a device, its credentials and the ACL rules written for it alone."""
    tenant = device.tenant
    _lock_tenant(tenant)
    name = device.name
    device.delete()
    _renumber(list(queries.acl_rules(tenant)))
    policy_snapshot.publish_devices(tenant, [name])
    policy_snapshot.publish(tenant)          # (its rules went with it)


# ---------------------------------------------------------------- credentials


def _new_credential(device: Device, label: str, expires_at, enabled: bool) -> tuple[Credential, str]:
    _check_datetime("expires_at", expires_at)
    if expires_at is not None and expires_at <= timezone.now():
        raise ServiceError("expires_at is in the past")
    secret = hashing.generate_secret()
    now = timezone.now()
    credential = Credential(
        device=device,
        label=label,
        secret_hash=hashing.hash_secret(secret),
        enabled=_check_bool("enabled", enabled),
        expires_at=expires_at,
        last_rotated_at=now,
    )
    _clean(credential)
    credential.save()
    return credential, secret


@transaction.atomic
def create_credential(
    device: Device, *, label: str = "", expires_at=None, enabled: bool = True
) -> tuple[Credential, str]:
    """A new credential for ``device``; returns ``(credential, secret)``, the
    secret shown once and never stored."""
    result = _new_credential(device, label, expires_at, enabled)
    policy_snapshot.publish_devices(device.tenant, [device.name])
    return result


@transaction.atomic
def rotate_credential(credential: Credential) -> tuple[Credential, str]:
    """Replace the credential's secret (the old one stops working at commit);
    returns ``(credential, new secret)``."""
    secret = hashing.generate_secret()
    credential.secret_hash = hashing.hash_secret(secret)
    credential.last_rotated_at = timezone.now()
    credential.save(update_fields=["secret_hash", "last_rotated_at"])
    policy_snapshot.publish_devices(credential.device.tenant, [credential.device.name])
    return credential, secret


@transaction.atomic
def rotate_device_credential(device: Device, credential: Credential | None = None) -> tuple[Credential, str]:
    """What ``devices rotate`` does: rotate ``credential``, else the device's
    only credential, else create its first one. A device with several
    credentials needs the one to rotate named."""
    if credential is None:
        existing = list(device.credentials.all()[:2])
        if len(existing) > 1:
            raise ServiceError(
                f"device {device} has {device.credentials.count()} credentials: name the one to rotate"
            )
        if not existing:
            return create_credential(device)
        credential = existing[0]
    elif credential.device_id != device.pk:
        raise NotFound(f"credential {credential.pk} does not belong to device {device}")
    return rotate_credential(credential)


def _set_credential(credential: Credential, **fields) -> Credential:
    for k, v in fields.items():
        setattr(credential, k, v)
    credential.save(update_fields=list(fields))
    policy_snapshot.publish_devices(credential.device.tenant, [credential.device.name])
    return credential


@transaction.atomic
def disable_credential(credential: Credential) -> Credential:
    return _set_credential(credential, enabled=False)


@transaction.atomic
def enable_credential(credential: Credential) -> Credential:
    return _set_credential(credential, enabled=True)


@transaction.atomic
def expire_credential(credential: Credential, at: dt.datetime | None = None) -> Credential:
    """Make the credential expire ``at`` (default: now, i.e. at once)."""
    _check_datetime("at", at)
    return _set_credential(credential, expires_at=at or timezone.now())


@transaction.atomic
def delete_credential(credential: Credential) -> None:
    device = credential.device
    credential.delete()
    policy_snapshot.publish_devices(device.tenant, [device.name])


def authenticate_device(tenant_slug: str, device_name: str, secret: str) -> bool:
    """Would ``TENANT/DEVICE`` with password ``secret`` be let in? The tenant
    is active, the device enabled, and an enabled, unexpired credential's hash
    matches (compared in constant time)."""
    if not isinstance(secret, str):
        return False
    device = (
        Device.objects.select_related("tenant").filter(tenant__slug=tenant_slug, name=device_name).first()
    )
    if device is None or device.tenant.status != Tenant.Status.ACTIVE or not device.enabled:
        return False
    now = timezone.now()
    # every credential is compared, not just up to the first match
    results = [
        hashing.verify_secret(secret, c.secret_hash) and c.usable(now) for c in device.credentials.all()
    ]
    return any(results)


# ---------------------------------------------------------------- ACL rules


def _device_of(tenant: Tenant, device) -> Device | None:
    if device is None or isinstance(device, Device):
        return device
    return queries.get_device(tenant, device)


def _check_position(position) -> int:
    if isinstance(position, bool) or not isinstance(position, int) or position < 1:
        raise ServiceError(f"position must be a positive integer, not {position!r}")
    return position


def _renumber(ordered: list[AclRule]) -> None:
    """Give ``ordered`` positions 1..N, writing the saved rules that changed."""
    changed = []
    for i, rule in enumerate(ordered, 1):
        if rule.position != i:
            rule.position = i
            if rule.pk is not None:
                changed.append(rule)
    AclRule.objects.bulk_update(changed, ["position"])


def _placed(tenant: Tenant, rule: AclRule, position: int | None) -> list[AclRule]:
    """The tenant's rules in order with ``rule`` at ``position`` (1-based,
    clamped to the end; None = last)."""
    others = [r for r in queries.acl_rules(tenant) if r.pk != rule.pk]
    index = len(others) if position is None else min(_check_position(position), len(others) + 1) - 1
    others.insert(index, rule)
    return others


@transaction.atomic
def add_acl_rule(
    tenant: Tenant,
    *,
    topic: str,
    action: str,
    allow: bool,
    device=None,
    pattern: str | None = None,
    who: str | None = None,
    position: int | None = None,
) -> AclRule:
    """A rule at ``position`` (later rules move down; default: last).

    ``who`` follows from the arguments when not given: ``device`` (a Device or
    its name) -> "device", ``pattern`` (a glob) -> "pattern", else "all".
    """
    _lock_tenant(tenant)
    limit = settings.TENANT_MAX_ACL_RULES
    if tenant.acl_rules.count() >= limit:
        raise ServiceError(f"a tenant has at most {limit} ACL rules (every node checks a client's new topics "
                           "against them one by one): change or delete one instead")
    device = _device_of(tenant, device)
    if who is None:
        who = "device" if device is not None else "pattern" if pattern else "all"
    rule = AclRule(
        tenant=tenant,
        who=who,
        device=device,
        device_pattern=pattern or "",
        action=action,
        topic=topic,
        allow=_check_bool("allow", allow),
        position=0,
    )
    ordered = _placed(tenant, rule, position)
    rule.position = ordered.index(rule) + 1
    _clean(rule)
    _renumber(ordered)
    rule.save()
    policy_snapshot.publish(tenant)
    return rule


@transaction.atomic
def update_acl_rule(
    rule: AclRule, *, who=UNSET, device=UNSET, pattern=UNSET, action=UNSET, topic=UNSET, allow=UNSET
) -> AclRule:
    """Change a rule in place (its position: ``move_acl_rule``). Giving a
    device or pattern alone switches ``who`` to match; switching ``who``
    clears the device or pattern it no longer uses."""
    tenant = rule.tenant
    if who is UNSET:
        if device is not UNSET and device is not None:
            who = "device"
        elif pattern is not UNSET and pattern:
            who = "pattern"
    if who is not UNSET:
        rule.who = who
        if device is UNSET and who != "device":
            rule.device = None
        if pattern is UNSET and who != "pattern":
            rule.device_pattern = ""
    if device is not UNSET:
        rule.device = _device_of(tenant, device)
    if pattern is not UNSET:
        rule.device_pattern = pattern or ""
    if action is not UNSET:
        rule.action = action
    if topic is not UNSET:
        rule.topic = topic
    if allow is not UNSET:
        rule.allow = _check_bool("allow", allow)
    _clean(rule)
    rule.save()
    policy_snapshot.publish(tenant)
    return rule


def move_target(rule: AclRule, direction: str | None = None, position: int | None = None) -> int | None:
    """Where "up", "down" (``direction``) or ``position`` would put ``rule``,
    clamped to the last place; None when it would stay where it is ("up" on
    the first rule, "down" on the last, a position past the end for the last
    rule, below 1, no position): no change to make, no audit row to write."""
    if direction == "up":
        position = max(1, rule.position - 1)
    elif direction == "down":
        position = rule.position + 1
    if position is None:
        return None
    position = min(position, rule.tenant.acl_rules.count())
    return position if position >= 1 and position != rule.position else None


@transaction.atomic
def move_acl_rule(rule: AclRule, position: int) -> AclRule:
    """Put ``rule`` at ``position`` (clamped to the last), shifting the rules between."""
    _lock_tenant(rule.tenant)
    _renumber(_placed(rule.tenant, rule, position))
    policy_snapshot.publish(rule.tenant)
    return rule


@transaction.atomic
def delete_acl_rule(rule: AclRule) -> None:
    tenant = rule.tenant
    _lock_tenant(tenant)
    rule.delete()
    _renumber(list(queries.acl_rules(tenant)))
    policy_snapshot.publish(tenant)


def acl_decision(
    tenant, device_name: str, client_id: str, action: str, topic: str
) -> tuple[bool, AclRule | None]:
    """Would ``device_name`` (with ``client_id``) be allowed to ``action``
    ("publish" a topic name or "subscribe" a filter) ``topic``? Returns
    ``(allowed, deciding rule)``, the rule None when the tenant's default
    decided. The semantics are ``tenants.acl``'s, on the snapshot's rules."""
    if not isinstance(tenant, Tenant):
        tenant = queries.get_tenant(tenant)
    rules = list(queries.acl_rules(tenant))
    documents = [policy_snapshot.rule_json(r) for r in rules]
    try:
        allowed, document = acl.decide(documents, tenant.default_acl, device_name, client_id, action, topic)
    except ValueError as e:
        raise ServiceError(str(e))
    return allowed, None if document is None else rules[documents.index(document)]


class AclCheck(NamedTuple):
    allowed: bool
    rule: AclRule | None        # the rule that decided, None for the tenant's default
    filtered: bool              # subscribe: granted, each delivered message checked
    known_device: bool          # the device exists (the checker also answers for names to come)


def check_acl(tenant: Tenant, device_name: str, client_id: str, action: str, topic: str) -> AclCheck:
    """The ACL checker's answer: what brokerd decides for ``device_name``
    (with ``client_id``) asking to ``action`` ``topic``, by ``tenants.acl``'s
    ``decide_detail`` on the snapshot's rules. ServiceError for a topic the
    request may not name."""
    rules = list(queries.acl_rules(tenant))
    documents = [policy_snapshot.rule_json(r) for r in rules]
    try:
        decision = acl.decide_detail(documents, tenant.default_acl, device_name, client_id, action, topic)
    except ValueError as e:
        raise ServiceError(str(e))
    rule = None if decision.rule is None else rules[documents.index(decision.rule)]
    return AclCheck(decision.allowed, rule, decision.filtered, tenant.devices.filter(name=device_name).exists())


# ---------------------------------------------------------------- onboarding: a device's own topics

# "allow both {device}/#" for every device: each may publish and subscribe under its own name
OWN_TOPICS = {"who": AclRule.Who.ALL, "action": AclRule.Action.BOTH, "topic": "{device}/#", "allow": True}


def own_topics_rule(tenant: Tenant) -> AclRule | None:
    """The tenant's ``OWN_TOPICS`` rule (the first, should it have several), if it has one."""
    return queries.acl_rules(tenant).filter(device=None, device_pattern="", **OWN_TOPICS).first()


@transaction.atomic
def allow_own_topics(tenant: Tenant) -> tuple[AclRule, bool]:
    """The one-click rule of a new tenant: ``OWN_TOPICS`` added last, unless the
    tenant has it already -> ``(rule, created)``. Idempotent: a second click,
    also a concurrent one (the tenant's row is locked first where the database
    locks rows; SQLite serialises the write transactions), adds nothing."""
    _lock_tenant(tenant)
    existing = own_topics_rule(tenant)
    if existing is not None:
        return existing, False
    return add_acl_rule(tenant, **OWN_TOPICS), True


def example_access(tenant: Tenant, device_name: str, topic: str, topic_filter: str) -> dict[str, AclCheck]:
    """What the tenant's ACL decides for the connect panel's examples: device
    ``device_name`` (its name as client id) publishing ``topic`` and
    subscribing ``topic_filter`` -> ``{"publish": AclCheck, "subscribe": AclCheck}``."""
    return {"publish": check_acl(tenant, device_name, device_name, "publish", topic),
            "subscribe": check_acl(tenant, device_name, device_name, "subscribe", topic_filter)}


# ---------------------------------------------------------------- quota, $SYS


@transaction.atomic
def update_quota(tenant: Tenant, **changes) -> Quota:
    """Set quota fields (``limits.QUOTA_FIELDS``) to positive ints, or None for unlimited."""
    unknown = sorted(set(changes) - set(limits.QUOTA_FIELDS))
    if unknown:
        raise ServiceError(f"unknown quota field(s): {', '.join(unknown)}")
    quota = queries.quota(tenant)
    for field, value in changes.items():
        try:
            setattr(quota, field, limits.check_limit(field, value))
        except ValueError as e:
            raise ServiceError(str(e))
    _clean(quota)
    quota.save()
    policy_snapshot.publish(tenant)
    return quota


@transaction.atomic
def update_own_quota(tenant: Tenant, **changes) -> OwnQuota:
    """The tenant's own limits (``limits.QUOTA_FIELDS``; None: the ceiling).

    A value above the administrators' ceiling (``Quota``) is refused: a tenant
    may lower a limit, never raise it."""
    unknown = sorted(set(changes) - set(limits.QUOTA_FIELDS))
    if unknown:
        raise ServiceError(f"unknown quota field(s): {', '.join(unknown)}")
    ceiling = queries.quota(tenant)
    own = queries.own_quota(tenant)
    errors = []
    for field, value in changes.items():
        try:
            value = limits.check_limit(field, value)
        except ValueError as e:
            errors.append(str(e))
            continue
        top = getattr(ceiling, field)
        if value is not None and top is not None and value > top:
            errors.append(f"{field} may not exceed the limit of {top} the administrators set")
            continue
        setattr(own, field, value)
    if errors:
        raise ServiceError("; ".join(errors))
    _clean(own)
    own.save()
    policy_snapshot.publish(tenant)
    return own


@transaction.atomic
def update_system_topics(tenant: Tenant, *, enabled=UNSET, interval=UNSET, parts=UNSET) -> SystemTopicSetting:
    """Whether the tenant's clients get ``$SYS`` topics, every ``interval``
    seconds, with which ``parts`` (a subset of ``SYS_PARTS``)."""
    setting = queries.system_topics(tenant)
    if enabled is not UNSET:
        setting.enabled = _check_bool("enabled", enabled)
    if interval is not UNSET:
        if isinstance(interval, bool) or not isinstance(interval, int):
            raise ServiceError(f"interval must be a whole number of seconds, not {interval!r}")
        setting.interval = interval
    if parts is not UNSET:
        if isinstance(parts, str):
            parts = [parts]
        parts = list(parts)
        setting.parts = [p for p in SYS_PARTS if p in parts] + [p for p in parts if p not in SYS_PARTS]
    _clean(setting)
    setting.save()
    policy_snapshot.publish(tenant)
    return setting
