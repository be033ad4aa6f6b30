"""A node reading the devices' rows (schema 2, ``tenants_devicepolicy``) beside the tenants' snapshots
(brokerd/tenancy/source.py): a device's change is its row alone, applied to the tenant's policy of now;
a tenant new to the node, or made again under its slug, gets every row of its own incarnation."""

import asyncio
import json
import sqlite3

import pytest

from brokerd.tenancy.control import TenantControl
from brokerd.tenancy.source import PolicySource


def _doc(slug="acme", incarnation=1, **extra) -> str:
    return json.dumps({"schema": 2, "tenant": slug, "incarnation": incarnation, "status": "active",
                       "default_acl": "deny", "acl": [], "quota": {}, "sys": {"enabled": True},
                       "rules": [], "autosub": [], **extra})


def _entry(enabled=True, cn=None, cred=1) -> str:
    return json.dumps({"enabled": enabled, "cert_fingerprint": None, "cert_cn": cn,
                       "credentials": [{"id": cred, "hash": "sha256$" + "ab" * 32, "enabled": True,
                                        "expires_at": None}]})


class Console:
    """The console's two tables in a SQLite file, written as the console writes them."""

    def __init__(self, path):
        self.path = path
        self.version = 0
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE tenants_policysnapshot (id INTEGER PRIMARY KEY, tenant_slug TEXT UNIQUE, "
                       "version INTEGER, data TEXT)")
            db.execute("CREATE TABLE tenants_devicepolicy (id INTEGER PRIMARY KEY, tenant_slug TEXT, incarnation "
                       "INTEGER, name TEXT, version INTEGER, data TEXT, UNIQUE (tenant_slug, name))")

    def tenant(self, slug, data):
        self.version += 1
        with sqlite3.connect(self.path) as db:
            db.execute("INSERT INTO tenants_policysnapshot (tenant_slug, version, data) VALUES (?, ?, ?) "
                       "ON CONFLICT (tenant_slug) DO UPDATE SET version = excluded.version, data = excluded.data",
                       (slug, self.version, data))

    def devices(self, slug, incarnation, entries: dict):
        self.version += 1
        with sqlite3.connect(self.path) as db:
            for name, data in entries.items():
                db.execute("INSERT INTO tenants_devicepolicy (tenant_slug, incarnation, name, version, data) "
                           "VALUES (?, ?, ?, ?, ?) ON CONFLICT (tenant_slug, name) DO UPDATE SET "
                           "incarnation = excluded.incarnation, version = excluded.version, data = excluded.data",
                           (slug, incarnation, name, self.version, data))

    def drop_devices(self, slug):
        with sqlite3.connect(self.path) as db:
            db.execute("DELETE FROM tenants_devicepolicy WHERE tenant_slug = ?", (slug,))


@pytest.fixture
def console(tmp_path):
    return Console(tmp_path / "console.sqlite3")


class _Broker:
    """What ``PolicySource.poll`` asks of the broker, without clients to enforce on: the changes it is
    given to enforce, recorded as (tenant, the devices whose connections it judges again)."""

    def __init__(self):
        self.autosub = {}
        self.changes = []

    def forget_gone_tenants(self, now):
        pass

    def policy_steps(self, tenant, old, new, now, wall, clock=None):
        self.changes.append((tenant, new.changed_devices if new is not None else "deleted"))
        return iter(())


def poll(source: PolicySource) -> list[tuple]:
    """One poll of the node's poller; -> the changes it enforced: [(slug, changed devices)]."""
    source.broker.changes.clear()
    source.loop.run_until_complete(source.poll())
    return list(source.broker.changes)


@pytest.fixture
def source(console):
    loop = asyncio.new_event_loop()
    yield PolicySource(f"sqlite:///{console.path}", TenantControl(), _Broker(), loop, wall=lambda: 0.0)
    loop.close()


def devices(source, slug="acme") -> dict:
    return {name: (d.enabled, len(d.credentials)) for name, d in source.control.policies[slug].devices.items()}


