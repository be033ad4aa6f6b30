"""The Channel answers a byte stream the same way however the stream is cut into
``receive_data`` calls -- including a stream that ends in garbage, where the good
packets before the garbage are still handled (the decoder's deferred error)."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from brokerd.protocol import properties as P
from brokerd.protocol.codec import encode
from brokerd.protocol.packets import (
    Connect,
    Disconnect,
    Pingreq,
    Publish,
    Pubrel,
    Subscribe,
    SubscriptionRequest,
    Unsubscribe,
)

from .harness import MQTT5, MQTT311, Net

SETTINGS = settings(
    derandomize=True, max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@st.composite
def scripts(draw):
    """A CONNECT, then a random mix of packets from a well-behaved client, then an optional end."""
    v = draw(st.sampled_from([MQTT311, MQTT5]))
    pkts = [
        Connect("c", protocol_level=v, properties={P.TOPIC_ALIAS_MAXIMUM: 3} if v == MQTT5 else None),
        Subscribe(1, [SubscriptionRequest("t/#", 2)], {P.SUBSCRIPTION_IDENTIFIER: 4} if v == MQTT5 else None),
    ]
    pid = 10
    for _ in range(draw(st.integers(0, 10))):
        kind = draw(st.sampled_from(["pub0", "pub1", "pub2", "ping", "unsub", "resub"]))
        topic = draw(st.sampled_from(["t/a", "t/b", "u"]))
        payload = draw(st.binary(max_size=300))
        if kind == "pub0":
            pkts.append(Publish(topic, payload, 0, draw(st.booleans())))
        elif kind == "pub1":
            pid += 1
            pkts.append(Publish(topic, payload, 1, False, False, pid))
        elif kind == "pub2":
            pid += 1
            pkts += [Publish(topic, payload, 2, False, False, pid), Pubrel(pid)]
        elif kind == "ping":
            pkts.append(Pingreq())
        elif kind == "unsub":
            pid += 1
            pkts.append(Unsubscribe(pid, ["t/#"]))
        else:
            pid += 1
            pkts.append(Subscribe(pid, [SubscriptionRequest("t/#", draw(st.integers(0, 2)))]))
    stream = b"".join(encode(p, v) for p in pkts)
    end = draw(st.sampled_from(["none", "disconnect", "garbage", "bad-topic"]))
    if end == "disconnect":
        stream += encode(Disconnect(), v)
    elif end == "garbage":
        stream += b"\x00\x00"
    elif end == "bad-topic":
        stream += encode(Publish("x/#", b""), v)
    return v, stream


def run(version, chunks):
    net = Net()
    c = net.client(version)
    for chunk in chunks:
        c.channel.receive_data(chunk, net.now)
    data = b"".join(c.channel.out)
    return data, c.closed, net.stats.as_dict()


@SETTINGS
@given(script=scripts(), data=st.data())
def test_output_does_not_depend_on_chunking(script, data):
    version, stream = script
    whole = run(version, [stream])
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    bounds = [0, *cuts, len(stream)]
    chunked = run(version, [stream[a:b] for a, b in zip(bounds, bounds[1:], strict=False)])
    assert chunked == whole


def test_good_packets_before_garbage_are_handled():
    net = Net()
    c = net.client(MQTT5)
    stream = encode(Connect("c", protocol_level=MQTT5)) + encode(Pingreq()) + b"\x00\x00"
    got = c.send_raw(stream)
    assert [type(p).__name__ for p in got] == ["Connack", "Pingresp", "Disconnect"]
    assert got[-1].reason_code == 0x81
    assert c.closed


def test_a_big_read_ends_the_connections_turn_and_small_ones_do_not():
    """A read of TURN_BYTES or more asks the transport to read no more in this loop iteration
    (``hooks.end_turn``): one client's flood of tiny packets was handled 8 MiB at a time before any
    other client was served. A read of one packet, or a few, does not (the steady-rate paths)."""
    from brokerd.protocol.channel import TURN_BYTES

    net = Net()
    c = net.connect("flooder")
    pings = encode(Pingreq(), MQTT311)
    c.send_raw(pings * 8)
    c.send(Publish(topic="nobody/here", payload=b"x", qos=1, packet_id=1))
    assert "end_turn" not in c.hooks.calls
    answers = c.send_raw(pings * (TURN_BYTES // len(pings)))
    assert c.hooks.calls.count("end_turn") == 1
    assert len(answers) == TURN_BYTES // len(pings)          # the read is handled whole all the same
