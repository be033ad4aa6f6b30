"""PUBLISH flows through Channel + Broker: QoS 0/1/2 both ways, acks, windows, redelivery."""

import pytest

from brokerd.protocol import properties as P
from brokerd.protocol.channel import ChannelLimits
from brokerd.protocol.codec import encode
from brokerd.protocol.packets import (
    Connect,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Subscribe,
    SubscriptionRequest,
)

from .harness import MQTT5, MQTT31, MQTT311, Net

BOTH = pytest.mark.parametrize("version", [MQTT311, MQTT5])


def pair(net, version=MQTT311, sub_version=None, qos=2, filt="t/#", **sub_connect):
    sub = net.client(sub_version or version)
    sub.connect("sub", **sub_connect)
    sub.subscribe(filt, qos=qos)
    pub = net.client(version)
    pub.connect("pub")
    return pub, sub


# ----------------------------------------------------------------------------- QoS 0 / 1 / 2 inbound


@BOTH
def test_qos0_round_trip(net, version):
    pub, sub = pair(net, version)
    assert pub.send(Publish("t/a", b"hello")) == []
    [p] = sub.publishes()
    assert (p.topic, p.payload, p.qos, p.retain, p.dup, p.packet_id) == ("t/a", b"hello", 0, False, False, 0)


def test_qos1_puback_bytes_311(net):
    pub, sub = pair(net, MQTT311)
    pub.channel.receive_data(encode(Publish("t/a", b"x", 1, packet_id=0x1234), MQTT311), net.now)
    assert b"".join(pub.channel.out) == b"\x40\x02\x12\x34"


@BOTH
def test_qos1_publish_is_acknowledged_and_routed(net, version):
    pub, sub = pair(net, version)
    ack = pub.publish("t/a", b"x", qos=1, pid=77)
    assert ack == Puback(77)
    [p] = sub.publishes()
    assert (p.topic, p.payload, p.qos) == ("t/a", b"x", 1)
    assert p.packet_id != 0


@BOTH
def test_qos2_inbound_exchange(net, version):
    pub, sub = pair(net, version)
    assert pub.publish("t/a", b"x", qos=2, pid=9) == Pubrec(9)
    assert pub.send(Pubrel(9)) == [Pubcomp(9)]
    [p] = sub.publishes()
    assert (p.payload, p.qos) == (b"x", 2)


@BOTH
def test_qos2_duplicate_publish_before_pubrel_is_not_routed_twice(net, version):
    pub, sub = pair(net, version)
    assert pub.publish("t/a", b"once", qos=2, pid=5) == Pubrec(5)
    # the client resends (DUP=1) before it saw the PUBREC: PUBREC again, no second copy
    assert pub.publish("t/a", b"once", qos=2, pid=5, dup=True) == Pubrec(5)
    assert pub.send(Pubrel(5)) == [Pubcomp(5)]
    assert sub.payloads() == [b"once"]
    # after PUBCOMP the id is free again: a new message with it is new
    assert pub.publish("t/a", b"twice", qos=2, pid=5) == Pubrec(5)
    assert sub.payloads() == [b"twice"]


def test_qos2_same_id_without_dup_still_gets_pubrec_v5(net):
    """5.0 4.3.3 [MQTT-4.3.3-10]: until PUBREL, any PUBLISH with the same id is answered with
    PUBREC and not delivered again. 0x91 is not in the DISCONNECT reason code table (3.14.2.1)."""
    pub, sub = pair(net, MQTT5)
    assert pub.publish("t/a", b"once", qos=2, pid=5) == Pubrec(5)
    assert pub.publish("t/a", b"once", qos=2, pid=5) == Pubrec(5)
    assert not pub.closed
    assert sub.payloads() == [b"once"]


def test_qos2_same_id_without_dup_311_gets_pubrec(net):
    pub, sub = pair(net, MQTT311)
    assert pub.publish("t/a", b"once", qos=2, pid=5) == Pubrec(5)
    assert pub.publish("t/a", b"once", qos=2, pid=5) == Pubrec(5)
    assert sub.payloads() == [b"once"]


