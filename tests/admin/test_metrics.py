"""A node's measurements as operators read them: ``GET /api/v1/metrics``
(JSON, what the console's dashboards poll), ``GET /metrics`` (Prometheus
text, tenant as a label) and the per-minute history rows in the console's
database -- each checked against traffic made by real paho clients, counted
by the test itself."""

import datetime
import re
import time
import urllib.error
import urllib.request

import pytest

from ..controlplane import ControlPlane
from ..mqtt import V5, V311, PahoClient
from .conftest import Http


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    plane = ControlPlane(tmp_path_factory.mktemp("console"))
    token = plane.issue_token("prometheus", "read")
    secrets = plane.provision([
        {"slug": "acme", "default_acl": "allow", "devices": ["s1", "p1", "p2"]},
        {"slug": "globex", "default_acl": "deny", "devices": ["g1"],
         "acl": [{"topic": "plant/#", "action": "both", "allow": True}]},
    ])
    node = plane.broker("--admin", "127.0.0.1:0", "--node-id", "m1", "--history-interval", "2")
    yield plane, node, token, secrets
    node.stop()


def device(node, secrets, who: str, version=V5) -> PahoClient:
    tenant, name = who.split("/")
    return PahoClient(f"{tenant}-{name}-{time.monotonic_ns()}", version=version, username=who,
                      password=secrets[who]).connect(node.port())


def metrics(node, token) -> dict:
    return Http(node.admin_url)("GET", "/api/v1/metrics", token=token)[2]


