"""Issue #4 end to end: tenants provisioned through the Django layer and
enforced by a running brokerd, observed with real MQTT clients."""

import socket
import time
from urllib.parse import quote

import pytest

from ..admin.conftest import Http
from ..mqtt import TIMEOUT, V5, V311, PahoClient
from ..procs import BrokerProcess

RULES = [  # each device publishes and reads its own subtree; every device reads "broadcast/#"
    {"topic": "{device}/#", "action": "both", "allow": True},
    {"topic": "broadcast/#", "action": "subscribe", "allow": True},
]


def client(secrets, who, version=V5, client_id=None, clean=True):
    tenant, _, device = who.partition("/")
    return PahoClient(client_id or f"{device}-{time.monotonic_ns()}", version, clean=clean, username=who,
                      password=secrets[who])


# paho reports a 3.1.1 CONNACK return code as the MQTT 5 reason code it stands for
V3_AS_V5 = {0: 0, 1: 0x84, 2: 0x85, 3: 0x88, 4: 0x86, 5: 0x87}


def connack_code(c: PahoClient, port: int, timeout: float = TIMEOUT) -> int:
    """The CONNACK code: a 5.0 reason code, or for 3.1.1 the 3.1.1 return code; then
    the connection is closed (a DISCONNECT if it was accepted).

    The calling thread drives paho's loop: stopping a network thread (``loop_start``)
    waits out its 1 s select when the connection is open, or its 1 s reconnect pause
    after a refusal -- up to a second a call, in tests that make dozens."""
    c.client.connect("127.0.0.1", port, keepalive=60, **({"clean_start": c.clean} if c.version == V5 else {}))
    deadline = time.monotonic() + timeout
    while c.connack.empty() and c.client.socket() is not None and time.monotonic() < deadline:
        c.client.loop(timeout=0.05)
    flags, code, _ = c.connack_result(timeout=0)
    c.client.disconnect()
    while c.client.socket() is not None and time.monotonic() < deadline:
        c.client.loop(timeout=0.05)
    if c.version == V5:
        return code.value
    return {v: k for k, v in V3_AS_V5.items()}[code.value]