def test_pubrel_for_unknown_id_v5(net):
    c = net.client(MQTT5)
    c.connect("c")
    assert c.send(Pubrel(42)) == [Pubcomp(42, 0x92)]
    assert not c.closed


def test_pubrel_for_unknown_id_311(net):
    c = net.connect("c")
    assert c.send(Pubrel(42)) == [Pubcomp(42)]


def test_pubrel_twice(net):
    pub, sub = pair(net, MQTT5)
    pub.publish("t/a", b"x", qos=2, pid=3)
    assert pub.send(Pubrel(3)) == [Pubcomp(3)]
    assert pub.send(Pubrel(3)) == [Pubcomp(3, 0x92)]


def test_inbound_qos2_state_survives_reconnect(net):
    """The PUBREL may come on a new connection of the same session (4.3.3)."""
    sub = net.connect("sub", version=MQTT311)
    sub.subscribe("t", qos=2)
    pub = net.connect("pub", clean=False)
    assert pub.publish("t", b"x", qos=2, pid=8) == Pubrec(8)
    pub.lose()
    pub2 = net.client(MQTT311)
    assert pub2.connect("pub", clean=False).session_present
    assert pub2.publish("t", b"x", qos=2, pid=8, dup=True) == Pubrec(8)
    assert pub2.send(Pubrel(8)) == [Pubcomp(8)]
    assert sub.payloads() == [b"x"]


def test_no_matching_subscribers(net):
    c5 = net.client(MQTT5)
    c5.connect("c5")
    assert c5.publish("nobody", b"x", qos=1, pid=1) == Puback(1, 0x10)
    assert c5.publish("nobody", b"x", qos=2, pid=2) == Pubrec(2, 0x10)
    c3 = net.connect("c3")
    assert c3.publish("nobody", b"x", qos=1, pid=1) == Puback(1)
    assert net.stats.dropped_no_subscribers == 3


# ----------------------------------------------------------------------------- QoS outbound


@BOTH
def test_qos2_outbound_exchange(net, version):
    pub, sub = pair(net, MQTT311, sub_version=version)
    pub.publish("t/a", b"x", qos=2)
    [p] = sub.publishes()
    assert p.qos == 2
    assert sub.send(Pubrec(p.packet_id)) == [Pubrel(p.packet_id)]
    assert sub.send(Pubcomp(p.packet_id)) == []


def test_pubrec_for_unknown_id_v5(net):
    c = net.client(MQTT5)
    c.connect("c")
    assert c.send(Pubrec(99)) == [Pubrel(99, 0x92)]


def test_pubrec_with_error_code_ends_the_flow(net):
    pub, sub = pair(net, MQTT5, qos=2, properties={P.RECEIVE_MAXIMUM: 1})
    pub.publish2("t/a", b"1")
    pub.publish("t/a", b"2", qos=1)
    [p] = sub.publishes()
    assert (p.payload, p.qos) == (b"1", 2)
    # 5.0 4.3.3: a PUBREC >= 0x80 ends the exchange: no PUBREL, and the window slot is free again
    got = sub.send(Pubrec(p.packet_id, 0x80))
    assert [(type(x).__name__, x.payload) for x in got] == [("Publish", b"2")]


@pytest.mark.parametrize(
    ("sub_qos", "pub_qos", "got"), [(0, 2, 0), (1, 2, 1), (2, 1, 1), (2, 0, 0), (1, 1, 1)]
)
def test_delivered_at_minimum_of_subscription_and_message_qos(net, sub_qos, pub_qos, got):
    pub, sub = pair(net, qos=sub_qos)
    pub.publish("t/a", b"x", qos=pub_qos)
    [p] = sub.publishes()
    assert p.qos == got


def test_suback_grants_requested_qos(net):
    c = net.connect("c")
    assert c.subscribe("a", "b", "c", qos=0).reason_codes == [0, 0, 0]
    ack = c.subscribe(SubscriptionRequest("a", 2), SubscriptionRequest("b", 1), SubscriptionRequest("c", 0))
    assert ack.reason_codes == [2, 1, 0]


