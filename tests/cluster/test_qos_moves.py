"""QoS 1/2 state that moves with a stored session between nodes (a takeover,
a node's death): what is in flight is sent again -- a PUBLISH with DUP, or
the PUBREL owed -- never lost, never delivered again as a new message."""

import sqlite3
import threading

from ..integration.helpers import connect
from ..integration.raw import PUBCOMP, PUBLISH, PUBREC, PUBREL, Closed, RawClient
from ..mqtt import V5, V311
from .conftest import settle
from .test_failover import adopted_by, persistent

EXPIRY = 300


def raw(port: int, client_id: str, version: int = 4) -> tuple[RawClient, object]:
    c = RawClient(port)
    props = {0x11: EXPIRY} if version == 5 else None
    ack = c.connect(client_id, version=version, clean=False, props=props)
    return c, ack


def test_a_retained_qos1_message_in_flight_is_sent_again_by_the_node_the_session_moves_to(cluster, tag):
    """A retained QoS 1 message sent on SUBSCRIBE to a stored session, not yet
    acknowledged, is part of the session: the node it moves to sends it again."""
    n1, n2 = cluster.start(2)
    topic = f"{tag}/r"
    pub = RawClient(n1.port())
    pub.connect(f"{tag}-pub")
    pub.publish(topic, b"kept", qos=1, retain=True, pid=1)
    pub.expect(4)                                   # PUBACK: retained and stored
    sub, _ = raw(n1.port(), f"{tag}-sub")
    sub.subscribe(topic, qos=1)
    first = sub.expect(PUBLISH)
    assert first.payload == b"kept" and first.qos == 1      # never acknowledged
    again, ack = raw(n2.port(), f"{tag}-sub")
    assert ack.session_present
    p = again.expect(PUBLISH, timeout=5)
    assert (p.payload, p.dup, p.pid) == (b"kept", True, first.pid)


class Receiver:
    """The receiving side of QoS 2 as clients do it (paho's): a PUBLISH is
    held under its packet id (PUBREC) and delivered on its PUBREL (PUBCOMP);
    a PUBLISH of an id held is a duplicate, one of an id completed is new."""

    def __init__(self):
        self.held: dict[int, bytes] = {}
        self.delivered: list[bytes] = []

    def run(self, c: RawClient, idle: float) -> None:
        """Answer what comes until ``idle`` seconds pass without a packet (or the connection closes)."""
        while True:
            try:
                p = c.recv(idle)
            except (TimeoutError, Closed):
                return
            if p.type == PUBLISH and p.qos == 2:
                self.held.setdefault(p.pid, p.payload)
                c.ack(PUBREC, p.pid)
            elif p.type == PUBREL:
                if p.pid in self.held:
                    self.delivered.append(self.held.pop(p.pid))
                c.ack(PUBCOMP, p.pid)


