"""CONNECT / CONNACK: return and reason codes, client identifiers, sessions, takeover."""

import time

import pytest

from ..procs import BrokerProcess
from . import raw
from .helpers import V5, V31, V311, Client, MosqSub, MosquittoProcess, connect, mosq_pub, props, wait_until
from .raw import CONNACK, RawClient


@pytest.fixture(scope="module")
def ka_broker():
    """brokerd with --max-keepalive 30."""
    with BrokerProcess("--max-keepalive", "30") as b:
        yield b


@pytest.fixture(scope="module")
def ka_mosquitto():
    m = MosquittoProcess("max_keepalive 30").start()
    yield m
    m.stop()


# --------------------------------------------------------------------------- return codes

@pytest.mark.parametrize("name,level", [("MQTT", 6), ("MQTT", 2), ("MQIsdp", 4)])
def test_unsupported_protocol_level_gets_connack_1_and_close(broker, name, level):
    """3.1.1 [MQTT-3.1.2-2]: unsupported level -> CONNACK 0x01 then close (Mosquitto answers the same)."""
    with RawClient(broker.port()) as c:
        c.send(raw.connect_packet("lvl", version=level, protocol_name=name))
        ack = c.expect(CONNACK)
        assert ack.body == b"\x00\x01"
        c.expect_closed()


def test_unknown_protocol_name_closes_connection(broker):
    """3.1.1 [MQTT-3.1.2-1]: a wrong protocol name may be dropped without CONNACK."""
    with RawClient(broker.port()) as c:
        c.send(raw.connect_packet("pn", version=4, protocol_name="MQTX"))
        got = c.expect_closed()
        assert all(p.code != 0 for p in got if p.type == CONNACK)


def test_v31_client_id_longer_than_23_is_rejected(broker):
    """MQTT 3.1: client ids are 1-23 characters; longer ones get CONNACK 2 (identifier rejected)."""
    c = Client("x" * 24, V31)
    c.connect(broker.port(), wait=False)
    _, rc, _ = c.connack_result()
    assert str(rc) == "Client identifier not valid"  # paho's name for 3.x return code 2
    c.client.loop_stop()
    proc = mosq_pub(broker.port(), "t/v31", "x", "-i", "y" * 24, version="mqttv31", check=False)
    assert proc.returncode != 0
    assert "identifier rejected" in proc.stderr.lower()


def test_v31_client_works(broker, topic):
    with MosqSub(broker.port(), topic, version="mqttv31", qos=1) as sub:
        mosq_pub(broker.port(), topic, "old", version="mqttv31", qos=1)
        assert sub.messages(1)[0]["payload"] == "old"


def test_v311_empty_client_id_needs_clean_session(broker):
    """3.1.1 [MQTT-3.1.3-7/8]: empty id with CleanSession=0 -> CONNACK 0x02; with CleanSession=1 accepted."""
    with RawClient(broker.port()) as c:
        assert c.connect("", version=4, clean=False).body == b"\x00\x02"
        c.expect_closed()
    with RawClient(broker.port()) as c:
        assert c.connect("", version=4, clean=True).code == 0
        assert c.is_open()


def test_v5_assigned_client_identifier(broker, topic):
    """5.0 3.2.2.3.7: an empty client id gets an Assigned Client Identifier in CONNACK."""
    c = Client("", V5).connect(broker.port(), properties=props(raw_type("CONNECT"), SessionExpiryInterval=30))
    try:
        assigned = c.connack_props.AssignedClientIdentifier
        assert assigned
        c.subscribe(topic, 1)
        c.publish(topic, b"me", qos=1)
        assert c.expect().payload == b"me"
        # the assigned id names a real session: a takeover with it works
        d = Client(assigned, V5, clean=False).connect(broker.port())
        assert d.session_present
        assert c.expect_disconnect()[0].value == 0x8E
        d.disconnect()
    finally:
        c.client.loop_stop()


def test_v5_mosquitto_sub_without_id_gets_assigned_one(broker, topic):
    with MosqSub(broker.port(), topic, version="mqttv5") as sub:
        mosq_pub(broker.port(), topic, "hello", version="mqttv5")
        assert sub.messages(1)[0]["payload"] == "hello"
    assert any("auto-" in line or "Client" in line for line in sub.debug)


# --------------------------------------------------------------------------- keepalive