def test_inflight_packet_ids_are_distinct(net):
    pub, sub = pair(net, qos=1)
    for i in range(20):
        pub.publish("t/a", bytes([i]), qos=1)
    pids = [p.packet_id for p in sub.publishes()]
    assert len(pids) == 20 and len(set(pids)) == 20 and 0 not in pids


# ----------------------------------------------------------------------------- windows


def test_inflight_window_respects_client_receive_maximum(net):
    pub, sub = pair(net, MQTT5, qos=1, properties={P.RECEIVE_MAXIMUM: 3})
    for i in range(10):
        pub.publish("t/a", b"%d" % i, qos=1)
    first = sub.publishes()
    assert [p.payload for p in first] == [b"0", b"1", b"2"]
    got = [p.payload for p in first]
    pending = list(first)
    while pending:
        p = pending.pop(0)
        more = [x for x in sub.send(Puback(p.packet_id)) if x.type == 3]
        sub.publishes()
        assert len(more) <= 1
        pending += more
        got += [x.payload for x in more]
    assert got == [b"%d" % i for i in range(10)]


def test_inflight_window_qos2_slot_freed_by_pubcomp_not_pubrec(net):
    pub, sub = pair(net, MQTT5, qos=2, properties={P.RECEIVE_MAXIMUM: 1})
    pub.publish("t/a", b"1", qos=2)
    pub.publish("t/a", b"2", qos=2)
    [p] = sub.publishes()
    assert sub.send(Pubrec(p.packet_id)) == [Pubrel(p.packet_id)]
    assert sub.publishes() == []
    [p2] = [x for x in sub.send(Pubcomp(p.packet_id)) if x.type == 3]
    sub.publishes()
    assert p2.payload == b"2"


def test_server_max_inflight_bounds_311_window():
    net = Net(ChannelLimits(max_inflight=2))
    pub, sub = pair(net, MQTT311, qos=1)
    for i in range(5):
        pub.publish("t/a", b"%d" % i, qos=1)
    assert [p.payload for p in sub.publishes()] == [b"0", b"1"]


def test_qos0_behind_a_full_window_keeps_publish_order(net):
    pub, sub = pair(net, MQTT5, qos=1, properties={P.RECEIVE_MAXIMUM: 1})
    pub.publish("t/a", b"q1-a", qos=1)
    pub.publish("t/a", b"q1-b", qos=1)
    pub.publish("t/a", b"q0", qos=0)
    got = sub.publishes()
    while got and got[-1].qos:
        more = sub.send(Puback(got[-1].packet_id))
        sub.publishes()
        got += [p for p in more if p.type == 3]
        if not more:
            break
    assert [p.payload for p in got] == [b"q1-a", b"q1-b", b"q0"]


def test_receive_maximum_exceeded_inbound():
    net = Net(ChannelLimits(max_inflight=2))
    pub, sub = pair(net, MQTT5)
    pub.publish("t/a", b"1", qos=2)
    pub.publish("t/a", b"2", qos=2)
    pub.send(Publish("t/a", b"3", 2, packet_id=50))  # a third unreleased QoS 2 message
    assert pub.server_disconnect().reason_code == 0x93
    assert pub.closed
    assert sub.payloads() == [b"1", b"2"]


def test_receive_maximum_is_freed_by_pubrel():
    net = Net(ChannelLimits(max_inflight=1))
    pub, sub = pair(net, MQTT5, qos=0)
    for i in range(5):
        pub.publish2("t/a", b"%d" % i)
    assert not pub.closed
    assert len(sub.payloads()) == 5


# ----------------------------------------------------------------------------- session resume


@BOTH
def test_unacknowledged_qos1_redelivered_with_dup_on_resume(net, version):
    props = {P.SESSION_EXPIRY_INTERVAL: 300} if version == MQTT5 else None
    pub, sub = pair(net, MQTT311, sub_version=version, qos=1, clean=False, properties=props)
    pub.publish("t/a", b"m1", qos=1)
    pub.publish("t/a", b"m2", qos=1)
    first = sub.publishes()
    assert [(p.payload, p.dup) for p in first] == [(b"m1", False), (b"m2", False)]
    sub.send(Puback(first[0].packet_id))
    sub.lose()
    again = net.client(version)
    ack = again.connect("sub", clean=False, properties=props)
    assert ack.session_present is True
    [p] = again.publishes()
    assert (p.payload, p.dup, p.packet_id, p.qos) == (b"m2", True, first[1].packet_id, 1)
    again.send(Puback(p.packet_id))
    again.lose()
    third = net.client(version)
    third.connect("sub", clean=False, properties=props)
    assert third.publishes() == []


