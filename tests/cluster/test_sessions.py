"""Sessions that move between nodes (issue #5): a CONNECT on another node
takes the session over (the old connection gets 0x8E, the new one the
session and what it was owed); a node that leaves with SIGTERM sends its v5
clients to another node (0x9C + Server Reference) where their sessions wait."""

import signal
import threading

from ..durability.test_crash import drain, received_in_order
from ..integration.helpers import Client, connect, wait_until
from ..integration.raw import (
    CONNACK,
    DISCONNECT,
    MAXIMUM_PACKET_SIZE,
    PUBREC,
    REASON_STRING,
    RECEIVE_MAXIMUM,
    SERVER_REFERENCE,
    SESSION_EXPIRY_INTERVAL,
    Closed,
    RawClient,
    publish_packet,
)
from ..mqtt import V5, V311, PacketTypes, props
from .conftest import PacedPublisher, settle

EXPIRY = 300


def persistent(port: int, client_id: str, manual_ack: bool = False, receive_maximum: int | None = None,
               will=None) -> Client:
    values = {"SessionExpiryInterval": EXPIRY}
    if receive_maximum:
        values["ReceiveMaximum"] = receive_maximum
    c = Client(client_id, V5, clean=False, manual_ack=manual_ack)
    return c.connect(port, properties=props(PacketTypes.CONNECT, **values), will=will)


def test_takeover_across_nodes_moves_queued_and_inflight_messages(cluster, tag):
    n1, n2, n3 = cluster.start(3)
    topic = f"{tag}/t"
    first = persistent(n1.port(), f"{tag}-dev", manual_ack=True, receive_maximum=2)
    first.subscribe(topic, qos=1)
    pub = connect(n3.port(), f"{tag}-pub", V5)
    settle(pub, topic, first)
    for n in range(6):
        code, _ = pub.publish_result(pub.publish(topic, b"%d" % n, qos=1, wait=False))
        assert code.value == 0
    # two in flight (Receive Maximum 2, never acknowledged), four queued
    assert [int(m.payload) for m in first.expect_n(2)] == [0, 1]
    first.expect_none(0.3)

    second = persistent(n2.port(), f"{tag}-dev")
    code, _ = first.expect_disconnect()
    assert code.value == 0x8E, f"old connection got {code}"
    assert second.session_present
    msgs = second.expect_n(6, timeout=10)
    assert [int(m.payload) for m in msgs] == list(range(6))
    # the two sent before come again with DUP; the four queued were never sent: no DUP ([MQTT-3.3.1-1])
    assert [m.dup for m in msgs] == [True, True, False, False, False, False]
    second.expect_none(0.3)
    # the subscription moved with it: new messages go to node 2 now
    settle(pub, topic, second)
    pub.publish(topic, b"after", qos=1)
    assert second.expect().payload == b"after"
    first.expect_none(0.3)


def at_once(port_and_clients: list[tuple[int, Client]], properties=None) -> list[tuple]:
    """Every client sends its CONNECT at the same moment (a thread each, a
    barrier); -> their CONNACKs' (flags, reason code, properties), in order."""
    barrier = threading.Barrier(len(port_and_clients))
    errors = []

    def go(port, c):
        try:
            barrier.wait(10)
            c.connect(port, properties=properties, wait=False)
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=go, args=pc) for pc in port_and_clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert not errors, errors
    acks = [c.connack_result(timeout=15) for _, c in port_and_clients]
    for (_, c), (_, code, _) in zip(port_and_clients, acks, strict=True):
        if code.is_failure:     # paho would reconnect in the background with this client id and take over
            c.client.disconnect()
            c.client.loop_stop()
    return acks


