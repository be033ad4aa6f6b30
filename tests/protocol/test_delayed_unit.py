"""Delayed publish on the sans-IO broker and channel (no store, no clock): the
topic's parsing, the ack that waits for the store, the refusals (v5 reason
codes with a reason string, 3.1.1 disconnects), the cap, and the release."""

import pytest

from brokerd.delayed import MAX_INTERVAL, DelayedQueue, DelayedTopicError, parse_delayed
from brokerd.protocol import properties as P
from brokerd.protocol.packets import Puback, Pubcomp, Publish, Pubrec, Pubrel

from .harness import MQTT5, MQTT311


@pytest.mark.parametrize(("topic", "parsed"), [
    ("$delayed/0/a", (0, "a")), ("$delayed/15/x/y", (15, "x/y")), ("$delayed/007/a/", (7, "a/")),
    (f"$delayed/{MAX_INTERVAL}/a/b/c", (MAX_INTERVAL, "a/b/c")),
])
def test_parse(topic, parsed):
    assert parse_delayed(topic) == parsed


@pytest.mark.parametrize("topic", ["$delayed/x/a", "$delayed/-1/a", "$delayed/+1/a", "$delayed/1e3/a",
                                   "$delayed/ 1/a", "$delayed/١/a", f"$delayed/{MAX_INTERVAL + 1}/a",
                                   "$delayed/", "$delayed/5", "$delayed/5/", "$delayed//a", "$delayed/5/$SYS/x"])
def test_parse_refuses(topic):
    with pytest.raises(DelayedTopicError):
        parse_delayed(topic)


def test_the_cap_is_the_smaller_of_the_node_and_the_tenant_quota():
    q = DelayedQueue(10)
    assert (q.limit(None), q.limit({}), q.limit({"max_delayed": 3}), q.limit({"max_delayed": 30})) == (10, 10, 3, 10)
    assert DelayedQueue(None).limit({"max_delayed": 3}) == 3
    q.take("t", 1.0, object(), None)
    q.take("t", 1.0, object(), None)
    assert q.full("t", {"max_delayed": 2}) and not q.full("t", None) and not q.full("u", {"max_delayed": 1})
    q.refresh({"t": 5, "u": 1})              # the store's counts, plus the two not written yet
    assert q.counts == {"t": 7, "u": 1}
    q.gone("u")
    assert q.counts == {"t": 7}


@pytest.fixture
def queue(net):
    q = DelayedQueue(2)
    net.broker.use_delayed(q)
    return q


def pair(net, version):
    sub = net.client(version)
    sub.connect("sub")
    sub.subscribe("t/#", qos=2)
    pub = net.client(version)
    pub.connect("pub")
    return pub, sub


@pytest.mark.parametrize("version", [MQTT311, MQTT5])
def test_the_ack_waits_until_the_message_is_stored_and_the_release_publishes_it(net, queue, version):
    pub, sub = pair(net, version)
    props = {P.USER_PROPERTY: [("k", "v")]} if version == MQTT5 else None
    assert pub.publish("$delayed/5/t/a", b"x", qos=1, retain=True, properties=props) is None   # not yet
    [(tenant, due, msg, ack, publisher)] = queue.pending
    assert (tenant, due, msg.topic, msg.qos, msg.retain) == ("default", net.now + 5, "t/a", 1, True)
    assert sub.publishes() == []
    ack(True)
    [puback] = [p for p in pub.recv() if isinstance(p, Puback)]
    assert puback.reason_code == 0
    # QoS 2: the PUBREC waits the same way
    assert pub.publish("$delayed/5/t/b", b"y", qos=2) is None
    queue.pending[-1][3](True)
    [rec] = [p for p in pub.recv() if isinstance(p, Pubrec)]
    assert rec.reason_code == 0
    assert [p for p in pub.send(Pubrel(rec.packet_id)) if isinstance(p, Pubcomp)]
    # released (by the runner, when due): published to the topic as the broker's own
    assert net.broker.release_delayed("default", Publish("t/a", b"x", 1, True, False, 0, props), net.now) == 1
    [p] = sub.publishes()
    assert (p.topic, p.payload, p.qos) == ("t/a", b"x", 1)
    if version == MQTT5:
        assert p.properties == props


def test_a_store_failure_is_a_negative_ack(net, queue):
    pub5, _ = pair(net, MQTT5)
    assert pub5.publish("$delayed/5/t/a", b"x", qos=1) is None
    queue.pending[-1][3](False)
    [puback] = [p for p in pub5.recv() if isinstance(p, Puback)]
    assert puback.reason_code == 0x83
    pub3 = net.client(MQTT311)
    pub3.connect("pub3")
    pub3.publish("$delayed/5/t/a", b"x", qos=1)
    queue.pending[-1][3](False)
    pub3.recv()
    assert pub3.closed


def test_refusals_v5_reason_codes_with_a_reason_string(net, queue):
    pub, sub = pair(net, MQTT5)
    bad = pub.publish("$delayed/soon/t/a", b"x", qos=1)
    assert bad.reason_code == 0x90 and "$delayed/{seconds" in bad.properties[P.REASON_STRING]
    for i in range(2):
        assert pub.publish(f"$delayed/9/t/{i}", b"x", qos=1) is None
        queue.pending[-1][3](True)
    full = pub.publish("$delayed/9/t/2", b"x", qos=2)
    assert full.reason_code == 0x97 and "quota" in full.properties[P.REASON_STRING]
    assert len(queue.pending) == 2 and not pub.closed
    assert pub.publish("$delayed/soon/t/a", b"x", qos=0) is None        # QoS 0: dropped
    assert not pub.closed and sub.publishes() == []


@pytest.mark.parametrize("topic", ["$delayed/soon/t/a", "$delayed/9/t/x"])
def test_refusals_disconnect_a_311_client(net, queue, topic):
    queue.take("default", 0.0, None, None)
    queue.take("default", 0.0, None, None)                    # the cap (2) is reached
    pub = net.client(MQTT311)
    pub.connect("p")
    assert pub.publish(topic, b"x", qos=1) is None
    assert pub.closed


def test_without_a_delayed_queue_the_topic_is_a_plain_one(net):
    pub, sub = pair(net, MQTT5)
    sub.subscribe("$delayed/#", qos=1)
    assert pub.publish("$delayed/5/t/a", b"x", qos=1).reason_code == 0
    assert [p.topic for p in sub.publishes()] == ["$delayed/5/t/a"]


def test_a_refusal_is_never_taken_for_an_ack_waiting_for_a_commit():
    """Both were marked with 0x100 when delayed publish met the batched durable acks: a cap
    refusal then waited for a commit that never acknowledged it (the client got no PUBACK)."""
    from brokerd.protocol import reason as rc

    assert all(not code & rc.AFTER_COMMIT and code > 0xFF for code in rc.REFUSALS)
