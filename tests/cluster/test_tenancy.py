"""A tenant's connection quota holds for the whole cluster: devices of one
tenant spread over nodes count together (the nodes share their counts
through the cluster bus every second)."""

import socket
import time

import pytest

from ..controlplane import ControlPlane
from ..mqtt import V5, PacketTypes, PahoClient, props
from ..procs import BrokerProcess
from .conftest import Cluster, settle, wait_until


@pytest.fixture
def plane(tmp_path):
    (tmp_path / "console").mkdir()
    return ControlPlane(tmp_path / "console")


def test_connection_quota_counts_devices_on_every_node(redis_server, tmp_path, plane, tag):
    secrets = plane.provision([{"slug": "acme", "default_acl": "allow", "quota": {"max_connections": 3},
                                "devices": ["d1", "d2", "d3", "d4"]}])
    c = Cluster(redis_server, tmp_path, env=plane.env)
    devs = []
    try:
        n1, n2 = c.start(2)

        def dev(i):
            return PahoClient(f"{tag}-d{i}", version=V5, username=f"acme/d{i}", password=secrets[f"acme/d{i}"])

        devs = [dev(1).connect(n1.port()), dev(2).connect(n1.port())]
        devs.append(dev(3).connect(n2.port()))
        time.sleep(2.5)                                  # two rounds of count sharing
        late = dev(4)
        with pytest.raises(ConnectionError, match="0x97"):
            late.connect(n2.port())
        with pytest.raises(ConnectionError, match="0x97"):
            dev(4).connect(n1.port())
        # one leaves on n1: a place is free on n2 once the counts have gone round
        devs.pop(0).disconnect()

        def joined():
            try:
                devs.append(dev(4).connect(n2.port()))
                return True
            except ConnectionError:
                return False
        wait_until(joined, timeout=15, interval=0.5, message="the freed place was not seen by the other node")
    finally:
        for d in devs:
            d.disconnect()
        c.stop_all()


@pytest.mark.parametrize("qos", [0, 1])
def test_a_tenant_whose_only_subscription_on_another_node_has_no_wildcard_gets_its_messages(
        redis_server, tmp_path, plane, tag, qos):
    """Tenant acme's one subscriber is on n2, on a topic without wildcards (no wildcard route of the
    tenant anywhere in the cluster): what a device on n1 publishes there reaches it, once each, in order."""
    secrets = plane.provision([{"slug": "acme", "default_acl": "allow", "devices": ["d1", "d2"]}])
    c = Cluster(redis_server, tmp_path, env=plane.env)
    clients = []
    try:
        n1, n2 = c.start(2)
        sub = PahoClient(f"{tag}-sub", version=V5, username="acme/d2", password=secrets["acme/d2"]).connect(n2.port())
        clients.append(sub)
        sub.subscribe("plant/line1", qos=1)
        pub = PahoClient(f"{tag}-pub", version=V5, username="acme/d1", password=secrets["acme/d1"]).connect(n1.port())
        clients.append(pub)
        settle(pub, "plant/line1", sub)
        for n in range(20):
            pub.publish("plant/line1", b"%d" % n, qos=qos)
        msgs = sub.expect_n(20)
        assert [int(m.payload) for m in msgs] == list(range(20))
        sub.expect_none(0.3)
    finally:
        for cl in clients:
            cl.disconnect()
        c.stop_all()


def _connect_packet(client_id: str, username: str, password: str) -> bytes:
    """An MQTT 3.1.1 CONNECT with a user name and password, clean session, keepalive 60."""
    def s(v: str) -> bytes:
        b = v.encode()
        return len(b).to_bytes(2, "big") + b
    body = s("MQTT") + bytes((4, 0xC2)) + (60).to_bytes(2, "big") + s(client_id) + s(username) + s(password)
    n, length = len(body), b""
    while True:
        n, digit = divmod(n, 128)
        length += bytes((digit | (0x80 if n else 0),))
        if not n:
            return b"\x10" + length + body


