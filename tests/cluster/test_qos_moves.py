"""QoS 1/2 state that moves with a stored session between nodes (a takeover,
a node's death): what is in flight is sent again -- a PUBLISH with DUP, or
the PUBREL owed -- never lost, never delivered again as a new message."""

import sqlite3
import threading

from ..integration.raw import PUBLISH, PUBREC, PUBREL, RawClient
from .test_failover import adopted_by

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
