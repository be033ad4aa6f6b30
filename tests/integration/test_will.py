"""Will messages: network drop, keepalive timeout, normal DISCONNECT, v5 DISCONNECT 0x04,
v5 Will Delay Interval, will properties."""

import time

import pytest

from . import raw
from .helpers import V5, V311, Client, MosqSub, PacketTypes, connect, props
from .raw import RawClient


def will_client(port, client_id, topic, version, payload=b"gone", qos=1, retain=False, will_props=None,
                keepalive=60, conn_props=None):
    c = Client(client_id, version)
    c.connect(port, keepalive=keepalive, will=(topic, payload, qos, retain, will_props), properties=conn_props)
    return c


@pytest.fixture
def watcher(broker, client_id, topic):
    with connect(broker.port(), client_id + "-watch", V5) as w:
        w.subscribe(topic + "/#", 1)
        yield w


@pytest.mark.parametrize("version", [V311, V5])
def test_will_sent_on_network_drop(broker, client_id, topic, watcher, version):
    c = will_client(broker.port(), client_id, topic + "/will", version)
    watcher.expect_none(0.1)
    c.drop()
    m = watcher.expect()
    assert (m.topic, m.payload, m.qos) == (topic + "/will", b"gone", 1)


@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
def test_mosquitto_sub_will_on_kill(broker, topic, version):
    """mosquitto_sub --will-topic, killed (no DISCONNECT): its will is published."""
    with MosqSub(broker.port(), topic + "/w", version=version) as watch:
        dying = MosqSub(broker.port(), topic + "/other", version=version,
                        args=["--will-topic", topic + "/w", "--will-payload", "bye", "--will-qos", "1"]).start()
        dying.proc.kill()
        dying.proc.wait(5)
        assert watch.messages(1)[0]["payload"] == "bye"


@pytest.mark.parametrize("version", [V311, V5])
def test_no_will_on_normal_disconnect(broker, client_id, topic, watcher, version):
    c = will_client(broker.port(), client_id, topic + "/will", version)
    c.disconnect()
    watcher.expect_none(0.5)


def test_mosquitto_sub_no_will_on_clean_exit(broker, topic):
    """mosquitto_sub -C 1 exits with a DISCONNECT: no will."""
    with MosqSub(broker.port(), topic + "/w") as watch:
        sub = MosqSub(broker.port(), topic + "/x", count=1,
                      args=["--will-topic", topic + "/w", "--will-payload", "bye"]).start()
        from .helpers import mosq_pub
        mosq_pub(broker.port(), topic + "/x", "one")
        assert sub.wait() == 0
        watch.none(0.5)


def test_v5_disconnect_with_will_message_sends_it(broker, client_id, topic, watcher):
    """5.0 3.14.2.1: DISCONNECT reason 0x04 (Disconnect with Will Message) publishes the will."""
    c = will_client(broker.port(), client_id, topic + "/will", V5)
    c.disconnect(reasoncode=_rc(0x04))
    assert watcher.expect().payload == b"gone"


@pytest.mark.parametrize("code", [0x80, 0x83, 0x96])
def test_v5_disconnect_with_an_error_reason_code_sends_the_will(broker, client_id, topic, watcher, code):
    """[MQTT-3.1.2-8] / [MQTT-3.14.4-3]: only DISCONNECT 0x00 (Normal disconnection) deletes the will;
    a client leaving with an error code (0x80 Unspecified error, 0x83, 0x96 ...) has its will published
    (as EMQX does). Before, every code but 0x04 deleted it: the subscribers never heard the client
    had failed."""
    with RawClient(broker.port()) as c:
        c.connect(client_id, version=5, will=(topic + "/will", b"failed", 1, False, None))
        c.disconnect(code)
    m = watcher.expect()
    assert (m.topic, m.payload) == (topic + "/will", b"failed")


@pytest.mark.parametrize("version", [4, 5])
def test_will_sent_on_keepalive_timeout(broker, client_id, topic, watcher, version):
    """[MQTT-3.1.2-22 / 5.0 3.1.2.10]: no packet within 1.5 x keepalive -> the server closes the
    connection (v5: DISCONNECT 0x8D first) and publishes the will."""
    with RawClient(broker.port()) as c:
        t0 = time.monotonic()
        c.connect(client_id, version=version, keepalive=1, will=(topic + "/will", b"timeout", 1, False, None))
        got = c.expect_closed(timeout=5)
        elapsed = time.monotonic() - t0
        assert 1.4 <= elapsed <= 3.0
        if version == 5:
            assert [(p.type, p.code) for p in got] == [(raw.DISCONNECT, 0x8D)]
        else:
            assert got == []
    assert watcher.expect().payload == b"timeout"


def test_paho_client_that_stops_pinging_is_cut_and_will_sent(broker, client_id, topic, watcher):
    c = will_client(broker.port(), client_id, topic + "/will", V311, keepalive=1, payload=b"silent")
    c.freeze()
    assert watcher.expect(timeout=4).payload == b"silent"


def test_pings_keep_connection_alive(broker, client_id):
    with RawClient(broker.port()) as c:
        c.connect(client_id, version=4, keepalive=1)
        for _ in range(3):
            time.sleep(0.6)
            c.send(b"\xc0\x00")
            assert c.expect(raw.PINGRESP).type == raw.PINGRESP


def test_a_client_that_pings_for_a_while_is_cut_from_its_last_ping(broker, client_id, topic, watcher):
    """Keepalive 1: pinging every 0.5 s keeps the connection up for 4 s (several keepalive periods);
    once silent it is cut about 1.5 s after its last packet, not after its CONNECT, and its will goes."""
    with RawClient(broker.port()) as c:
        c.connect(client_id, version=4, keepalive=1, will=(topic + "/will", b"quiet", 1, False, None))
        for _ in range(8):
            time.sleep(0.5)
            c.send(b"\xc0\x00")
            assert c.expect(raw.PINGRESP).type == raw.PINGRESP
        last = time.monotonic()
        assert c.expect_closed(timeout=5) == []
        assert 1.4 <= time.monotonic() - last <= 3.0
    assert watcher.expect().payload == b"quiet"


