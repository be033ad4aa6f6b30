"""The node links face a hostile network (issue #16): nothing a link carries
is acted on before the other end proved it holds the cluster secret and is a
member, answers count only on the link they were asked on, and a socket that
never authenticates costs a bounded, short-lived slot.

The attacker is a raw socket speaking the link protocol by hand
(``RawLink``); with the secret it plays a rogue member. A canary pair keeps
making round trips on the attacked node throughout.
"""

import os
import re
import signal
import socket
import struct
import time

import pytest

from brokerd.cluster import frames, handshake

from ..hostile.conftest import Canary, rss_kib
from ..integration.helpers import Client, connect
from ..mqtt import V5, PacketTypes, props
from ..procs import BrokerProcess, sigstop
from .conftest import settle, wait_until

LINK = re.compile(r"joined the cluster \(\d+ other nodes, link ([\d.]+):(\d+)\)")


def link_port(node) -> int:
    m = LINK.search(node.log)
    assert m, f"no link address in the log:\n{node.log}"
    return int(m.group(2))


def old_hello(name: str) -> bytes:
    """The HELLO of the link protocol before authentication: a bare node id."""
    raw = name.encode()
    return struct.pack(">IBH", 3 + len(raw), frames.HELLO, len(raw)) + raw


class RawLink:
    """A socket to a node's link port, driven by hand. Frames read are
    (type, body) -- split by their header only, so that whatever a node sends
    can be seen -- and decoded where a test needs their fields."""

    def __init__(self, port: int, source: str = "127.0.0.1", timeout: float = 5.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(source, 0))
        self.buf = b""
        self.frames: list[tuple] = []           # read, not yet taken
        self.seen: list[tuple] = []             # taken by closed_by_node

    def send(self, *parts: bytes) -> None:
        self.sock.sendall(b"".join(parts))

    def _split(self) -> None:
        while len(self.buf) >= 5:
            length, kind = struct.unpack_from(">IB", self.buf)
            if len(self.buf) < 4 + length:
                return
            self.frames.append((kind, self.buf[5:4 + length]))
            self.buf = self.buf[4 + length:]

    def read(self, timeout: float = 5.0) -> tuple:
        """The next (type, body) from the node; raises EOFError when it closed
        the link, TimeoutError when nothing came."""
        deadline = time.monotonic() + timeout
        while not self.frames:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(65536)
            except (ConnectionResetError, BrokenPipeError):
                data = b""
            if not data:
                raise EOFError("the node closed the link")
            self.buf += data
            self._split()
        return self.frames.pop(0)

    def read_decoded(self, timeout: float = 5.0) -> tuple:
        return frames.decode(*self.read(timeout))

    def closed_by_node(self, timeout: float = 5.0) -> bool:
        """Whether the node closes the link within ``timeout``; what it sent
        meanwhile is kept in ``seen``."""
        deadline = time.monotonic() + timeout
        try:
            while True:
                self.seen.append(self.read(max(0.01, deadline - time.monotonic())))
        except EOFError:
            return True
        except TimeoutError:
            return False

    def handshake(self, secret: bytes, me: str) -> str:
        """Authenticate as node ``me`` (with the right secret: a rogue member); -> the node's id."""
        kind, node, nonce = self.read_decoded()
        assert kind == frames.HELLO
        mine = os.urandom(frames.NONCE)
        self.send(frames.hello(me, mine), frames.auth(handshake.proof(secret, me, node, nonce, mine)))
        kind, got = self.read_decoded()
        assert kind == frames.AUTH and handshake.check(secret, got, node, me, mine, nonce)
        return node

    def close(self) -> None:
        self.sock.close()


def persistent(port: int, client_id: str) -> Client:
    c = Client(client_id, V5, clean=False)
    return c.connect(port, properties=props(PacketTypes.CONNECT, SessionExpiryInterval=3600))