def test_qos2_resume_resends_publish_or_pubrel(net):
    pub, sub = pair(net, MQTT311, qos=2, clean=False)
    pub.publish("t/a", b"a", qos=2)
    pub.publish("t/a", b"b", qos=2)
    pa, pb = sub.publishes()
    assert sub.send(Pubrec(pa.packet_id)) == [Pubrel(pa.packet_id)]
    sub.lose()
    again = net.client(MQTT311)
    again.connect("sub", clean=False)
    got = again.take()
    # [MQTT-4.4.0-1]: resend unacknowledged PUBLISH (DUP) and PUBREL, in their original order
    assert got == [Pubrel(pa.packet_id), Publish("t/a", b"b", 2, False, True, pb.packet_id)]


def test_resume_resends_no_more_than_the_new_connections_receive_maximum(net):
    """[MQTT-4.9.0-2]: the server never has more unacknowledged QoS 1/2 PUBLISHes towards a
    client than the Receive Maximum of its connection -- also right after a reconnect, when the
    messages of the session's previous connection are sent again ([MQTT-4.4.0-1]). A QoS 2
    message whose PUBREL is owed still counts (until PUBCOMP). Those past the window go once
    slots free, still with DUP and their packet id, in their order."""
    big = {P.SESSION_EXPIRY_INTERVAL: 300, P.RECEIVE_MAXIMUM: 10}
    pub, sub = pair(net, MQTT311, sub_version=MQTT5, qos=2, clean=False, properties=big)
    pub.publish2("t/a", b"q2")
    for i in range(5):
        pub.publish("t/a", b"%d" % i, qos=1)
    first = sub.publishes()
    assert [p.payload for p in first] == [b"q2", b"0", b"1", b"2", b"3", b"4"]
    assert sub.send(Pubrec(first[0].packet_id)) == [Pubrel(first[0].packet_id)]
    sub.lose()
    again = net.client(MQTT5)
    again.connect("sub", clean=False, properties={P.SESSION_EXPIRY_INTERVAL: 300, P.RECEIVE_MAXIMUM: 3})
    got = again.take()
    # the PUBREL owed and two PUBLISHes: three unacknowledged
    assert got == [Pubrel(first[0].packet_id)] + [
        Publish("t/a", p.payload, 1, False, True, p.packet_id) for p in first[1:3]]
    sent = got[1:]
    more = [x for x in again.send(Pubcomp(first[0].packet_id)) if x.type == 3]
    assert [(p.payload, p.dup, p.packet_id) for p in more] == [(b"2", True, first[3].packet_id)]
    sent += more
    i = 0
    while i < len(sent):
        sent += [x for x in again.send(Puback(sent[i].packet_id)) if x.type == 3]
        i += 1
    assert [(p.payload, p.dup, p.packet_id) for p in sent] == [
        (p.payload, True, p.packet_id) for p in first[1:]]
    again.take()
    pub.publish("t/a", b"new", qos=1)
    [p] = again.publishes()
    assert p.payload == b"new" and p.packet_id not in {q.packet_id for q in first}


def test_queued_messages_follow_inflight_on_resume(net):
    pub, sub = pair(net, MQTT311, qos=1, clean=False)
    pub.publish("t/a", b"inflight", qos=1)
    sub.publishes()
    sub.lose()
    pub.publish("t/a", b"queued1", qos=1)
    pub.publish("t/a", b"queued2", qos=0)
    again = net.client(MQTT311)
    again.connect("sub", clean=False)
    got = again.publishes()
    assert [(p.payload, p.dup) for p in got] == [
        (b"inflight", True),
        (b"queued1", False),
        (b"queued2", False),
    ]


