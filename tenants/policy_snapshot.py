"""The policy snapshot: what brokerd enforces for a tenant -- one JSON row per tenant and one
per device (written here, read by ``brokerd/tenancy/``; not brokerd's metrics snapshot).

The contract (brokerd reads it with plain SQL, no Django):

table ``tenants_policysnapshot``: ``tenant_slug`` (unique text), ``version``
(bigint, indexed), ``data`` (text, JSON). One row per tenant slug ever seen;
a deleted tenant keeps its row with ``{"schema": 2, "tenant": SLUG, "status":
"deleted"}``.

table ``tenants_devicepolicy``: ``tenant_slug``, ``incarnation`` (the tenant's id), ``name``
(unique with the slug), ``version`` (bigint, indexed), ``data`` (text, JSON: the device's entry
below; NULL: the device was deleted). A deleted tenant's rows are deleted with it. A device's change
writes its row alone (``publish_devices``); until schema 2 the tenant's document held every device,
and a device's change rewrote it whole (~1 s and 31 MB for every node to read at 150,000 devices).

brokerd polls both::

    SELECT tenant_slug, version, data FROM tenants_policysnapshot
    WHERE version > ? ORDER BY version
    SELECT tenant_slug, incarnation, name, version, data FROM tenants_devicepolicy
    WHERE version > ? ORDER BY version

``version`` comes from ``tenants_policycounter`` (row id 1), bumped in the
same transaction as the change, after the document is built; the UPDATE's row
lock serialises publishing transactions from there to their commit, so on
PostgreSQL versions become visible in increasing order (SQLite serialises
writers anyway). The document is built under a lock of the tenant's own (on
PostgreSQL a transaction-level advisory lock, ``_lock_publishing``): a
tenant's publishers build one after the other, each seeing what the one
before committed, and a big tenant's build does not hold up the other
tenants' changes. Versions increase but are not contiguous
(a rolled-back transaction leaves a gap). A row always holds the whole of
what it covers (the tenant's policy but its devices; a device's entry), never
a difference.

``data`` of a tenant::

    {"schema": 2, "tenant": "acme", "incarnation": int (the tenant's id: a slug deleted and made again
     is another tenant), "status": "active"|"suspended",
     "default_acl": "allow"|"deny",
     "acl": [{"id", "position", "who", "device", "pattern", "action",
              "topic", "allow"}],             # by position, then id
     "quota": {QUOTA_FIELDS: int|null},     # ceiling and own limit, the smaller
     "sys": {"enabled": bool, "interval": int, "parts": [str]},
     "rules": [{"id": int, "sql": str, "action": "republish"|..., "config": {...},
                "enabled": bool}],             # by id; brokerd/rules/ (absent before issue 19)
     "autosub": [{"id": int, "pattern": str|None, "filter": str, "qos": 0-2, "no_local": bool,
                  "rap": bool, "rh": 0-2}]}    # by position, id; applied on CONNECT (absent before issue 19)

``data`` of a device::

    {"enabled": bool, "cert_fingerprint": hex|null, "cert_cn": str|null,
     "credentials": [{"id": int, "hash": "sha256$<hex>", "enabled": bool,
                      "expires_at": unix seconds float|null}]}

(Schema 1, which brokerd still reads, held the devices in the tenant's document: ``"devices":
{"<name>": entry}``.)
"""

import json

from django.db import connection
from django.db.models import F

from . import limits
from .errors import NotFound
from .models import (
    AclRule,
    AutoSubscription,
    Credential,
    Device,
    DevicePolicy,
    OwnQuota,
    PolicyCounter,
    PolicySnapshot,
    Rule,
    Tenant,
)
from .validators import SYS_PARTS

SCHEMA = 2


