"""The console database on PostgreSQL, as production runs it: migrated and
provisioned with ``manage.py``, read and written by a real brokerd node
started with ``--control-plane postgres://...`` (plain SQL through psycopg,
no Django), observed with real paho clients and over the admin API.

One PostgreSQL server for the test session (``tests/postgres.py``), one
database, console and node for this module; each test uses its own tenant
where it changes policy, so the tests do not depend on their order.
"""

import datetime
import json
import time
import uuid

import pytest

from ..admin.conftest import Http
from ..controlplane import ControlPlane
from ..mqtt import V5, V311, PahoClient
from .test_enforcement import connack_code, wait_until

pytestmark = pytest.mark.slow

RULES = [{"topic": "{device}/#", "action": "both", "allow": True}]
NODE = "pg1"


@pytest.fixture(scope="module")
def world(postgres, tmp_path_factory):
    url = postgres.create_database(f"pgcp{uuid.uuid4().hex[:12]}")
    plane = ControlPlane(tmp_path_factory.mktemp("pgconsole"), database_url=url)
    secrets = plane.provision([
        {"slug": "acme", "acl": RULES, "devices": ["dev1", "dev2"]},
        {"slug": "globex", "default_acl": "allow", "devices": ["g1"]},
        {"slug": "initech", "default_acl": "allow", "devices": ["printer"]},
        {"slug": "umbrella", "acl": RULES, "devices": ["u1"]},
    ])
    # application_name: libpq parameters in the URL's query reach the server, as Django passes them
    node = plane.broker("--control-plane", url + f"?application_name=brokerd-{NODE}", "--node-id", NODE,
                        "--admin", "127.0.0.1:0", "--history-interval", "1")
    yield plane, node, secrets
    node.stop()


def device(secrets, who: str, version=V5, client_id: str | None = None) -> PahoClient:
    tenant, _, name = who.partition("/")
    return PahoClient(client_id or f"{name}-{time.monotonic_ns()}", version, username=who, password=secrets[who])


def test_node_reads_the_console_database_on_postgres(world, postgres):
    plane, node, secrets = world
    assert plane.query("SELECT version()")[0][0].startswith("PostgreSQL")
    assert any("control plane postgres://" in line and "4 tenants loaded" in line for line in node.output)
    # the node's connection to the console database, named as its URL asked
    names = [r[0] for r in plane.query("SELECT application_name FROM pg_stat_activity WHERE datname = "
                                       "current_database()")]
    assert f"brokerd-{NODE}" in names, names


@pytest.mark.parametrize("version,bad", [(V5, 0x86), (V311, 4)], ids=["v5", "v3.1.1"])
def test_provisioned_device_connects_and_a_wrong_secret_is_refused(world, version, bad):
    plane, node, secrets = world
    with device(secrets, "acme/dev1", version).connect(node.port()) as c:
        assert [r.value for r in c.subscribe("dev1/#", 1)] == [1]
        c.publish("dev1/temp", b"21", qos=1)
        assert c.expect().payload == b"21"
    wrong = PahoClient(f"w-{time.monotonic_ns()}", version, username="acme/dev1", password="not-the-secret")
    assert connack_code(wrong, node.port()) == bad
    other_tenant = PahoClient(f"o-{time.monotonic_ns()}", version, username="acme/dev1",
                              password=secrets["globex/g1"])
    assert connack_code(other_tenant, node.port()) == bad