def attempts(tenant: str, topic: str, victim: str) -> dict[str, bytes]:
    """What an unauthenticated socket sends, by how it introduces itself."""
    forged = (frames.publish(0, 1, 1, -1, tenant.encode(), topic.encode(), b"", b"injected")
              + frames.takeover(1, tenant, victim)
              + b"".join(frames.ack(req, 0) for req in range(1, 200)))
    return {
        "no hello": forged,
        "hello of the old protocol": old_hello("attacker") + forged,
        "hello and a made-up proof": frames.hello("attacker", os.urandom(32)) + frames.auth(os.urandom(32)) + forged,
        "hello and an empty proof": frames.hello("attacker", os.urandom(32)) + frames.auth(b"") + forged,
    }


def test_forged_frames_from_an_unauthenticated_socket_change_nothing(cluster, tag):
    """HELLO + PUBLISH delivered into any tenant (retained too); a forged
    TAKEOVER released a connected persistent session (0x8E), losing what was
    published for it next. Now each such socket is closed and nothing moves."""
    n1, n2 = cluster.start(2)
    topic = f"{tag}/injected"
    watcher = connect(n1.port(), f"{tag}-watch", V5)
    watcher.subscribe(f"{tag}/#", qos=1)
    victim = persistent(n1.port(), f"{tag}-dev")
    victim.subscribe(f"{tag}/owned", qos=1)
    pub = connect(n2.port(), f"{tag}-pub", V5)
    settle(pub, f"{tag}/owned", victim)
    settle(pub, f"{tag}/x", watcher)
    kept_open, answered = [], {}
    for how, data in attempts("default", topic, f"{tag}-dev").items():
        raw = RawLink(link_port(n1))
        raw.send(data)
        if not raw.closed_by_node(3):
            kept_open.append(how)
        answered[how] = [kind for kind, _ in raw.seen if kind != frames.HELLO]
        raw.close()
    watcher.expect_none(1.0)
    assert victim.disconnects.empty(), "the persistent session's connection was closed"
    assert kept_open == [], f"links kept open: {kept_open}"
    assert all(kinds == [] for kinds in answered.values()), f"the node answered (frame types): {answered}"
    fresh = connect(n1.port(), f"{tag}-fresh", V5)
    fresh.subscribe(topic, qos=1)
    fresh.expect_none(0.5)                       # no retained message was set
    for n in range(50):
        pub.publish(f"{tag}/owned", b"%d" % n, qos=1)
    assert [int(m.payload) for m in victim.expect_n(50)] == list(range(50))
    assert n1.proc.poll() is None
    assert "before the link was authenticated" in n1.log or "wrong cluster secret" in n1.log


def test_a_wrong_secret_cannot_join(cluster, tag):
    """A node with another secret starts (Redis lets it in) but no link to or
    from it is ever authenticated: no message crosses."""
    n1, n2 = cluster.start(2)
    intruder = cluster.node(wait=False, env={"BROKERD_CLUSTER_SECRET": "not-the-cluster-secret-" + tag})
    sub1 = connect(n1.port(), f"{tag}-s1", V5)
    sub1.subscribe(f"{tag}/#", qos=0)
    sub3 = connect(intruder.port(), f"{tag}-s3", V5)
    sub3.subscribe(f"{tag}/#", qos=0)
    p1 = connect(n1.port(), f"{tag}-p1", V5)
    p3 = connect(intruder.port(), f"{tag}-p3", V5)
    for _ in range(20):                           # 2 s of chances for routes and links
        p1.publish(f"{tag}/from1", b"x")
        p3.publish(f"{tag}/from3", b"x")
        time.sleep(0.1)
    got1 = {sub1.expect().topic for _ in range(sub1.messages.qsize())}
    got3 = {sub3.expect().topic for _ in range(sub3.messages.qsize())}
    assert f"{tag}/from3" not in got1
    assert f"{tag}/from1" not in got3
    wait_until(lambda: "wrong cluster secret" in n1.log + n2.log + intruder.log, timeout=10,
               message="no link was refused for its secret")
    cluster.wait_connected([n1, n2])              # the rightful nodes still talk


