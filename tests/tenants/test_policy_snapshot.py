"""The policy snapshot contract brokerd reads: table, JSON and versions."""

import datetime as dt
import json

import pytest
from django.db import connection, transaction
from django.utils import timezone

from tenants import queries, services
from tenants.limits import QUOTA_FIELDS
from tenants.models import PolicySnapshot

from ..postgres import run_django

pytestmark = pytest.mark.django_db


def row(slug):
    """(version, document) of the tenant's row, read with plain SQL like brokerd."""
    with connection.cursor() as cur:
        cur.execute("SELECT version, data FROM tenants_policysnapshot WHERE tenant_slug = %s", [slug])
        rows = cur.fetchall()
    assert len(rows) == 1
    version, data = rows[0]
    return version, json.loads(data)


def device_rows(slug) -> dict:
    """name -> (incarnation, version, entry or None) of the tenant's device rows, read like brokerd."""
    with connection.cursor() as cur:
        cur.execute("SELECT name, incarnation, version, data FROM tenants_devicepolicy WHERE tenant_slug = %s", [slug])
        return {name: (inc, version, None if data is None else json.loads(data))
                for name, inc, version, data in cur.fetchall()}


def newest(slug) -> int:
    return max([row(slug)[0], *(v for _i, v, _e in device_rows(slug).values())])


class Versions:
    """Asserts that each change publishes a strictly newer version; ``next()``: the tenant's policy as a
    node puts it together (its snapshot, and ``devices`` from its device rows)."""

    def __init__(self, slug):
        self.slug = slug
        self.last = newest(slug)

    def next(self) -> dict:
        version = newest(self.slug)
        assert version > self.last
        self.last = version
        doc = row(self.slug)[1]
        doc["devices"] = {name: entry for name, (inc, _v, entry) in sorted(device_rows(self.slug).items())
                          if inc == doc["incarnation"] and entry is not None}
        return doc


def test_table_is_the_contract():
    assert PolicySnapshot._meta.db_table == "tenants_policysnapshot"
    with connection.cursor() as cur:
        columns = {c.name for c in connection.introspection.get_table_description(cur, "tenants_policysnapshot")}
    assert {"tenant_slug", "version", "data"} <= columns


def test_new_tenant_document(tenant):
    version, doc = row("acme")
    assert version >= 1
    assert doc == {
        "schema": 2, "tenant": "acme", "incarnation": tenant.pk, "status": "active", "default_acl": "deny",
        "acl": [], "quota": dict.fromkeys(QUOTA_FIELDS),
        "sys": {"enabled": True, "interval": 10,
                "parts": ["clients", "messages", "bytes", "subscriptions", "retained", "load"]},
        "rules": [],
        "autosub": [],
    }
    assert list(doc) == ["schema", "tenant", "incarnation", "status", "default_acl", "acl", "quota", "sys",
                         "rules", "autosub"]
    assert device_rows("acme") == {}


def test_tenant_changes(tenant):
    v = Versions("acme")
    services.update_tenant(tenant, default_acl="allow")
    assert v.next()["default_acl"] == "allow"
    services.suspend_tenant(tenant)
    assert v.next()["status"] == "suspended"
    services.resume_tenant(tenant)
    assert v.next()["status"] == "active"
    services.update_tenant(tenant, name="Renamed", contact_emails=["x@y.test"])
    assert v.next()["tenant"] == "acme"


