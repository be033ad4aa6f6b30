"""What the store holds, as plain data, and how messages become bytes.

Times in records are wall-clock seconds (``time.time()``): they must mean the
same thing after a restart and on another node. The broker works in event-loop
time and converts with its ``wall_offset``.

Message properties are kept in their MQTT 5 wire form (the codec's own
encoder and decoder), so what is stored is exactly what was received.
"""

import json
from dataclasses import dataclass, field

from ..protocol import codec
from ..protocol import properties as P
from ..protocol.packets import Will


@dataclass(slots=True)
class StoredMessage:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: dict | None = None
    expiry_at: float | None = None      # wall clock


@dataclass(slots=True)
class QueueEntry:
    """One message owed to one session, in its queue or in flight."""

    seq: int
    msg: StoredMessage
    qos: int                             # delivery QoS (after downgrade)
    retain: bool = False                 # retain flag to send
    sub_ids: tuple | None = None
    share: tuple | None = None           # (group, filter) of a shared subscription
    pid: int = 0                         # packet identifier reserved for it
    state: int = 0                       # 0: PUBLISH owed/sent, 1: PUBREL sent (QoS 2)


@dataclass(slots=True)
class SubscriptionRecord:
    filter: str
    qos: int = 0
    no_local: bool = False
    rap: bool = False
    rh: int = 0
    sub_id: int | None = None


@dataclass(slots=True)
class SessionRecord:
    tenant: str
    client_id: str
    expiry_interval: int
    disconnected_at: float | None = None     # wall clock; None: connected when last written
    will: Will | None = None                 # the will of the connection (or the pending delayed will)
    will_due: float | None = None            # wall clock at which a delayed will is due
    device: str | None = None                # the tenant device the session belongs to
    subscriptions: list = field(default_factory=list)
    queue: list = field(default_factory=list)
    awaiting_rel: set = field(default_factory=set)
    last_seq: int = 0                        # the queue's sequence counter
    # the highest queue entry number sent to the client before it went away (the entries numbered
    # up to it may come again, with DUP; those after never went out) -- written with the session's
    # disconnect; None: not known (a record written connected, or by an older brokerd)
    sent: int | None = None


@dataclass(slots=True)
class DelayedMessage:
    """A message published to ``$delayed/{seconds}/{topic}``: to be published to
    ``msg.topic`` in ``tenant`` at ``due`` (wall clock). ``id`` is unique in the
    store (made by the node that took the message, sorting
    in the order it took them: ties of ``due`` are claimed in id order). ``publisher``: who
    published it, ``(client_id, username, device)`` -- the tenant's rules run on
    its release as on that client's publish (None: not known, a message stored
    by an older node)."""

    id: str
    tenant: str
    due: float
    msg: StoredMessage
    publisher: tuple | None = None


def pack_publisher(publisher: tuple | None) -> str | None:
    return json.dumps(list(publisher)) if publisher else None


def unpack_publisher(text) -> tuple | None:
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, list) or len(value) != 3 or not all(v is None or isinstance(v, str) for v in value):
        return None
    return tuple(value)


# ---------------------------------------------------------------- bytes

def pack_props(props: dict | None) -> bytes | None:
    return codec.encode_properties(props) if props else None


def unpack_props(blob, kind=P.PUBLISH) -> dict | None:
    if not blob:
        return None
    blob = bytes(blob)
    props, _ = codec.decode_properties(blob, 0, len(blob), kind)
    return props


def pack_will(will: Will | None) -> bytes | None:
    """A will as bytes: [qos|retain][topic][payload][properties]."""
    if will is None:
        return None
    topic = will.topic.encode()
    flags = will.qos | (4 if will.retain else 0)
    props = codec.encode_properties(will.properties)
    return (bytes((flags,)) + len(topic).to_bytes(2, "big") + topic + len(will.payload).to_bytes(4, "big")
            + will.payload + props)


def unpack_will(blob) -> Will | None:
    if not blob:
        return None
    blob = bytes(blob)
    flags = blob[0]
    tl = int.from_bytes(blob[1:3], "big")
    topic = blob[3:3 + tl].decode()
    i = 3 + tl
    pl = int.from_bytes(blob[i:i + 4], "big")
    payload = blob[i + 4:i + 4 + pl]
    i += 4 + pl
    props, _ = codec.decode_properties(blob, i, len(blob), P.WILL)
    return Will(topic, payload, flags & 3, bool(flags & 4), props)


def pack_ids(ids: tuple | None) -> str | None:
    return ",".join(map(str, ids)) if ids else None


def unpack_ids(text) -> tuple | None:
    return tuple(int(x) for x in text.split(",")) if text else None


def pack_share(share: tuple | None) -> str | None:
    return f"{share[0]}/{share[1]}" if share else None


def unpack_share(text) -> tuple | None:
    if not text:
        return None
    group, _, filt = text.partition("/")
    return group, filt
