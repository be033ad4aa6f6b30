"""Cross-node publish/subscribe (issue #5): a message published on one node
reaches the subscribers of every other node once each, in publish order;
retained messages are on every node; ``$SYS/cluster/...`` sums the nodes."""

import time

import pytest

from ..integration.helpers import Client, connect
from ..mqtt import V5, V311, PacketTypes, props
from .conftest import settle, wait_until

COUNT = 500


@pytest.mark.parametrize("qos,persistent", [(0, False), (1, False), (2, False), (1, True), (2, True)],
                         ids=["qos0", "qos1", "qos2", "qos1-stored", "qos2-stored"])
def test_publisher_order_across_nodes(cluster, tag, qos, persistent):
    """A publisher on node 1 sends numbered messages; subscribers on nodes 2 and
    3 (one 3.1.1, one 5.0; stored sessions or not) get all, in order, once."""
    n1, n2, n3 = cluster.start(3)
    expiry = props(PacketTypes.CONNECT, SessionExpiryInterval=300) if persistent else None
    subs = [connect(n2.port(), f"{tag}-sub2", V311, clean=not persistent),
            connect(n3.port(), f"{tag}-sub3", V5, clean=not persistent, properties=expiry)]
    for c in subs:
        c.subscribe(f"{tag}/#", qos=2)
    pub = Client(f"{tag}-pub", V5)
    # at most 16 in flight: brokerd counts a QoS 2 PUBLISH that waits for another node twice against
    # its Receive Maximum (32), see test_sessions.py::test_qos2_burst_within_receive_maximum_...
    pub.client.max_inflight_messages_set(16)
    pub.connect(n1.port())
    settle(pub, f"{tag}/probe", *subs)
    infos = [pub.publish(f"{tag}/m", b"%05d" % n, qos=qos, wait=False) for n in range(COUNT)]
    if qos:
        codes = {pub.publish_result(info, timeout=30)[0].value for info in infos}
        assert codes == {0}, f"PUBACK/PUBREC reason codes {codes}"
    for c in subs:
        msgs = c.expect_n(COUNT, timeout=30)
        assert [int(m.payload) for m in msgs] == list(range(COUNT))
        assert {(m.qos, m.dup, m.topic) for m in msgs} == {(qos, False, f"{tag}/m")}
    for c in subs:
        c.expect_none(0.5)


def test_one_copy_per_subscriber_with_several_subscribers_on_each_node(cluster, tag):
    """The message crosses to each node once, and there every local subscriber
    (plain filter, wildcard, several clients) gets its own copy -- and the
    publisher's node's own subscriber too."""
    n1, n2, n3 = cluster.start(3)
    subs = []
    for i, node in enumerate((n1, n2, n2, n3, n3)):
        c = connect(node.port(), f"{tag}-s{i}", V5)
        c.subscribe(f"{tag}/a/b" if i % 2 else f"{tag}/+/b", qos=1)
        subs.append(c)
    pub = connect(n1.port(), f"{tag}-pub", V311)
    settle(pub, f"{tag}/a/b", *subs)
    for n in range(20):
        pub.publish(f"{tag}/a/b", b"%d" % n, qos=1)
    for c in subs:
        assert [int(m.payload) for m in c.expect_n(20)] == list(range(20))
        c.expect_none(0.3)