def test_will_retained_flag(broker, client_id, topic, watcher):
    c = will_client(broker.port(), client_id, topic + "/will", V311, payload=b"dead", retain=True)
    c.drop()
    assert watcher.expect().payload == b"dead"
    with connect(broker.port(), client_id + "late", V311) as late:
        late.subscribe(topic + "/will", 0)
        m = late.expect()
        assert (m.payload, m.retain) == (b"dead", True)
        late.publish(topic + "/will", b"", retain=True)


def test_v5_will_properties_passed_through(broker, client_id, topic, watcher):
    wp = props(PacketTypes.WILLMESSAGE, ContentType="text/plain", ResponseTopic=topic + "/resp",
               CorrelationData=b"\x01\x02", UserProperty=[("k", "v")], PayloadFormatIndicator=1)
    c = will_client(broker.port(), client_id, topic + "/will", V5, will_props=wp)
    c.drop()
    m = watcher.expect()
    p = m.properties
    assert p.ContentType == "text/plain"
    assert p.ResponseTopic == topic + "/resp"
    assert p.CorrelationData == b"\x01\x02"
    assert p.UserProperty == [("k", "v")]
    assert p.PayloadFormatIndicator == 1


# --------------------------------------------------------------------------- will delay

def _session(expiry):
    return props(PacketTypes.CONNECT, SessionExpiryInterval=expiry)


def test_v5_will_delay_interval_delays_the_will(broker, client_id, topic, watcher):
    """5.0 3.1.3.2.2: the will is published Will Delay Interval (1 s) after the connection closed."""
    wp = props(PacketTypes.WILLMESSAGE, WillDelayInterval=1)
    c = will_client(broker.port(), client_id, topic + "/will", V5, will_props=wp, conn_props=_session(30))
    t0 = time.monotonic()
    c.drop()
    watcher.expect_none(0.7)
    watcher.expect(timeout=3)
    assert 0.9 <= time.monotonic() - t0 <= 2.5
    connect(broker.port(), client_id, V5).disconnect()


def test_v5_will_delay_cancelled_by_reconnect(broker, client_id, topic, watcher):
    """[MQTT-3.1.2-8]: a new connection for the client id before the delay elapses: no will."""
    wp = props(PacketTypes.WILLMESSAGE, WillDelayInterval=1)
    c = will_client(broker.port(), client_id, topic + "/will", V5, will_props=wp, conn_props=_session(30))
    c.drop()
    time.sleep(0.2)
    back = connect(broker.port(), client_id, V5, clean=False, properties=_session(30))
    assert back.session_present
    watcher.expect_none(1.8)
    back.disconnect()


def test_v5_will_published_when_session_ends_before_delay(broker, client_id, topic, watcher):
    """5.0 3.1.3.2.2: the will is published when the session ends (expiry 1 s) if that comes
    before the Will Delay Interval (30 s)."""
    wp = props(PacketTypes.WILLMESSAGE, WillDelayInterval=30)
    c = will_client(broker.port(), client_id, topic + "/will", V5, will_props=wp, conn_props=_session(1))
    t0 = time.monotonic()
    c.drop()
    watcher.expect(timeout=4)
    assert time.monotonic() - t0 <= 2.5


def test_v5_delayed_will_message_expiry_starts_at_publication(broker, client_id, topic, watcher):
    """5.0 3.1.3.2.4: the will's Message Expiry Interval is "sent as the Publication Expiry Interval
    when the Server publishes the Will Message" -- its lifetime starts at publication. Will Delay 1 s,
    Message Expiry 1 s: an online subscriber must still get the will (the reference Mosquitto
    delivers it). Regression: found by this suite, fixed in 7882229."""
    wp = props(PacketTypes.WILLMESSAGE, WillDelayInterval=1, MessageExpiryInterval=1)
    c = will_client(broker.port(), client_id, topic + "/will", V5, will_props=wp, conn_props=_session(30))
    c.drop()
    m = watcher.expect(timeout=3)
    assert m.payload == b"gone"
    connect(broker.port(), client_id, V5).disconnect()


def test_v5_will_on_takeover(broker, client_id, topic, watcher):
    """5.0 [MQTT-3.1.2-8]: a taken-over connection is closed without DISCONNECT 0x00, so its will
    (no delay) is published -- same as the reference Mosquitto."""
    c = will_client(broker.port(), client_id, topic + "/will", V5, payload=b"taken")
    second = connect(broker.port(), client_id, V5)
    assert watcher.expect().payload == b"taken"
    c.stop_loop()
    second.disconnect()


def _rc(value):
    from paho.mqtt.reasoncodes import ReasonCode

    return ReasonCode(PacketTypes.DISCONNECT, identifier=value)


@pytest.mark.parametrize("version", [4, 5])
def test_will_sent_when_server_closes_for_protocol_error(broker, client_id, topic, watcher, version):
    """3.1.1 3.1.2.5 / 5.0 [MQTT-3.1.2-8]: the server closing the connection because of a protocol
    error (here a PUBLISH with QoS 3) publishes the will."""
    with RawClient(broker.port()) as c:
        c.connect(client_id, version=version, will=(topic + "/will", b"broken", 1, False, None))
        c.send(b"\x36\x05\x00\x01a\x00\x01")
        c.expect_closed()
    assert watcher.expect().payload == b"broken"