def test_acl_rule_added_through_the_console_is_enforced_within_2_seconds(world):
    plane, node, secrets = world
    with device(secrets, "umbrella/u1").connect(node.port()) as u1:
        assert [r.value for r in u1.subscribe("alerts/#", 1)] == [0x87]
        out = plane.shell("import time\nfrom tenants import services\nfrom tenants.models import Tenant\n"
                          "services.add_acl_rule(Tenant.objects.get(slug='umbrella'), topic='alerts/#', "
                          "action='subscribe', allow=True, position=1)\nprint('COMMITTED', time.time())")
        committed = float([ln for ln in out.splitlines() if ln.startswith("COMMITTED ")][-1].split()[1])
        wait_until(lambda: u1.subscribe("alerts/#", 1)[0].value == 1, timeout=5, what="the new rule")
        assert time.time() - committed < 2.0
        # and the rule is the console's: publishing there is still refused (subscribe only)
        got = {}
        u1.client.on_publish = lambda c, u, mid, rc, p: got.setdefault(mid, rc.value)
        mid = u1.client.publish("alerts/fire", b"x", qos=1).mid
        wait_until(lambda: mid in got, what="PUBACK")
        assert got[mid] == 0x87


def test_suspending_the_tenant_disconnects_its_device(world):
    plane, node, secrets = world
    c = device(secrets, "initech/printer").connect(node.port())
    other = device(secrets, "globex/g1").connect(node.port())
    try:
        plane.shell("from tenants import services\nfrom tenants.models import Tenant\n"
                    "services.suspend_tenant(Tenant.objects.get(slug='initech'))")
        reason, _ = c.expect_disconnect(timeout=5)
        assert reason.value == 0x87
        assert connack_code(device(secrets, "initech/printer"), node.port()) == 0x87
        assert other.client.is_connected()       # another tenant is not affected
        assert other.subscribe("x", 0)
        plane.manage("tenants", "resume", "initech")
        wait_until(lambda: connack_code(device(secrets, "initech/printer"), node.port()) == 0, what="resume")
    finally:
        other.disconnect()


def test_console_token_authenticates_and_an_api_write_lands_in_the_audit_log(world):
    plane, node, secrets = world
    http = Http(node.admin_url)
    write = plane.issue_token("ops", "write")
    read = plane.issue_token("grafana", "read")
    deadline = time.monotonic() + 5
    # tokens are re-read every poll
    while not all(http("GET", "/api/v1/nodes", token=t)[0] == 200 for t in (write, read)):
        assert time.monotonic() < deadline, "a console token never became valid"
        time.sleep(0.1)
    status, _, body = http("GET", "/api/v1/nodes", token=read)
    assert status == 200 and [n["id"] for n in body["items"]] == [NODE]
    assert http("GET", "/api/v1/nodes", token="mqh_not-a-token")[0] == 401
    client_id = f"kickme-{time.monotonic_ns()}"
    c = device(secrets, "acme/dev2", client_id=client_id).connect(node.port())
    assert http("DELETE", f"/api/v1/clients/acme/{client_id}", token=read)[0] == 403
    before = datetime.datetime.now(datetime.UTC)
    status, _, body = http("DELETE", f"/api/v1/clients/acme/{client_id}", token=write)
    assert (status, body["kicked"]) == (200, True)
    c.expect_disconnect()
    rows = []
    deadline = time.monotonic() + 5
    while not rows and time.monotonic() < deadline:
        rows = plane.query("SELECT at, actor, source, action, object_type, tenant, before, remote_addr "
                           "FROM console_auditevent WHERE object_id = ?", (client_id,))
        time.sleep(0.05)
    assert len(rows) == 1, rows
    at, actor, source, action, otype, tenant, before_json, addr = rows[0]
    assert actor == "api-token:ops"     # a console-made token names no console user (tests/admin/test_tokens.py)
    assert (source, action, otype, tenant) == ("api", "client.kick", "client", "acme")
    assert client_id in before_json and addr.startswith("127.0.0.1")
    # a timestamp with its time zone: the moment of the kick, whatever the session's zone
    assert abs((at - before).total_seconds()) < 5, (at, before)
    # the console reads it back as the audit page shows it
    out = plane.shell("from core.models import AuditEvent\n"
                      f"e = AuditEvent.objects.get(object_id={client_id!r})\n"
                      "print('EVENT', e.at.timestamp(), e.actor)")
    line = [ln for ln in out.splitlines() if ln.startswith("EVENT ")][-1].split(" ", 2)
    assert abs(float(line[1]) - before.timestamp()) < 5 and line[2] == actor