def test_retained_message_is_on_every_node_and_cleared_everywhere(cluster, tag):
    n1, n2 = cluster.start(2)
    topic = f"{tag}/state"
    pub = connect(n1.port(), f"{tag}-pub", V5)
    pub.publish(topic, b"on", qos=1, retain=True)

    def retained_on(node, i=[0]):  # noqa: B006 -- a counter for unique client ids
        i[0] += 1
        c = connect(node.port(), f"{tag}-r{i[0]}", V5)
        try:
            c.subscribe(f"{tag}/#", qos=1)
            try:
                return c.expect(0.3)
            except AssertionError:
                return None
        finally:
            c.disconnect()

    msg = wait_until(lambda: retained_on(n2), timeout=5, message="retained message never reached node 2")
    assert (msg.topic, msg.payload, msg.retain) == (topic, b"on", True)
    # a node that joins later gets it too
    n3 = cluster.node()
    msg = wait_until(lambda: retained_on(n3), timeout=5, message="retained message never reached node 3")
    assert msg.payload == b"on"
    # replaced from node 3, cleared from node 2: everywhere
    connect(n3.port(), f"{tag}-pub3", V311).publish(topic, b"off", qos=1, retain=True)
    for node in (n1, n2):
        wait_until(lambda node=node: (m := retained_on(node)) is not None and m.payload == b"off", timeout=5,
                   message="replaced retained message not on every node")
    connect(n2.port(), f"{tag}-pub2", V311).publish(topic, b"", qos=1, retain=True)
    for node in (n1, n2, n3):
        wait_until(lambda node=node: retained_on(node) is None, timeout=5,
                   message="cleared retained message still delivered")
    time.sleep(1.2)         # a heartbeat later: still nothing anywhere (no replay of an old copy)
    assert [retained_on(node) for node in (n1, n2, n3)] == [None, None, None]