def wait_until(pred, timeout=5.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return time.monotonic()
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def acme(control_plane):
    secrets = control_plane.provision([
        {"slug": "acme", "acl": RULES, "devices": ["dev1", "dev2"]},
        {"slug": "globex", "acl": RULES, "devices": ["dev1"]},
    ])
    node = control_plane.broker()
    yield control_plane, node, secrets
    node.stop()


def test_device_connects_with_generated_secret_printed_by_manage_py(control_plane):
    control_plane.manage("tenants", "create", "initech")
    secret = control_plane.device("initech", "printer")
    node = control_plane.broker()
    try:
        for version in (V311, V5):
            with PahoClient(f"printer-{version}", version, username="initech/printer",
                            password=secret).connect(node.port()) as c:
                assert c.subscribe("x", 0)
    finally:
        node.stop()


@pytest.mark.parametrize("version,bad,not_authorized", [(V5, 0x86, 0x87), (V311, 4, 5)])
def test_wrong_unknown_and_missing_credentials_are_refused(acme, version, bad, not_authorized):
    cp, node, secrets = acme
    port = node.port()
    wrong = PahoClient("w", version, username="acme/dev1", password="not-the-secret")
    assert connack_code(wrong, port) == bad
    unknown_device = PahoClient("u", version, username="acme/nobody", password=secrets["acme/dev1"])
    assert connack_code(unknown_device, port) == bad
    unknown_tenant = PahoClient("t", version, username="nobody/dev1", password=secrets["acme/dev1"])
    assert connack_code(unknown_tenant, port) == bad
    other_tenants_secret = PahoClient("o", version, username="acme/dev1", password=secrets["globex/dev1"])
    assert connack_code(other_tenants_secret, port) == bad
    anonymous = PahoClient("a", version)
    assert connack_code(anonymous, port) == not_authorized


def test_acl_publish_and_subscribe_with_exact_reason_codes(acme):
    cp, node, secrets = acme
    port = node.port()
    with client(secrets, "acme/dev1").connect(port) as d1, client(secrets, "acme/dev2").connect(port) as d2, \
            client(secrets, "acme/dev1", V311).connect(port) as d1v3:
        # subscribe: own subtree and broadcast granted, another device's refused
        assert [c.value for c in d1.subscribe("dev1/#", 1)] == [1]
        assert [c.value for c in d1.subscribe("broadcast/+", 1)] == [1]
        assert [c.value for c in d1.subscribe("dev2/#", 1)] == [0x87]
        assert [c.value for c in d1v3.subscribe("dev2/#", 1)] == [0x80]
        # publish: to its own subtree allowed, elsewhere PUBACK 0x87 (v5) and nothing delivered
        d2.subscribe("dev2/#", 1)
        assert d1.publish("dev1/temp", b"21", qos=1).rc == 0
        assert d1.expect().payload == b"21"
        info = d1.client.publish("dev2/cmd", b"intrusion", qos=1)
        info.wait_for_publish(5)
        d2.expect_none(0.5)
        got = {}
        d1.client.on_publish = lambda c, u, mid, rc, p: got.setdefault(mid, rc.value)
        mid = d1.client.publish("broadcast/all", b"not allowed to publish", qos=1).mid
        wait_until(lambda: mid in got, what="PUBACK")
        assert got[mid] == 0x87
        # 3.1.1 has no negative PUBACK: the message is acknowledged and dropped
        d1v3.publish("dev2/cmd", b"v3 intrusion", qos=1)
        d1v3.publish("dev2/cmd", b"v3 qos0", qos=0)
        d2.expect_none(0.5)


def test_tenants_never_see_each_other_even_with_wildcards(control_plane):
    secrets = control_plane.provision([
        {"slug": "red", "default_acl": "allow", "devices": ["a"]},
        {"slug": "blue", "default_acl": "allow", "devices": ["a"]},
    ])
    node = control_plane.broker()
    try:
        port = node.port()
        with client(secrets, "red/a", client_id="same-id").connect(port) as red, \
                client(secrets, "blue/a", client_id="same-id").connect(port) as blue:
            red.subscribe("#", 1)
            blue.subscribe("#", 1)
            red.subscribe("$share/g/#", 1)
            red.publish("sensors/1", b"red", qos=1, retain=True)
            blue.publish("sensors/1", b"blue", qos=1, retain=True)
            assert {m.payload for m in red.expect_n(2)} == {b"red"}
            assert {m.payload for m in blue.expect_n(1)} == {b"blue"}
            blue.expect_none(0.5)
            # retained messages stay in their tenant too, and the same client id is two sessions
            with client(secrets, "blue/a", client_id="late").connect(port) as late:
                late.subscribe("sensors/#", 1)
                assert [m.payload for m in late.expect_n(1)] == [b"blue"]
                late.expect_none(0.3)
    finally:
        node.stop()


@pytest.mark.parametrize("version,code", [(V5, 0x97), (V311, 3)])
def test_connection_quota(control_plane, version, code):
    secrets = control_plane.provision([{"slug": "small", "default_acl": "allow", "devices": ["d"],
                                        "quota": {"max_connections": 2}}])
    node = control_plane.broker()
    try:
        port = node.port()
        with client(secrets, "small/d", version).connect(port), client(secrets, "small/d", version).connect(port):
            assert connack_code(client(secrets, "small/d", version), port) == code
        # the quota counts live connections: once they are gone there is room again
        wait_until(lambda: connack_code(client(secrets, "small/d", version), port) == 0, what="room again")
    finally:
        node.stop()


def test_revoking_a_credential_disconnects_the_client_within_2_seconds(acme):
    cp, node, secrets = acme
    c = client(secrets, "acme/dev2").connect(node.port())
    cp.manage("devices", "disable", "acme", "dev2")
    committed = time.monotonic()            # manage.py has ended: the change is in the database
    reason, _ = c.expect_disconnect(timeout=10)
    assert reason.value == 0x87
    # the promise is about the node, from the commit (manage.py's own start-up is not the node's)
    assert c.disconnected_at - committed < 2, c.disconnected_at - committed
    assert connack_code(client(secrets, "acme/dev2"), node.port()) == 0x87


def test_a_policy_change_reaches_a_running_node_within_2_seconds(acme):
    cp, node, secrets = acme
    with client(secrets, "acme/dev1").connect(node.port()) as d1:
        assert [c.value for c in d1.subscribe("alerts/#", 1)] == [0x87]
        proc = cp.manage("acl", "add", "acme", "--allow", "--action", "subscribe", "--topic", "alerts/#",
                         "--position", "1")
        committed = time.monotonic()
        assert proc.returncode == 0
        granted = wait_until(lambda: d1.subscribe("alerts/#", 1)[0].value == 1, timeout=5, what="new rule")
        assert granted - committed < 2.0


def test_suspending_a_tenant_disconnects_and_refuses_its_devices(acme):
    cp, node, secrets = acme
    c = client(secrets, "acme/dev1").connect(node.port())
    other = client(secrets, "globex/dev1").connect(node.port())
    cp.manage("tenants", "suspend", "acme")
    reason, _ = c.expect_disconnect(timeout=5)
    assert reason.value == 0x87
    assert connack_code(client(secrets, "acme/dev2"), node.port()) == 0x87
    assert connack_code(client(secrets, "acme/dev2", V311), node.port()) == 5
    other.subscribe("dev1/x", 0)          # another tenant is not affected
    other.disconnect()
    cp.manage("tenants", "resume", "acme")
    wait_until(lambda: connack_code(client(secrets, "acme/dev2"), node.port()) == 0, what="resume")


def test_console_database_unreachable_keeps_serving_from_cache(acme):
    cp, node, secrets = acme
    db = cp.dir / "console.sqlite3"
    live = client(secrets, "acme/dev1").connect(node.port())
    db.rename(cp.dir / "console.sqlite3.away")
    try:
        wait_until(lambda: "unreachable" in node.log, timeout=5, what="outage logged")
        # the connected device stays, another authorised device can still connect
        live.subscribe("dev1/#", 1)
        live.publish("dev1/t", b"still here", qos=1)
        assert live.expect().payload == b"still here"
        assert connack_code(client(secrets, "acme/dev2"), node.port()) == 0
        assert connack_code(PahoClient("x", V5, username="acme/dev2", password="wrong"), node.port()) == 0x86
    finally:
        (cp.dir / "console.sqlite3.away").rename(db)
        live.disconnect()
    wait_until(lambda: "reachable again" in node.log, timeout=5, what="recovery logged")


def test_connect_rate_quota(control_plane):
    """connect_rate 2/s: a burst of 6 CONNECTs (raw sockets, back to back) gets 2 accepted
    and the rest CONNACK 0x9F (3.1.1: 3)."""
    from ..integration.raw import connect_packet

    secrets = control_plane.provision([{"slug": "burst", "default_acl": "allow", "devices": ["d"],
                                        "quota": {"connect_rate": 2}}])
    node = control_plane.broker()
    try:
        socks = []
        for i in range(6):
            s = socket.create_connection(("127.0.0.1", node.port()), timeout=5)
            s.sendall(connect_packet(f"burst-{i}", 5, username="burst/d", password=secrets["burst/d"].encode()))
            socks.append(s)
        codes = [s.recv(64)[3] for s in socks]          # CONNACK: 0x20, length, flags, reason
        for s in socks:
            s.close()
        assert codes.count(0) == 2 and codes.count(0x9F) == 4, codes
    finally:
        node.stop()


def test_payload_subscription_and_retained_quotas(control_plane):
    secrets = control_plane.provision([{"slug": "q", "default_acl": "allow", "devices": ["d"],
                                        "quota": {"max_payload": 100, "max_subscriptions": 2, "max_retained": 1}}])
    node = control_plane.broker()
    try:
        with client(secrets, "q/d").connect(node.port()) as c:
            assert [x.value for x in c.subscribe("a", 0)] == [0]
            assert [x.value for x in c.subscribe("b", 0)] == [0]
            assert [x.value for x in c.subscribe("c", 0)] == [0x97]
            assert [x.value for x in c.subscribe("a", 1)] == [1]        # replacing one is not a new one
            got = {}
            c.client.on_publish = lambda cl, u, mid, rc, p: got.setdefault(mid, rc.value)
            first = c.client.publish("r1", b"x", qos=1, retain=True).mid
            second = c.client.publish("r2", b"y", qos=1, retain=True).mid
            wait_until(lambda: first in got and second in got, what="PUBACKs")
            assert got[first] in (0, 0x10) and got[second] == 0x97       # 0x10: no subscriber, still retained
        big = client(secrets, "q/d").connect(node.port())
        big.client.publish("a", b"z" * 101, qos=0)
        reason, _ = big.expect_disconnect()
        assert reason.value == 0x95
    finally:
        node.stop()


def test_the_brokers_sys_messages_are_not_the_tenants_retained_messages(control_plane):
    """Every tenant carries the broker's retained ``$SYS/broker/...`` tree: a fresh tenant
    showed 34 retained messages in use, and a ceiling of 1 refused its first device's
    retained publish with 0x97."""
    secrets = control_plane.provision([{"slug": "sysq", "default_acl": "allow", "devices": ["d"],
                                        "quota": {"max_retained": 1}}])
    token = control_plane.issue_token("sysq-reader", "read")
    node = BrokerProcess("--sys-interval", "1", "--admin", "127.0.0.1:0", env=control_plane.env).start()
    api = Http(node.admin_url)
    try:
        with client(secrets, "sysq/d").connect(node.port()) as c:
            c.subscribe("$SYS/broker/uptime", 0)
            c.expect_n(1, timeout=10)                      # the $SYS tree is there, retained

            def retained_in_use():
                _, _, body = api("GET", "/api/v1/metrics?local=1", token)
                return body["tenants"].get("sysq", {}).get("retained")

            wait_until(lambda: retained_in_use() == 0, what="the tenant's figures")
            _, _, listing = api("GET", "/api/v1/retained?tenant=sysq", token)
            assert listing["items"] == []
            _, _, with_sys = api("GET", "/api/v1/retained?tenant=sysq&sys=1", token)
            assert len(with_sys["items"]) >= 10 and all(i["topic"].startswith("$SYS/") for i in with_sys["items"])
            got = {}
            c.client.on_publish = lambda cl, u, mid, rc, p: got.setdefault(mid, rc.value)
            first = c.client.publish("state/mode", b"eco", qos=1, retain=True).mid
            second = c.client.publish("state/other", b"x", qos=1, retain=True).mid
            wait_until(lambda: first in got and second in got, what="PUBACKs")
            assert got[first] in (0, 0x10) and got[second] == 0x97      # the ceiling counts the device's own
            wait_until(lambda: retained_in_use() == 1, what="one retained message in use")
            _, _, listing = api("GET", "/api/v1/retained?tenant=sysq", token)
            assert [i["topic"] for i in listing["items"]] == ["state/mode"]
    finally:
        node.stop()


def test_a_device_with_an_open_acl_cannot_retain_into_sys(control_plane):
    """A tenant whose ACL allows everything (no rule, default allow: its devices' ACL is "open")
    let them publish into "$SYS/...": those retained messages counted as the broker's, so a
    device kept as many as it liked past max_retained, and faked the tenant's $SYS figures."""
    secrets = control_plane.provision([{"slug": "sysw", "default_acl": "allow", "devices": ["d"],
                                        "quota": {"max_retained": 1}}])
    token = control_plane.issue_token("sysw-reader", "read")
    node = BrokerProcess("--sys-interval", "60", "--admin", "127.0.0.1:0", env=control_plane.env).start()
    api = Http(node.admin_url)
    try:
        with client(secrets, "sysw/d").connect(node.port()) as c:
            c.subscribe("$SYS/broker/clients/connected", 0)
            figure = c.expect(timeout=15).payload               # the tenant's $SYS round has run
            c.unsubscribe("$SYS/broker/clients/connected")
            got = {}
            c.client.on_publish = lambda cl, u, mid, rc, p: got.setdefault(mid, rc.value)
            mids = [c.client.publish(f"$SYS/stash/{i}", b"x" * 100, qos=1, retain=True).mid for i in range(5)]
            mids.append(c.client.publish("$SYS/broker/clients/connected", b"9999", qos=1, retain=True).mid)
            wait_until(lambda: all(m in got for m in mids), what="PUBACKs")
            assert [got[m] for m in mids] == [0x87] * 6
        _, _, with_sys = api("GET", "/api/v1/retained?tenant=sysw&sys=1&per_page=1000", token)
        topics = [i["topic"] for i in with_sys["items"]]
        assert not [t for t in topics if t.startswith("$SYS/stash/")]
        _, _, view = api("GET", "/api/v1/retained?tenant=sysw&topic=" + quote("$SYS/broker/clients/connected"),
                         token)
        assert view["payload"].encode() == figure               # the broker's figure, not the device's
    finally:
        node.stop()


def test_inbound_rate_limit_slows_the_client_and_loses_nothing(control_plane):
    secrets = control_plane.provision([{"slug": "slow", "default_acl": "allow", "devices": ["d"],
                                        "quota": {"client_msgs_in": 20}}])
    node = control_plane.broker()
    try:
        with client(secrets, "slow/d").connect(node.port()) as sub, client(secrets, "slow/d").connect(
                node.port()) as pub:
            sub.subscribe("t", 1)
            t0 = time.monotonic()
            for i in range(60):
                pub.client.publish("t", b"%d" % i, qos=1)
            got = [m.payload for m in sub.expect_n(60, timeout=15)]
            elapsed = time.monotonic() - t0
        assert got == [b"%d" % i for i in range(60)]
        assert elapsed > 1.5, f"60 messages at 20/s (burst 20) took only {elapsed:.2f} s"
    finally:
        node.stop()


def test_reconnecting_does_not_refill_a_clients_rate_limit(control_plane):
    """A client's rate limit is a bucket that a large message puts in debt:
    the client waits until it is paid. A new connection started with a full
    bucket, so a device limited to 1,000 bytes/s could send 30 kB, reconnect
    and send again at once, as often as it liked. Now its client id keeps its
    buckets between connections (the tenant's own limits were shared all
    along)."""
    secrets = control_plane.provision([{"slug": "slow", "default_acl": "allow", "devices": ["d"],
                                        "quota": {"client_bytes_in": 1000}}])
    node = control_plane.broker()
    try:
        with client(secrets, "slow/d").connect(node.port()) as sub:
            sub.subscribe("t", 1)
            pub = client(secrets, "slow/d", client_id="greedy").connect(node.port())
            pub.publish("t", b"x" * 30_000, qos=1)               # 30 s of the client's allowance
            assert sub.expect().payload == b"x" * 30_000
            pub.drop()
            time.sleep(0.3)
            again = client(secrets, "slow/d", client_id="greedy").connect(node.port())
            again.publish("t", b"again", qos=1, wait=False)
            sub.expect_none(2.0)                                 # held back: the debt is still there
            again.drop(at_once=True)                             # (its PUBACK would come with the message)
            other = client(secrets, "slow/d", client_id="polite").connect(node.port())
            other.publish("t", b"other", qos=1)                  # another client of the tenant: its own bucket
            got = []
            while b"other" not in got:                           # ("again" may come first: it was read)
                got.append(sub.expect().payload)
            other.disconnect()
    finally:
        node.stop()


def test_tenant_sys_tree_shows_only_its_own_figures(control_plane):
    secrets = control_plane.provision([
        {"slug": "one", "devices": ["a"]},
        {"slug": "two", "devices": ["a", "b", "c"]},
    ])
    control_plane.manage("shell", "-c", "from tenants import services; from tenants.models import Tenant; "
                         "services.update_system_topics(Tenant.objects.get(slug='one'), interval=1, "
                         "parts=['clients'])")
    node = control_plane.broker("--sys-interval", "1")
    try:
        port = node.port()
        others = [client(secrets, f"two/{d}").connect(port) for d in "abc"]
        with client(secrets, "one/a").connect(port) as one:
            assert [x.value for x in one.subscribe("$SYS/#", 0)] == [0]
            seen = {}
            deadline = time.monotonic() + 5
            while not {"clients/connected", "clients/maximum"} <= set(seen) and time.monotonic() < deadline:
                m = one.expect()
                seen[m.topic.removeprefix("$SYS/broker/")] = m.payload
            assert seen["clients/connected"] == b"1"               # its own client, not the four
            assert seen["clients/maximum"] == b"1"
            assert not any(k.startswith(("messages/", "bytes/")) for k in seen)   # only the "clients" part
        for c in others:
            c.disconnect()
    finally:
        node.stop()


def test_a_sys_part_the_tenant_turns_off_leaves_no_stale_value(control_plane):
    """Turning a part of a tenant's $SYS tree off stopped its updates, but its
    last values stayed retained: every later subscriber read figures frozen
    at that moment as if current. Now they go."""
    secrets = control_plane.provision([{"slug": "one", "devices": ["a"]}])

    def parts(*names):
        control_plane.manage("shell", "-c", "from tenants import services; from tenants.models import Tenant; "
                             "services.update_system_topics(Tenant.objects.get(slug='one'), interval=1, "
                             f"parts={list(names)!r})")

    def keys_seen(seconds, enough=lambda keys: False):
        """The $SYS keys a new subscriber gets within ``seconds`` (the retained ones at once, then a
        round's worth: the tree is published every second); sooner once ``enough(keys)``."""
        with client(secrets, "one/a").connect(node.port()) as watcher:
            watcher.subscribe("$SYS/#", 0)
            seen = set()
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline and not enough(seen):
                try:
                    seen.add(watcher.expect(timeout=max(0.05, deadline - time.monotonic()))
                             .topic.removeprefix("$SYS/broker/"))
                except AssertionError:
                    break
            return seen

    def has_messages(keys):
        return any(k.startswith("messages/") for k in keys)

    parts("clients", "messages")
    node = control_plane.broker("--sys-interval", "1")
    try:
        wait_until(lambda: has_messages(keys_seen(1.5, enough=has_messages)), timeout=10, what="the messages part")
        parts("clients")
        # once the change has reached the node (polled), a new subscriber gets the "clients" part and, for
        # a whole round and more, nothing of "messages": no stale retained value (that one would come at
        # once, on every look), nor a fresh one
        last = []

        def clients_only():
            last[:] = [keys_seen(1.5)]
            return any(k.startswith("clients/") for k in last[0]) and not has_messages(last[0])

        try:
            wait_until(clients_only, timeout=10, what="the messages part gone")
        except AssertionError:
            raise AssertionError(f"still seen: {sorted(last[0])}") from None
    finally:
        node.stop()


def test_a_suspended_tenants_devices_do_not_lock_out_their_neighbours(control_plane):
    """Devices of a suspended tenant keep reconnecting with their right secrets (0x87 each time):
    that is no password guessing, so other tenants' devices behind the same address (here
    127.0.0.1, as behind one NAT) still connect -- only wrong secrets count towards the 0x9F
    lock-out."""
    secrets = control_plane.provision([{"slug": "gone", "default_acl": "allow", "devices": ["d"]},
                                       {"slug": "ok", "default_acl": "allow", "devices": ["d"]}])
    control_plane.manage("tenants", "suspend", "gone")
    node = control_plane.broker()
    try:
        codes = [connack_code(client(secrets, "gone/d"), node.port()) for _ in range(15)]
        assert codes == [0x87] * 15
        assert connack_code(client(secrets, "ok/d"), node.port()) == 0
        wrong = [connack_code(PahoClient(f"w{i}", V5, username="ok/d", password="guess"), node.port())
                 for i in range(12)]
        assert wrong[:10] == [0x86] * 10 and wrong[10:] == [0x9F, 0x9F]
    finally:
        node.stop()


@pytest.mark.parametrize("store", [False, True])
def test_messages_queued_before_a_read_right_is_revoked_are_not_delivered(control_plane, tmp_path, store):
    """dev1's persistent session subscribed to ``dev1/#`` is away while three messages are queued
    for it; the console then denies it ``dev1/secret/#``. When it comes back it gets the two it
    may still read, not the secret one (nor after a restart, from the store). Before, what was
    queued before the change was delivered whatever the new ACL said."""
    secrets = control_plane.provision([{"slug": "acme", "acl": RULES, "devices": ["dev1"]}])
    flags = ("--store", f"sqlite:///{tmp_path}/s.sqlite3") if store else ()
    node = control_plane.broker(*flags)
    try:
        sub = client(secrets, "acme/dev1", client_id="away", clean=False)
        sub.connect(node.port(), properties=_expiry(300))
        sub.subscribe("dev1/#", 1)
        sub.disconnect()
        with client(secrets, "acme/dev1").connect(node.port()) as pub:
            for topic in ("dev1/a", "dev1/secret/x", "dev1/b"):
                pub.publish(topic, topic.encode(), qos=1)
            proc = control_plane.manage("acl", "add", "acme", "--deny", "--action", "subscribe",
                                        "--topic", "dev1/secret/#", "--position", "1")
            assert proc.returncode == 0
            wait_until(lambda: pub.subscribe("dev1/secret/#", 1)[0].value == 0x87, timeout=5, what="new rule")
        if store:
            node.stop()
            node = control_plane.broker(*flags)
        back = client(secrets, "acme/dev1", client_id="away", clean=False)
        with back.connect(node.port(), properties=_expiry(300)) as c:
            assert [m.payload for m in c.expect_n(2)] == [b"dev1/a", b"dev1/b"]
            c.expect_none(1.0)
    finally:
        node.stop()


def _expiry(seconds: int):
    from ..mqtt import PacketTypes, props

    return props(PacketTypes.CONNECT, SessionExpiryInterval=seconds)


@pytest.mark.parametrize("version", [V5, V311])
def test_wills_are_held_to_the_tenants_payload_and_retained_quotas(control_plane, version):
    """A will is a PUBLISH its client asks for: its payload within ``max_payload`` and its
    retained copy within ``max_retained``, as a PUBLISH of it would be. A will over
    ``max_payload`` is refused at CONNECT (0x95; 3.1.1: 3); a retained will past
    ``max_retained`` reaches its subscribers without being retained. Before, the tenant's quotas
    did not apply to wills: a device limited to 100-byte payloads set a 5,000-byte will and had the
    broker publish it by dropping its connection; a tenant with a cap of 1 retained message had 2."""
    secrets = control_plane.provision([{"slug": "q", "default_acl": "allow", "devices": ["d"],
                                        "quota": {"max_payload": 100, "max_retained": 1}}])
    node = control_plane.broker()
    try:
        big = client(secrets, "q/d", version)
        big.client.will_set("wills/big", b"w" * 5000, qos=1)
        code = connack_code(big, node.port())
        assert code == (0x95 if version == V5 else 3), code
        with client(secrets, "q/d", version).connect(node.port()) as watcher:
            watcher.subscribe("wills/#", 1)
            watcher.client.publish("kept", b"the one retained message", qos=1, retain=True).wait_for_publish(5)
            dev = client(secrets, "q/d", version)
            dev.client.will_set("wills/small", b"gone", qos=1, retain=True)
            dev.connect(node.port())
            dev.drop()
            assert watcher.expect().payload == b"gone"                  # published to its subscribers
        with client(secrets, "q/d", version).connect(node.port()) as late:
            late.subscribe("wills/#", 1)
            late.expect_none(1.0)                                       # and not retained: the cap is 1
    finally:
        node.stop()


@pytest.mark.parametrize("store", [False, True])
def test_shared_messages_queued_for_a_member_whose_read_right_is_revoked_go_to_another_member(
        control_plane, tmp_path, store):
    """Two devices share ``$share/g/jobs/#``; both persistent sessions are away, so the group's
    messages are queued for them in turn. The console then denies dev1 ``jobs/#``: what was queued
    for dev1 through the group goes to dev2 (as when a member's session ends), not nowhere. Before,
    dev1's share was dropped: dev2 got only its own half of the jobs."""
    rules = RULES + [{"topic": "jobs/#", "action": "both", "allow": True}]
    secrets = control_plane.provision([{"slug": "acme", "acl": rules, "devices": ["dev1", "dev2"]}])
    flags = ("--store", f"sqlite:///{tmp_path}/s.sqlite3") if store else ()
    node = control_plane.broker(*flags)
    try:
        for dev in ("dev1", "dev2"):
            with client(secrets, f"acme/{dev}", client_id=f"worker-{dev}", clean=False).connect(
                    node.port(), properties=_expiry(300)) as c:
                assert c.subscribe("$share/g/jobs/#", 1)[0].value == 1
        jobs = [b"job%d" % i for i in range(6)]
        with client(secrets, "acme/dev2").connect(node.port()) as pub:
            for job in jobs:
                pub.publish("jobs/x", job, qos=1)
        control_plane.manage("acl", "add", "acme", "--deny", "--action", "subscribe", "--topic", "jobs/#",
                             "--device", "dev1", "--position", "1")
        with client(secrets, "acme/dev1").connect(node.port()) as probe:
            wait_until(lambda: probe.subscribe("jobs/#", 1)[0].value == 0x87, timeout=5, what="new rule")
        back = client(secrets, "acme/dev2", client_id="worker-dev2", clean=False)
        with back.connect(node.port(), properties=_expiry(300)) as c:
            assert c.session_present
            assert sorted(m.payload for m in c.expect_n(len(jobs))) == jobs
            c.expect_none(1.0)
        back = client(secrets, "acme/dev1", client_id="worker-dev1", clean=False)
        with back.connect(node.port(), properties=_expiry(300)) as c:
            c.expect_none(1.0)
    finally:
        node.stop()


def test_retained_messages_still_owed_when_a_read_right_is_revoked_are_not_sent(control_plane):
    """dev1 subscribes to ``dev1/#`` with 300 retained messages under it, half under
    ``dev1/secret/``; it acknowledges slowly, so most are still owed (sent as the window frees)
    when the console denies it ``dev1/secret/#``. From then on no secret one comes (but the window's
    in flight). Before, the feed went on with the ACL of the SUBSCRIBE: every secret one was sent."""
    from ..integration import raw
    from ..integration.raw import PUBLISH, RawClient

    secrets = control_plane.provision([{"slug": "acme", "acl": RULES, "devices": ["dev1"]}])
    node = control_plane.broker("--max-inflight", "5")
    try:
        with client(secrets, "acme/dev1").connect(node.port()) as pub:
            for i in range(150):
                pub.publish(f"dev1/open/{i:03d}", b"o", qos=1, retain=True, wait=False)
                pub.publish(f"dev1/secret/{i:03d}", b"s", qos=1, retain=True, wait=False)
            pub.publish("dev1/open/zzz", b"last", qos=1, retain=True)
        with RawClient(node.port(), timeout=10) as c:
            c.connect("slow-reader", version=5, username="acme/dev1", password=secrets["acme/dev1"].encode())
            c.send(raw.subscribe_packet(1, [("dev1/#", 1)], 5))
            c.expect(raw.SUBACK)
            first = [c.expect(PUBLISH) for _ in range(5)]              # the window: the feed waits
            proc = control_plane.manage("acl", "add", "acme", "--deny", "--action", "subscribe",
                                        "--topic", "dev1/secret/#", "--position", "1")
            assert proc.returncode == 0
            with client(secrets, "acme/dev1").connect(node.port()) as probe:
                wait_until(lambda: probe.subscribe("dev1/secret/#", 1)[0].value == 0x87, timeout=5, what="new rule")
            got = []
            for p in first:
                c.ack(raw.PUBACK, p.pid)
            while True:
                try:
                    p = c.recv(2)
                except TimeoutError:
                    break
                if p.type == PUBLISH:
                    got.append(p.topic)
                    c.ack(raw.PUBACK, p.pid)
            assert got and "dev1/open/zzz" in got
            assert not [t for t in got if t.startswith("dev1/secret/")], got[:10]
    finally:
        node.stop()


def test_a_qos2_message_sent_before_a_read_right_is_revoked_is_still_sent_again(control_plane):
    """dev1 received five QoS 2 messages under ``dev1/secret/`` and answered none (PUBREC) before it
    went away; it comes back with Receive Maximum 1, so four wait in the queue with their packet ids
    and DUP, and then the console denies it ``dev1/secret/#``. They go again all the same: the
    client holds their packet ids until each exchange ends, and a message sent later under a freed id
    would be taken for the old one and dropped. Before, the four were taken out with their ids."""
    from ..integration import raw
    from ..integration.raw import PUBLISH, RawClient

    secrets = control_plane.provision([{"slug": "acme", "acl": RULES, "devices": ["dev1"]}])
    node = control_plane.broker()
    password = secrets["acme/dev1"].encode()
    expiry = {raw.SESSION_EXPIRY_INTERVAL: 300}
    try:
        with RawClient(node.port(), timeout=10) as c:
            c.connect("held", version=5, clean=True, props=expiry, username="acme/dev1", password=password)
            c.send(raw.subscribe_packet(1, [("dev1/#", 2)], 5))
            c.expect(raw.SUBACK)
            with client(secrets, "acme/dev1").connect(node.port()) as pub:
                for i in range(5):
                    pub.publish(f"dev1/secret/{i}", b"%d" % i, qos=2)
            first = [c.expect(PUBLISH) for _ in range(5)]                # no PUBREC sent
        with RawClient(node.port(), timeout=10) as c:
            c.connect("held", version=5, clean=False, props={**expiry, raw.RECEIVE_MAXIMUM: 1},
                      username="acme/dev1", password=password)
            p = c.expect(PUBLISH)                                       # one again; four wait in the queue
            proc = control_plane.manage("acl", "add", "acme", "--deny", "--action", "subscribe",
                                        "--topic", "dev1/secret/#", "--position", "1")
            assert proc.returncode == 0
            with client(secrets, "acme/dev1").connect(node.port()) as probe:
                wait_until(lambda: probe.subscribe("dev1/secret/#", 1)[0].value == 0x87, timeout=5,
                           what="new rule")
            again = []
            for i in range(5):
                if i:
                    p = c.expect(PUBLISH)
                assert p.dup and p.qos == 2, p
                again.append((p.pid, p.topic))
                c.ack(raw.PUBREC, p.pid)
                c.expect(raw.PUBREL)
                c.ack(raw.PUBCOMP, p.pid)
            assert sorted(again) == sorted((p.pid, p.topic) for p in first)
    finally:
        node.stop()


def test_a_flood_of_pingreqs_from_a_rate_limited_client_does_not_swell_the_node(control_plane):
    """tests/hostile's flood of tiny packets (PINGREQs as fast as the socket takes them, nothing
    read), from a device of a tenant with an inbound rate limit. A PINGREQ is not a message: the
    limit does not slow it, and each one is answered. The answers must be written as they pile up
    (OUT_AT_ONCE) and the socket no longer read while they are not read, as for a client without a
    limit. Before, a rate-limited client's packets went a way that never wrote its answers before
    the end of the loop's iteration: 32 reads of 256 KB made millions of PINGRESPs at once and the
    node's peak RSS grew by hundreds of MB."""
    from ..hostile.conftest import MIB, peak_rss_kib
    from ..integration import raw

    secrets = control_plane.provision([{"slug": "lim", "default_acl": "allow", "devices": ["d"],
                                        "quota": {"client_msgs_in": 1000}}])
    node = control_plane.broker()
    try:
        s = socket.create_connection(("127.0.0.1", node.port()), timeout=5)
        s.sendall(raw.connect_packet("flood", version=4, keepalive=0, username="lim/d", password=secrets["lim/d"]))
        assert s.recv(4) == b"\x20\x02\x00\x00"
        chunk = b"\xc0\x00" * 32768
        s.settimeout(0.5)
        peak0 = peak_rss_kib(node)
        stop = time.monotonic() + 4
        while time.monotonic() < stop:
            try:
                s.sendall(chunk)
            except TimeoutError:
                pass                                  # the broker stopped reading: it is not read either
        grown = peak_rss_kib(node) - peak0
        s.close()
        with client(secrets, "lim/d").connect(node.port()) as c:          # the node still answers
            c.subscribe("x", 1)
        assert grown < 32 * MIB, f"the node's peak RSS grew by {grown // 1024} MiB"
    finally:
        node.stop()
