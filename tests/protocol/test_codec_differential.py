"""Differential tests against ``mqtt-codec`` 1.0.2, an independent MQTT 3.1.1 codec.

For random valid 3.1.1 packets:
- our encoding, decoded by mqtt-codec, has the same field values;
- mqtt-codec's encoding, decoded by us, gives back the packet we started from;
- and, since both encode minimally, the two encodings are byte-identical.

Quirks of mqtt-codec this has to work around (it is old and unmaintained):
- it models the CONNECT password as a ``str`` and writes it as a UTF-8 string,
  where 3.1.1 (3.1.3.5) makes it binary data: generated passwords are UTF-8 text;
- its CONNECT encoder sets the user name / password flags from the *truthiness*
  of the fields but writes them whenever they are not None, so an empty user
  name or password comes out as a corrupt packet (flag clear, field present):
  when mqtt-codec encodes, empty user names and passwords are not generated
  (its decoder reads them correctly, so the other direction keeps them);
- it only knows protocol level 4 (3.1.1), and its CONNACK / SUBACK decoders
  refuse codes outside the 3.1.1 tables: CONNACK 0-5 and SUBACK 0, 1, 2, 0x80;
- it emits DeprecationWarnings on import (filtered in pyproject.toml).
"""

from io import BytesIO

import mqtt_codec.packet as mc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from brokerd.protocol.codec import FrameDecoder, encode
from brokerd.protocol.packets import (
    MQTT311,
    Connack,
    Connect,
    Disconnect,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
    Will,
)

from . import strategies as s