def test_a_qos2_message_whose_pubrel_was_sent_is_not_sent_again_after_its_node_dies(cluster, tag):
    """Once the PUBREL of an outgoing QoS 2 message is sent, its PUBLISH must
    never be sent again ([MQTT-4.3.3-5]): the client completes it on that
    PUBREL, and a PUBLISH of its packet id after that is a new message. So
    the state "PUBREL owed" is durable before the PUBREL goes -- here the
    store's commit is held up (another connection holds its write lock) when
    the client's PUBREC arrives, and the node is SIGKILLed; the survivor that
    adopts the session must not deliver the message a second time."""
    n1, n2 = cluster.start(2)
    topic = f"{tag}/q2"
    sub, _ = raw(n1.port(), f"{tag}-sub")
    sub.subscribe(topic, qos=2)
    pub = RawClient(n1.port())
    pub.connect(f"{tag}-pub")
    pub.publish(topic, b"once", qos=2, pid=1)
    pub.expect(PUBREC)
    first = sub.expect(PUBLISH)
    assert (first.payload, first.qos) == (b"once", 2)
    receiver = Receiver()
    receiver.held[first.pid] = first.payload

    lock = sqlite3.connect(cluster.store[len("sqlite:///"):], timeout=10, isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")          # the nodes' writes wait
    try:
        sub.ack(PUBREC, first.pid)
        receiver.run(sub, idle=1.5)          # a PUBREL now, if the node sends it before the store has its state
        n1.kill()
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    sub.close()
    adopted_by([n2], cluster.name(n1))

    again, ack = raw(n2.port(), f"{tag}-sub")
    assert ack.session_present
    receiver.run(again, idle=3.0)
    assert receiver.delivered == [b"once"], f"delivered {receiver.delivered}, holding {receiver.held}"


def test_a_qos2_packet_id_refused_with_a_negative_pubrec_is_free_again_on_the_node_the_session_moves_to(
        cluster, tag):
    """A QoS 2 PUBLISH answered with a negative PUBREC (here: a node that holds a
    stored subscriber was just SIGKILLed, the message could not be stored for
    it) ends that flow: the packet id is the client's to use again. It must not
    stay "awaiting PUBREL" in the stored session, or the node the session moves
    to takes the next message under that id for a duplicate -- PUBREC, and
    never delivered."""
    n1, n2, n3 = cluster.start(3)
    topic = f"{tag}/q2"
    stored = persistent(n2.port(), f"{tag}-stored", V311)
    stored.subscribe(topic, qos=2)
    settle(connect(n1.port(), f"{tag}-probe", V5), topic, stored)
    stored.disconnect()
    n2.kill()

    pub, _ = raw(n1.port(), f"{tag}-pub", version=5)
    pub.publish(topic, b"refused", qos=2, pid=7)
    rec = pub.expect(PUBREC, timeout=15)
    assert rec.pid == 7 and rec.code >= 0x80, f"PUBREC {rec.code:#x}: the message was taken, nothing to test"
    pub.disconnect()

    sub = RawClient(n3.port())
    sub.connect(f"{tag}-sub", version=5)
    sub.subscribe(f"{tag}/other", qos=2)
    again, ack = raw(n3.port(), f"{tag}-pub", version=5)
    assert ack.session_present
    again.publish(f"{tag}/other", b"new", qos=2, pid=7)
    rec = again.expect(PUBREC)
    assert rec.code < 0x80
    again.ack(PUBREL, 7)
    again.expect(PUBCOMP)
    p = sub.expect(PUBLISH)
    assert p.payload == b"new"


def test_a_clean_start_on_another_node_discards_the_stored_session_and_what_it_had_in_flight(cluster, tag):
    """Clean Start on another node than the one holding the session ends that
    session ([MQTT-3.1.2-4]): its subscriptions and the message it had in
    flight are gone -- also for the session's next connection (Clean Start 0)
    on a third node, which loads the session from the store."""
    n1, n2, n3 = cluster.start(3)
    topic = f"{tag}/t"
    old, _ = raw(n1.port(), f"{tag}-dev", version=5)
    old.subscribe(topic, qos=1)
    old.publish(topic, b"old", qos=1, pid=1)
    assert old.expect(PUBLISH).payload == b"old"           # in flight, never acknowledged
    old.expect(4)                                          # the PUBACK of our own PUBLISH

    fresh = RawClient(n2.port())
    ack = fresh.connect(f"{tag}-dev", version=5, clean=True, props={0x11: EXPIRY})
    assert not ack.session_present
    fresh.disconnect()

    last, ack = raw(n3.port(), f"{tag}-dev", version=5)
    assert ack.session_present                             # the session Clean Start made on n2
    last.subscribe(f"{tag}/probe", qos=0)
    pub = RawClient(n3.port())
    pub.connect(f"{tag}-pub")
    pub.publish(topic, b"new")                             # for the old subscription, if it were there
    pub.publish(f"{tag}/probe", b"probe")
    got = []
    while not got or got[-1].payload != b"probe":
        got.append(last.expect(PUBLISH))
    assert [p.payload for p in got] == [b"probe"]


def test_qos2_flows_in_both_directions_move_with_the_session(cluster, tag):
    """In: PUBLISH (PUBREC) on n1, the same PUBLISH again with DUP and its
    PUBREL on n2 -- delivered once, PUBCOMP. Out: PUBREC sent on n1 -- n2
    sends the PUBREL owed, not the PUBLISH."""
    n1, n2 = cluster.start(2)
    topic = f"{tag}/q2"
    sub, _ = raw(n1.port(), f"{tag}-sub")
    sub.subscribe(topic, qos=2)
    sub.subscribe(f"{tag}/probe", qos=0, pid=2)
    dev, _ = raw(n1.port(), f"{tag}-dev", version=5)
    dev.publish(topic, b"once", qos=2, pid=9)
    assert dev.expect(PUBREC).code < 0x80
    out = sub.expect(PUBLISH)
    sub.ack(PUBREC, out.pid)
    assert sub.expect(PUBREL).pid == out.pid

    dev2, ack = raw(n2.port(), f"{tag}-dev", version=5)
    assert ack.session_present
    dev2.publish(topic, b"once", qos=2, pid=9, dup=True)
    assert dev2.expect(PUBREC).code < 0x80
    dev2.ack(PUBREL, 9)
    assert dev2.expect(PUBCOMP).code == 0
    sub2, ack = raw(n2.port(), f"{tag}-sub")
    assert ack.session_present
    assert sub2.expect(PUBREL).pid == out.pid
    sub2.ack(PUBCOMP, out.pid)
    dev2.publish(f"{tag}/probe", b"probe")
    p = sub2.expect(PUBLISH)
    assert p.payload == b"probe", f"got {p}"


def test_a_session_taken_over_while_its_nodes_writes_are_held_up_is_not_loaded_without_them(cluster, tag):
    """A message queued on node 1 for an offline stored session is acknowledged once it is stored; the
    store is held up (another connection holds its write lock, longer than node 1 waits for its writes)
    when the session's client comes back on node 2. Loaded then, the session would lack the message, which
    node 1 stores and acknowledges a moment later: acknowledged and never sent. Node 2 refuses the CONNECT
    (0x88) while node 1's writes are not in the store, and the client's next CONNECT gets the message."""
    n1, n2 = cluster.start(2)
    topic = f"{tag}/held"
    sub, _ = raw(n1.port(), f"{tag}-sub", version=5)
    sub.subscribe(topic, qos=1)
    sub.disconnect()
    pub = RawClient(n1.port())
    pub.connect(f"{tag}-pub", version=5)

    lock = sqlite3.connect(cluster.store[len("sqlite:///"):], timeout=10, isolation_level=None,
                           check_same_thread=False)
    lock.execute("BEGIN IMMEDIATE")          # the nodes' writes wait ...
    unlock = threading.Timer(8.0, lambda: (lock.execute("ROLLBACK"), lock.close()))    # ... past the takeover's 5 s
    unlock.start()
    try:
        pub.publish(topic, b"held", qos=1, pid=1)
        again = RawClient(n2.port(), timeout=20)
        ack = again.connect(f"{tag}-sub", version=5, clean=False, props={0x11: EXPIRY})
    finally:
        unlock.join()
    assert ack.code == 0x88, f"CONNACK {ack.code:#x}, session present {ack.session_present}"
    again.close()
    assert pub.expect(4, timeout=10).code == 0               # PUBACK: stored now

    again, ack = raw(n2.port(), f"{tag}-sub", version=5)
    assert ack.session_present
    p = again.expect(PUBLISH, timeout=5)
    assert (p.payload, p.qos) == (b"held", 1)