def test_a_burst_of_connects_on_one_node_does_not_pass_the_connection_quota(redis_server, tmp_path, plane, tag):
    """On a node of a cluster a CONNECT is counted once its client id's claim came back from
    Redis: CONNECTs that arrive together must not all be admitted against the count of before."""
    secrets = plane.provision([{"slug": "acme", "default_acl": "allow", "quota": {"max_connections": 2},
                                "devices": ["d"]}])
    c = Cluster(redis_server, tmp_path, env=plane.env)
    socks = []
    try:
        (n1,) = c.start(1)
        socks = [socket.create_connection(("127.0.0.1", n1.port()), timeout=10) for _ in range(8)]
        packets = [_connect_packet(f"{tag}-{i}", "acme/d", secrets["acme/d"]) for i in range(8)]
        for sock, packet in zip(socks, packets, strict=True):
            sock.sendall(packet)
        codes = []
        for sock in socks:
            data = b""
            while len(data) < 4:
                chunk = sock.recv(4 - len(data))
                assert chunk, "closed without a CONNACK"
                data += chunk
            assert data[:2] == b"\x20\x02"
            codes.append(data[3])
        assert sorted(codes) == [0, 0] + [3] * 6, codes
    finally:
        for sock in socks:
            sock.close()
        c.stop_all()


def test_connections_of_a_node_no_one_reaped_do_not_count_against_the_quota(redis_server, tmp_path, plane, tag):
    """A node that died with no other member to see it go (the whole cluster
    restarted, nodes or workers under new ids) left its connection counts in
    Redis, and every node summed them for good: its tenants' devices were
    refused 0x97 for connections that no longer existed. Now only the
    members' counts are summed (and a node's $SYS figures likewise)."""
    secrets = plane.provision([{"slug": "acme", "default_acl": "allow", "quota": {"max_connections": 2},
                                "devices": ["d1", "d2"]}])
    c = Cluster(redis_server, tmp_path, env=plane.env)
    devs = []
    try:
        def dev(i):
            return PahoClient(f"{tag}-d{i}", version=V5, username=f"acme/d{i}", password=secrets[f"acme/d{i}"])

        [n1] = c.start(1)
        first = [dev(1).connect(n1.port()), dev(2).connect(n1.port())]
        r = redis_server.client()

        def n1_counted():                                # a round of count sharing: n1's 2 in Redis
            return any(r.hget(key, "n1") == b"2" for key in r.scan_iter(f"{c.prefix}:conns:*"))

        wait_until(n1_counted, timeout=10, message="n1's connections not shared")
        n1.kill()
        for d in first:
            d.drop()
        wait_until(lambda: not r.exists(f"{c.prefix}:node:n1"), timeout=15,
                   message="n1's membership did not expire")      # no one will see it go
        [n2] = c.start(1)                                # another node id, the only member
        devs = [dev(1).connect(n2.port())]
        time.sleep(1.5)                                  # a round of count sharing
        devs.append(dev(2).connect(n2.port()))
    finally:
        for d in devs:
            d.disconnect()
        c.stop_all()


def test_a_device_taking_over_its_own_connection_at_the_quota_is_let_in(redis_server, tmp_path, plane, tag):
    """max_connections 1 and the device's one connection half-open: its new CONNECT with the same
    client id on the same node replaces that connection (0x8E), it is not refused 0x97 until the
    old one's keepalive runs out; another client id still is. (On another node: the next test.)"""
    secrets = plane.provision([{"slug": "acme", "default_acl": "allow", "quota": {"max_connections": 1},
                                "devices": ["d"]}])
    c = Cluster(redis_server, tmp_path, env=plane.env)
    clients = []
    try:
        (n1,) = c.start(1)

        def dev(cid):
            d = PahoClient(cid, version=V5, username="acme/d", password=secrets["acme/d"])
            clients.append(d)
            return d

        old = dev(f"{tag}-d")
        old.client.reconnect_delay_set(60, 120)          # (paho would come back and take the id over again)
        old.connect(n1.port())
        dev(f"{tag}-d").connect(n1.port())
        reason, _ = old.expect_disconnect(timeout=5)
        assert reason.value == 0x8E
        with pytest.raises(ConnectionError, match="0x97"):
            dev(f"{tag}-other").connect(n1.port())
    finally:
        for cl in clients:
            cl.disconnect()
        c.stop_all()


def _counted_everywhere(nodes, refused_client) -> None:
    """Wait until each node refuses a new client id 0x97 (the quota's counts went round)."""
    for node in nodes:
        def refused(node=node):
            try:
                refused_client().connect(node.port()).disconnect()
            except ConnectionError as exc:
                return "0x97" in str(exc)
            return False
        wait_until(refused, timeout=15, interval=0.3, message="the tenant's connections were not counted")