def test_the_first_read_takes_every_row_and_a_devices_change_is_its_row_alone(console, source):
    console.tenant("acme", _doc())
    console.devices("acme", 1, {f"d{i}": _entry() for i in range(5)})
    console.tenant("globex", _doc("globex", 2))
    console.devices("globex", 2, {"g0": _entry()})
    poll(source)
    assert devices(source) == {f"d{i}": (True, 1) for i in range(5)}
    assert devices(source, "globex") == {"g0": (True, 1)}
    before = source.control.policies["acme"]

    console.devices("acme", 1, {"d1": _entry(enabled=False), "d4": None, "d9": _entry()})
    assert poll(source) == [("acme", frozenset({"d1", "d4", "d9"}))]
    after = source.control.policies["acme"]
    assert devices(source) == {"d0": (True, 1), "d1": (False, 1), "d2": (True, 1), "d3": (True, 1), "d9": (True, 1)}
    assert after.acl is before.acl and after.quota == before.quota and after.version == console.version
    assert before.devices["d1"].enabled          # the policy it replaced is left as it was
    assert poll(source) == []


def test_a_snapshot_and_device_rows_read_together_make_one_change(console, source):
    console.tenant("acme", _doc())
    console.devices("acme", 1, {"d0": _entry()})
    poll(source)
    console.devices("acme", 1, {"d1": _entry()})
    console.tenant("acme", _doc(default_acl="allow"))
    console.devices("acme", 1, {"d0": _entry(enabled=False)})
    assert [slug for slug, _ in poll(source)] == ["acme"]
    policy = source.control.policies["acme"]
    assert policy.default_allow and devices(source) == {"d0": (False, 1), "d1": (True, 1)}
    assert policy.version == console.version


def test_a_slug_made_again_between_two_reads_gets_its_own_devices_only(console, source):
    """The tenant deleted and made again (another incarnation) between two polls: the rows of the
    new one read at that poll are not all of them (those older than the node's version are not read
    again), so its devices are read whole; the old one's devices are gone with it."""
    console.tenant("acme", _doc())
    console.devices("acme", 1, {"old": _entry()})
    poll(source)
    console.drop_devices("acme")                     # delete_tenant
    console.tenant("acme", json.dumps({"schema": 2, "tenant": "acme", "status": "deleted"}))
    console.tenant("acme", _doc(incarnation=7))      # made again
    console.devices("acme", 7, {"new1": _entry()})
    console.devices("acme", 7, {"new2": _entry()})
    seen = source.control.version
    with sqlite3.connect(console.path) as db:        # new1's row as if read at the last poll already
        db.execute("UPDATE tenants_devicepolicy SET version = ? WHERE name = 'new1'", (seen,))
    poll(source)
    assert source.control.policies["acme"].incarnation == 7
    assert devices(source) == {"new1": (True, 1), "new2": (True, 1)}


def test_rows_of_another_incarnation_or_unknown_tenant_are_passed_and_an_unreadable_row_alone(console, source,
                                                                                                caplog):
    console.tenant("acme", _doc())
    console.devices("acme", 1, {"d0": _entry()})
    poll(source)
    console.devices("acme", 5, {"stale": _entry()})           # (a row of another incarnation of the slug)
    console.devices("nobody", 3, {"x": _entry()})
    console.devices("acme", 1, {"bad": '{"credentials": [{"hash": "no id"}]}', "d1": _entry(), "cut": '{"enab'})
    poll(source)
    assert devices(source) == {"d0": (True, 1), "d1": (True, 1)}
    assert "nobody" not in source.control.policies
    assert source.control.version == console.version
    assert "device 'bad' of tenant 'acme'" in caplog.text and "device 'cut' of tenant 'acme'" in caplog.text


def test_a_certificate_cn_another_device_names_is_judged_again_for_both(console, source):
    """Whether a CN identifies a device depends on whether another names it too: a device's row naming
    the CN of another makes that other device's connections judged again."""
    console.tenant("acme", _doc())
    console.devices("acme", 1, {"a": _entry(cn="gw"), "b": _entry()})
    poll(source)
    console.devices("acme", 1, {"b": _entry(cn="gw")})
    assert poll(source) == [("acme", frozenset({"a", "b"}))]
    assert source.control._cert_matches("acme", source.control.policies["acme"].devices["a"], None, "gw") is False


