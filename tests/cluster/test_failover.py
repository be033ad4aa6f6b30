"""Nodes that die or lose the cluster bus (issue #5).

- SIGKILL: the node's stored sessions are adopted by one survivor (after its
  membership key expires, 5 s), which publishes its clients' wills once;
  nothing a publisher got a PUBACK for is lost.
- Netsplit (a node cut off from Redis by a proxy we stop): the node fences
  itself after ~3.5 s -- its clients are sent away (v5: 0x9C + Server
  Reference), CONNECTs are refused (0x88 / 3) -- the others adopt its
  sessions; when Redis is back it rejoins. Cut off from its store too, it
  writes nothing of those sessions once the others may have adopted them,
  not even when the network heals.
"""

import re
import time

import pytest

from ..durability.test_crash import TOTAL, drain, drain_until, received_in_order
from ..hbase_double import HBaseDoubleProcess
from ..integration.helpers import Client, connect
from ..integration.raw import CONNACK, RawClient
from ..mqtt import V5, V311, PacketTypes, props
from .conftest import PacedPublisher, TcpProxy, settle, wait_until

EXPIRY = 300


def persistent(port: int, client_id: str, version=V5, will=None) -> Client:
    c = Client(client_id, version, clean=False)
    p = props(PacketTypes.CONNECT, SessionExpiryInterval=EXPIRY) if version == V5 else None
    return c.connect(port, properties=p, will=will)


def adopted_by(nodes, dead: str, timeout: float = 15.0):
    """The node whose log says it adopted ``dead``'s sessions (exactly one does)."""
    pattern = re.compile(rf"adopted (\d+) sessions of node {dead}\b")

    def find():
        found = [n for n in nodes if pattern.search(n.log)]
        return found or None

    found = wait_until(find, timeout=timeout, message=f"no node adopted the sessions of {dead}")
    if len(nodes) > 1:
        time.sleep(1.5)       # the other survivors noticed the death too by now (heartbeat 1 s)
        found = find()
    assert len(found) == 1, f"{len(found)} nodes adopted the sessions of {dead}"
    return found[0]