def test_every_api_write_is_audited_on_postgres(world):
    """PostgreSQL text cannot hold U+0000 (SQLite can): a write the audit log
    could not record is refused, as MQTT refuses such names, and whatever
    reaches the audit log is stored."""
    plane, node, secrets = world
    http = Http(node.admin_url)
    write = plane.issue_token("nul-ops", "write")
    wait_until(lambda: http("GET", "/api/v1/nodes", token=write)[0] == 200, what="the token")
    with device(secrets, "globex/g1").connect(node.port()) as watcher:
        watcher.subscribe("#", 0)
        for tenant, topic in (("globex", "plant/\u0000x"), ("glo\u0000bex", "plant/x")):
            status, _, body = http("POST", "/api/v1/publish", token=write,
                                   body={"tenant": tenant, "topic": topic, "payload": "x"})
            assert status == 400, (tenant, topic, status, body)
        watcher.expect_none(0.3)
        client_id = f"sub-{time.monotonic_ns()}"
        with device(secrets, "globex/g1", client_id=client_id).connect(node.port()):
            status, _, body = http("POST", f"/api/v1/clients/globex/{client_id}/subscriptions", token=write,
                                   body={"filter": "a/\u0000/#", "qos": 1})
            assert status == 400, body
        status, _, _ = http("POST", "/api/v1/publish", token=write,
                            body={"tenant": "globex", "topic": "plant/\u00fcber", "payload": "x"})
        assert status == 200
    rows = []
    deadline = time.monotonic() + 5
    while not rows and time.monotonic() < deadline:
        rows = plane.query("SELECT actor, action, object_id, tenant FROM console_auditevent "
                           "WHERE actor LIKE ?", ("%nul-ops%",))
        time.sleep(0.05)
    assert rows == [("api-token:nul-ops", "message.publish", "plant/\u00fcber", "globex")]
    assert not any("audit event not written" in line for line in node.output)


def test_audit_rows_with_text_postgres_cannot_store_are_written_not_lost(world):
    """brokerd's own writer, on the module's database: U+0000 and a lone
    surrogate (both possible in JSON) become replacement characters."""
    from brokerd.tenancy.source import PolicyDatabase

    plane, node, secrets = world
    oid = f"odd-{time.monotonic_ns()}"
    PolicyDatabase(plane.url).insert_audit({
        "at": time.time(), "actor": "api-token:x\x00y", "source": "api", "action": "client.kick",
        "object_type": "client", "object_id": oid + "\x00", "tenant": "t\ud800", "before": {"k": "v\x00"},
        "after": None, "remote_addr": "127.0.0.1:1"})
    assert plane.query("SELECT actor, tenant, before FROM console_auditevent WHERE object_id = ?",
                       (oid + "\ufffd",)) == [("api-token:x\ufffdy", "t?", '{"k": "v\\u0000"}')]