def test_a_burst_of_connects_keeps_one_session_per_client_id(cluster, tag):
    """CONNECTs sent at once on two nodes -- their client-id claims go to
    Redis together: persistent sessions taken over from the other node, new
    client ids, and client ids connecting on both nodes at the same moment.
    Every client id ends with one connection holding its session, and what
    was acknowledged to a publisher before the burst reaches it."""
    n1, n2 = cluster.start(2)
    n = 12
    session = props(PacketTypes.CONNECT, SessionExpiryInterval=EXPIRY)
    pub = connect(n2.port(), f"{tag}-pub", V5)
    olds = []
    for i in range(n):
        c = persistent(n1.port(), f"{tag}-m{i}", manual_ack=True)
        c.subscribe(f"{tag}/m{i}", qos=1)
        settle(pub, f"{tag}/m{i}", c)
        olds.append(c)
    for i, c in enumerate(olds):
        code, _ = pub.publish_result(pub.publish(f"{tag}/m{i}", b"before", qos=1, wait=False))
        assert code.value == 0
        assert c.expect().payload == b"before"          # in flight, never acknowledged by the client

    takers = [(n2.port(), Client(f"{tag}-m{i}", V5, clean=False)) for i in range(n)]
    fresh = [((n1, n2)[i % 2].port(), Client(f"{tag}-f{i}", V5, clean=False)) for i in range(n)]
    # half the twins persistent: the first CONNECT's store read after its claim was a window in which a
    # takeover from the other node found no session, and both nodes opened one (tests/cluster/test_takeover_unit.py)
    twins = [(node.port(), Client(f"{tag}-d{i}", V5, clean=i % 2 == 0)) for i in range(n) for node in (n1, n2)]
    acks = at_once(takers + fresh + twins, properties=session)

    for i, ((flags, code, _), (_, c)) in enumerate(zip(acks[:n], takers, strict=True)):
        assert code.value == 0, f"{tag}-m{i}: CONNACK {code}"
        assert flags.session_present, f"{tag}-m{i}: its session did not follow it"
        code, _ = olds[i].expect_disconnect()
        assert code.value == 0x8E, f"{tag}-m{i}: old connection got {code}"
        msg = c.expect(timeout=10)
        assert (msg.payload, msg.dup) == (b"before", True), f"{tag}-m{i}: got {msg.payload!r}"
    assert [code.value for _, code, _ in acks[n:2 * n]] == [0] * n
    for i in range(n):
        pair = [c for _, c in twins[2 * i:2 * i + 2]]
        codes = [code.value for _, code, _ in acks[2 * n + 2 * i:2 * n + 2 * i + 2]]

        def holding(pair=pair, codes=codes) -> int:       # accepted and not taken over (0x8E) since
            return sum(code == 0 and c.disconnects.empty() for c, code in zip(pair, codes, strict=True))

        wait_until(lambda: holding() == 1, timeout=10,
                   message=f"{tag}-d{i}: not exactly one connection holds the client id",
                   explain=lambda pair=pair, codes=codes: f"CONNACKs {codes}, disconnects "
                                                          f"{[list(c.disconnects.queue) for c in pair]}")
        assert [code for code in codes if code != 0] in ([], [0x89]), codes     # or refused: Server busy (being taken over)
    # an accepted connection ends only by being taken over (a refused one's socket close is not an end)
    pair_ends = [list(c.disconnects.queue) for (_, c), (_, code, _) in zip(twins, acks[2 * n:], strict=True)
                 if code.value == 0]
    assert all(d[0][0].value == 0x8E for d in pair_ends if d), pair_ends
    # the subscriptions moved with the sessions: new messages reach the new connections only
    for i, (_, c) in enumerate(takers):
        settle(pub, f"{tag}/m{i}", c)
        assert pub.publish_result(pub.publish(f"{tag}/m{i}", b"after", qos=1, wait=False))[0].value == 0
        assert c.expect().payload == b"after"
    for c in olds:
        c.expect_none(0.1)
    for _, c in takers + fresh + twins:
        c.disconnect()


def test_takeover_back_and_forth_with_311_client(cluster, tag):
    """A 3.1.1 persistent session hops n1 -> n2 -> n1; the old connection is
    closed each time; the session (subscription and queued messages) follows."""
    n1, n2 = cluster.start(2)
    topic = f"{tag}/t"
    pub = connect(n2.port(), f"{tag}-pub", V5)
    a = connect(n1.port(), f"{tag}-dev", V311, clean=False)
    a.subscribe(topic, qos=1)
    settle(pub, topic, a)
    for hop, node in enumerate((n2, n1, n2)):
        b = connect(node.port(), f"{tag}-dev", V311, clean=False)
        a.expect_disconnect()
        assert b.session_present, f"hop {hop}"
        b.disconnect()
        assert pub.publish_result(pub.publish(topic, b"%d" % hop, qos=1, wait=False))[0].value == 0
        a = connect(node.port(), f"{tag}-dev", V311, clean=False)
        assert a.session_present
        assert a.expect().payload == b"%d" % hop


def test_no_acknowledged_message_lost_while_the_session_moves(cluster, tag):
    """QoS 1 messages published on node 3 all along while a persistent session
    is taken over from node 1 to node 2 and back, three times: whatever got a
    PUBACK arrives (in order, repeats only with DUP)."""
    n1, n2, n3 = cluster.start(3)
    topic = f"{tag}/t"
    conn = persistent(n1.port(), f"{tag}-dev")
    conn.subscribe(topic, qos=1)
    settle(connect(n3.port(), f"{tag}-probe", V5), topic, conn)
    pub = PacedPublisher(n3.port(), topic, total=2400, rate=600).start()
    received = []
    for hop, node in enumerate((n2, n1, n2)):
        pub.wait_acked(400 * (hop + 1))
        new = persistent(node.port(), f"{tag}-dev")
        conn.expect_disconnect()
        assert new.session_present
        received += list(conn.messages.queue)
        conn = new
    pub.finish()
    got = received_in_order(received + drain(conn, idle=2.0))
    missing = sorted(pub.acked - set(got))
    assert not missing, (f"{len(missing)} acknowledged messages lost: {missing[:20]}; "
                         f"{len(pub.acked)} acknowledged, reason codes {pub.by_code()}")


