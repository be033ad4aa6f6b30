"""Wills of persistent sessions across nodes: a delayed will already
published is not published again by the survivor that adopts the session,
and a Clean Start on another node ends the old session -- its will goes
([MQTT-3.1.2-8]; 3.1.4: "if the new Network Connection has Clean Start set
to 1 ... the Will Message ... will be sent because the original Session is
ended on the takeover"), as on a single node."""

import time

import pytest

from ..durability.test_crash import drain
from ..integration.helpers import Client, connect
from ..mqtt import V5, PacketTypes, props
from .conftest import settle
from .test_failover import adopted_by

EXPIRY = 300


def will_session(port, client_id, topic, payload, delay):
    c = Client(client_id, V5, clean=False)
    wp = props(PacketTypes.WILLMESSAGE, WillDelayInterval=delay)
    return c.connect(port, properties=props(PacketTypes.CONNECT, SessionExpiryInterval=EXPIRY),
                     will=(topic, payload, 1, False, wp))


def watching(cluster, nodes, port, tag):
    w = connect(port, f"{tag}-watch", V5)
    w.subscribe(f"{tag}/will/#", qos=1)
    for node in nodes:
        settle(connect(node.port(), f"{tag}-probe-{cluster.name(node)}", V5), f"{tag}/will/probe", w)
    return w


@pytest.mark.slow
def test_a_delayed_will_already_published_is_not_published_again_by_the_adopter(cluster, tag):
    n1, n2 = cluster.start(2)
    w = watching(cluster, (n1, n2), n1.port(), tag)
    c = will_session(n2.port(), f"{tag}-dev", f"{tag}/will/dev", b"dev gone", 1)
    c.drop()
    assert w.expect(timeout=10).payload == b"dev gone"       # after its delay, from node 2
    # node 2 records the will as sent in its next store batch: killed within those milliseconds it
    # would be sent again (at least once, never lost -- the order a message gets too); the test
    # is about a will sent and recorded, and a loaded machine can take a while to commit
    time.sleep(1.0)
    n2.kill()
    adopted_by([n1], cluster.name(n2))
    got = [m.payload for m in drain(w, idle=2.5, limit=20)]
    assert got == [], f"the will was published again after the adoption: {got}"


@pytest.mark.slow
@pytest.mark.parametrize("connected", [True, False])
def test_a_clean_start_on_another_node_publishes_the_old_sessions_delayed_will(cluster, tag, connected):
    n1, n2 = cluster.start(2)
    w = watching(cluster, (n1, n2), n2.port(), tag)
    c = will_session(n1.port(), f"{tag}-dev", f"{tag}/will/dev", b"dev gone", 120)
    if not connected:
        c.drop()
    fresh = connect(n2.port(), f"{tag}-dev", V5, clean=True)
    assert w.expect(timeout=10).payload == b"dev gone"
    got = [m.payload for m in drain(w, idle=2.5, limit=20)]
    assert got == [], f"more wills: {got}"
    fresh.disconnect()


@pytest.mark.slow
def test_a_clean_start_ends_a_stored_session_the_registry_lost(tmp_path, tag):
    """Redis restarted empty (no persistence) as the node holding an offline
    persistent session died: the session is in the shared store, with its
    delayed will, and no node holds it -- the registry has no record of it,
    so the survivor adopted nothing. A CONNECT of its client id with Clean
    Start left it there: its will was never published, and the next CONNECT
    without Clean Start got the old session back (Session Present, its
    subscription). Clean Start discards the existing session [MQTT-3.1.2-4]
    and ends it, so its will goes (3.1.3.2.2), Redis's record or not."""
    from ..integration.helpers import wait_until
    from .conftest import Cluster, RedisServer

    redis = RedisServer(tmp_path).start()
    c = Cluster(redis, tmp_path)
    try:
        n1, n2 = c.start(2)
        w = watching(c, (n1, n2), n2.port(), tag)
        dev = will_session(n1.port(), f"{tag}-dev", f"{tag}/will/dev", b"dev gone", 120)
        dev.subscribe(f"{tag}/old", qos=1)
        dev.drop()                                          # its will waits for its delay, stored with it
        time.sleep(1.0)                                     # the session and its will are in the store
        n1.kill()
        redis.restart()                                     # empty: no registry, no will, no mark of n1's
        wait_until(lambda: "adopted 0 sessions of node n1" in n2.log, timeout=20,
                   message=f"n2 did not reap n1:\n{n2.log[-3000:]}")
        fresh = connect(n2.port(), f"{tag}-dev", V5, clean=True)
        assert w.expect(timeout=10).payload == b"dev gone", "the ended session's will was not published"
        fresh.disconnect()                                  # (no Session Expiry: its session ends with it)
        again = Client(f"{tag}-dev", V5, clean=False)
        again.connect(n2.port(), properties=props(PacketTypes.CONNECT, SessionExpiryInterval=EXPIRY))
        assert not again.session_present, "the session Clean Start discarded came back"
        got = [m.payload for m in drain(w, idle=1.0, limit=20)]
        assert got == [], f"more wills: {got}"
    finally:
        c.stop_all()
        redis.stop()