_EXPIRY = props(PacketTypes.CONNECT, SessionExpiryInterval=300)


@pytest.fixture
def one_place(redis_server, tmp_path, plane):
    """Tenant acme, max_connections 1, device d: -> (the cluster, ``dev(client id)``: a v5 client of d)."""
    secrets = plane.provision([{"slug": "acme", "default_acl": "allow", "quota": {"max_connections": 1},
                                "devices": ["d"]}])
    c = Cluster(redis_server, tmp_path, env=plane.env)
    clients = []

    def dev(cid):
        d = PahoClient(cid, version=V5, username="acme/d", password=secrets["acme/d"])
        clients.append(d)
        return d

    try:
        yield c, dev
    finally:
        for cl in clients:
            cl.disconnect()
        c.stop_all()


def _refused_with_its_session_offline_on(holder, other_node, dev, tag):
    """max_connections 1: client id ``{tag}-stored`` has a stored session on ``holder``, offline, owed
    "before" on plant/s; the tenant's one place is taken there; its CONNECT on ``other_node`` is refused
    0x97. -> the client holding the place."""
    stored = dev(f"{tag}-stored").connect(holder.port(), properties=_EXPIRY)
    stored.subscribe("plant/s", qos=1)
    stored.disconnect()
    other = dev(f"{tag}-live").connect(holder.port())      # the tenant's one place
    _counted_everywhere((holder, other_node), lambda: dev(f"{tag}-third"))
    other.publish("plant/s", b"before", qos=1)
    with pytest.raises(ConnectionError, match="0x97"):
        dev(f"{tag}-stored").connect(other_node.port(), properties=_EXPIRY, clean_start=False)
    return other


def _back_when_there_is_room(node, dev, tag):
    """``{tag}-stored`` connected to ``node`` once the place is free again, its session there."""
    def back():
        try:
            return dev(f"{tag}-stored").connect(node.port(), properties=_EXPIRY, clean_start=False)
        except ConnectionError:
            return None
    client = wait_until(back, timeout=15, interval=0.3, message="the freed place was not seen")
    assert client.session_present
    return client


def test_a_device_taking_over_its_own_connection_on_another_node_at_the_quota_is_let_in(one_place, tag):
    """max_connections 1, the device's one connection on n1 half-open (its NAT changed, a load
    balancer sends it elsewhere): its new CONNECT of the same client id on n2 was refused 0x97 --
    the old connection still counted -- until n1's keepalive ran out (90 s at keepalive 60), at every
    retry. Now n2 admits it in place of that connection: n1 lets it go (0x8E) and the quota still
    holds for any other client id, on either node."""
    c, dev = one_place
    n1, n2 = c.start(2)
    old = dev(f"{tag}-d")
    old.client.reconnect_delay_set(60, 120)          # (paho would come back and take the id over again)
    old.connect(n1.port())
    _counted_everywhere((n1, n2), lambda: dev(f"{tag}-other"))
    new = dev(f"{tag}-d").connect(n2.port())
    reason, _ = old.expect_disconnect(timeout=5)
    assert reason.value == 0x8E
    new.subscribe("plant/x", qos=1)                  # the new connection is the device's, and works
    new.publish("plant/x", b"here", qos=1)
    assert new.expect().payload == b"here"
    with pytest.raises(ConnectionError, match="0x97"):
        dev(f"{tag}-other").connect(n2.port())
    time.sleep(2.5)                                  # two rounds of count sharing: n1 sees n2's one
    with pytest.raises(ConnectionError, match="0x97"):
        dev(f"{tag}-other").connect(n1.port())


def test_at_the_quota_a_client_id_offline_on_another_node_is_refused_and_its_session_stays(one_place, tag):
    """Admitted only in place of a live connection: a CONNECT at the quota whose client id has a
    session on another node but no connection there is refused 0x97, and that session is not
    touched -- what it was owed before and after the refusal comes when the device gets in."""
    c, dev = one_place
    n1, n2 = c.start(2)
    other = _refused_with_its_session_offline_on(n1, n2, dev, tag)
    other.publish("plant/s", b"after", qos=1)
    other.disconnect()
    back_client = _back_when_there_is_room(n2, dev, tag)
    assert [m.payload for m in back_client.expect_n(2)] == [b"before", b"after"]


