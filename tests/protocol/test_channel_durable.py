"""Persistent sessions with a durable store, the event-loop side: what a client
sees before and after the store commits a batch (the store itself is the
journal's batches committed by hand, as ``StoreWriter`` does, or failed).

A QoS 1 PUBLISH is acknowledged only once its batch is durable; a stored
message goes to its subscriber only once its row is; order is kept -- between
acknowledgements, and between a stored delivery and what comes after it.
"""

import pytest

from brokerd.persistence import Persistence
from brokerd.protocol import properties as P
from brokerd.protocol.channel import ChannelLimits
from brokerd.protocol.packets import (
    PUBACK,
    PUBCOMP,
    PUBREC,
    Puback,
    Publish,
    Pubrel,
    Suback,
    Subscribe,
    SubscriptionRequest,
)
from brokerd.protocol.reason import STORE_UNAVAILABLE
from brokerd.store import Journal

from .harness import MQTT5, MQTT311, Net

BOTH = pytest.mark.parametrize("version", [MQTT311, MQTT5])


def durable_net(limits: ChannelLimits | None = None) -> Net:
    net = Net(limits)
    net.broker.use_store(Persistence(Journal()))
    return net


def commit(net: Net, ok: bool = True) -> None:
    """What the store writer does for the batch gathered so far."""
    journal = net.broker.journal
    gen, ops, waiters = journal.take()
    if ok:
        journal.committed = gen
        net.broker.commit_done(gen, net.now)
    for fn in waiters:
        fn(ok)


def persistent(net, cid, version, *filters):
    """A client with a persistent session, subscribed at QoS 1 to ``filters``
    (a durable session's SUBACK waits for the commit)."""
    c = net.client(version)
    c.connect(cid, clean=False,
              properties={P.SESSION_EXPIRY_INTERVAL: 3600} if version == MQTT5 else None)
    for f in filters:
        c.send(Subscribe(c.pid(), [SubscriptionRequest(f, 1)]))
        commit(net)
        assert [p for p in c.take() if isinstance(p, Suback)]
    commit(net)
    return c


def acks(client) -> list:
    client.recv()
    got = [(p.packet_id, p.reason_code) for p in client.inbox if p.type == PUBACK]
    client.inbox = [p for p in client.inbox if p.type != PUBACK]
    return got


@BOTH
def test_pubacks_wait_for_the_commit_and_leave_in_order(version):
    net = durable_net()
    sub = persistent(net, "sub", version, "d/#")
    pub = net.client(version)
    pub.connect("pub")
    assert pub.publish("d/1", b"a", qos=1) is None          # stored for sub: waits
    assert pub.publish("x/1", b"b", qos=1) is None          # no subscriber: behind the first
    assert pub.publish("d/2", b"c", qos=1) is None
    assert acks(pub) == [] and sub.publishes() == []
    commit(net)
    assert acks(pub) == [(1, 0), (2, 0x10 if version == MQTT5 else 0), (3, 0)]
    assert [p.payload for p in sub.publishes()] == [b"a", b"c"]



@BOTH
def test_a_pubrec_that_waits_holds_back_the_pubacks_of_its_batch_behind_it(version):
    net = durable_net()
    sub = persistent(net, "sub", version, "d/#")
    pub = net.client(version)
    pub.connect("pub")
    pub.publish("d/1", b"a", qos=1)
    pub.publish("d/2", b"b", qos=2)           # its PUBREC waits for the commit too, in line
    pub.publish("d/3", b"c", qos=1)
    pub.publish("x/4", b"d", qos=1)           # no subscriber: known at once, still behind them
    assert pub.take() == []
    commit(net)
    got = [(p.type, p.packet_id) for p in pub.take()]
    assert got == [(PUBACK, 1), (PUBREC, 2), (PUBACK, 3), (PUBACK, 4)]
    assert [p.payload for p in sub.publishes()] == [b"a", b"b", b"c"]

def test_a_failed_commit_refuses_every_ack_of_its_batch_and_the_next_batch_is_acked():
    net = durable_net()
    persistent(net, "sub", MQTT5, "d/#")
    pub = net.client(MQTT5)
    pub.connect("pub")
    pub.publish("d/1", b"a", qos=1)
    pub.publish("d/2", b"b", qos=1)
    commit(net, ok=False)
    assert acks(pub) == [(1, STORE_UNAVAILABLE), (2, STORE_UNAVAILABLE)]
    pub.publish("d/3", b"c", qos=1)
    commit(net)
    assert acks(pub) == [(3, 0)]


@BOTH
def test_a_stored_delivery_is_sent_after_its_commit_and_before_what_came_after_it(version):
    net = durable_net()
    sub = persistent(net, "sub", version, "q1/#", "q0/#")
    pub = net.connect("pub", version)
    pub.publish("q1/a", b"1", qos=1)
    pub.publish("q0/a", b"2", qos=0)          # not stored (QoS 0), but after the stored one
    pub.publish("q1/b", b"3", qos=1)
    assert sub.publishes() == []
    commit(net)
    assert [p.payload for p in sub.publishes()] == [b"1", b"2", b"3"]