def test_clean_session_discards_inflight(net):
    pub, sub = pair(net, MQTT311, qos=1, clean=False)
    pub.publish("t/a", b"x", qos=1)
    sub.publishes()
    sub.lose()
    again = net.client(MQTT311)
    assert again.connect("sub", clean=True).session_present is False
    assert again.publishes() == []


# ----------------------------------------------------------------------------- retain flag on delivery


@BOTH
def test_retain_flag_cleared_on_live_delivery_and_set_for_retained(net, version):
    pub, sub = pair(net, MQTT311, sub_version=version, qos=1)
    pub.publish("t/r", b"kept", qos=1, retain=True)
    [live] = sub.publishes()
    assert live.retain is False  # [MQTT-3.3.1-9] / 5.0 without Retain As Published
    late = net.client(version)
    late.connect("late")
    late.subscribe("t/#", qos=1)
    [old] = late.publishes()
    assert (old.payload, old.retain) == (b"kept", True)  # [MQTT-3.3.1-8]


def test_empty_retained_payload_clears_and_is_still_delivered(net):
    pub, sub = pair(net, MQTT311, qos=0)
    pub.publish("t/r", b"v", retain=True)
    pub.publish("t/r", b"", retain=True)
    assert sub.payloads() == [b"v", b""]
    late = net.connect("late")
    late.subscribe("t/#")
    assert late.publishes() == []
    assert net.broker.retained_count() == 0


# ----------------------------------------------------------------------------- invalid PUBLISH / SUBSCRIBE


@pytest.mark.parametrize("topic", ["a/+", "#", "a/#", "+"])
def test_publish_to_wildcard_topic_closes(net, topic):
    c3 = net.connect("c3")
    c3.send(Publish(topic, b"x"))
    assert c3.closed
    c5 = net.client(MQTT5)
    c5.connect("c5")
    c5.send(Publish(topic, b"x"))
    assert c5.server_disconnect().reason_code in (0x90, 0x82)
    assert c5.closed


def test_publish_with_empty_topic_311_closes(net):
    c = net.connect("c")
    c.send(Publish("", b"x"))
    assert c.closed


def test_publish_with_empty_topic_and_no_alias_v5(net):
    """5.0 3.3.2.1: "It is a Protocol Error if the Topic Name is zero length and there is no Topic Alias"."""
    c = net.client(MQTT5)
    c.connect("c")
    c.send(Publish("", b"x"))
    assert c.closed
    assert c.server_disconnect().reason_code in (0x82, 0x90)


def test_subscription_identifier_in_client_publish_is_protocol_error(net):
    c = net.client(MQTT5)
    c.connect("c")
    c.send(Publish("t", b"x", properties={P.SUBSCRIPTION_IDENTIFIER: [1]}))
    assert c.server_disconnect().reason_code == 0x82  # [MQTT-3.3.4-6]


def test_subscription_identifier_zero_is_protocol_error(net):
    c = net.client(MQTT5)
    c.connect("c")
    c.send(Subscribe(1, [SubscriptionRequest("a")], {P.SUBSCRIPTION_IDENTIFIER: 0}))
    assert c.server_disconnect().reason_code == 0x82


@pytest.mark.parametrize(
    "filt", ["a/#/b", "a+", "#a", "a/b#", "", "$share/g", "$share//a", "$share/g+/a", "$share/g/"]
)
def test_invalid_filters_fail_in_suback(net, filt):
    c3 = net.connect("c3")
    assert c3.subscribe(filt, "ok").reason_codes == [0x80, 0]
    c5 = net.client(MQTT5)
    c5.connect("c5")
    assert c5.subscribe(filt, "ok").reason_codes == [0x8F, 0]
    assert not c3.closed and not c5.closed


def test_payload_format_invalid(net):
    pub, sub = pair(net, MQTT5)
    bad = {P.PAYLOAD_FORMAT_INDICATOR: 1}
    assert pub.publish("t/a", b"\xff\xfe", qos=1, properties=bad, pid=4) == Puback(
        4, 0x99, {P.REASON_STRING: "payload is not valid UTF-8"}
    )
    pub.publish("t/a", b"\xff", qos=0, properties=bad)
    assert sub.payloads() == []
    assert not pub.closed
    pub.publish("t/a", "ü".encode(), qos=1, properties=bad)
    [p] = sub.publishes()
    assert p.properties == {P.PAYLOAD_FORMAT_INDICATOR: 1}