SETTINGS = settings(
    derandomize=True, max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

_MC_CLASSES = {
    1: mc.MqttConnect,
    2: mc.MqttConnack,
    3: mc.MqttPublish,
    4: mc.MqttPuback,
    5: mc.MqttPubrec,
    6: mc.MqttPubrel,
    7: mc.MqttPubcomp,
    8: mc.MqttSubscribe,
    9: mc.MqttSuback,
    10: mc.MqttUnsubscribe,
    11: mc.MqttUnsuback,
    12: mc.MqttPingreq,
    13: mc.MqttPingresp,
    14: mc.MqttDisconnect,
}


# ----------------------------------------------------------------------------- conversions


def to_mc(p):
    """Our packet -> the equivalent mqtt-codec packet."""
    if isinstance(p, Connect):
        will = None
        if p.will is not None:
            will = mc.MqttWill(p.will.qos, p.will.topic, p.will.payload, p.will.retain)
        pw = p.password.decode() if p.password is not None else None
        return mc.MqttConnect(p.client_id, p.clean_start, p.keepalive, p.username, pw, will)
    if isinstance(p, Connack):
        return mc.MqttConnack(p.session_present, mc.ConnackResult(p.reason_code))
    if isinstance(p, Publish):
        return mc.MqttPublish(p.packet_id, p.topic, p.payload, p.dup, p.qos, p.retain)
    if isinstance(p, Subscribe):
        return mc.MqttSubscribe(p.packet_id, [mc.MqttTopic(t.filter, t.qos) for t in p.topics])
    if isinstance(p, Suback):
        return mc.MqttSuback(p.packet_id, [mc.SubscribeResult(c) for c in p.reason_codes])
    if isinstance(p, Unsubscribe):
        return mc.MqttUnsubscribe(p.packet_id, list(p.topics))
    for ours, theirs in (
        (Puback, mc.MqttPuback),
        (Pubrec, mc.MqttPubrec),
        (Pubrel, mc.MqttPubrel),
        (Pubcomp, mc.MqttPubcomp),
        (Unsuback, mc.MqttUnsuback),
    ):
        if isinstance(p, ours):
            return theirs(p.packet_id)
    return {Pingreq: mc.MqttPingreq, Pingresp: mc.MqttPingresp, Disconnect: mc.MqttDisconnect}[type(p)]()


def fields(p):
    """A comparable view of an mqtt-codec packet, in our field names."""
    if isinstance(p, mc.MqttConnect):
        will = None
        if p.will is not None:
            will = (p.will.topic, p.will.message, p.will.qos, p.will.retain)
        return ("connect", p.client_id, p.clean_session, p.keep_alive, p.username, p.password, will)
    if isinstance(p, mc.MqttConnack):
        return ("connack", p.session_present, int(p.return_code))
    if isinstance(p, mc.MqttPublish):
        return ("publish", p.topic, p.payload, p.qos, p.retain, p.dupe, p.packet_id)
    if isinstance(p, mc.MqttSubscribe):
        return ("subscribe", p.packet_id, [(t.name, t.max_qos) for t in p.topics])
    if isinstance(p, mc.MqttSuback):
        return ("suback", p.packet_id, [int(r) for r in p.results])
    if isinstance(p, mc.MqttUnsubscribe):
        return ("unsubscribe", p.packet_id, list(p.topics))
    if hasattr(p, "packet_id"):
        return (type(p).__name__[4:].lower(), p.packet_id)
    return (type(p).__name__[4:].lower(),)


def our_fields(p):
    """The same view of one of our packets."""
    if isinstance(p, Connect):
        will = None
        if p.will is not None:
            will = (p.will.topic, p.will.payload, p.will.qos, p.will.retain)
        pw = p.password.decode() if p.password is not None else None
        return ("connect", p.client_id, p.clean_start, p.keepalive, p.username, pw, will)
    if isinstance(p, Connack):
        return ("connack", p.session_present, p.reason_code)
    if isinstance(p, Publish):
        return ("publish", p.topic, p.payload, p.qos, p.retain, p.dup, p.packet_id)
    if isinstance(p, Subscribe):
        return ("subscribe", p.packet_id, [(t.filter, t.qos) for t in p.topics])
    if isinstance(p, Suback):
        return ("suback", p.packet_id, list(p.reason_codes))
    if isinstance(p, Unsubscribe):
        return ("unsubscribe", p.packet_id, list(p.topics))
    if hasattr(p, "packet_id"):
        return (type(p).__name__.lower(), p.packet_id)
    return (type(p).__name__.lower(),)


def mc_encode(p) -> bytes:
    f = BytesIO()
    n = p.encode(f)
    data = f.getvalue()
    assert n == len(data)
    return data


def mc_decode(data: bytes):
    cls = _MC_CLASSES[data[0] >> 4]
    n, p = cls.decode(BytesIO(data))
    assert n == len(data)
    return p


# ----------------------------------------------------------------------------- strategies


@st.composite
def connects_311(draw, for_mc_encoder=False):
    """3.1.1 CONNECTs that mqtt-codec can represent (password = UTF-8 text)."""
    strings = s.nonempty_text if for_mc_encoder else s.text
    username = draw(st.none() | strings)
    password = None
    if username is not None:
        pw = draw(st.none() | strings)
        password = pw.encode() if pw is not None else None
    will = None
    if draw(st.booleans()):
        will = Will(draw(s.text), draw(s.small_bytes), draw(s.qos), draw(st.booleans()))
    return Connect(draw(s.text), draw(st.booleans()), draw(st.integers(0, 0xFFFF)), username, password, will)


def packets_311(for_mc_encoder=False):
    return st.one_of(
        connects_311(for_mc_encoder),
        s.connacks(MQTT311),
        s.publishes(MQTT311, topics=s.text),
        s.acks(MQTT311, Puback),
        s.acks(MQTT311, Pubrec),
        s.acks(MQTT311, Pubrel),
        s.acks(MQTT311, Pubcomp),
        s.subscribes(MQTT311),
        s.subacks(MQTT311),
        s.unsubscribes(MQTT311),
        s.unsubacks(MQTT311),
        st.just(Pingreq()),
        st.just(Pingresp()),
        st.just(Disconnect()),
    )


# ----------------------------------------------------------------------------- the tests


@SETTINGS
@given(pkt=packets_311())
def test_ours_decoded_by_mqtt_codec(pkt):
    theirs = mc_decode(encode(pkt, MQTT311))
    assert fields(theirs) == our_fields(pkt)


@SETTINGS
@given(pkt=packets_311(for_mc_encoder=True))
def test_mqtt_codec_decoded_by_ours(pkt):
    data = mc_encode(to_mc(pkt))
    dec = FrameDecoder(version=MQTT311)
    assert dec.feed(data) == [pkt]
    assert dec.buffered == 0


@SETTINGS
@given(pkt=packets_311(for_mc_encoder=True))
def test_encodings_are_byte_identical(pkt):
    assert encode(pkt, MQTT311) == mc_encode(to_mc(pkt))


@settings(derandomize=True, max_examples=100, deadline=None)
@given(pkts=st.lists(packets_311(for_mc_encoder=True), min_size=1, max_size=10), data=st.data())
def test_mqtt_codec_stream_chunked_into_ours(pkts, data):
    stream = b"".join(mc_encode(to_mc(p)) for p in pkts)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    dec = FrameDecoder(version=MQTT311)
    got, prev = [], 0
    for cut in [*cuts, len(stream)]:
        got += dec.feed(stream[prev:cut])
        prev = cut
    assert got == pkts


def test_mqtt_codec_empty_user_name_quirk_is_real():
    """Documents why empty user names are kept away from mqtt-codec's encoder."""
    quirky = mc_encode(mc.MqttConnect("c", True, 0, "", None, None))
    ours = encode(Connect("c", True, 0, ""), MQTT311)
    assert quirky != ours
    assert quirky[9] & 0x80 == 0  # user name flag clear ...
    assert quirky.endswith(b"\x00\x00")  # ... yet an empty user name written
    assert mc_decode(ours).username == ""  # its decoder reads ours fine
