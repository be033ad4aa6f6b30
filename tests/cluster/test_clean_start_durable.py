"""A CONNECT with Clean Start of a client id with a stored session, in a cluster:
its CONNACK (session present 0) goes only once the old session's end is durable
in the store ([MQTT-3.1.2-4]) -- the session held on the node the client comes
back to, or on another node (taken over, then ended).

Before, the CONNACK went at once and the deletion followed with the node's next
batch: a node killed (SIGKILL) between the two left the old session in the store,
and the id's next CONNECT without Clean Start -- on the adopting node or any
other -- found it again, subscriptions and queue. The tests hold the SQLite
file's write lock (another connection's ``BEGIN IMMEDIATE``) to keep the node's
batch out of the store for a while."""

import sqlite3

import pytest

from ..durability.test_clean_start_durable import (
    EXPIRY,
    assert_not_subscribed,
    connack_within,
    queued,
    stored_session,
)
from ..integration.raw import SESSION_EXPIRY_INTERVAL, RawClient, connect_packet
from .test_failover import adopted_by


@pytest.mark.parametrize("where", ["same node", "other node"])
def test_a_clean_start_is_acknowledged_only_once_the_old_session_is_gone_from_the_store(cluster, tag, where):
    n1, n2 = cluster.start(2)
    cid = f"{tag}-dev"
    topic = f"{tag}/old"
    stored_session(n1.port(), cid, topic)
    node, survivor = (n1, n2) if where == "same node" else (n2, n1)
    db = cluster.store.removeprefix("sqlite:///")
    lock = sqlite3.connect(db, timeout=5, isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")             # the nodes' next batches wait for this lock
    locked = True
    try:
        fresh = RawClient(node.port(), timeout=10)
        fresh.send(connect_packet(cid, 5, True, props={SESSION_EXPIRY_INTERVAL: 0}))
        ack = connack_within(fresh, 1.5)
        if ack is None:
            lock.execute("ROLLBACK")
            locked = False
            ack = connack_within(fresh, 10)     # once the old session's end is written
            assert ack is not None, "no CONNACK once the store took the writes"
        assert ack.code == 0 and not ack.session_present, ack
        node.kill()                             # the node dies right after the CONNACK
    finally:
        if locked:
            lock.execute("ROLLBACK")
        lock.close()
    if where == "same node":
        adopted_by([survivor], cluster.name(node))
    again = RawClient(survivor.port())
    back = again.connect(cid, version=5, clean=False, props=EXPIRY)
    assert back.code == 0, back
    got = queued(again)
    assert not back.session_present and got == [], (
        f"the session the Clean Start ended came back (present {back.session_present}, queue {got})")
    assert_not_subscribed(again, survivor.port(), f"{tag}-pub2", topic)
