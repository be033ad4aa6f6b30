"""Sessions across connections: wills, takeover, expiry, the offline queue and its drop
policy, and shared subscriptions."""

import gc
import weakref

import pytest

from brokerd.protocol import properties as P
from brokerd.protocol.channel import ChannelLimits
from brokerd.protocol.packets import Puback, Publish, Will
from brokerd.tenancy.control import TenantControl
from brokerd.tenancy.policy import TenantPolicy

from .harness import MQTT5, MQTT311, Net

BOTH = pytest.mark.parametrize("version", [MQTT311, MQTT5])


def watcher(net, filt="will/#", version=MQTT5):
    w = net.client(version)
    w.connect("watcher", keepalive=0)
    w.subscribe(filt, qos=2)
    return w


def v5(net, cid, **kw):
    c = net.client(MQTT5)
    c.connect(cid, **kw)
    return c


# ----------------------------------------------------------------------------- wills


@BOTH
def test_will_on_abnormal_close(net, version):
    w = watcher(net)
    c = net.client(version)
    c.connect("dev", will=Will("will/dev", b"gone", qos=1))
    c.lose()
    [p] = w.publishes()
    assert (p.topic, p.payload, p.qos) == ("will/dev", b"gone", 1)
    assert net.stats.wills_published == 1


@BOTH
def test_no_will_after_normal_disconnect(net, version):
    w = watcher(net)
    c = net.client(version)
    c.connect("dev", will=Will("will/dev", b"gone"))
    c.disconnect()
    c.lose()
    assert w.publishes() == []


def test_will_after_disconnect_with_will_message(net):
    w = watcher(net)
    c = v5(net, "dev", will=Will("will/dev", b"bye"))
    c.disconnect(0x04)
    assert c.closed
    assert w.payloads() == [b"bye"]


@BOTH
def test_will_on_protocol_error(net, version):
    w = watcher(net)
    c = net.client(version)
    c.connect("dev", will=Will("will/dev", b"err"))
    c.send(Publish("bad/#", b""))
    assert c.closed
    assert w.payloads() == [b"err"]


@BOTH
def test_will_on_keepalive_timeout(net, version):
    w = watcher(net)
    c = net.client(version)
    c.connect("dev", keepalive=10, will=Will("will/dev", b"timeout"))
    net.advance(16)
    assert c.closed
    assert w.payloads() == [b"timeout"]


def test_will_retained_and_qos(net):
    c = net.connect("dev", will=Will("will/dev", b"offline", qos=2, retain=True))
    c.lose()
    late = v5(net, "late")
    late.subscribe("will/#", qos=1)
    [p] = late.publishes()
    assert (p.payload, p.retain, p.qos) == (b"offline", True, 1)


def test_will_properties_forwarded_but_not_will_delay(net):
    w = watcher(net)
    props = {P.CONTENT_TYPE: "text/plain", P.USER_PROPERTY: [("k", "v")], P.WILL_DELAY_INTERVAL: 0}
    c = v5(net, "dev", will=Will("will/dev", b"x", properties=props))
    c.lose()
    [p] = w.publishes()
    assert p.properties == {P.CONTENT_TYPE: "text/plain", P.USER_PROPERTY: [("k", "v")]}


def test_will_delay(net):
    w = watcher(net)
    c = v5(
        net,
        "dev",
        properties={P.SESSION_EXPIRY_INTERVAL: 100},
        will=Will("will/dev", b"late", properties={P.WILL_DELAY_INTERVAL: 10}),
    )
    c.lose()
    net.advance(9)
    assert w.publishes() == []
    net.advance(1)
    assert w.payloads() == [b"late"]
    net.advance(100)
    assert w.publishes() == []


def test_will_delay_cancelled_by_reconnect(net):
    w = watcher(net)
    will = Will("will/dev", b"late", properties={P.WILL_DELAY_INTERVAL: 10})
    c = v5(net, "dev", properties={P.SESSION_EXPIRY_INTERVAL: 100}, will=will)
    c.lose()
    net.advance(5)
    again = net.client(MQTT5)
    assert again.connect("dev", clean=False, properties={P.SESSION_EXPIRY_INTERVAL: 100}).session_present
    net.advance(20)
    assert w.publishes() == []  # [MQTT-3.1.3-9]