def _sys_value(client, topic: str, expected: str, timeout: float = 10.0) -> str:
    """Read the (retained, periodically republished) $SYS value until it is ``expected``."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            msg = client.expect(max(0.05, deadline - time.monotonic()))
        except AssertionError:
            break
        if msg.topic == topic:
            last = msg.payload.decode()
            if last == expected:
                return last
    raise AssertionError(f"{topic}: last value {last!r}, expected {expected!r}")


def test_sys_cluster_counts_clients_of_all_nodes(cluster, tag):
    nodes = cluster.start(3, "--sys-interval", "1")
    clients = [connect(node.port(), f"{tag}-c{i}-{k}", V311)
               for i, node in enumerate(nodes) for k in range(i + 1)]           # 1 + 2 + 3
    watcher = connect(nodes[0].port(), f"{tag}-sys", V5)
    watcher.subscribe("$SYS/#", qos=0)
    _sys_value(watcher, "$SYS/cluster/nodes", "3")
    _sys_value(watcher, "$SYS/cluster/clients/connected", str(len(clients) + 1))
    _sys_value(watcher, "$SYS/broker/clients/connected", "2")      # node 1's own: one client and the watcher
    for c in clients[3:]:                                              # node 3's clients leave
        c.disconnect()
    _sys_value(watcher, "$SYS/cluster/clients/connected", "4")
    _sys_value(watcher, "$SYS/broker/clients/connected", "2")


def test_sys_cluster_does_not_count_a_node_no_one_reaped(cluster, tag):
    """A node that died with no member left to see it go (the cluster
    restarted under new node ids) stayed in $SYS/cluster's sums for good:
    its clients counted as connected. Now only members are summed."""
    [n1] = cluster.start(1, "--sys-interval", "1")
    gone = [connect(n1.port(), f"{tag}-c{k}", V311) for k in range(3)]
    r = cluster.redis.client()
    wait_until(lambda: r.hget(f"{cluster.prefix}:stats:n1", "connected") == b"3", timeout=10,
               message="n1's figures with its 3 clients not shared")         # a round of figures shared
    n1.kill()
    for c in gone:
        c.drop()
    wait_until(lambda: not r.exists(f"{cluster.prefix}:node:n1"), timeout=15,
               message="n1's membership did not expire")                      # no one will see it go
    [n2] = cluster.start(1, "--sys-interval", "1")     # another node id, the only member
    watcher = connect(n2.port(), f"{tag}-sys", V5)
    watcher.subscribe("$SYS/cluster/#", qos=0)
    _sys_value(watcher, "$SYS/cluster/nodes", "1")
    _sys_value(watcher, "$SYS/cluster/clients/connected", "1")


def test_qos0_properties_reach_other_nodes_after_a_local_3x_delivery(cluster, tag):
    """A 5.0 client's QoS 0 PUBLISH with properties, delivered first to a 3.1.1
    subscriber on its own node (which caches the message's 3.x wire form), still
    reaches a 5.0 subscriber on another node with its properties: the 3.x wire
    form, passed between nodes as it is, carries none."""
    n1, n2 = cluster.start(2)
    topic = f"{tag}/p"
    local3 = connect(n1.port(), f"{tag}-l3", V311)
    local3.subscribe(topic, qos=0)
    remote5 = connect(n2.port(), f"{tag}-r5", V5)
    remote5.subscribe(topic, qos=0)
    pub = connect(n1.port(), f"{tag}-pub", V5)
    settle(pub, topic, local3, remote5)
    up = [("k", "v")]
    pub.publish(topic, b"x", qos=0, properties=props(PacketTypes.PUBLISH, UserProperty=up,
                                                     ContentType="text/plain"))
    assert local3.expect().payload == b"x"
    msg = remote5.expect()
    assert msg.payload == b"x"
    assert getattr(msg.properties, "UserProperty", None) == up
    assert getattr(msg.properties, "ContentType", None) == "text/plain"


def test_a_message_expiry_interval_above_2_to_the_31_crosses_nodes(cluster, tag):
    """A Message Expiry Interval is a Four Byte Integer: up to 4,294,967,295 s (5.0 3.3.2.3.3).
    Forwarded to another node it went into the frame's i32 field: struct.error in the
    publisher's read callback -- its connection closed without a PUBACK and the subscriber on
    the other node never got the message. It crosses, with the interval left (unsigned)."""
    n1, n2 = cluster.start(2)
    topic = f"{tag}/long"
    sub = connect(n2.port(), f"{tag}-sub", V5)
    sub.subscribe(topic, qos=1)
    pub = connect(n1.port(), f"{tag}-pub", V5)
    settle(pub, topic, sub)
    for interval in (0xFFFFFFFF, 2**31):
        code, _ = pub.publish_result(pub.publish(
            topic, b"%d" % interval, qos=1, wait=False,
            properties=props(PacketTypes.PUBLISH, MessageExpiryInterval=interval)), timeout=10)
        assert code.value == 0
        m = sub.expect(timeout=10)
        assert m.payload == b"%d" % interval
        assert interval - 5 <= m.properties.MessageExpiryInterval <= interval


def test_sys_cluster_counts_each_retained_message_once(cluster, tag):
    """Every node holds a copy of every retained message, and $SYS/cluster summed the
    nodes' counts: 30 retained messages on two nodes read 60 more in
    "$SYS/cluster/retained messages/count" (three times as many on three nodes) -- while
    the admin API's cluster figure, and a --workers host's tree, count them once. Now the
    cluster's count is the largest node's: the node watched (the same copies) reads the
    same figure."""
    n1, n2 = cluster.start(2, "--sys-interval", "1")

    def retained_count(node) -> int:
        c = connect(node.port(), f"{tag}-count", V311)
        c.subscribe(f"{tag}/#", qos=0)
        n = 0
        try:
            while True:
                c.expect(0.3)
                n += 1
        except AssertionError:
            return n
        finally:
            c.disconnect()

    pub = connect(n2.port(), f"{tag}-pub", V311)
    for i in range(30):
        pub.publish(f"{tag}/r{i}", b"kept", qos=1, retain=True)
    wait_until(lambda: retained_count(n1) >= 30, timeout=5, message="retained messages not copied to node 1")
    watcher = connect(n1.port(), f"{tag}-sys", V5)
    watcher.subscribe("$SYS/cluster/nodes", qos=0)
    watcher.subscribe("$SYS/+/retained messages/count", qos=0)
    last: dict[str, int] = {}
    deadline = time.monotonic() + 4                 # rounds of both nodes' figures shared
    while (left := deadline - time.monotonic()) > 0:
        try:
            msg = watcher.expect(left)
        except AssertionError:
            break
        last[msg.topic] = int(msg.payload)
    assert last["$SYS/cluster/nodes"] == 2
    mine = last["$SYS/broker/retained messages/count"]       # the 30 and node 1's own $SYS tree
    assert mine >= 30 and last["$SYS/cluster/retained messages/count"] == mine, last
    pub.disconnect()
    watcher.disconnect()