def _devices(tenant: Tenant, names=None) -> dict:
    """The tenant's devices (``names``: only those) as their rows carry them, read as plain rows:
    through model objects a tenant of 150,000 devices took 17 s to build."""
    devices = Device.objects.filter(tenant=tenant)
    creds_q = Credential.objects.filter(device__tenant=tenant)
    if names is not None:
        devices = devices.filter(name__in=names)
        creds_q = creds_q.filter(device__name__in=names)
    creds: dict[int, list] = {}
    for device_id, cid, secret_hash, enabled, expires_at in creds_q.order_by("device_id", "id").values_list(
            "device_id", "id", "secret_hash", "enabled", "expires_at").iterator(chunk_size=10_000):
        creds.setdefault(device_id, []).append(credential_entry(cid, secret_hash, enabled, expires_at))
    return {
        name: device_entry(enabled, fingerprint, cn, creds.get(pk, []))
        for pk, name, enabled, fingerprint, cn in devices.order_by("name").values_list(
            "pk", "name", "enabled", "cert_fingerprint", "cert_cn").iterator(chunk_size=10_000)
    }


def credential_entry(cid: int, secret_hash: str, enabled: bool, expires_at) -> dict:
    return {"id": cid, "hash": secret_hash, "enabled": enabled,
            "expires_at": expires_at.timestamp() if expires_at else None}


def device_entry(enabled: bool, fingerprint, cn, credentials: list) -> dict:
    """A device's entry: its row's ``data``."""
    return {"enabled": enabled, "cert_fingerprint": fingerprint or None, "cert_cn": cn or None,
            "credentials": credentials}


def rule_json(r: AclRule) -> dict:
    return {
        "id": r.pk,
        "position": r.position,
        "who": r.who,
        "device": r.device.name if r.device_id else None,
        "pattern": r.device_pattern or None,
        "action": r.action,
        "topic": r.topic,
        "allow": r.allow,
    }


def processing_rule_json(r: Rule) -> dict:
    """A rule of the rule engine (not an ACL rule: ``rule_json``)."""
    return {"id": r.pk, "sql": r.sql, "action": r.action, "config": r.config, "enabled": r.enabled}


def autosub_json(a: AutoSubscription) -> dict:
    """An auto-subscribe rule as the snapshot carries it (``brokerd.tenancy.autosub``)."""
    return {"id": a.pk, "pattern": a.device_pattern or None, "filter": a.filter, "qos": a.qos,
            "no_local": a.no_local, "rap": a.retain_as_published, "rh": a.retain_handling}


def _quota(tenant: Tenant) -> dict:
    """The administrators' ceilings, lowered where the tenant lowered them."""
    own = OwnQuota.objects.filter(tenant=tenant).first()
    return {f: limits.effective_limit(getattr(tenant.quota, f), getattr(own, f) if own else None)
            for f in limits.QUOTA_FIELDS}


def build(tenant: Tenant) -> dict:
    """The snapshot document of an existing tenant, read afresh from the database."""
    tenant = Tenant.objects.select_related("quota", "system_topics").get(pk=tenant.pk)
    rules = tenant.acl_rules.select_related("device").order_by("position", "id")
    sys_ = tenant.system_topics
    return {
        "schema": SCHEMA,
        "tenant": tenant.slug,
        "incarnation": tenant.pk,
        "status": tenant.status,
        "default_acl": tenant.default_acl,
        "acl": [rule_json(r) for r in rules],
        "quota": _quota(tenant),
        "sys": {
            "enabled": sys_.enabled,
            "interval": sys_.interval,
            "parts": [p for p in SYS_PARTS if p in sys_.parts],
        },
        "rules": [processing_rule_json(r) for r in tenant.rules.order_by("id")],
        "autosub": [autosub_json(a) for a in tenant.auto_subscriptions.order_by("position", "id")],
    }


def deleted(slug: str) -> dict:
    return {"schema": SCHEMA, "tenant": slug, "status": "deleted"}


def next_version() -> int:
    """Bump the policy counter (``UPDATE ... SET value = value + 1 WHERE id =
    1``) and read it back; must run inside the publishing transaction."""
    bumped = PolicyCounter.objects.filter(pk=1).update(value=F("value") + 1)
    if not bumped:  # the migration creates the row; a flushed test database lacks it
        PolicyCounter.objects.get_or_create(pk=1, defaults={"value": 0})
        PolicyCounter.objects.filter(pk=1).update(value=F("value") + 1)
    return PolicyCounter.objects.values_list("value", flat=True).get(pk=1)


def _write(slug: str, data: str) -> int:
    """Store the tenant's row under a new version; returns the version. The counter's row lock is
    held from here to the commit: keep what follows it short."""
    version = next_version()
    PolicySnapshot.objects.update_or_create(tenant_slug=slug, defaults={"version": version, "data": data})
    return version