def test_unsubscribe_stops_delivery(net):
    c5 = net.client(MQTT5)
    c5.connect("c5")
    c5.subscribe("a", "b")
    ack = c5.unsubscribe("a", "zzz", "bad/#/x")
    assert ack.reason_codes == [0, 0x11, 0x8F]
    pub = net.connect("p")
    pub.publish("a", b"1")
    pub.publish("b", b"2")
    assert c5.payloads() == [b"2"]


def test_unsuback_311_has_no_codes(net):
    c = net.connect("c")
    c.subscribe("a")
    c.channel.receive_data(encode(Subscribe(2, [SubscriptionRequest("b")]), MQTT311), net.now)
    c.take()
    from brokerd.protocol.packets import Unsubscribe

    c.channel.receive_data(encode(Unsubscribe(3, ["a"]), MQTT311), net.now)
    assert b"".join(c.channel.out) == b"\xb0\x02\x00\x03"


def test_resubscribe_replaces_options(net):
    pub, sub = pair(net, qos=0)
    sub.subscribe("t/#", qos=1)
    pub.publish("t/a", b"x", qos=2)
    [p] = sub.publishes()
    assert p.qos == 1


def test_messages_from_one_publisher_arrive_in_order(net):
    pub, sub = pair(net, qos=2)
    for i in range(30):
        q = i % 3
        if q == 2:
            pub.publish2("t/a", b"%d" % i)
        else:
            pub.publish("t/a", b"%d" % i, qos=q)
    got = sub.publishes()
    for p in got:
        sub.ack(p)
    assert [p.payload for p in got] == [b"%d" % i for i in range(30)]


def test_dup_flag_is_not_propagated(net):
    """[MQTT-3.3.1-3]: the outgoing DUP flag depends only on whether *that* packet is a resend."""
    pub, sub = pair(net, qos=1)
    pub.publish("t/a", b"x", qos=1, dup=True)
    [p] = sub.publishes()
    assert p.dup is False


def test_output_mark_queues_then_drains_in_order():
    """Deliveries past ``max_pending`` bytes of unwritten output wait in the session queue and
    go out, in order, once the transport reports the write."""
    net = Net(ChannelLimits(max_pending=100))
    pub, sub = pair(net, qos=1)
    sub.auto_flush = False
    for i in range(10):
        pub.publish("t/a", b"%d" % i + b"x" * 30, qos=i % 2)
    got = sub.publishes()
    assert 0 < len(got) < 10
    while len(got) < 10:
        sub.channel.flushed(net.now)
        more = sub.publishes()
        assert more
        got += more
    assert [p.payload[:1] for p in got] == [b"%d" % i for i in range(10)]
    assert net.stats.dropped_queue_full == 0


def test_311_client_may_pipeline_many_qos2_publishes(net):
    """MQTT 3.1.1 has no Receive Maximum: a client may send any number of QoS 2 PUBLISHes before it
    reads the PUBRECs (4.3.3). Only a v5 client that exceeds the Receive Maximum it was given is in
    error (5.0 3.3.4, 0x93)."""
    pub, sub = pair(net, MQTT311)
    got = pub.send(*[Publish("t/a", b"%d" % i, 2, False, False, i + 1) for i in range(40)])
    assert not pub.closed
    assert got == [Pubrec(i + 1) for i in range(40)]


# ----------------------------------------------------------------------------- a 3.x QoS 1 PUBLISH, forwarded


def _raw_out(client) -> bytes:
    """The bytes the channel wrote since the last look (what the socket would carry)."""
    ch = client.channel
    data = b"".join(ch.out)
    ch.out.clear()
    ch.flushed(client.net.now)
    return data