def test_will_delay_ends_early_when_a_clean_start_ends_the_session(net):
    """3.1.2.5: the will waits for the delay *or the end of the session*, whichever comes first."""
    w = watcher(net)
    will = Will("will/dev", b"late", properties={P.WILL_DELAY_INTERVAL: 10})
    c = v5(net, "dev", properties={P.SESSION_EXPIRY_INTERVAL: 100}, will=will)
    c.lose()
    net.advance(2)
    v5(net, "dev", clean=True)
    assert w.payloads() == [b"late"]
    net.advance(20)
    assert w.publishes() == []


def test_will_on_session_expiry_before_will_delay(net):
    w = watcher(net)
    will = Will("will/dev", b"expired", properties={P.WILL_DELAY_INTERVAL: 100})
    c = v5(net, "dev", properties={P.SESSION_EXPIRY_INTERVAL: 10}, will=will)
    c.lose()
    net.advance(9)
    assert w.publishes() == []
    net.advance(1)
    assert w.payloads() == [b"expired"]
    assert net.stats.sessions_expired == 1


def test_will_delay_with_session_expiry_zero_publishes_at_once(net):
    w = watcher(net)
    c = v5(net, "dev", will=Will("will/dev", b"now", properties={P.WILL_DELAY_INTERVAL: 30}))
    c.lose()
    assert w.payloads() == [b"now"]


_WILL_EXPIRY_BUG = (
    "brokerd bug: a delayed will's Message Expiry Interval runs from the disconnect, not from "
    "its publication (5.0 3.1.3.2.4)"
)


def test_delayed_will_expiry_counts_from_publication(net):
    """5.0 3.1.3.2.4: the will's Message Expiry Interval "is the lifetime of the Will Message in seconds
    and is sent as the Publication Expiry Interval when the Server publishes the Will Message"."""
    w = watcher(net)
    will = Will("will/dev", b"bye", properties={P.WILL_DELAY_INTERVAL: 10, P.MESSAGE_EXPIRY_INTERVAL: 30})
    c = v5(net, "dev", properties={P.SESSION_EXPIRY_INTERVAL: 100}, will=will)
    c.lose()
    net.advance(10)
    [p] = w.publishes()
    assert p.properties[P.MESSAGE_EXPIRY_INTERVAL] == 30


def test_delayed_will_with_expiry_shorter_than_delay_is_still_published(net):
    w = watcher(net)
    will = Will("will/dev", b"bye", properties={P.WILL_DELAY_INTERVAL: 10, P.MESSAGE_EXPIRY_INTERVAL: 5})
    c = v5(net, "dev", properties={P.SESSION_EXPIRY_INTERVAL: 100}, will=will)
    c.lose()
    net.advance(10)
    assert w.payloads() == [b"bye"]  # brokerd: counted in dropped_expired instead


def test_undelayed_will_expiry(net):
    w = watcher(net)
    c = v5(net, "dev", will=Will("will/dev", b"bye", properties={P.MESSAGE_EXPIRY_INTERVAL: 30}))
    c.lose()
    [p] = w.publishes()
    assert p.properties[P.MESSAGE_EXPIRY_INTERVAL] == 30


def test_will_on_server_shutdown(net):
    c = net.connect("dev", will=Will("will/dev", b"offline", retain=True))
    net.broker.shutdown(net.now)
    assert c.closed
    late = v5(net, "late")
    late.subscribe("will/#")
    assert late.payloads() == [b"offline"]


# ----------------------------------------------------------------------------- takeover


def test_takeover_v5_old_connection_gets_disconnect_8e(net):
    props = {P.SESSION_EXPIRY_INTERVAL: 100}
    old = v5(net, "dev", properties=props)
    old.subscribe("t", qos=1)
    new = net.client(MQTT5)
    ack = new.connect("dev", clean=False, properties=props)
    assert old.server_disconnect().reason_code == 0x8E  # [MQTT-3.1.4-3]
    assert old.closed
    assert ack.session_present is True
    assert net.stats.takeovers == 1
    net.connect("pub").publish("t", b"x")
    assert new.payloads() == [b"x"] and old.publishes() == []


def test_takeover_311_closes_old_connection(net):
    old = net.connect("dev", clean=False)
    new = net.client(MQTT311)
    assert new.connect("dev", clean=False).session_present
    assert old.closed
    assert old.take() == []
    assert not new.closed


def test_takeover_publishes_old_connections_will(net):
    w = watcher(net)
    net.connect("dev", will=Will("will/dev", b"replaced"))
    net.connect("dev")
    assert w.payloads() == [b"replaced"]