def test_sigterm_sends_v5_clients_to_another_node_with_their_sessions(cluster, tag):
    n1, n2, n3 = cluster.start(3)
    topic = f"{tag}/t"
    will_topic = f"{tag}/will"
    watchers = [connect(n.port(), f"{tag}-w{i}", V5) for i, n in enumerate((n1, n3))]
    for w in watchers:
        w.subscribe(will_topic, qos=1)
    dev = persistent(n2.port(), f"{tag}-dev", will=(will_topic, b"gone", 1, False))
    dev.subscribe(topic, qos=1)
    v3 = connect(n2.port(), f"{tag}-v3", V311)
    pub = connect(n3.port(), f"{tag}-pub", V5)
    settle(pub, topic, dev)
    settle(pub, will_topic, *watchers)

    assert n2.stop(signal.SIGTERM) == 0
    code, p = dev.expect_disconnect()
    assert code.value == 0x9C, f"got {code}"
    reference = getattr(p, "ServerReference", None)
    others = {f"127.0.0.1:{n.port()}": n for n in (n1, n3)}
    assert reference in others, f"Server Reference {reference!r}, other nodes {sorted(others)}"
    v3.expect_disconnect()

    again = persistent(others[reference].port(), f"{tag}-dev")
    assert again.session_present
    settle(pub, topic, again)
    pub.publish(topic, b"hello", qos=1)
    assert again.expect().payload == b"hello"
    # the will: published by the node that closed the connection, not again by the one that adopted it
    for w in watchers:
        assert [m.payload for m in drain(w, idle=2.0, limit=10)] == [b"gone"]


def test_qos2_burst_within_receive_maximum_to_a_stored_session_on_another_node(cluster, tag):
    """17 QoS 2 PUBLISHes in one write from a v5 client (brokerd's Receive
    Maximum is 32) to a topic of a stored session on another node: each gets
    its PUBREC. brokerd counts each of those waiting for the other node twice
    (in awaiting_rel and in inbound_pending), so the 17th exceeds 32."""
    n1, n2 = cluster.start(2)
    topic = f"{tag}/q2"
    sub = persistent(n2.port(), f"{tag}-sub")
    sub.subscribe(topic, qos=2)
    settle(connect(n1.port(), f"{tag}-probe", V5), topic, sub)
    raw = RawClient(n1.port())
    ack = raw.connect(f"{tag}-raw", version=5, props={SESSION_EXPIRY_INTERVAL: 0})
    assert ack.type == CONNACK and ack.code == 0
    assert ack.props.get(RECEIVE_MAXIMUM, 65535) > 17
    raw.send(b"".join(publish_packet(topic, b"%d" % i, 2, pid=i + 1, version=5) for i in range(17)))
    answers = []
    try:
        while len(answers) < 17:
            p = raw.recv(5)
            answers.append((p.type, p.code))
    except Closed:
        pass
    assert DISCONNECT not in {t for t, _ in answers}, f"disconnected: {answers[-1]}"
    assert answers == [(PUBREC, 0)] * 17


def test_advertised_addresses_for_nodes_behind_names(cluster, tag):
    """Nodes in containers bind 0.0.0.0 and are reached by name: the others link to and fan admin
    requests out to --advertise-host, and a node leaving sends v5 clients to the address the other
    node gives as --server-reference (its published port), not to its address inside the network."""
    n1 = cluster.node("--advertise-host", "localhost", "--server-reference", "mqtt2.example.net:18842")
    n2 = cluster.node("--advertise-host", "localhost")
    topic = f"{tag}/t"
    sub = connect(n1.port(), f"{tag}-sub", V5)
    sub.subscribe(topic, qos=1)
    pub = connect(n2.port(), f"{tag}-pub", V5)
    settle(pub, topic, sub)                       # a publish on n2 reached n1 over the link to localhost:PORT
    assert n2.stop(signal.SIGTERM) == 0
    code, p = pub.expect_disconnect()
    assert (code.value, getattr(p, "ServerReference", None)) == (0x9C, "mqtt2.example.net:18842")


def test_server_reference_kept_when_only_the_reason_string_must_go(cluster, tag):
    """[MQTT-3.14.2-3]: a client's Maximum Packet Size makes the server leave the Reason String out
    of its DISCONNECT -- that one only: a device whose limit takes 0x9C with its Server Reference but
    not with "server shutting down" as well is still told where to go (it was sent 0x9C alone, and
    had nowhere to reconnect to)."""
    reference = "mqtt-node-one.broker.example.net:18842"
    cluster.node("--server-reference", reference)
    n2 = cluster.node()
    with RawClient(n2.port()) as c:
        # 68 bytes with both properties, 45 with the Server Reference alone
        assert c.connect(f"{tag}-dev", version=5, props={MAXIMUM_PACKET_SIZE: 60}).code == 0
        assert n2.stop(signal.SIGTERM) == 0
        [d] = c.expect_closed()
    assert (d.type, d.code, d.props) == (DISCONNECT, 0x9C, {SERVER_REFERENCE: reference})
    assert REASON_STRING not in d.props
