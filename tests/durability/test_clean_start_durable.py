"""A CONNECT with Clean Start of a client id with a stored session: its CONNACK
(session present 0) goes only once the old session's end is durable in the store.

Before, the CONNACK went at once and the deletion followed with the next batch:
a node killed (SIGKILL) between the two came back with the old session --
its subscriptions and queue -- for a client that had been told it was over
([MQTT-3.1.2-4]). The test holds the SQLite file's write lock (another
connection's ``BEGIN IMMEDIATE``) to hold the broker's batch in the store.
"""

import sqlite3
import time

import pytest

from ..integration.raw import (
    CONNACK,
    PUBACK,
    PUBLISH,
    SESSION_EXPIRY_INTERVAL,
    Closed,
    RawClient,
    connect_packet,
)
from ..procs import BrokerProcess

EXPIRY = {SESSION_EXPIRY_INTERVAL: 3600}


def stored_session(port: int, cid: str, topic: str) -> None:
    """A persistent session of ``cid`` subscribed to ``topic``, offline, one QoS 1 message queued for it."""
    old = RawClient(port)
    old.connect(cid, version=5, clean=False, props=EXPIRY)
    old.subscribe(topic, qos=1)
    old.disconnect()
    pub = RawClient(port)
    pub.connect(f"{cid}-pub", version=5)
    pub.publish(topic, b"queued", qos=1, pid=1)
    assert pub.expect(PUBACK).code == 0
    pub.disconnect()


def queued(client: RawClient) -> list[bytes]:
    """The payloads of the PUBLISHes ``client`` gets until a second passes without one."""
    got = []
    try:
        while True:
            got.append(client.expect(PUBLISH, timeout=1.0).payload)
    except TimeoutError:
        return got


def assert_not_subscribed(client: RawClient, port: int, publisher: str, topic: str) -> None:
    """A message to ``topic`` (from a new client ``publisher``) does not reach ``client``: the old
    session's subscription did not come back."""
    pub = RawClient(port)
    pub.connect(publisher, version=5)
    pub.publish(topic, b"after", qos=1, pid=2)
    pub.expect(PUBACK)
    try:
        p = client.expect(PUBLISH, timeout=1.0)
        raise AssertionError(f"the old session's subscription came back: got {p.payload!r}")
    except TimeoutError:
        pass


def connack_within(client: RawClient, timeout: float):
    try:
        return client.expect(CONNACK, timeout=timeout)
    except (TimeoutError, Closed):
        return None


@pytest.mark.parametrize("new_expiry", [0, 3600])
def test_clean_start_is_acknowledged_only_once_the_old_session_is_gone_from_the_store(tmp_path, new_expiry):
    """``new_expiry``: the new session's (0: nothing of it is stored; 3600: stored in its turn, empty)."""
    db = tmp_path / "store.db"
    node = BrokerProcess("--store", f"sqlite:///{db}", "--sys-interval", "0").start()
    try:
        stored_session(node.port(), "dev", "cs/old")
        lock = sqlite3.connect(db, timeout=0, isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")           # the broker's next batch waits for this lock
        try:
            fresh = RawClient(node.port(), timeout=10)
            fresh.send(connect_packet("dev", 5, True, props={SESSION_EXPIRY_INTERVAL: new_expiry}))
            ack = connack_within(fresh, 1.5)
            if ack is not None:
                # the client was told its session is over: the node dies right after (what a crash does)
                assert not ack.session_present
                node.kill()
        finally:
            if ack is None:
                lock.execute("ROLLBACK")
        if ack is None:
            # waited for the store: it comes once the old session's end is written
            ack = connack_within(fresh, 10)
            assert ack is not None and ack.code == 0 and not ack.session_present
            node.kill()
        else:
            lock.execute("ROLLBACK")
        lock.close()
        node.start()                              # the same store
        again = RawClient(node.port())
        back = again.connect("dev", version=5, clean=False, props=EXPIRY)
        got = queued(again)
        assert got == [], f"the queue of the session ended by the Clean Start came back after the crash: {got}"
        if not new_expiry:
            assert not back.session_present, "the session ended by the Clean Start came back after the crash"
        # nor its subscription
        assert_not_subscribed(again, node.port(), "dev-pub2", "cs/old")
    finally:
        node.kill()


def test_clean_start_of_a_client_without_a_stored_session_does_not_wait_for_the_store(tmp_path):
    """The usual CONNECT (no session stored for the id) is answered at once, store busy or not."""
    db = tmp_path / "store.db"
    node = BrokerProcess("--store", f"sqlite:///{db}", "--sys-interval", "0").start()
    try:
        RawClient(node.port()).connect("warm", version=5)
        lock = sqlite3.connect(db, timeout=0, isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")
        try:
            t0 = time.monotonic()
            c = RawClient(node.port())
            ack = c.connect("nobody-stored", version=5, clean=True)
            assert ack.code == 0 and time.monotonic() - t0 < 1.0
        finally:
            lock.execute("ROLLBACK")
            lock.close()
    finally:
        node.kill()