def test_device_and_credential_changes(tenant):
    v = Versions("acme")
    fp = "0f" * 32
    d = services.create_device(tenant, "sensor-1", cert_fingerprint=fp, cert_cn="sensor-1.acme")
    assert v.next()["devices"] == {"sensor-1": {
        "enabled": True, "cert_fingerprint": fp, "cert_cn": "sensor-1.acme", "credentials": []}}
    expires = timezone.now() + dt.timedelta(days=30)
    c1, _ = services.create_credential(d, expires_at=expires)
    creds = v.next()["devices"]["sensor-1"]["credentials"]
    assert creds == [{"id": c1.pk, "hash": c1.secret_hash, "enabled": True,
                      "expires_at": pytest.approx(expires.timestamp())}]
    assert isinstance(creds[0]["expires_at"], float)
    c2, _ = services.create_credential(d)
    assert [c["id"] for c in v.next()["devices"]["sensor-1"]["credentials"]] == [c1.pk, c2.pk]
    old_hash = c1.secret_hash
    services.rotate_credential(c1)
    assert v.next()["devices"]["sensor-1"]["credentials"][0]["hash"] not in (old_hash, None)
    services.disable_credential(c2)
    assert v.next()["devices"]["sensor-1"]["credentials"][1]["enabled"] is False
    services.expire_credential(c2)
    assert v.next()["devices"]["sensor-1"]["credentials"][1]["expires_at"] <= timezone.now().timestamp()
    services.delete_credential(c2)
    assert len(v.next()["devices"]["sensor-1"]["credentials"]) == 1
    services.disable_device(d)
    assert v.next()["devices"]["sensor-1"]["enabled"] is False
    services.update_device(d, cert_fingerprint=None, cert_cn=None)
    dev = v.next()["devices"]["sensor-1"]
    assert (dev["cert_fingerprint"], dev["cert_cn"]) == (None, None)
    services.provision_device(tenant, "a-gw")
    assert list(v.next()["devices"]) == ["a-gw", "sensor-1"]
    services.delete_device(d)
    assert list(v.next()["devices"]) == ["a-gw"]


def test_a_devices_change_writes_its_row_alone(tenant):
    """A device's change (made, a credential added or rotated, disabled, deleted) writes that
    device's row under a new version and nothing else: until schema 2 it rewrote the tenant's whole
    document (~1 s at 150,000 devices), which every node read again. Deleting it leaves its row
    saying so (NULL) and republishes the tenant (its own rules went with it)."""
    services.provision_device(tenant, "other")
    d, _c, _s = services.provision_device(tenant, "sensor-1")
    tenant_row, others = row("acme"), device_rows("acme")
    for change in (lambda: services.create_credential(d), lambda: services.disable_device(d),
                   lambda: services.rotate_device_credential(d, d.credentials.first())):
        change()
        now = device_rows("acme")
        assert row("acme") == tenant_row and now["other"] == others["other"]
        assert now["sensor-1"][1] > others["sensor-1"][1] and now["sensor-1"][0] == tenant.pk
        others = now
    assert now["sensor-1"][2]["enabled"] is False and len(now["sensor-1"][2]["credentials"]) == 2
    services.delete_device(d)
    assert device_rows("acme")["sensor-1"][2] is None and row("acme")[0] > tenant_row[0]
    assert queries.get_tenant("acme") and list(services.policy_snapshot.load("acme")["devices"]) == ["other"]


def test_a_deleted_tenants_device_rows_go_with_it(tenant):
    services.provision_device(tenant, "sensor-1")
    services.delete_tenant(tenant)
    assert device_rows("acme") == {} and row("acme")[1]["status"] == "deleted"
    again = services.create_tenant("acme")
    services.provision_device(again, "sensor-2")
    assert {name: inc for name, (inc, _v, _e) in device_rows("acme").items()} == {"sensor-2": again.pk}


def test_acl_changes(tenant, device):
    v = Versions("acme")
    r1 = services.add_acl_rule(tenant, topic="sensors/{device}/#", action="publish", allow=True,
                               pattern="sensor-*")
    r2 = services.add_acl_rule(tenant, topic="cmd/{client_id}", action="subscribe", allow=False,
                               device=device, position=1)
    assert v.next()["acl"] == [
        {"id": r2.pk, "position": 1, "who": "device", "device": "sensor-1", "pattern": None,
         "action": "subscribe", "topic": "cmd/{client_id}", "allow": False},
        {"id": r1.pk, "position": 2, "who": "pattern", "device": None, "pattern": "sensor-*",
         "action": "publish", "topic": "sensors/{device}/#", "allow": True},
    ]
    services.move_acl_rule(r2, 2)
    assert [(r["id"], r["position"]) for r in v.next()["acl"]] == [(r1.pk, 1), (r2.pk, 2)]
    services.update_acl_rule(r1, who="all", action="both")
    first = v.next()["acl"][0]
    assert (first["who"], first["pattern"], first["action"]) == ("all", None, "both")
    services.delete_acl_rule(r1)
    assert [(r["id"], r["position"]) for r in v.next()["acl"]] == [(r2.pk, 1)]


def test_quota_and_sys_changes(tenant):
    v = Versions("acme")
    services.update_quota(tenant, max_connections=10, tenant_bytes_in=10**9)
    quota = v.next()["quota"]
    assert list(quota) == list(QUOTA_FIELDS)
    assert (quota["max_connections"], quota["tenant_bytes_in"], quota["max_payload"]) == (10, 10**9, None)
    services.update_system_topics(tenant, enabled=False, interval=30, parts=["load", "clients"])
    assert v.next()["sys"] == {"enabled": False, "interval": 30, "parts": ["clients", "load"]}