def test_a_node_no_device_of_the_tenant_reached_yet_counts_its_connections_on_the_others(
        redis_server, tmp_path, plane, tag):
    """The nodes summed each tenant's connections only for the tenants a node had a namespace
    for: a node none of the tenant's devices had reached yet read no total for it and admitted
    devices up to the whole quota on its own -- with the quota used up on the other node."""
    secrets = plane.provision([{"slug": "acme", "default_acl": "allow", "quota": {"max_connections": 2},
                                "devices": ["d"]}])
    c = Cluster(redis_server, tmp_path, env=plane.env)
    clients = []
    try:
        n1, n2 = c.start(2)

        def dev(i):
            d = PahoClient(f"{tag}-{i}", version=V5, username="acme/d", password=secrets["acme/d"])
            clients.append(d)
            return d

        dev(1).connect(n1.port())
        dev(2).connect(n1.port())
        time.sleep(2.5)                                  # two rounds of count sharing
        for i in (3, 4):
            with pytest.raises(ConnectionError, match="0x97"):
                dev(i).connect(n2.port())
    finally:
        for cl in clients:
            cl.disconnect()
        c.stop_all()


class _ChangeDuringClaim:
    """A CONNECT (raw socket, MQTT 5) authenticated, its claim then held up in Redis (``CLIENT PAUSE``,
    2.5 s) while the console makes ``change`` (a Django shell started beforehand, so that the change
    lands at once): the connection as it opens after that."""

    def __init__(self, redis_server, plane, node, change: str):
        import subprocess
        import sys

        from ..procs import ROOT

        self.redis, self.node = redis_server, node
        self.django = subprocess.Popen(
            [sys.executable, "manage.py", "shell", "-c",
             "import sys\nfrom tenants import services, queries\nt = queries.get_tenant('acme')\n"
             "print('READY', flush=True)\nsys.stdin.readline()\n" + change + "\nprint('DONE', flush=True)\n"],
            cwd=ROOT, env=plane.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.sock = None

    def _line(self, want: str) -> None:
        while self.django.stdout.readline().strip() != want:      # (the shell may say something first)
            assert self.django.poll() is None, "the console's shell ended"

    def connect(self, client_id: str, username: str, password: str, props: dict | None = None) -> bytes:
        """-> the CONNACK's first bytes."""
        from ..integration.raw import connect_packet

        self._line("READY")
        self.redis.client().execute_command("CLIENT", "PAUSE", "2500", "ALL")     # the claim waits
        self.sock = socket.create_connection(("127.0.0.1", self.node.port()), timeout=10)
        self.sock.sendall(connect_packet(client_id, 5, username=username, password=password.encode(), props=props))
        time.sleep(0.2)                                  # authenticated, its claim waiting
        self.django.stdin.write("go\n")
        self.django.stdin.flush()
        self._line("DONE")
        self.sock.settimeout(6)
        data = b""
        while len(data) < 4:
            chunk = self.sock.recv(64)
            if not chunk:
                break
            data += chunk
        assert data[:1] == b"\x20", data
        self.rest = data[2 + data[1]:] if len(data) >= 2 + data[1] else b""
        return data

    def next_bytes(self, n: int, timeout: float = 3.0) -> bytes:
        """What the node sends next (up to ``n`` bytes; fewer if it sends nothing more in ``timeout``)."""
        self.sock.settimeout(timeout)
        rest = self.rest
        try:
            while len(rest) < n:
                chunk = self.sock.recv(64)
                if not chunk:
                    break
                rest += chunk
        except TimeoutError:
            pass
        self.rest = b""
        return rest

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.django.kill()
        self.django.wait()


@pytest.fixture
def change_during_claim(redis_server, tmp_path, plane):
    """Tenant acme (device d) and a cluster: -> (``start(change)``: one node and a ``_ChangeDuringClaim``
    of ``change`` on it, ``secrets``)."""
    secrets = plane.provision([{"slug": "acme", "default_acl": "allow", "devices": ["d"]}])
    c = Cluster(redis_server, tmp_path, env=plane.env)
    made = []

    def start(change: str):
        (n1,) = c.start(1)
        made.append(_ChangeDuringClaim(redis_server, plane, n1, change))
        return n1, made[-1]

    try:
        yield start, secrets
    finally:
        for change in made:
            change.close()
        c.stop_all()


def test_a_connect_authenticated_before_its_device_was_disabled_is_not_opened_after(change_during_claim, tag):
    """In a cluster a CONNECT is authenticated, then waits for its client id's claim in Redis, then
    opens. A policy change that lands between the two (the device disabled: its connections are
    disconnected) did not see that connection -- not open yet -- and the connection opened after
    it on the device's old rights, and stayed."""
    start, secrets = change_during_claim
    n1, change = start("services.disable_device(queries.get_device(t, 'd'))")
    data = change.connect(f"{tag}-d", "acme/d", secrets["acme/d"])
    if data[3] == 0:
        # accepted: then it must be disconnected (0x87) as its device's other connections were
        rest = change.next_bytes(3)
        assert rest[:1] == b"\xe0" and rest[2] == 0x87, f"still connected: {rest!r}"
    else:
        assert data[3] == 0x87, data
    # (the change was in: the device is refused now)
    with pytest.raises(ConnectionError, match="0x87"):
        PahoClient(f"{tag}-d2", version=V5, username="acme/d", password=secrets["acme/d"]).connect(n1.port())


def test_a_connect_that_opens_after_its_tenants_quota_was_lowered_is_held_to_the_new_quota(change_during_claim, tag):
    """The same wait, the tenant's max_payload lowered to 10 meanwhile: the connection opened with
    the quota of before its claim (no limit) and kept it until the next change of the tenant's policy."""
    from ..integration.raw import publish_packet

    start, secrets = change_during_claim
    n1, change = start("services.update_quota(t, max_payload=10)")
    data = change.connect(f"{tag}-d", "acme/d", secrets["acme/d"])
    assert data[3] == 0, data
    change.sock.sendall(publish_packet("t", b"x" * 50, version=5))
    rest = change.next_bytes(3)
    assert rest[:1] == b"\xe0" and rest[2] == 0x95, f"over the new max_payload and not disconnected: {rest!r}"


def test_a_connect_that_opens_after_its_tenants_session_expiry_cap_was_lowered_gets_the_new_cap(
        change_during_claim, tag):
    """The same wait, the tenant's max_session_expiry lowered to 60 s meanwhile: a CONNECT asking for
    an hour got the cap of before (none) -- its session kept for an hour, past what the platform
    now allows for the tenant. Now the CONNACK says 60 and the session is kept for that."""
    from ..integration.raw import _decode_props

    start, secrets = change_during_claim
    n1, change = start("services.update_quota(t, max_session_expiry=60)")
    data = change.connect(f"{tag}-d", "acme/d", secrets["acme/d"], props={0x11: 3600})
    assert data[3] == 0, data
    connack = data + change.next_bytes(2 + data[1] - len(data), timeout=1.0) if len(data) < 2 + data[1] else data
    props, _ = _decode_props(connack, 4)
    assert props.get(0x11) == 60, f"the CONNACK's session expiry: {props}"


# the version before the TAKEOVER frame's LIVE_ONLY flag (1bd7a7f): it reads a TAKEOVER's client id and
# ignores any byte after it
_BEFORE_LIVE_ONLY = "8ea4efbd94bb8df725d892556dbc384ac064c841"


class _OldNode(BrokerProcess):
    """A brokerd of an earlier commit (its ``brokerd`` package unpacked in ``tree``)."""

    def __init__(self, tree, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.tree = str(tree)

    def command(self):
        cmd = super().command()
        run = f"import sys, runpy; sys.path.insert(0, {self.tree!r}); runpy.run_module('brokerd', run_name='__main__')"
        return [cmd[0], "-c", run, *cmd[3:]]          # (cmd[1:3]: -m brokerd)


def old_node(c: Cluster, tmp_path, env=None, commit: str = _BEFORE_LIVE_ONLY, anonymous: bool = True) -> BrokerProcess:
    """Node n1 of ``c`` started from the ``brokerd`` of ``commit`` (a cluster upgrading node by node)."""
    import subprocess

    from ..procs import ROOT

    old_tree = tmp_path / "old"
    old_tree.mkdir()
    try:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "brokerd"],
                                 capture_output=True, check=True, timeout=60).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("the repository's history is not here")
    subprocess.run(["tar", "-x", "-C", str(old_tree)], input=archive, check=True, timeout=60)
    old = _OldNode(old_tree, "--node-id", "n1", "--store", c.store, "--cluster", c.url(), *c.flags,
                   listen=("mqtt://127.0.0.1:0",), anonymous=anonymous,
                   env={"BROKERD_CLUSTER_SECRET": c.secret, **(env or {})})
    c.nodes.append(old)
    c.names[id(old)] = "n1"
    c._n = 1
    old.start()
    wait_until(lambda: "joined the cluster" in old.log, timeout=10, message=f"n1 did not join:\n{old.log}")
    return old