def eventually_connected(cluster, timeout: float = 20.0) -> None:
    """cluster.wait_connected(), tried again (new clients, new filters) until ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            cluster.wait_connected(timeout=4)
            return
        except (AssertionError, ConnectionError):
            if time.monotonic() > deadline:
                raise


def ranges(numbers) -> str:
    """[1, 2, 3, 7] -> '1-3 7'."""
    out = []
    for n in sorted(numbers):
        if out and n == out[-1][1] + 1:
            out[-1][1] = n
        else:
            out.append([n, n])
    return " ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in out)


# ----------------------------------------------------------------------- SIGKILL

@pytest.mark.slow
def test_sigkill_of_subscriber_node_mid_stream_loses_no_acknowledged_message(cluster, tag):
    """test_crash's scenario across nodes: a persistent QoS 1 subscriber,
    offline, whose session is on node 2; 5,000 numbered messages published on
    node 1; node 2 SIGKILLed after a third of them were acknowledged; the
    stream goes on (negative acks while node 2 is not yet declared dead); the
    subscriber comes back on node 3: every PUBACKed message, in order."""
    n1, n2, n3 = cluster.start(3, "--max-queued", str(TOTAL * 2))
    topic = f"{tag}/stream"
    sub_id = f"{tag}-sub"
    sub = persistent(n2.port(), sub_id, V311)
    sub.subscribe(topic, qos=1)
    settle(connect(n1.port(), f"{tag}-probe", V5), topic, sub)
    sub.disconnect()
    time.sleep(0.2)                      # the route stays (stored session): nothing to wait for but the DISCONNECT

    pub = PacedPublisher(n1.port(), topic, total=TOTAL, rate=400).start()
    pub.wait_acked(TOTAL // 3)
    n2.kill()
    killed_at = pub.sent
    pub.finish()
    acked = pub.acked
    adopter = adopted_by([n1, n3], cluster.name(n2))

    again = persistent(n3.port(), sub_id, V311)
    assert again.session_present
    got = received_in_order(drain_until(again, acked))
    missing = sorted(acked - set(got))
    failed = sum(v for code, v in pub.by_code().items() if code >= 0x80)
    assert not missing, (f"{len(missing)} acknowledged messages lost, first {missing[:20]} (killed at #{killed_at}; "
                         f"reason codes {pub.by_code()}; 0x10 for #{pub.numbers_with(0x10)[:10]}...; "
                         f"adopted by {cluster.name(adopter)})")
    assert failed, "no publish failed: the kill did not happen mid-stream"
    assert max(acked) > killed_at + 500, "the stream did not go on after the node was declared dead"


@pytest.mark.slow
def test_wills_of_a_killed_node_are_published_once(cluster, tag):
    n1, n2, n3 = cluster.start(3)
    watchers = [connect(n.port(), f"{tag}-w{i}", V5) for i, n in enumerate((n1, n3))]
    for w in watchers:
        w.subscribe(f"{tag}/will/#", qos=1)
    for node in (n1, n2, n3):
        settle(connect(node.port(), f"{tag}-probe-{cluster.name(node)}", V5), f"{tag}/will/probe", *watchers)
    # a plain 3.1.1 client (its will kept in Redis), a persistent v5 session (its will in the store), and a
    # client that said goodbye (no will owed)
    plain = connect(n2.port(), f"{tag}-plain", V311, will=(f"{tag}/will/plain", b"plain gone", 1, False))
    stored = persistent(n2.port(), f"{tag}-stored", will=(f"{tag}/will/stored", b"stored gone", 1, False))
    polite = connect(n2.port(), f"{tag}-polite", V5, will=(f"{tag}/will/polite", b"polite gone", 1, False))
    polite.disconnect()
    time.sleep(0.3)       # the will registration of the ones that stay is one Redis write after their CONNACK
    n2.kill()
    for c in (plain, stored):
        c.expect_disconnect()
    adopted_by([n1, n3], cluster.name(n2))
    quiet = 2.5
    for w in watchers:
        got = sorted(m.payload for m in drain(w, idle=quiet, limit=20))
        assert got == [b"plain gone", b"stored gone"], f"wills received: {got}"
        quiet = 0.5         # the next watcher's messages kept coming meanwhile: it has had 2.5 s of quiet too


# ----------------------------------------------------------------------- netsplit

@pytest.fixture
def split_cluster(cluster):
    """Nodes n1, n3 reach Redis directly, n2 through a proxy the test can stop."""
    proxy = TcpProxy(cluster.redis.port).start()
    n1 = cluster.node(wait=False)
    n2 = cluster.node(redis_port=proxy.port, wait=False)
    n3 = cluster.node(wait=False)
    cluster.wait_connected()
    yield proxy, n1, n2, n3
    proxy.stop()


@pytest.mark.slow
def test_netsplit_fences_the_cut_off_node_and_it_rejoins(cluster, split_cluster, tag):
    proxy, n1, n2, n3 = split_cluster
    others = {f"127.0.0.1:{n.port()}": n for n in (n1, n3)}
    topic = f"{tag}/p"
    dev = persistent(n2.port(), f"{tag}-dev")
    dev.subscribe(topic, qos=1)
    v3 = connect(n2.port(), f"{tag}-v3", V311)
    listener = connect(n1.port(), f"{tag}-listener", V5)
    listener.subscribe(f"{tag}/live", qos=1)
    pub = connect(n3.port(), f"{tag}-pub", V5)
    settle(pub, topic, dev)
    settle(pub, f"{tag}/live", listener)

    proxy.stop()
    t0 = time.monotonic()
    code, p = dev.expect_disconnect(timeout=10)
    fenced_after = time.monotonic() - t0
    reference = getattr(p, "ServerReference", None)
    assert code.value == 0x9C and reference in others or code.value == 0x8B, (code, reference)
    v3.expect_disconnect()
    wait_until(lambda: "lost the cluster bus" in n2.log, timeout=2, message="node 2 did not log its fencing")
    assert 2.0 < fenced_after < 8.0, f"fenced after {fenced_after:.1f} s"
    # new CONNECTs are refused while it is cut off
    for version, refused in ((5, 0x88), (4, 3)):
        with RawClient(n2.port()) as raw:
            ack = raw.connect(f"{tag}-late{version}", version=version)
            assert (ack.type, ack.code) == (CONNACK, refused)
    # the rest of the cluster keeps working
    pub.publish(f"{tag}/live", b"still here", qos=1)
    assert listener.expect().payload == b"still here"
    # the persistent session is adopted by a survivor once n2's membership expires, and usable there
    adopter = adopted_by([n1, n3], cluster.name(n2))
    again = persistent(adopter.port(), f"{tag}-dev")
    assert again.session_present
    settle(pub, topic, again)
    pub.publish(topic, b"after the split", qos=1)
    assert again.expect().payload == b"after the split"

    # Redis is back: n2 rejoins, takes clients again, forwards and receives (give it a few tries: right
    # after the rejoin brokerd still uses its pooled Redis connections of before the split -- see
    # test_bus.py, where that is checked strictly)
    proxy.start()
    wait_until(lambda: "rejoined the cluster" in n2.log, timeout=10, message="node 2 did not rejoin")
    eventually_connected(cluster)
    back = connect(n2.port(), f"{tag}-back", V5)
    back.subscribe(f"{tag}/live", qos=1)
    settle(pub, f"{tag}/live", back, listener)
    # the adopted session is in one place only: one copy of each message
    pub.publish(topic, b"once", qos=1)
    assert again.expect().payload == b"once"
    again.expect_none(1.0)


@pytest.mark.slow
def test_netsplit_loses_no_acknowledged_message_to_the_cut_off_nodes_session(cluster, split_cluster, tag):
    """QoS 1 messages for a persistent session of the node that gets cut off,
    published on another node all along: before, during and after the
    fencing and the adoption. Every PUBACKed one reaches the client, which
    follows the Server Reference once its session is adopted."""
    proxy, n1, n2, n3 = split_cluster
    topic = f"{tag}/p"
    dev = persistent(n2.port(), f"{tag}-dev")
    dev.subscribe(topic, qos=1)
    settle(connect(n3.port(), f"{tag}-probe", V5), topic, dev)
    pub = PacedPublisher(n3.port(), topic, total=4000, rate=300).start()
    pub.wait_acked(300)
    proxy.stop()
    split_at = pub.sent
    dev.expect_disconnect(timeout=10)
    fenced_at = pub.sent
    before = list(dev.messages.queue)
    adopter = adopted_by([n1, n3], cluster.name(n2))
    adopted_at = pub.sent
    again = persistent(adopter.port(), f"{tag}-dev")
    assert again.session_present
    pub.finish()
    got = received_in_order(before + drain_until(again, pub.acked - {int(m.payload) for m in before}))
    missing = sorted(pub.acked - set(got))
    assert not missing, (f"{len(missing)} acknowledged messages lost: {ranges(missing)} (split at #{split_at}, "
                         f"fenced at #{fenced_at}, adopted by #{adopted_at}; reason codes {pub.by_code()}; "
                         f"received before the fencing: {ranges(received_in_order(before))})")


@pytest.mark.slow
def test_a_node_cut_off_from_redis_and_its_store_writes_nothing_stale_when_the_network_heals(cluster, tmp_path, tag):
    """n2 reaches Redis and the store (the HBase double) through proxies that
    are stopped together. A persistent session's UNSUBSCRIBE, taken on n2 as
    it was cut off, could not be written; the session is adopted by n1 as the
    store had it (still subscribed), where the client subscribes again. When
    the network heals, n2 must not write the UNSUBSCRIBE then: the
    subscription the client holds on n1 would be gone from the store, and
    the session, moved again, would miss every message for it."""
    gateway = HBaseDoubleProcess(tmp_path / "hbase.db").start()
    store_link = TcpProxy(gateway.port).start()
    redis_link = TcpProxy(cluster.redis.port).start()
    try:
        cluster.store = f"hbase://{gateway.address}?table_prefix=heal&timeout=2000"
        n1 = cluster.node(wait=False)
        n2 = cluster.node(redis_port=redis_link.port, wait=False,
                          store=f"hbase://127.0.0.1:{store_link.port}?table_prefix=heal&timeout=2000")
        cluster.wait_connected()
        topic = f"{tag}/t"
        dev = persistent(n2.port(), f"{tag}-dev")
        dev.subscribe(topic, qos=1)
        pub = connect(n1.port(), f"{tag}-pub", V5)
        settle(pub, topic, dev)

        store_link.stop()
        redis_link.stop()
        dev.unsubscribe(topic)
        dev.expect_disconnect(timeout=10)
        adopted_by([n1], cluster.name(n2))
        assert "writes before the other nodes may adopt this node's sessions: given up" in n2.log
        again = persistent(n1.port(), f"{tag}-dev")
        assert again.session_present
        again.subscribe(topic, qos=1)
        settle(pub, topic, again)

        store_link.start()
        redis_link.start()
        wait_until(lambda: "rejoined the cluster" in n2.log, timeout=15, message="node 2 did not rejoin")
        time.sleep(3)                   # a write n2 still retried would be in by now (its backoff: 2 s at most)
        again.disconnect()
        eventually_connected(cluster)
        moved = persistent(n2.port(), f"{tag}-dev")      # the session moves to n2, read from the store
        assert moved.session_present
        settle(pub, topic, moved)                       # fails when the session lost its subscription
        pub.publish(topic, b"after the heal", qos=1)
        assert moved.expect().payload == b"after the heal"
    finally:
        store_link.stop()
        redis_link.stop()
        gateway.stop()


@pytest.mark.slow
def test_a_node_that_rejoined_after_a_netsplit_is_adopted_when_it_dies(cluster, split_cluster, tag):
    """n2 is cut off, fences, is adopted by a survivor (which marks n2 reaped), and rejoins
    when Redis is back. Killed later, it is adopted again and its client's will published:
    the mark of its first adoption says nothing of its second death."""
    proxy, n1, n2, n3 = split_cluster
    proxy.stop()
    wait_until(lambda: "lost the cluster bus" in n2.log, timeout=10, message="node 2 did not fence")
    adopted_by([n1, n3], cluster.name(n2))
    proxy.start()
    wait_until(lambda: "rejoined the cluster" in n2.log, timeout=15, message="node 2 did not rejoin")
    eventually_connected(cluster)
    watcher = connect(n1.port(), f"{tag}-watcher", V5)
    watcher.subscribe(f"{tag}/will", qos=1)
    dev = persistent(n2.port(), f"{tag}-dev", will=(f"{tag}/will", b"gone", 1))
    dev.subscribe(f"{tag}/p", qos=1)
    settle(connect(n3.port(), f"{tag}-probe", V5), f"{tag}/p", dev)
    settled_adoptions = {n: n.log.count(f"of node {cluster.name(n2)}") for n in (n1, n3)}
    n2.kill()
    wait_until(lambda: any(n.log.count(f"adopted 1 sessions of node {cluster.name(n2)}") for n in (n1, n3)),
               timeout=20, message=f"no node adopted the sessions of n2 a second time: {settled_adoptions}")
    assert watcher.expect(timeout=10).payload == b"gone"
    again = persistent(n1.port(), f"{tag}-dev")
    assert again.session_present