def publish_devices(tenant: Tenant, names, entries: dict | None = None) -> int:
    """Store the rows of the tenant's devices ``names`` (inside the change's transaction): each one's
    entry as it is now, or NULL for a name no device has any more; -> the version. The tenant's own
    snapshot is not written: a device's change costs its row, not the whole tenant (150,000 devices:
    ~1 s to build, and every node read 31 MB again). ``entries``: the devices' entries, when the
    change has them at hand (an import: reading back what it wrote held SQLite's write lock longer)."""
    names = sorted(set(names))
    if not names:
        return 0
    _lock_publishing(tenant)
    if entries is None:
        entries = {}
        for i in range(0, len(names), 5_000):          # (a query's parameters are bounded: SQLite's 32,766)
            entries.update(_devices(tenant, names[i:i + 5_000]))
    version = next_version()
    dumps = json.JSONEncoder(separators=(",", ":")).encode
    rows = [(tenant.slug, tenant.pk, name, version, dumps(entries[name]) if name in entries else None)
            for name in names]
    # plain SQL, the same on SQLite and PostgreSQL: through the ORM's bulk_create 20,000 rows took 1.3 s of
    # an import's transaction (SQLite's write lock held: every other tenant's change waited)
    table = DevicePolicy._meta.db_table
    with connection.cursor() as cur:
        cur.executemany(f"INSERT INTO {table} (tenant_slug, incarnation, name, version, data) "
                        "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (tenant_slug, name) DO UPDATE SET "
                        "incarnation = excluded.incarnation, version = excluded.version, data = excluded.data",
                        rows)
    return version


def publish(tenant: Tenant) -> int:
    """Rebuild and store the tenant's snapshot (inside the change's transaction).

    The tenant's publishing lock is taken first and the document built under it alone (the
    build sees every change of the tenant committed by its publishers before this one --
    PostgreSQL, READ COMMITTED: each statement sees what was committed before it began);
    only then is the counter taken. The build of a tenant of 150,000 devices (~1 s with its
    JSON) held the counter's lock, and every other tenant's changes waited for it."""
    _lock_publishing(tenant)
    return _write(tenant.slug, json.dumps(build(tenant), separators=(",", ":")))


# the first key of the advisory locks of ``_lock_publishing`` (the second: the tenant's id)
PUBLISHING_LOCK = 0x6D717470        # "mqtp"


def _lock_publishing(tenant: Tenant) -> None:
    """Until the transaction ends, this tenant's other publishers wait here (PostgreSQL: an
    advisory lock of the tenant's id; SQLite has one writer at a time already). Not the tenant's
    row: a change that locks that row first and then writes others (an ACL rule added renumbers
    the tenant's rules) and a change that wrote one of those and then published would each wait
    for the other's lock (deadlock detected: one change lost). Taken after a change's writes,
    followed by reads and the counter alone, this lock closes no such circle."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s, %s)", [PUBLISHING_LOCK, tenant.pk])
    if not Tenant.objects.filter(pk=tenant.pk).exists():
        raise NotFound(f"the tenant {tenant.slug} was deleted meanwhile")


def publish_deleted(slug: str) -> int:
    """The slug's tenant is gone: its snapshot says so, and its devices' rows go (a tenant made again
    under the slug starts with none; the nodes drop the devices with the tenant)."""
    DevicePolicy.objects.filter(tenant_slug=slug).delete()
    return _write(slug, json.dumps(deleted(slug), separators=(",", ":")))


def load(slug: str) -> dict | None:
    """The stored policy of ``slug`` as a node puts it together: its snapshot, with ``devices`` from
    its incarnation's device rows (None if never published)."""
    row = PolicySnapshot.objects.filter(tenant_slug=slug).values_list("data", flat=True).first()
    if row is None:
        return None
    doc = json.loads(row)
    if doc.get("status") != "deleted":
        doc["devices"] = {name: json.loads(data) for name, data in DevicePolicy.objects.filter(
            tenant_slug=slug, incarnation=doc.get("incarnation"), data__isnull=False).order_by(
            "name").values_list("name", "data")}
    return doc