def prometheus(node, token) -> str:
    req = urllib.request.Request(node.admin_url + "/metrics", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
        return resp.read().decode()


def sample(text: str, name: str, **labels) -> float:
    """The value of one Prometheus sample (labels in any order)."""
    for line in text.splitlines():
        m = re.match(r"^(\w+)\{(.*)\} (\S+)$", line)
        if m and m.group(1) == name:
            got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
            if all(got.get(k) == v for k, v in labels.items()):
                return float(m.group(3))
    raise AssertionError(f"no sample {name}{labels}")


def wait_for(fn, timeout=5.0):
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def test_tenant_traffic_counted_per_qos_in_json_and_prometheus(world):
    plane, node, token, secrets = world
    before = metrics(node, token)["tenants"].get("acme")
    sub = device(node, secrets, "acme/s1")
    sub.subscribe("t/#", qos=2)
    pub = device(node, secrets, "acme/p1")
    sent = {0: 7, 1: 5, 2: 3}
    for qos, n in sent.items():
        for i in range(n):
            pub.publish(f"t/{qos}", f"m{i}".encode(), qos=qos)
    got = sub.expect_n(sum(sent.values()))
    assert len(got) == 15
    snap = metrics(node, token)
    acme = snap["tenants"]["acme"]
    base_in = before["messages_in"] if before else {"0": 0, "1": 0, "2": 0}
    base_out = before["messages_out"] if before else {"0": 0, "1": 0, "2": 0}
    assert {q: acme["messages_in"][q] - base_in[q] for q in "012"} == {"0": 7, "1": 5, "2": 3}
    assert {q: acme["messages_out"][q] - base_out[q] for q in "012"} == {"0": 7, "1": 5, "2": 3}
    assert acme["connections"] == 2 and acme["subscriptions"] >= 1
    assert "globex" not in snap["tenants"] or snap["tenants"]["globex"]["messages_in"] == {"0": 0, "1": 0, "2": 0}
    node_row = snap["items"][0]
    assert node_row["node"] == "m1" and node_row["health"] == "ok"
    assert node_row["memory_rss"] > 10_000_000 and node_row["cpu_seconds"] > 0 and node_row["loop_lag"] < 1
    assert snap["cluster"]["messages_in"]["0"] >= 7

    text = prometheus(node, token)
    assert sample(text, "brokerd_messages_received_total", tenant="acme", qos="1", node="m1") == acme["messages_in"]["1"]
    assert sample(text, "brokerd_messages_sent_total", tenant="acme", qos="2") == acme["messages_out"]["2"]
    assert sample(text, "brokerd_connections", tenant="acme") == 2
    assert sample(text, "brokerd_bytes_received_total", tenant="acme") > 15
    assert sample(text, "brokerd_up", node="m1") == 1
    assert "process_resident_memory_bytes " in text and "process_cpu_seconds_total " in text
    sub.disconnect()
    pub.disconnect()


def test_drops_and_rejections_counted_by_reason_for_the_right_tenant(world):
    plane, node, token, secrets = world
    a = device(node, secrets, "acme/s1")        # acme is on the node too (listed even when run alone)
    g = device(node, secrets, "globex/g1", version=V5)
    start = metrics(node, token)["tenants"]["globex"]
    info = g.client.publish("office/door", b"x", qos=1)          # not in globex's ACL: denied
    info.wait_for_publish(5)
    g.publish("plant/nobody-listens", b"x", qos=1)              # allowed, nobody subscribed
    bad = PahoClient(f"bad-{time.monotonic_ns()}", version=V311, username="globex/g1", password="wrong")
    with pytest.raises(ConnectionError):
        bad.connect(node.port())
    end = wait_for(lambda: (m := metrics(node, token)["tenants"]["globex"])["dropped"]["no_subscribers"]
                   > start["dropped"]["no_subscribers"] and m)
    assert end["dropped"]["acl_denied"] - start["dropped"]["acl_denied"] == 1
    assert end["dropped"]["no_subscribers"] - start["dropped"]["no_subscribers"] == 1
    assert end["auth_failures"] - start["auth_failures"] == 1
    acme = metrics(node, token)["tenants"]["acme"]
    text = prometheus(node, token)
    assert sample(text, "brokerd_messages_dropped_total", tenant="globex", reason="acl_denied") == \
        end["dropped"]["acl_denied"]
    assert sample(text, "brokerd_messages_dropped_total", tenant="acme", reason="acl_denied") == \
        acme["dropped"]["acl_denied"] == 0
    g.disconnect()
    a.disconnect()


def test_latency_histogram_fills_from_sampled_messages(world):
    plane, node, token, secrets = world
    sub = device(node, secrets, "acme/s1")
    sub.subscribe("lat/#", qos=0)
    pub = device(node, secrets, "acme/p2")
    for i in range(400):
        pub.publish("lat/x", b"%d" % i, qos=0)
    sub.expect_n(400)
    lat = metrics(node, token)["items"][0]["latency"]
    assert lat["count"] >= 400 // 64 - 1
    assert lat["buckets"][-1] == ["+Inf", lat["count"]]
    counts = [n for _, n in lat["buckets"]]
    assert counts == sorted(counts)                       # cumulative
    assert 0 < lat["sum"] / lat["count"] < 0.5            # a loopback delivery takes well under 0.5 s
    text = prometheus(node, token)
    assert sample(text, "brokerd_delivery_latency_seconds_count", node="m1") == lat["count"]
    sub.disconnect()
    pub.disconnect()


def test_history_rows_per_period_and_hour_rows_add_them_up(world):
    plane, node, token, secrets = world
    pub = device(node, secrets, "acme/p1")
    marker = time.time()
    for _ in range(20):
        pub.publish("hist/x", b"y", qos=1)
    # the rows of the periods after the publishes are written within two periods (2 s here)
    since = datetime.datetime.fromtimestamp(marker - 2, datetime.UTC).replace(tzinfo=None).isoformat(" ")

    def rows():
        return plane.query("SELECT at, connections, messages_in FROM metrics_sample WHERE node='m1' AND "
                           "tenant='acme' AND resolution='m' AND at >= ?", (since,))
    assert wait_for(lambda: sum(r[2] for r in rows()) >= 20, timeout=8), rows()
    assert max(r[1] for r in rows()) >= 1
    pub.disconnect()
    time.sleep(2.5)
    minutes = plane.query("SELECT at, messages_in, bytes_in, connects FROM metrics_sample WHERE node='m1' AND "
                          "tenant='acme' AND resolution='m'")
    hours = plane.query("SELECT at, messages_in, bytes_in, connects FROM metrics_sample WHERE node='m1' AND "
                        "tenant='acme' AND resolution='h'")
    by_hour: dict[str, list] = {}
    for at, m, b, c in minutes:
        hour = at[:13] + ":00:00"
        acc = by_hour.setdefault(hour, [0, 0, 0])
        acc[0] += m
        acc[1] += b
        acc[2] += c
    assert {at: [m, b, c] for at, m, b, c in hours} == by_hour
    # the node's own row is there for every period, tenant ""
    assert plane.query("SELECT count(*) FROM metrics_sample WHERE node='m1' AND tenant='' AND resolution='m'")[0][0] >= 2


def test_metrics_need_a_token(world):
    plane, node, token, secrets = world
    for path in ("/metrics", "/api/v1/metrics"):
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(node.admin_url + path, timeout=5)
        assert err.value.code == 401



def test_history_of_periods_the_database_refused_is_written_once_it_takes_writes(tmp_path):
    """A minute's row the console's database refused (down, locked past the timeout, failing over)
    was lost: the node had already moved its counters on, and wrote only the next minute's
    difference once the database came back ("the next minute tries again" -- it did not)."""
    import sqlite3

    plane = ControlPlane(tmp_path)
    secrets = plane.provision([{"slug": "acme", "default_acl": "allow", "devices": ["p1"]}])
    node = plane.broker("--node-id", "h1", "--history-interval", "1")

    def ddl(sql):
        conn = sqlite3.connect(plane.dir / "console.sqlite3", isolation_level=None, timeout=10)
        try:
            conn.execute(sql)
        finally:
            conn.close()

    def written():
        return plane.query("SELECT coalesce(sum(messages_in), 0) FROM metrics_sample WHERE node='h1' AND "
                           "tenant='acme' AND resolution='m'")[0][0]

    try:
        pub = device(node, secrets, "acme/p1")
        assert wait_for(lambda: plane.query("SELECT count(*) FROM metrics_sample WHERE node='h1'")[0][0], 5)
        ddl("ALTER TABLE metrics_sample RENAME TO metrics_sample_away")         # the database refuses the rows
        try:
            for _ in range(20):
                pub.publish("hist/x", b"y", qos=1)
            assert wait_for(lambda: node.log.count("metrics history not written") >= 2, 6), node.log
        finally:
            ddl("ALTER TABLE metrics_sample_away RENAME TO metrics_sample")
        for _ in range(5):
            pub.publish("hist/x", b"y", qos=1)
        wait_for(lambda: written() >= 25, 6)
        time.sleep(1.5)
        assert written() == 25                                  # each message once, none lost, none twice
        pub.disconnect()
    finally:
        node.stop()