def test_takeover_keeps_inflight_messages(net):
    props = {P.SESSION_EXPIRY_INTERVAL: 100}
    old = v5(net, "dev", properties=props)
    old.subscribe("t", qos=1)
    net.connect("pub").publish("t", b"m", qos=1)
    [p] = old.publishes()
    new = net.client(MQTT5)
    new.connect("dev", clean=False, properties=props)
    [again] = new.publishes()
    assert (again.payload, again.dup, again.packet_id) == (b"m", True, p.packet_id)


def test_old_connection_cannot_act_after_takeover(net):
    old = net.connect("dev", clean=False)
    net.connect("dev", clean=False)
    old.send(Publish("t", b"ghost"))
    assert old.take() == []
    old.lose()  # the transport noticing later changes nothing
    assert net.broker.session_count() == 1


# ----------------------------------------------------------------------------- session expiry


def test_v5_session_expiry(net):
    props = {P.SESSION_EXPIRY_INTERVAL: 10}
    c = v5(net, "dev", properties=props)
    c.subscribe("t", qos=1)
    c.lose()
    net.advance(9)
    assert net.client(MQTT5).connect("dev", clean=False, properties=props).session_present
    net.clients[-1].lose()
    net.advance(10)
    assert net.client(MQTT5).connect("dev", clean=False, properties=props).session_present is False
    assert net.stats.sessions_expired == 1


def test_expired_session_stops_collecting_messages(net):
    c = v5(net, "dev", properties={P.SESSION_EXPIRY_INTERVAL: 10})
    c.subscribe("t", qos=1)
    c.disconnect()
    pub = net.connect("pub")
    pub.publish("t", b"kept", qos=1)
    net.advance(11)
    pub.publish("t", b"nobody", qos=1)
    assert net.stats.dropped_no_subscribers == 1
    assert net.broker.session_count() == 1  # only the publisher's


def test_session_expiry_zero_ends_at_disconnect(net):
    c = v5(net, "dev")
    c.subscribe("t", qos=1)
    c.lose()
    assert net.broker.session_count() == 0
    assert net.client(MQTT5).connect("dev", clean=False).session_present is False


def test_311_persistent_session_never_expires(net):
    c = net.connect("dev", clean=False)
    c.subscribe("t", qos=1)
    c.lose()
    net.advance(10**8)
    assert net.client(MQTT311).connect("dev", clean=False).session_present


def test_max_session_expiry_bounds_311_persistent_sessions():
    net = Net(ChannelLimits(max_session_expiry=60))
    c = net.connect("dev", clean=False)
    c.subscribe("t", qos=1)
    c.lose()
    net.advance(61)
    assert net.client(MQTT311).connect("dev", clean=False).session_present is False


def test_311_clean_session_ends_at_disconnect(net):
    c = net.connect("dev", clean=True)
    c.subscribe("t", qos=1)
    c.lose()
    assert net.client(MQTT311).connect("dev", clean=False).session_present is False


def test_disconnect_expiry_after_a_connack_lowered_it_to_zero_is_no_protocol_error():
    """[MQTT-3.14.2-2] makes a non-zero Session Expiry Interval on DISCONNECT a Protocol Error only
    when the CONNECT's was 0. A CONNECT asking for 300 that the server lowered to 0 (its CONNACK
    says so) may send it: its normal DISCONNECT ends the session -- no DISCONNECT 0x82 back, and
    no will published (the client asked for none)."""
    net = Net(ChannelLimits(max_session_expiry=0))
    w = watcher(net)
    c = net.client(MQTT5)
    ack = c.connect("dev", will=Will("will/dev", b"gone"), properties={P.SESSION_EXPIRY_INTERVAL: 300})
    assert ack.properties[P.SESSION_EXPIRY_INTERVAL] == 0
    c.disconnect(properties={P.SESSION_EXPIRY_INTERVAL: 300})
    assert c.closed and c.server_disconnect() is None
    assert w.payloads() == []
    assert net.broker.session_count() == 1          # the watcher's: the session of 0 s ended
    # a CONNECT with 0 still may not
    c = v5(net, "dev2", will=Will("will/dev2", b"gone"))
    c.disconnect(properties={P.SESSION_EXPIRY_INTERVAL: 300})
    assert c.server_disconnect().reason_code == 0x82
    assert w.payloads() == [b"gone"]