def test_delete_leaves_a_deleted_row(tenant):
    before = row("acme")[0]
    services.delete_tenant(tenant)
    version, doc = row("acme")
    assert version > before
    assert doc == {"schema": 2, "tenant": "acme", "status": "deleted"}
    # re-creating the slug reuses its row
    services.create_tenant("acme")
    version2, doc2 = row("acme")
    assert version2 > version and doc2["status"] == "active"
    assert PolicySnapshot.objects.filter(tenant_slug="acme").count() == 1


def test_versions_across_tenants_and_polling():
    services.create_tenant("a")
    b = services.create_tenant("b")
    start = queries.policy_changes(0)
    assert [slug for slug, _, _ in start] == ["a", "b"]
    last = start[-1][1]
    services.update_quota(b, max_queued=5)
    services.create_tenant("c")
    services.delete_tenant(b)
    changes = queries.policy_changes(last)
    assert [(slug, json.loads(data)["status"]) for slug, _, data in changes] == [("c", "active"),
                                                                                 ("b", "deleted")]
    versions = [v for _, v, _ in queries.policy_changes(0)]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)


def test_failed_change_publishes_nothing(tenant):
    version = row("acme")[0]
    with pytest.raises(services.ServiceError):
        services.add_acl_rule(tenant, topic="a/#/b", action="both", allow=True)
    with pytest.raises(RuntimeError), transaction.atomic():
        services.update_quota(tenant, max_connections=1)
        raise RuntimeError("the caller's transaction rolls back")
    assert row("acme")[0] == version
    assert queries.quota(tenant).max_connections is None


# ---------------------------------------------------------------- publishing, on PostgreSQL

# Tenant "big"'s publish is held inside its build (as a tenant of 150,000 devices took ~1 s with its
# JSON before its devices had rows of their own; an import of 100,000 devices still builds that many). A change of tenant "small" made meanwhile must commit at once -- the build held the policy
# counter's row lock, and every tenant's change waited for it. A second change of "big" must wait
# (its publishers build one after the other), and big's last snapshot then holds both changes.
PUBLISH_RACE = """
import json, threading, time
import django
django.setup()
from django.core.management import call_command
from django.db import connection
from tenants import policy_snapshot, services

call_command("migrate", verbosity=0)
big, small = services.create_tenant("big"), services.create_tenant("small")
gate, building = threading.Event(), threading.Event()
real_build = policy_snapshot._devices

def held_build(tenant, names=None):
    doc = real_build(tenant, names)
    if tenant.slug == "big" and not gate.is_set():
        building.set()
        gate.wait(60)
    return doc

policy_snapshot._devices = held_build

def change(tenant, device, done):
    try:
        services.create_device(tenant, device)
        done.set()
    finally:
        connection.close()

first, second, other = threading.Event(), threading.Event(), threading.Event()
threads = [threading.Thread(target=change, args=(big, "b1", first))]
threads[0].start()
assert building.wait(60)
threads.append(threading.Thread(target=change, args=(small, "s1", other)))
threads.append(threading.Thread(target=change, args=(big, "b2", second)))
for t in threads[1:]:
    t.start()
other_done = other.wait(10)
second_waited = not second.is_set()
gate.set()
for t in threads:
    t.join(60)
print(json.dumps({"other_tenant_done_while_big_built": other_done, "big_second_change_waited": second_waited,
                  "big": sorted(policy_snapshot.load("big")["devices"]),
                  "small": sorted(policy_snapshot.load("small")["devices"])}))
"""


def test_a_big_tenants_publish_does_not_hold_up_the_other_tenants_changes(postgres_db, tmp_path):
    result = run_django(postgres_db, tmp_path, PUBLISH_RACE)
    assert result == {"other_tenant_done_while_big_built": True, "big_second_change_waited": True,
                      "big": ["b1", "b2"], "small": ["s1"]}