def test_at_the_quota_a_node_of_the_previous_version_does_not_let_go_of_an_offline_session(
        redis_server, tmp_path, plane, tag):
    """A node of the version before LIVE_ONLY does not know the flag: asked to let go of the session of a
    client id only if its client is connected there, it let go of it offline too -- the CONNECT at the
    quota, on the new node, was let in in place of no connection: two connections of a tenant allowed
    one, the session moved. A node asks LIVE_ONLY only of members that say they answer it (their
    membership's "features"): the two versions still link (a cluster upgrades node by node), the
    CONNECT is refused 0x97 and the session stays where it is."""
    secrets = plane.provision([{"slug": "acme", "default_acl": "allow", "quota": {"max_connections": 1},
                                "devices": ["d"]}])
    # the console of the nodes' previous version too (its snapshots hold their devices, schema 1): a node
    # of that version reads no device rows -- nodes are upgraded before the console
    plane.manage("migrate", "tenants", "0009_max_devices")
    c = Cluster(redis_server, tmp_path, env=plane.env)
    clients = []
    try:
        old = old_node(c, tmp_path, plane.env)
        n2 = c.node(wait=False)
        time.sleep(1.0)                                  # the links (if any) made

        def dev(cid):
            d = PahoClient(cid, version=V5, username="acme/d", password=secrets["acme/d"])
            clients.append(d)
            return d

        other = _refused_with_its_session_offline_on(old, n2, dev, tag)
        assert "another link protocol version" not in old.log + n2.log
        other.disconnect()
        assert _back_when_there_is_room(old, dev, tag).expect().payload == b"before"
    finally:
        for cl in clients:
            cl.disconnect()
        c.stop_all()