def test_disconnect_expiry_is_bounded_by_the_tenants_quota_as_on_connect():
    """A tenant's max_session_expiry quota bounds the interval a CONNECT asks for (its CONNACK
    says 60); the DISCONNECT's was bounded by the node's cap only, so a client could make its
    session outlive the quota -- here never expire."""
    net = Net()
    net.broker.auth = TenantControl(allow_anonymous=True)
    net.broker.auth.policies["default"] = TenantPolicy("default", default_allow=True,
                                                       quota={"max_session_expiry": 60})
    c = net.client(MQTT5)
    ack = c.connect("dev", properties={P.SESSION_EXPIRY_INTERVAL: 300})
    assert ack.properties[P.SESSION_EXPIRY_INTERVAL] == 60
    c.subscribe("t", qos=1)
    c.disconnect(properties={P.SESSION_EXPIRY_INTERVAL: 0xFFFFFFFF})
    assert c.closed and c.server_disconnect() is None
    net.advance(61)
    assert net.broker.session_count() == 0
    assert net.client(MQTT5).connect("dev", clean=False).session_present is False


# ----------------------------------------------------------------------------- the offline queue


def offline_sub(net, qos=1, cid="sub"):
    sub = net.connect(cid, clean=False)
    sub.subscribe("t", qos=qos)
    sub.lose()
    return net.connect("pub-" + cid)


def test_queued_and_retained_messages_do_not_keep_their_publishers_session():
    # A message queued for an offline session, or retained, outlives the
    # connection that published it; it must not keep the publisher's session
    # (its queues, subscriptions and window) in memory with it. Found by the
    # soak: thousands of ended clean sessions were held by queued messages.
    net = Net()
    pub = offline_sub(net)
    pub.subscribe("own/#", qos=1)
    gone = weakref.ref(pub.channel.session)
    pub.publish("t", b"queued", qos=1)
    pub.publish("t", b"and retained", qos=1, retain=True)
    pub.disconnect()
    del pub
    gc.collect()
    assert gone() is None
    again = net.connect("sub", clean=False)
    assert again.payloads() == [b"queued", b"and retained"]


def test_offline_queue_drop_policy_qos0_first_then_oldest():
    net = Net(ChannelLimits(max_queued=3))
    pub = offline_sub(net)
    for payload, qos in [(b"m1", 1), (b"a", 0), (b"m2", 1), (b"b", 0), (b"m3", 1), (b"c", 0), (b"m4", 1)]:
        pub.publish("t", payload, qos=qos)
    # [m1,a,m2] +b drops a; +m3 drops b; +c (no QoS 0 queued) drops c itself; +m4 drops m1
    assert net.stats.dropped_queue_full == 4
    again = net.client(MQTT311)
    again.connect("sub", clean=False)
    got = again.publishes()
    assert [p.payload for p in got] == [b"m2", b"m3", b"m4"]
    assert [p.dup for p in got] == [False] * 3


def test_offline_queue_keeps_mixed_qos_order():
    net = Net(ChannelLimits(max_queued=10))
    pub = offline_sub(net, qos=2)
    sent = [(b"%d" % i, i % 3) for i in range(9)]
    for payload, qos in sent:
        pub.publish("t", payload, qos=qos)
    again = net.client(MQTT311)
    again.connect("sub", clean=False)
    got = again.publishes()
    assert [(p.payload, p.qos) for p in got] == sent


def test_offline_qos0_not_queued_when_disabled():
    net = Net(ChannelLimits(queue_qos0=False))
    pub = offline_sub(net)
    pub.publish("t", b"q0", qos=0)
    pub.publish("t", b"q1", qos=1)
    assert net.stats.dropped_queue_full == 1
    again = net.client(MQTT311)
    again.connect("sub", clean=False)
    assert again.payloads() == [b"q1"]


def test_offline_queue_byte_bound():
    net = Net(ChannelLimits(max_queued_bytes=10))
    pub = offline_sub(net)
    pub.publish("t", b"1111", qos=1)
    pub.publish("t", b"2222", qos=1)
    pub.publish("t", b"3333", qos=1)  # 12 bytes > 10: the oldest goes
    pub.publish("t", b"x" * 11, qos=1)  # larger than the whole bound: dropped itself
    again = net.client(MQTT311)
    again.connect("sub", clean=False)
    assert again.payloads() == [b"2222", b"3333"]
    assert net.stats.dropped_queue_full == 2