def test_metrics_history_rows_land_in_metrics_sample(world):
    plane, node, secrets = world
    start = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=1)
    with device(secrets, "acme/dev1").connect(node.port()) as pub:
        for _ in range(20):
            pub.publish("dev1/hist", b"y", qos=1)

        def sent():
            return plane.query("SELECT coalesce(sum(messages_in), 0) FROM metrics_sample WHERE node = ? AND "
                               "tenant = 'acme' AND resolution = 'm' AND at >= ?", (NODE, start))[0][0]
        wait_until(lambda: sent() >= 20, timeout=8, what="history rows of the publishes")
    time.sleep(1.5)                     # the period of the disconnect is written too
    # one statement, one snapshot: a period's minute and hour rows are written in one transaction
    rows = plane.query("SELECT resolution, at, connections, messages_in, bytes_in, connects FROM metrics_sample "
                       "WHERE node = ? AND tenant = 'acme'", (NODE,))
    minutes = [r[1:] for r in rows if r[0] == "m"]
    hours = [r[1:] for r in rows if r[0] == "h"]
    now = datetime.datetime.now(datetime.UTC)
    for at, *_ in minutes:                # periods start on the wall clock's second (--history-interval 1)
        assert at.tzinfo is not None and at.microsecond == 0 and now - at < datetime.timedelta(minutes=10), at
    assert max(r[1] for r in minutes) >= 1
    # each hour row adds up its periods (the upsert), its peak is theirs
    by_hour: dict = {}
    for at, conns, m, b, c in minutes:
        acc = by_hour.setdefault(at.replace(minute=0, second=0), [0, 0, 0, 0])
        acc[0] = max(acc[0], conns)
        acc[1] += m
        acc[2] += b
        acc[3] += c
    assert {at: list(v) for at, *v in hours} == by_hour
    # the node's own row (tenant "") every period (three of them: a node started just now, as when this
    # test runs alone, may have written two so far)
    wait_until(lambda: plane.query("SELECT count(*) FROM metrics_sample WHERE node = ? AND tenant = '' AND "
                                   "resolution = 'm'", (NODE,))[0][0] >= 3, timeout=8, what="three node rows")
    # and the console's history chart reads them
    out = plane.shell("import json\nfrom metrics.history_queries import series\n"
                      "print('TOTALS', json.dumps(series('1h', tenant='acme')['totals']))")
    totals = json.loads([ln for ln in out.splitlines() if ln.startswith("TOTALS ")][-1][7:])
    assert totals["messages_in"] >= 20 and totals["connections_peak"] >= 1, totals


def test_database_outage_keeps_devices_served_and_the_node_recovers(world, postgres):
    """Last in the module: the database refuses connections for a while."""
    plane, node, secrets = world
    dbname = plane.url.rsplit("/", 1)[1]
    live = device(secrets, "globex/g1").connect(node.port())
    try:
        postgres.execute(f'ALTER DATABASE "{dbname}" WITH ALLOW_CONNECTIONS false')
        postgres.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                         f"WHERE application_name = 'brokerd-{NODE}'")
        wait_until(lambda: any("unreachable" in line for line in node.output), what="the outage logged")
        # served from the node's cache: the connected device stays, a known one still gets in
        assert live.client.is_connected() and live.subscribe("x/#", 0)
        with device(secrets, "acme/dev2").connect(node.port()) as c:
            assert [r.value for r in c.subscribe("dev2/#", 1)] == [1]
        assert connack_code(PahoClient(f"w-{time.monotonic_ns()}", V5, username="acme/dev2", password="nope"),
                            node.port()) == 0x86
    finally:
        postgres.execute(f'ALTER DATABASE "{dbname}" WITH ALLOW_CONNECTIONS true')
    wait_until(lambda: any("reachable again" in line for line in node.output), timeout=5, what="recovery")
    # and changes made in the console reach the node again
    plane.manage("devices", "disable", "globex", "g1")
    reason, _ = live.expect_disconnect(timeout=5)
    assert reason.value == 0x87


def test_the_nodes_connection_bounds_every_wait(postgres):
    """A query cannot hold the node's poll for long (statement_timeout) and a server or
    network gone silent is given up on (TCP keepalives, tcp_user_timeout), whatever the URL
    already asks for."""
    import psycopg

    from brokerd.tenancy.source import pg_params

    params = pg_params(postgres.url() + "?options=-c%20work_mem%3D8MB&application_name=bounds")
    assert (params["keepalives"], params["tcp_user_timeout"]) == (1, 20000)
    with psycopg.connect(**params, autocommit=True) as conn:
        assert conn.execute("SHOW statement_timeout").fetchone()[0] == "10s"
        assert conn.execute("SHOW work_mem").fetchone()[0] == "8MB"
        assert conn.execute("SHOW application_name").fetchone()[0] == "bounds"