def test_connects_refused_at_the_quota_on_another_node_are_counted_as_quota_refusals(redis_server, tmp_path, plane,
                                                                                      tag):
    """In a cluster, a CONNECT at the tenant's connection quota is let through to its claim (it may take
    over a live connection of its client id on another node) and refused 0x97 there when it does not --
    and those refusals were counted nowhere: the tenant's quota refusals in the metrics (dropped: quota)
    stayed 0 while its devices were turned away. Each counts, as a refusal at its admission does."""
    from ..admin.conftest import CONSOLE_TOKEN, Http

    secrets, tokens = plane.provision_with_tokens(
        [{"slug": "acme", "default_acl": "allow", "quota": {"max_connections": 1}, "devices": ["d"]}],
        {"grafana": "read"})
    c = Cluster(redis_server, tmp_path, flags=("--admin", "127.0.0.1:0"),
                env={**plane.env, "BROKERD_ADMIN_TOKEN": CONSOLE_TOKEN})
    clients = []
    try:
        n1, n2 = c.start(2)

        def dev(cid):
            d = PahoClient(cid, version=V5, username="acme/d", password=secrets["acme/d"])
            clients.append(d)
            return d

        def refused() -> int:
            body = Http(n2.admin_url)("GET", "/api/v1/metrics", token=tokens["grafana"])[2]
            return body["tenants"]["acme"]["dropped"]["quota"]

        dev(f"{tag}-live").connect(n1.port())                 # the tenant's one place
        _counted_everywhere((n1, n2), lambda: dev(f"{tag}-probe"))
        before = refused()
        for i in range(3):
            with pytest.raises(ConnectionError, match="0x97"):
                dev(f"{tag}-x{i}").connect(n2.port())
        time.sleep(0.5)
        assert refused() - before == 3
    finally:
        for cl in clients:
            cl.disconnect()
        c.stop_all()