def test_keepalive_above_maximum_refused_for_v311(ka_broker, client_id):
    """--max-keepalive 30: a 3.1.1 client asking for 60 s is refused with CONNACK 2 (as brokerd --help says).

    3.1.1 has no way to tell a client the keepalive to use. Not checked against the reference:
    Mosquitto 2.0.11 (installed) applies max_keepalive to v5 clients only, so this pins brokerd's
    documented choice.
    """
    b = ka_broker
    c = Client(client_id, V311)
    c.connect(b.port(), keepalive=60, wait=False)
    _, rc, _ = c.connack_result()
    c.client.loop_stop()
    assert str(rc) == "Client identifier not valid"  # paho's name for 3.x return code 2
    ok = connect(b.port(), client_id + "ok", V311, keepalive=30)
    ok.disconnect()


@pytest.mark.parametrize("which", ["brokerd", "mosquitto"])
@pytest.mark.parametrize("asked", [60, 0])
def test_v5_keepalive_above_maximum_gets_server_keep_alive(request, which, client_id, asked):
    """5.0 3.2.2.3.14: the server tells a v5 client the keepalive to use (Server Keep Alive = 30).

    Keepalive 0 (no keepalive) is also overridden: same as the reference Mosquitto with max_keepalive 30.
    """
    b = request.getfixturevalue("ka_broker" if which == "brokerd" else "ka_mosquitto")
    c = connect(b.port(), client_id, V5, keepalive=asked)
    assert c.connack_props.ServerKeepAlive == 30
    c.disconnect()
    c = connect(b.port(), client_id, V5, keepalive=20)
    assert not hasattr(c.connack_props, "ServerKeepAlive")
    c.disconnect()


# --------------------------------------------------------------------------- sessions

def test_v311_persistent_session_present_and_kept_subscription(broker, client_id, topic):
    c = connect(broker.port(), client_id, V311, clean=False)
    assert not c.session_present
    c.subscribe(topic, 1)
    c.disconnect()
    mosq_pub(broker.port(), topic, "while-away", qos=1)
    c = connect(broker.port(), client_id, V311, clean=False)
    assert c.session_present
    assert c.expect().payload == b"while-away"
    c.disconnect()
    # clean session discards it
    c = connect(broker.port(), client_id, V311, clean=True)
    assert not c.session_present
    c.disconnect()
    mosq_pub(broker.port(), topic, "gone", qos=1)
    c = connect(broker.port(), client_id, V311, clean=False)
    assert not c.session_present
    c.expect_none()
    c.disconnect()


def test_v311_clean_session_has_no_session_present(broker, client_id):
    for _ in range(2):
        c = connect(broker.port(), client_id, V311, clean=True)
        assert not c.session_present
        c.disconnect()


def test_mosquitto_sub_persistent_session(broker, client_id, topic):
    """mosquitto_sub -c -i: messages published while it is away arrive when it comes back."""
    sub = MosqSub(broker.port(), topic, qos=1, client_id=client_id, args=["-c"], count=1).start()
    sub.stop()
    mosq_pub(broker.port(), topic, "queued", qos=1)
    sub = MosqSub(broker.port(), topic, qos=1, client_id=client_id, args=["-c"], count=1, wait=5)
    sub.start(expect_suback=False)
    assert sub.messages(1)[0]["payload"] == "queued"
    assert sub.wait() == 0


def test_v5_session_expiry_zero_ends_session_on_disconnect(broker, client_id, topic):
    c = connect(broker.port(), client_id, V5, clean=False)
    c.subscribe(topic, 1)
    c.disconnect()
    c = connect(broker.port(), client_id, V5, clean=False)
    assert not c.session_present
    c.disconnect()


def test_v5_session_expiry_interval(broker, client_id, topic):
    """Session Expiry Interval 1 s: present right after a disconnect, gone 2 s later."""
    p = props(raw_type("CONNECT"), SessionExpiryInterval=1)
    c = connect(broker.port(), client_id, V5, clean=True, properties=p)
    assert not c.session_present
    c.subscribe(topic, 1)
    c.disconnect()
    c = connect(broker.port(), client_id, V5, clean=False, properties=p)
    assert c.session_present
    c.disconnect()
    time.sleep(2.2)
    c = connect(broker.port(), client_id, V5, clean=False, properties=p)
    assert not c.session_present
    c.disconnect()


def test_v5_clean_start_discards_existing_session(broker, client_id, topic):
    p = props(raw_type("CONNECT"), SessionExpiryInterval=60)
    c = connect(broker.port(), client_id, V5, clean=False, properties=p)
    c.subscribe(topic, 1)
    c.disconnect()
    c = connect(broker.port(), client_id, V5, clean=True, properties=p)
    assert not c.session_present
    with Client(client_id + "p", V5).connect(broker.port()) as pub:
        pub.publish(topic, b"x", qos=1)
    c.expect_none()
    c.disconnect()