def test_a_rogue_member_must_be_in_the_membership(cluster, tag):
    """With the secret but a node id Redis does not list, a link is refused."""
    n1, _ = cluster.start(2)
    raw = RawLink(link_port(n1))
    kind, node, nonce = raw.read_decoded()
    mine = os.urandom(32)
    raw.send(frames.hello("ghost", mine),
             frames.auth(handshake.proof(cluster.secret.encode(), "ghost", node, nonce, mine)))
    assert raw.closed_by_node(5)
    assert [f for f in raw.seen if f[0] == frames.AUTH] == []
    wait_until(lambda: "'ghost' is not a member" in n1.log, message="the refusal was not logged")


def test_a_takeover_from_a_member_that_does_not_hold_the_lock_is_refused(cluster, tag):
    """Even an authenticated link takes a session over only while its node
    holds the client id's lock in Redis (as a CONNECT there does)."""
    n1, n2 = cluster.start(2)
    victim = persistent(n1.port(), f"{tag}-dev")
    victim.subscribe(f"{tag}/owned", qos=1)
    raw = RawLink(link_port(n1))
    raw.handshake(cluster.secret.encode(), cluster.name(n2))
    raw.send(frames.takeover(77, "default", f"{tag}-dev"))
    assert raw.read_decoded() == (frames.RELEASED, 77, 2)
    time.sleep(0.3)
    assert victim.disconnects.empty()
    pub = connect(n2.port(), f"{tag}-pub", V5)
    settle(pub, f"{tag}/owned", victim)


def test_answers_count_only_on_the_link_they_were_asked_on(cluster, tag):
    """With the subscriber's node stopped, forged ACKs for request ids 1..5000
    -- from an unauthenticated socket, and from an authenticated link of
    another member -- made publishes PUBACK Success for messages no node had
    stored. Now the publisher is refused (and sends again)."""
    n1, n2, n3 = cluster.start(3)
    owner = persistent(n2.port(), f"{tag}-dev")
    owner.subscribe(f"{tag}/t", qos=1)
    pub = Client(f"{tag}-pub", V5)
    pub.connect(n1.port())
    settle(pub, f"{tag}/t", owner)
    owner.drop()                                   # offline: its messages are stored on n2
    time.sleep(0.3)
    rogue = RawLink(link_port(n1))
    rogue.handshake(cluster.secret.encode(), cluster.name(n3))
    sigstop(n2.proc.pid)
    try:
        infos = [pub.publish(f"{tag}/t", b"%d" % n, qos=1, wait=False) for n in range(20)]
        time.sleep(0.2)
        forged = b"".join(frames.ack(req, 0) for req in range(1, 5001))
        stranger = RawLink(link_port(n1))
        stranger.send(old_hello("n2") + forged)
        rogue.send(forged)
        codes = [pub.publish_result(info, timeout=15)[0].value for info in infos]
    finally:
        os.kill(n2.proc.pid, signal.SIGCONT)
    assert all(code >= 0x80 for code in codes), f"acknowledged without a store: {codes}"