# A change held at ``{held}`` (after its first writes) while the tenant's administrator adds an ACL rule at
# the top; -> the errors of the two changes and the tenant's ACL topics as the snapshot has them.
ADD_AT_THE_TOP_WHILE = """
import json, threading, time
import django
django.setup()
from django.core.management import call_command
from django.db import connection
from tenants import policy_snapshot, services

call_command("migrate", verbosity=0)
t = services.create_tenant("acme")
{setup}
first, adding = threading.Event(), threading.Event()
real = {held}

def held(*args):
    if threading.current_thread().name == "change":
        first.set()                     # its first rows written: the add starts, locks the tenant, renumbers
        adding.wait(60)
        time.sleep(1.0)
    return real(*args)

{held} = held
errors = {{}}

def run(name, fn):
    try:
        fn()
    except Exception as exc:
        errors[name] = f"{{type(exc).__name__}}: {{exc}}"
    finally:
        connection.close()

change = threading.Thread(name="change", target=run, args=("change", lambda: {change}))
add = threading.Thread(name="add", target=run,
                       args=("add", lambda: services.add_acl_rule(t, topic="d/#", action="both", allow=True,
                                                                   position=1)))
change.start()
assert first.wait(60)
add.start()
adding.set()
change.join(60)
add.join(60)
print(json.dumps({{"errors": errors, "acl": [r["topic"] for r in policy_snapshot.load("acme")["acl"]]}}))
"""
# An ACL rule changed (its row written, then the snapshot published) while a rule is added at the top
# (the tenant's row locked first, then every rule renumbered): with a publish that locked the tenant's
# row, each waited for the other -- PostgreSQL's deadlock detector failed one change (the console: a 500).
ACL_RACE = ADD_AT_THE_TOP_WHILE.format(
    setup='r1 = services.add_acl_rule(t, topic="a/#", action="both", allow=True)\n'
          'services.add_acl_rule(t, topic="b/#", action="both", allow=True)',
    held="policy_snapshot.publish", change='services.update_acl_rule(r1, topic="c/#")')



# A device given a certificate fingerprint (its row written, then the snapshot published: the tenant's row
# locked) while a device with the same fingerprint is made in the tenant (its row locked first, then the
# insert waits on the fingerprint's unique index for the first change): one of the two must be told the
# fingerprint is taken (a Conflict) -- PostgreSQL's deadlock detector failed one instead (the console: a 500).
CERT_RACE = """
import json, threading, time
import django
django.setup()
from django.core.management import call_command
from django.db import connection
from tenants import policy_snapshot, services

call_command("migrate", verbosity=0)
t = services.create_tenant("acme")
d1 = services.create_device(t, "d1")
fp = "ab" * 32
written, creating = threading.Event(), threading.Event()
real_publish = policy_snapshot.publish_devices

def held_publish(tenant, names):
    if threading.current_thread().name == "update":
        written.set()                   # d1's fingerprint is written: the create starts, locks the tenant
        creating.wait(60)
        time.sleep(1.0)
    return real_publish(tenant, names)

policy_snapshot.publish_devices = held_publish
outcome = {}

def run(name, fn):
    try:
        fn()
        outcome[name] = "ok"
    except Exception as exc:
        outcome[name] = type(exc).__name__
    finally:
        connection.close()

update = threading.Thread(name="update", target=run,
                          args=("update", lambda: services.update_device(d1, cert_fingerprint=fp)))
create = threading.Thread(name="create", target=run,
                          args=("create", lambda: services.create_device(t, "d2", cert_fingerprint=fp)))
update.start()
assert written.wait(60)
create.start()
creating.set()
update.join(60)
create.join(60)
print(json.dumps(outcome))
"""


def test_a_fingerprint_given_to_a_device_while_a_device_with_it_is_made_is_refused_once(postgres_db, tmp_path):
    outcome = run_django(postgres_db, tmp_path, CERT_RACE)
    assert sorted(outcome.values()) == ["Conflict", "ok"], outcome


# A device deleted (its own ACL rule deleted with it, then the others renumbered) while a rule is added at
# the top (the tenant's row locked, then every rule renumbered: the rows it reaches first locked, then
# waiting for the deleted rule's): the delete's renumbering waited for the rows the add held --
# PostgreSQL's deadlock detector failed one change (the console: a 500).
DELETE_RACE = ADD_AT_THE_TOP_WHILE.format(
    setup='dv = services.create_device(t, "dv")\n'
          'services.add_acl_rule(t, topic="b/#", action="both", allow=True)\n'
          'services.add_acl_rule(t, topic="c/#", action="both", allow=True)\n'
          'services.add_acl_rule(t, topic="dv/#", action="both", allow=True, device=dv, position=1)  # the last row',
    held="services._renumber", change="services.delete_device(dv)")