def test_v5_disconnect_can_shorten_session_expiry(broker, client_id, topic):
    """5.0 3.14.2.2.2: DISCONNECT may set Session Expiry Interval (60 -> 0 ends the session now)."""
    p = props(raw_type("CONNECT"), SessionExpiryInterval=60)
    c = connect(broker.port(), client_id, V5, clean=False, properties=p)
    c.subscribe(topic, 1)
    c.disconnect(properties=props(raw_type("DISCONNECT"), SessionExpiryInterval=0))
    c = connect(broker.port(), client_id, V5, clean=False, properties=p)
    assert not c.session_present
    c.disconnect()


def test_v5_disconnect_setting_expiry_after_zero_is_protocol_error(broker, client_id):
    """5.0 [MQTT-3.14.2-2]: expiry 0 on CONNECT, non-zero on DISCONNECT -> Protocol Error (0x82)."""
    with RawClient(broker.port()) as c:
        c.connect(client_id, version=5)
        c.send(raw.disconnect_packet(5, 0, {raw.SESSION_EXPIRY_INTERVAL: 30}))
        got = c.expect_closed()
        assert [p.code for p in got if p.type == raw.DISCONNECT] == [0x82]


def test_max_session_expiry_caps_the_interval(broker_factory, client_id):
    b = broker_factory("--max-session-expiry", "5")
    c = connect(b.port(), client_id, V5, properties=props(raw_type("CONNECT"), SessionExpiryInterval=3600))
    assert c.connack_props.SessionExpiryInterval == 5
    c.disconnect()


# --------------------------------------------------------------------------- takeover

@pytest.mark.parametrize("version", [V311, V5])
def test_takeover_disconnects_first_connection(broker, client_id, topic, version):
    """[MQTT-3.1.4-2] a second connection with the same id disconnects the first (v5: DISCONNECT 0x8E).

    The session (persistent: v5 with an expiry interval) carries over with session present = 1.
    """
    kw = {"properties": props(raw_type("CONNECT"), SessionExpiryInterval=30)} if version == V5 else {}
    first = connect(broker.port(), client_id, version, clean=False, **kw)
    first.subscribe(topic, 1)
    second = connect(broker.port(), client_id, version, clean=False, **kw)
    assert second.session_present
    rc, _ = first.expect_disconnect()
    if version == V5:
        assert rc.value == 0x8E
    first.client.loop_stop()
    # the subscription carried over to the new connection
    mosq_pub(broker.port(), topic, "to-second", qos=1)
    assert second.expect().payload == b"to-second"
    second.disconnect()


def test_takeover_raw_v5_reason_code(broker, client_id):
    with RawClient(broker.port()) as first:
        first.connect(client_id, version=5)
        with RawClient(broker.port()) as second:
            assert second.connect(client_id, version=5).code == 0
            got = first.expect_closed()
            assert [(p.type, p.code) for p in got] == [(raw.DISCONNECT, 0x8E)]
            assert second.is_open()


def test_takeover_with_mosquitto_sub(broker, client_id, topic):
    """Two mosquitto_sub with the same -i: the first one is kicked off, the second receives."""
    first = MosqSub(broker.port(), topic, client_id=client_id, version="mqttv5", args=["--quiet"]).start()
    second = MosqSub(broker.port(), topic, client_id=client_id, version="mqttv5").start()
    try:
        mosq_pub(broker.port(), topic, "x")
        assert second.messages(1)[0]["payload"] == "x"
        first.none(0.3)
    finally:
        first.stop()
        second.stop()


def raw_type(name: str):
    from .helpers import PacketTypes

    return getattr(PacketTypes, name)


def test_connack_received_within_deadline(broker, client_id):
    t0 = time.monotonic()
    c = connect(broker.port(), client_id, V5)
    assert time.monotonic() - t0 < 2
    wait_until(lambda: c.client.is_connected())
    c.disconnect()


def test_v5_server_keep_alive_is_enforced(broker_factory, client_id):
    """The keepalive the server announced (Server Keep Alive 1, the client asked for 100) is the one
    enforced: a silent client is cut after about 1.5 s with DISCONNECT 0x8D."""
    b = broker_factory("--max-keepalive", "1")
    with RawClient(b.port()) as c:
        ack = c.connect(client_id, version=5, keepalive=100)
        assert ack.props[raw.SERVER_KEEP_ALIVE] == 1
        t0 = time.monotonic()
        got = c.expect_closed(timeout=4)
        assert [(p.type, p.code) for p in got] == [(raw.DISCONNECT, 0x8D)]
        assert 1.4 <= time.monotonic() - t0 <= 2.6
