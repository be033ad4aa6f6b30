"""MQTT control packets as plain data.

Dataclasses with ``__slots__`` rather than frozen ones: a frozen dataclass's
``__init__`` goes through ``object.__setattr__`` per field, which costs about
twice as much on the per-message path. Treat packets as immutable once they
leave the decoder; the only fields ever written later are the routing
metadata of :class:`Publish` (``compare=False``), set by the broker before
the message is shared between subscribers.

Protocol levels: 3 = MQTT 3.1 ("MQIsdp"), 4 = MQTT 3.1.1, 5 = MQTT 5.0.
"""

from dataclasses import dataclass, field

MQTT31, MQTT311, MQTT5 = 3, 4, 5

CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT, AUTH = 8, 9, 10, 11, 12, 13, 14, 15


@dataclass(slots=True)
class Will:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: dict | None = None


@dataclass(slots=True)
class Connect:
    client_id: str = ""
    clean_start: bool = True
    keepalive: int = 60
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    protocol_level: int = MQTT311
    properties: dict | None = None
    protocol_name: str = "MQTT"

    type = CONNECT


@dataclass(slots=True)
class Connack:
    session_present: bool = False
    reason_code: int = 0
    properties: dict | None = None

    type = CONNACK


@dataclass(slots=True)
class Publish:
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int = 0
    properties: dict | None = None
    # Routing metadata, set by the broker; not part of the packet.
    origin: object = field(default=None, compare=False, repr=False)
    expiry_at: float | None = field(default=None, compare=False, repr=False)
    # Encoded forms shared by every subscriber that receives the same bytes:
    # QoS 0, no retain flag, per protocol family (3.x / 5).
    enc3: bytes | None = field(default=None, compare=False, repr=False)
    enc5: bytes | None = field(default=None, compare=False, repr=False)
    # Its stored form, made once for every durable session it goes to.
    stored: object = field(default=None, compare=False, repr=False)
    # A 3.x QoS 1 PUBLISH as received, up to its packet id (fixed header, topic): a
    # QoS 1 delivery of it to a 3.x client is these bytes, its own packet id, the payload.
    head31: bytes | None = field(default=None, compare=False, repr=False)

    type = PUBLISH


@dataclass(slots=True)
class RulePublish(Publish):
    """A PUBLISH a tenant's rule made (its republish action): one whose delivery is dropped raises
    no ``$events/delivery_dropped`` -- a rule republishing that event could otherwise feed itself,
    from node to node. The mark travels between nodes (the cluster's PUBLISH flag ``RULE``)."""


_new = object.__new__


def publish_q1(topic: str, payload: bytes, packet_id: int, head31: bytes | None) -> Publish:
    """``Publish(topic, payload, 1, packet_id=packet_id, head31=head31)``: a QoS 1 PUBLISH without
    retain, DUP or properties (a steady publisher's, decoded in ``Channel.receive_data``), made
    without the dataclass ``__init__`` -- a class call runs it in an interpreter frame of its own,
    0.30 against 0.13 µs. Every field is set here: a field added to Publish must be added here too
    (tests/protocol/test_packets_fast.py compares the two)."""
    p = _new(Publish)
    p.topic = topic
    p.payload = payload
    p.qos = 1
    p.retain = False
    p.dup = False
    p.packet_id = packet_id
    p.properties = None
    p.origin = None
    p.expiry_at = None
    p.enc3 = None
    p.enc5 = None
    p.stored = None
    p.head31 = head31
    return p


@dataclass(slots=True)
class _Ack:
    packet_id: int
    reason_code: int = 0
    properties: dict | None = None


@dataclass(slots=True)
class Puback(_Ack):
    type = PUBACK


@dataclass(slots=True)
class Pubrec(_Ack):
    type = PUBREC


@dataclass(slots=True)
class Pubrel(_Ack):
    type = PUBREL


@dataclass(slots=True)
class Pubcomp(_Ack):
    type = PUBCOMP


@dataclass(slots=True)
class SubscriptionRequest:
    """One topic filter of a SUBSCRIBE, with its subscription options."""

    filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


@dataclass(slots=True)
class Subscribe:
    packet_id: int
    topics: list
    properties: dict | None = None

    type = SUBSCRIBE


@dataclass(slots=True)
class Suback:
    packet_id: int
    reason_codes: list
    properties: dict | None = None

    type = SUBACK


@dataclass(slots=True)
class Unsubscribe:
    packet_id: int
    topics: list
    properties: dict | None = None

    type = UNSUBSCRIBE


@dataclass(slots=True)
class Unsuback:
    packet_id: int
    reason_codes: list = field(default_factory=list)
    properties: dict | None = None

    type = UNSUBACK


@dataclass(slots=True)
class Pingreq:
    type = PINGREQ


@dataclass(slots=True)
class Pingresp:
    type = PINGRESP


@dataclass(slots=True)
class Disconnect:
    reason_code: int = 0
    properties: dict | None = None

    type = DISCONNECT


@dataclass(slots=True)
class Auth:
    reason_code: int = 0
    properties: dict | None = None

    type = AUTH