@pytest.mark.parametrize(("script", "acl"), [(ACL_RACE, ["d/#", "c/#", "b/#"]), (DELETE_RACE, ["d/#", "b/#", "c/#"])],
                         ids=["an ACL rule changed", "a device deleted"])
def test_a_change_while_a_rule_is_added_at_the_top_are_both_done(postgres_db, tmp_path, script, acl):
    assert run_django(postgres_db, tmp_path, script) == {"errors": {}, "acl": acl}


# A database of the code before the device rows (tenants 0009): schema-1 snapshots holding their devices
# (one of a tenant written before snapshots named their incarnation, one of a deleted tenant), migrated to
# the device rows and back.
SPLIT_DEVICES = """
import json
import django
django.setup()
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

def migrate(target):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate([("tenants", target)])
    return MigrationExecutor(connection).loader.project_state([("tenants", target)]).apps

apps = migrate("0009_max_devices")
Tenant, Snapshot = apps.get_model("tenants", "Tenant"), apps.get_model("tenants", "PolicySnapshot")
acme, old = Tenant.objects.create(slug="acme"), Tenant.objects.create(slug="old")
entry = {"enabled": True, "cert_fingerprint": None, "cert_cn": "gw", "credentials": [
    {"id": 1, "hash": "sha256$" + "ab" * 32, "enabled": True, "expires_at": None}]}
docs = {"acme": {"schema": 1, "tenant": "acme", "incarnation": acme.pk, "status": "active", "default_acl": "deny",
                 "devices": {"a": entry, "b": dict(entry, enabled=False)}, "acl": [], "quota": {}},
        "old": {"schema": 1, "tenant": "old", "status": "active", "devices": {"c": entry}},
        "gone": {"schema": 1, "tenant": "gone", "status": "deleted"}}
for version, (slug, doc) in enumerate(docs.items(), 1):
    Snapshot.objects.create(tenant_slug=slug, version=version, data=json.dumps(doc))
apps.get_model("tenants", "PolicyCounter").objects.update_or_create(pk=1, defaults={"value": 3})
apps = migrate("0010_device_policy")
split = {s.tenant_slug: [s.version, json.loads(s.data)] for s in apps.get_model("tenants", "PolicySnapshot").objects.all()}
rows = sorted([r.tenant_slug, r.incarnation, r.name, r.version, json.loads(r.data)]
              for r in apps.get_model("tenants", "DevicePolicy").objects.all())
apps = migrate("0009_max_devices")
back = {s.tenant_slug: json.loads(s.data) for s in apps.get_model("tenants", "PolicySnapshot").objects.all()}
print(json.dumps({"docs": docs, "split": split, "rows": rows, "back": back, "ids": [acme.pk, old.pk]}))
"""


def test_the_migration_moves_each_snapshots_devices_into_rows_and_back(tmp_path):
    out = run_django(f"sqlite:///{tmp_path}/console.sqlite3", tmp_path, SPLIT_DEVICES)
    docs, split, rows, back = out["docs"], out["split"], out["rows"], out["back"]
    acme_id, old_id = out["ids"]
    assert all(version > 3 for version, _ in split.values())           # read again by every node
    assert {slug: doc["schema"] for slug, (_, doc) in split.items()} == {"acme": 2, "old": 2, "gone": 2}
    assert not any("devices" in doc for _, doc in split.values())
    assert split["old"][1]["incarnation"] == old_id                     # named now: its rows are found
    assert [r[:3] for r in rows] == [["acme", acme_id, "a"], ["acme", acme_id, "b"], ["old", old_id, "c"]]
    assert rows[0][4] == docs["acme"]["devices"]["a"] and rows[1][4] == docs["acme"]["devices"]["b"]
    assert back["acme"] == docs["acme"] and back["gone"] == docs["gone"]
    assert back["old"] == dict(docs["old"], incarnation=old_id)


def test_an_imports_rows_are_what_its_devices_read_back_give(tenant):
    """An import writes its devices' rows from what it made (not read back: that held SQLite's write lock
    longer); they are the entries a rebuild from the database gives."""
    made = services.provision_devices(tenant, [{"name": "gw-1", "cert_cn": "gw-1.acme"}, {"name": "pump-2"}])
    assert len(made) == 2
    rows = {name: entry for name, (_inc, _v, entry) in device_rows("acme").items()}
    assert rows == services.policy_snapshot._devices(tenant)