def test_queue_bound_applies_while_connection_is_congested():
    net = Net(ChannelLimits(max_queued=2))
    sub = net.connect("sub")
    sub.subscribe("t", qos=1)
    pub = net.connect("pub")
    sub.channel.set_congested(True, net.now)
    for i in range(5):
        pub.publish("t", b"%d" % i, qos=1)
    assert sub.publishes() == []
    sub.channel.set_congested(False, net.now)
    assert sub.payloads() == [b"3", b"4"]
    assert net.stats.dropped_queue_full == 3


def test_queue_drains_in_order_after_acks():
    net = Net(ChannelLimits(max_inflight=2, max_queued=100))
    pub = offline_sub(net)
    for i in range(10):
        pub.publish("t", b"%d" % i, qos=1)
    again = net.client(MQTT311)
    again.connect("sub", clean=False)
    got = []
    batch = again.publishes()
    while batch:
        got += batch
        for p in batch:
            again.send(Puback(p.packet_id))
        batch = again.publishes()
    assert [p.payload for p in got] == [b"%d" % i for i in range(10)]


# ----------------------------------------------------------------------------- shared subscriptions


def members(net, n, filt="$share/g/job/#", qos=1, version=MQTT5, **kw):
    out = []
    for i in range(n):
        c = net.client(version)
        c.connect(f"m{i}", **kw)
        assert c.subscribe(filt, qos=qos).reason_codes == [qos]
        out.append(c)
    return out


def test_shared_subscription_round_robin(net):
    ms = members(net, 3)
    pub = net.connect("pub")
    for i in range(9):
        pub.publish("job/x", b"%d" % i)
    got = [m.payloads() for m in ms]
    assert sorted(sum(got, [])) == sorted(b"%d" % i for i in range(9))
    assert [len(g) for g in got] == [3, 3, 3]
    assert got[0] == [b"0", b"3", b"6"]


def test_shared_and_plain_subscribers_both_receive(net):
    ms = members(net, 2)
    plain = v5(net, "plain")
    plain.subscribe("job/#")
    other_group = members(net, 1, filt="$share/h/job/#")[0]
    pub = net.connect("pub")
    for i in range(4):
        pub.publish("job/x", b"%d" % i)
    assert len(plain.payloads()) == 4
    assert len(other_group.payloads()) == 4
    assert sum(len(m.payloads()) for m in ms) == 4


def test_shared_subscription_failover_when_member_session_ends(net):
    a, b = members(net, 2, qos=1)
    pub = net.connect("pub")
    pub.publish("job/1", b"one", qos=1)
    [p] = a.publishes()
    assert b.publishes() == []
    a.lose()  # session expiry 0: the session ends with the connection
    [again] = b.publishes()  # 5.0 4.8.2: the unacknowledged message goes to another member
    assert again.payload == b"one"
    pub.publish("job/2", b"two", qos=1)
    assert b.payloads() == [b"two"]


def test_shared_subscription_skips_offline_member_while_others_are_online(net):
    a, b = members(net, 2, qos=1, clean=False, properties={P.SESSION_EXPIRY_INTERVAL: 100})
    a.lose()
    pub = net.connect("pub")
    for i in range(4):
        pub.publish("job/x", b"%d" % i, qos=1)
    assert len(b.payloads()) == 4


def test_shared_subscription_retained_not_sent(net):
    pub = net.connect("pub")
    pub.publish("job/r", b"kept", retain=True)
    [m] = members(net, 1)
    assert m.publishes() == []  # 5.0 4.8.2: no retained messages for shared subscriptions


def test_shared_subscription_unsubscribe(net):
    a, b = members(net, 2)
    assert a.unsubscribe("$share/g/job/#").reason_codes == [0]
    pub = net.connect("pub")
    for i in range(3):
        pub.publish("job/x", b"%d" % i)
    assert a.publishes() == [] and len(b.payloads()) == 3


def test_shared_subscription_311(net):
    ms = members(net, 2, version=MQTT311)
    pub = net.connect("pub")
    for i in range(4):
        pub.publish("job/x", b"%d" % i)
    assert [len(m.payloads()) for m in ms] == [2, 2]


def test_shared_subscription_downgrades_to_member_qos(net):
    [m] = members(net, 1, qos=0)
    net.connect("pub").publish("job/x", b"x", qos=2)
    [p] = m.publishes()
    assert p.qos == 0