def test_a_huge_frame_is_cut_at_its_header(cluster, tag):
    """One socket announcing a 500 MiB frame and sending it: the node buffered
    it all (quadratically), RSS +369 MB and a canary's p50 at 3.2 s. Now the
    frame is refused from its header (before authentication: 1 KiB; after it:
    the maximum packet size plus names)."""
    n1, n2 = cluster.start(2)
    canary = Canary(n1, f"{tag}-c")
    canary.check()
    before = rss_kib(n1)
    header = struct.pack(">IB", 500 * 1024 * 1024, frames.PUBLISH)
    chunk = bytes(1024 * 1024)
    with canary.running():
        for who in ("stranger", "member"):
            raw = RawLink(link_port(n1))
            if who == "member":
                raw.handshake(cluster.secret.encode(), cluster.name(n2))
            sent = 0
            with pytest.raises(OSError):
                raw.send(header)
                while sent < 256 * 1024 * 1024:
                    raw.sock.sendall(chunk)
                    sent += len(chunk)
            assert sent < 64 * 1024 * 1024, f"{who}: the node read {sent} bytes of the frame"
            raw.close()
    grew = rss_kib(n1) - before
    assert grew < 16 * 1024, f"RSS grew by {grew} KiB"
    assert max(canary.latencies) < 5.0
    print(f"canary median {sorted(canary.latencies)[len(canary.latencies) // 2] * 1000:.1f} ms, "
          f"worst {max(canary.latencies) * 1000:.1f} ms; RSS +{grew} KiB")


def test_sockets_that_never_authenticate_are_capped_and_timed_out(cluster, tag):
    """Sockets from one address beyond a few are closed at once; the rest
    within the handshake timeout; nodes keep linking meanwhile."""
    n1, n2 = cluster.start(2)
    port = link_port(n1)
    idle = [RawLink(port, source="127.0.0.2") for _ in range(30)]
    closed_at_once = [s for s in idle if s.closed_by_node(0.3)]
    assert len(closed_at_once) >= 30 - 8, f"only {len(closed_at_once)} of 30 closed at once"
    n3 = cluster.node()                            # joins and links with both while the others wait
    cluster.wait_connected([n1, n2, n3])
    for s in idle:
        if s not in closed_at_once:
            assert s.closed_by_node(10), "a socket that never authenticated was kept"
    for s in idle:
        s.close()


@pytest.mark.parametrize("secret, message", [(None, "BROKERD_CLUSTER_SECRET"), ("short", "too short")])
def test_a_node_without_a_link_credential_refuses_to_start(redis_server, secret, message):
    env = {"BROKERD_CLUSTER_SECRET": secret or ""}
    node = BrokerProcess("--cluster", redis_server.url(0, "nocred"), listen=("mqtt://127.0.0.1:0",), env=env)
    with pytest.raises(RuntimeError):
        node.start()
    errors = [line for line in node.output if line.strip()]
    assert len(errors) == 1 and message in errors[0], errors
    assert node.proc.returncode == 2


def test_links_on_mutual_tls_without_a_secret(redis_server, tmp_path, tag):
    """--cluster-tls-*: nodes link with certificates of the cluster's CA; a
    socket without one, or with another CA's, gets no HELLO."""
    import ssl

    import trustme

    from ..pki import write_cert
    from .conftest import Cluster

    ca = trustme.CA()
    ca_file = str(tmp_path / "ca.pem")
    ca.cert_pem.write_to_path(ca_file)
    c = Cluster(redis_server, tmp_path)
    try:
        nodes = []
        for i in range(2):
            cert, key = write_cert(ca.issue_cert(f"node{i}"), tmp_path, f"node{i}")
            nodes.append(c.node("--cluster-tls-cert", cert, "--cluster-tls-key", key, "--cluster-tls-ca", ca_file,
                                wait=False, env={"BROKERD_CLUSTER_SECRET": ""}))
        c.wait_connected()
        port = link_port(nodes[0])
        other = trustme.CA()
        for name, ctx in (("no certificate", ssl.create_default_context(cafile=ca_file)),
                          ("another CA's", ssl.create_default_context(cafile=ca_file))):
            ctx.check_hostname = False
            if name == "another CA's":
                other.issue_cert("node9").configure_cert(ctx)
            refused = (ssl.SSLError, ConnectionResetError, EOFError, BrokenPipeError)
            with (socket.create_connection(("127.0.0.1", port), timeout=5) as s, pytest.raises(refused),
                  ctx.wrap_socket(s) as t):
                if not t.recv(64):                  # TLS 1.3: the refusal arrives with the first read
                    raise EOFError(name)
    finally:
        c.stop_all()


