"""Hypothesis strategies for valid MQTT packets (3.1, 3.1.1 and 5.0).

Every strategy here produces packets that the spec allows on the wire, in
the exact shape our decoder returns them (an empty property block decodes
to ``None``, not ``{}``; 3.x acks carry reason code 0 and no properties),
so ``decode(encode(p)) == p`` is the round-trip property.
"""

from hypothesis import strategies as st

from brokerd.protocol import properties as P
from brokerd.protocol.packets import (
    MQTT5,
    MQTT31,
    MQTT311,
    Auth,
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
    SubscriptionRequest,
    Unsuback,
    Unsubscribe,
    Will,
)

# Any Unicode scalar value except U+0000 (and surrogates, which UTF-8 cannot
# carry): MQTT strings are "well-formed UTF-8 without U+0000".
mqtt_chars = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
text = st.text(mqtt_chars, max_size=12)
nonempty_text = st.text(mqtt_chars, min_size=1, max_size=12)
small_bytes = st.binary(max_size=40)
packet_ids = st.integers(1, 0xFFFF)
qos = st.integers(0, 2)

_WIRE_VALUES = {
    P.BYTE: st.integers(0, 1),
    P.U16: st.integers(0, 0xFFFF),
    P.U32: st.integers(0, 0xFFFFFFFF),
    P.VARINT: st.integers(1, 268_435_455),
    P.UTF8: text,
    P.BINARY: small_bytes,
}

user_properties = st.lists(st.tuples(text, text), min_size=1, max_size=4)


def _value(kind, ident):
    if ident == P.USER_PROPERTY:
        return user_properties
    if ident == P.SUBSCRIPTION_IDENTIFIER and kind == P.PUBLISH:
        return st.lists(st.integers(1, 268_435_455), min_size=1, max_size=3)
    return _WIRE_VALUES[P.TYPES[ident]]


def properties(kind, exclude=()):
    """None or a non-empty dict of properties valid in packet ``kind``."""
    idents = sorted(i for i, where in P.ALLOWED.items() if kind in where and i not in exclude)
    fixed = st.fixed_dictionaries({}, optional={i: _value(kind, i) for i in idents})
    return st.none() | fixed.filter(bool)


@st.composite
def wills(draw, level):
    return Will(
        topic=draw(nonempty_text),
        payload=draw(small_bytes),
        qos=draw(qos),
        retain=draw(st.booleans()),
        properties=draw(properties(P.WILL)) if level == MQTT5 else None,
    )


@st.composite
def connects(draw, level):
    username = draw(st.none() | text)
    if username is None and level != MQTT5:
        password = None  # 3.x: no password without a user name [MQTT-3.1.2-22]
    else:
        password = draw(st.none() | small_bytes)
    return Connect(
        client_id=draw(text),
        clean_start=draw(st.booleans()),
        keepalive=draw(st.integers(0, 0xFFFF)),
        username=username,
        password=password,
        will=draw(st.none() | wills(level)),
        protocol_level=level,
        properties=draw(properties(P.CONNECT)) if level == MQTT5 else None,
        protocol_name="MQIsdp" if level == MQTT31 else "MQTT",
    )


@st.composite
def connacks(draw, level):
    v5 = level == MQTT5
    return Connack(
        session_present=draw(st.booleans()),
        reason_code=draw(st.integers(0, 255) if v5 else st.integers(0, 5)),
        properties=draw(properties(P.CONNACK)) if v5 else None,
    )


@st.composite
def publishes(draw, level, topics=nonempty_text):
    q = draw(qos)
    return Publish(
        topic=draw(topics),
        payload=draw(small_bytes),
        qos=q,
        retain=draw(st.booleans()),
        dup=draw(st.booleans()) if q else False,
        packet_id=draw(packet_ids) if q else 0,
        properties=draw(properties(P.PUBLISH)) if level == MQTT5 else None,
    )


def acks(level, cls):
    kind = cls.type
    if level != MQTT5:
        return st.builds(cls, packet_ids)
    return st.builds(cls, packet_ids, st.integers(0, 255), properties(kind))


@st.composite
def subscription_requests(draw, level):
    if level != MQTT5:
        return SubscriptionRequest(draw(text), draw(qos))
    return SubscriptionRequest(
        draw(text), draw(qos), draw(st.booleans()), draw(st.booleans()), draw(st.integers(0, 2))
    )


@st.composite
def subscribes(draw, level):
    return Subscribe(
        packet_id=draw(packet_ids),
        topics=draw(st.lists(subscription_requests(level), min_size=1, max_size=5)),
        properties=draw(properties(P.SUBSCRIBE)) if level == MQTT5 else None,
    )


@st.composite
def subacks(draw, level):
    codes = st.integers(0, 255) if level == MQTT5 else st.sampled_from([0, 1, 2, 0x80])
    return Suback(
        packet_id=draw(packet_ids),
        reason_codes=draw(st.lists(codes, min_size=1, max_size=5)),
        properties=draw(properties(P.SUBACK)) if level == MQTT5 else None,
    )


@st.composite
def unsubscribes(draw, level):
    return Unsubscribe(
        packet_id=draw(packet_ids),
        topics=draw(st.lists(text, min_size=1, max_size=5)),
        properties=draw(properties(P.UNSUBSCRIBE)) if level == MQTT5 else None,
    )


@st.composite
def unsubacks(draw, level):
    if level != MQTT5:
        return Unsuback(draw(packet_ids))
    return Unsuback(
        draw(packet_ids),
        draw(st.lists(st.integers(0, 255), min_size=1, max_size=5)),
        draw(properties(P.UNSUBACK)),
    )


def reason_only(level, cls):
    if level != MQTT5:
        return st.just(cls())
    return st.builds(cls, st.integers(0, 255), properties(cls.type))


def packets(level):
    """Any packet but CONNECT, in the format of a connection at ``level``."""
    options = [
        connacks(level),
        publishes(level),
        acks(level, Puback),
        acks(level, Pubrec),
        acks(level, Pubrel),
        acks(level, Pubcomp),
        subscribes(level),
        subacks(level),
        unsubscribes(level),
        unsubacks(level),
        st.just(Pingreq()),
        st.just(Pingresp()),
        reason_only(level, Disconnect),
    ]
    if level == MQTT5:
        options.append(reason_only(level, Auth))
    return st.one_of(options)


levels = st.sampled_from([MQTT311, MQTT5])