def test_deliveries_of_a_batch_not_yet_written_wait_for_it():
    net = durable_net()
    sub = persistent(net, "sub", MQTT311, "t")
    pub = net.connect("pub")
    pub.publish("t", b"1", qos=1)
    journal = net.broker.journal
    gen, ops, waiters = journal.take()       # batch 1 is being written ...
    pub.publish("t", b"2", qos=1)            # ... while batch 2 gathers
    journal.committed = gen
    net.broker.commit_done(gen, net.now)
    for fn in waiters:
        fn(True)
    assert sub.payloads() == [b"1"]
    commit(net)
    assert sub.payloads() == [b"2"]


@BOTH
def test_stored_deliveries_held_for_a_commit_survive_their_connection_closing(version):
    net = durable_net()
    sub = persistent(net, "sub", version, "t")
    pub = net.connect("pub", version)
    for i in range(3):
        pub.publish("t", b"%d" % i, qos=1)
    sub.lose()                                # before the batch is durable
    pub.publish("t", b"3", qos=1)             # queued for the offline session
    commit(net)
    again = persistent(net, "sub", version)
    got = again.publishes()
    assert [p.payload for p in got] == [b"0", b"1", b"2", b"3"]
    assert not any(p.dup for p in got)        # never sent before
    assert len({p.packet_id for p in got}) == 4
    for p in got:
        again.send(Puback(p.packet_id))
    session = net.broker.router.session("default", "sub")
    assert not session.inflight and not session.queue


def test_more_stored_deliveries_than_the_window_go_through_the_queue_in_order():
    net = durable_net()
    sub = persistent(net, "sub", MQTT5, "t")
    pub = net.connect("pub", MQTT311)            # (a 5.0 one could not send past its Receive Maximum)
    n = net.limits.max_inflight + 5
    for i in range(n):
        pub.publish("t", b"%d" % i, qos=1)
    commit(net)
    got = sub.publishes()
    assert [p.payload for p in got] == [b"%d" % i for i in range(net.limits.max_inflight)]
    for p in got:
        sub.send(Puback(p.packet_id))
    assert [p.payload for p in sub.publishes()] == [b"%d" % i for i in range(net.limits.max_inflight, n)]


# ----------------------------------------------------------------------------- our Receive Maximum


def test_a_known_puback_waiting_behind_a_stored_one_counts_against_our_receive_maximum():
    """[MQTT-3.3.4-8]: more QoS 1/2 PUBLISHes than our Receive Maximum (2) for which we have not
    sent a PUBACK or PUBCOMP -> DISCONNECT 0x93. A PUBACK whose code is known but that waits in
    line behind one waiting for the store is not sent yet: it counts (it did not, and a client
    could send any number while a commit was slow, their PUBACKs piling up)."""
    net = durable_net(ChannelLimits(max_inflight=2))
    persistent(net, "sub", MQTT5, "d/#")
    pub = net.connect("pub", MQTT5)
    pub.send(Publish("d/1", b"a", 1, packet_id=1))     # stored for sub: its PUBACK waits for the commit
    pub.send(Publish("x/1", b"b", 1, packet_id=2))     # no subscriber: its PUBACK waits behind
    assert not pub.closed and acks(pub) == []
    pub.send(Publish("x/2", b"c", 1, packet_id=3))     # a third unacknowledged
    assert pub.server_disconnect().reason_code == 0x93
    assert pub.closed


def test_a_pubcomp_waiting_for_the_store_counts_against_our_receive_maximum():
    """A QoS 2 PUBLISH counts against our Receive Maximum until we send its PUBCOMP -- which, for
    a stored session, waits for the commit of the id's removal: until then it counts (it stopped
    counting at the PUBREL). Once sent, the slot is free."""
    net = durable_net(ChannelLimits(max_inflight=2))
    pub = persistent(net, "pub", MQTT5)
    pub.send(Publish("x/1", b"a", 2, packet_id=1))
    commit(net)
    assert [p.type for p in pub.take()] == [PUBREC]
    pub.send(Pubrel(1))                                 # its PUBCOMP waits for the commit
    pub.send(Publish("x/2", b"b", 2, packet_id=2))
    assert not pub.closed and pub.take() == []
    pub.send(Publish("x/3", b"c", 2, packet_id=3))      # a third without its PUBCOMP
    assert pub.server_disconnect().reason_code == 0x93
    # the same with the PUBCOMP sent: within the limit
    net = durable_net(ChannelLimits(max_inflight=2))
    pub = persistent(net, "pub", MQTT5)
    pub.send(Publish("x/1", b"a", 2, packet_id=1))
    commit(net)
    pub.send(Pubrel(1))
    commit(net)
    assert [p.type for p in pub.take()] == [PUBREC, PUBCOMP]
    pub.send(Publish("x/2", b"b", 2, packet_id=2))
    pub.send(Publish("x/3", b"c", 2, packet_id=3))
    commit(net)
    assert not pub.closed and [p.type for p in pub.take()] == [PUBREC, PUBREC]