def test_redis_with_a_password_and_tls(tmp_path, tag):
    """The bus on a Redis that requires a password and speaks only TLS (rediss://)."""
    import trustme

    from .conftest import Cluster, RedisServer

    redis = RedisServer(tmp_path, password="bus-" + tag, tls=trustme.CA()).start()
    c = Cluster(redis, tmp_path)
    try:
        n1, n2 = c.start(2)
        sub = connect(n2.port(), f"{tag}-s", V5)
        sub.subscribe(f"{tag}/t", qos=1)
        pub = connect(n1.port(), f"{tag}-p", V5)
        settle(pub, f"{tag}/t", sub)
        assert redis.client().exists(f"{c.prefix}:node:n1")
    finally:
        c.stop_all()
        redis.stop()


def test_a_wrong_redis_password_is_said_in_one_line(tmp_path, tag):
    from .conftest import RedisServer

    redis = RedisServer(tmp_path, password="right-" + tag).start()
    try:
        node = BrokerProcess("--cluster", f"redis://:wrong@127.0.0.1:{redis.port}/0", listen=("mqtt://127.0.0.1:0",),
                             env={"BROKERD_CLUSTER_SECRET": "a-long-enough-cluster-secret"})
        with pytest.raises(RuntimeError):
            node.start()
        errors = [line for line in node.output if " ERROR " in line or "Traceback" in line]
        assert len(errors) == 1 and "cannot reach the cluster bus redis://:***@" in errors[0], node.output
        assert "wrong" not in errors[0]
        assert node.proc.returncode == 2
    finally:
        redis.stop()


def test_a_node_that_stops_reading_does_not_swell_the_node_that_forwards_to_it(cluster, tag):
    """The subscriber's node stops (SIGSTOP) while a publisher on another node
    sends QoS 0 as fast as it can: what waits for the stopped node counts
    against the sender's queue budget, so the publisher is paced, and a
    canary whose messages stay on the node is not."""
    import threading

    from ..integration.raw import connect_packet, publish_packet

    n1, n2 = cluster.start(2, "--queue-budget", str(8 * 1024 * 1024))
    far = connect(n2.port(), f"{tag}-far", V5)
    far.subscribe(f"{tag}/flood", qos=0)
    pub = connect(n1.port(), f"{tag}-probe", V5)
    settle(pub, f"{tag}/flood", far)
    canary = Canary(n1, f"{tag}-c")
    canary.check()
    before = rss_kib(n1)
    batch = publish_packet(f"{tag}/flood", bytes(1024)) * 256
    blaster = socket.create_connection(("127.0.0.1", n1.port()), timeout=10)
    blaster.sendall(connect_packet(f"{tag}-blaster", 4))
    blaster.recv(4)
    stop = threading.Event()
    sent = [0]

    def blast():
        blaster.settimeout(0.5)
        while not stop.is_set():
            try:
                blaster.sendall(batch)
                sent[0] += len(batch)
            except TimeoutError:
                continue                  # paced: the node does not read from it now
            except OSError:
                return

    sigstop(n2.proc.pid)
    try:
        with canary.running():
            thread = threading.Thread(target=blast, daemon=True)
            thread.start()
            time.sleep(3.0)               # under the 5 s after which n2 counts as gone and its link is dropped
            grew = rss_kib(n1) - before
            stop.set()
            thread.join(5)
    finally:
        os.kill(n2.proc.pid, signal.SIGCONT)
        blaster.close()
    print(f"sent {sent[0] >> 20} MiB in 3 s; RSS +{grew >> 10} MiB; canary worst "
          f"{max(canary.latencies) * 1000:.0f} ms over {len(canary.latencies)} round trips")
    assert grew < 48 * 1024, f"RSS grew by {grew >> 10} MiB while the peer did not read"