def test_a_database_error_reading_a_new_tenants_devices_is_tried_again_not_the_tenant_passed(console):
    """The devices of a tenant new to the node (or made again under its slug) are read by a statement
    of their own, after the poll's: the connection dropped there (the database restarted, a failover,
    the statement timed out) is a failed poll, tried again -- before, the tenant's snapshot was refused
    as if unreadable and its version passed: the node never had the tenant (nor a device added to it
    later, whose row alone came) until something else of the tenant changed, its devices refused."""
    console.tenant("acme", _doc())
    console.devices("acme", 1, {"d0": _entry()})

    async def run():
        source = PolicySource(f"sqlite:///{console.path}", TenantControl(), _Broker(), asyncio.get_running_loop(),
                              wall=lambda: 0.0)
        await source.poll()                                # the first read: acme
        console.tenant("globex", _doc("globex", 2))        # a new tenant, with a device
        console.devices("globex", 2, {"g0": _entry()})
        real, failed = source.db.fetch_devices, []

        def dropped(slug, incarnation):
            if not failed:
                failed.append(slug)
                raise sqlite3.OperationalError("disk I/O error")       # (psycopg: OperationalError)
            return real(slug, incarnation)

        source.db.fetch_devices = dropped
        try:
            await source.poll()
        except sqlite3.OperationalError:
            pass                                           # (the poller logs it and polls again)
        await source.poll()
        console.devices("globex", 2, {"g1": _entry()})     # a device added later: its row alone
        await source.poll()
        return source

    source = asyncio.run(run())
    assert "globex" in source.control.policies, "the new tenant never reached the node"
    assert devices(source, "globex") == {"g0": (True, 1), "g1": (True, 1)}


def test_a_console_not_migrated_yet_on_postgres_is_read_on_one_connection(postgres_db):
    """A node upgraded before its console (docs/operations.md's order) finds no device table: it reads
    the snapshots alone (schema 1) at each poll -- on the connection it has. Before, the refused
    statement closed it, and the node connected to PostgreSQL again twice a second until the console
    was migrated. Once the table comes, the next poll reads its rows."""
    import psycopg

    from brokerd.tenancy.source import pg_params

    with psycopg.connect(**pg_params(postgres_db), autocommit=True) as db:
        db.execute("CREATE TABLE tenants_policysnapshot (id serial PRIMARY KEY, tenant_slug text UNIQUE, "
                   "version bigint, data text)")
        legacy = json.loads(_doc())
        legacy.update(schema=1, devices={"d0": json.loads(_entry())})
        db.execute("INSERT INTO tenants_policysnapshot (tenant_slug, version, data) VALUES ('acme', 1, %s)",
                   (json.dumps(legacy),))
        loop = asyncio.new_event_loop()
        source = PolicySource(postgres_db, TenantControl(), _Broker(), loop, wall=lambda: 0.0)
        try:
            poll(source)
            backend = source.db.conn.info.backend_pid
            db.execute("UPDATE tenants_policysnapshot SET version = 2, data = %s",
                       (json.dumps({**legacy, "devices": {"d0": json.loads(_entry(enabled=False))}}),))
            assert [slug for slug, _ in poll(source)] == ["acme"]
            assert devices(source) == {"d0": (False, 1)}
            poll(source)
            assert source.db.conn is not None and source.db.conn.info.backend_pid == backend

            db.execute("CREATE TABLE tenants_devicepolicy (id serial PRIMARY KEY, tenant_slug text, incarnation "
                       "integer, name text, version bigint, data text, UNIQUE (tenant_slug, name))")
            db.execute("UPDATE tenants_policysnapshot SET version = 3, data = %s", (_doc(),))
            db.execute("INSERT INTO tenants_devicepolicy (tenant_slug, incarnation, name, version, data) "
                       "VALUES ('acme', 1, 'd0', 3, %s), ('acme', 1, 'd7', 4, %s)", (_entry(), _entry()))
            poll(source)
            assert devices(source) == {"d0": (True, 1), "d7": (True, 1)}
            assert source.db.conn.info.backend_pid == backend
        finally:
            source.db.close()
            loop.close()