@pytest.mark.parametrize("pub_version", [MQTT311, MQTT5])
@pytest.mark.parametrize("sub_version", [MQTT31, MQTT311, MQTT5])
@pytest.mark.parametrize("sub_qos", [1, 2])
@pytest.mark.parametrize(("topic", "size"), [
    ("t/a", 0), ("t/a", 100), ("t/a", 120), ("t/a", 121), ("t/ü/€", 1024),
    ("t/" + "x" * 300, 16000), ("t/" + "x" * 300, 16100)])
def test_a_311_qos1_publish_alone_in_its_read_reaches_subscribers_as_our_codec_encodes_it(
        net, pub_version, sub_version, sub_qos, topic, size):
    # A 3.x QoS 1 PUBLISH read alone is delivered from the bytes it came in (up to its packet
    # id) to 3.x subscribers: the same bytes as encoding the delivery, whatever the lengths
    # (remaining length of 1, 2 or 3 bytes: 120 + 7 = 127, 121 + 7 = 128, 16100 + 306 > 16383)
    pub, sub = pair(net, pub_version, sub_version=sub_version, qos=sub_qos)
    payload = bytes(range(256)) * (size // 256) + b"p" * (size % 256)
    for pid in (1, 300, 65535):
        ack = pub.publish(topic, payload, qos=1, pid=pid)
        assert isinstance(ack, Puback) and ack.packet_id == pid
        data = _raw_out(sub)
        got = sub.decoder.feed(data)
        assert [(p.topic, p.payload, p.qos, p.retain, p.dup) for p in got] == [(topic, payload, 1, False, False)]
        assert data == encode(Publish(topic, payload, 1, False, False, got[0].packet_id), sub_version)
        sub.send(Puback(got[0].packet_id))


def test_a_forwarded_311_qos1_publish_is_resent_with_dup_on_resume(net):
    pub, sub = pair(net, MQTT311, qos=1, clean=False)
    pub.publish("t/a", b"m" * 200, qos=1)
    [first] = sub.decoder.feed(_raw_out(sub))
    sub.lose()
    again = net.client(MQTT311)
    again.channel.receive_data(encode(Connect("sub", False, 60), MQTT311), net.now)
    data = _raw_out(again)
    assert data[:4] == b"\x20\x02\x01\x00"         # CONNACK, session present
    assert data[4:] == encode(Publish("t/a", b"m" * 200, 1, False, True, first.packet_id), MQTT311)


@BOTH
def test_a_steady_publishers_next_publish_is_read_for_what_it_says(net, version):
    # A publisher at a steady rate sends PUBLISHes with the same fixed header and topic; the
    # channel remembers the last one's. What differs -- another topic of the same length, a
    # wildcard, a DUP or retain flag, properties (5.0), another size -- is read as sent.
    pub, sub = pair(net, version, qos=1)
    for topic in ("t/a", "t/a", "t/b", "t/a"):
        ack = pub.publish(topic, b"x" * 50, qos=1)
        assert isinstance(ack, Puback) and ack.reason_code == 0
        [p] = sub.publishes()
        assert (p.topic, p.payload, p.qos, p.retain) == (topic, b"x" * 50, 1, False)
        sub.send(Puback(p.packet_id))
    pub.publish("t/a", b"y" * 50, qos=1, retain=True)
    [p] = sub.publishes()
    assert (p.topic, p.payload, p.retain) == ("t/a", b"y" * 50, False)     # (Retain As Published: 0)
    sub.send(Puback(p.packet_id))
    pub.publish("t/a", b"z" * 49, qos=1)
    [p] = sub.publishes()
    assert (p.topic, p.payload) == ("t/a", b"z" * 49)
    sub.send(Puback(p.packet_id))
    if version == MQTT5:
        pub.publish("t/a", b"x" * 50, qos=1, properties={P.USER_PROPERTY: [("k", "v")]})
        [p] = sub.publishes()
        assert (p.topic, p.payload, p.properties) == ("t/a", b"x" * 50, {P.USER_PROPERTY: [("k", "v")]})
        sub.send(Puback(p.packet_id))
    pub.publish("t/+", b"x" * 50, qos=1)
    assert pub.closed
    assert sub.publishes() == []
