"""Frames between brokerd nodes (pure): encode, and split a byte stream.

Every frame is ``u32 length | u8 type | body``. Strings are ``u16 length |
UTF-8``, byte strings ``u32 length | bytes``. Types:

``PUBLISH``  forward a message, one struct then the variable parts:
             req id (u32, 0 = no answer wanted), qos, flags (retain; the
             payload is the message's 3.x QoS 0 wire form, forwarded as it
             came), expiry (i32 seconds left, -1 none), the lengths of tenant,
             topic, properties (MQTT 5 wire form), shared group and filter
             ("" unless the message is for one member of that group); then
             those, then the payload (or wire form) to the end of the frame
``ACK``      req id, code (0: stored by every durable session it went to)
``TAKEOVER`` req id, tenant, client id[, flags]: hand the session over to the asker; flag 1
             (``LIVE_ONLY``): only if its client is connected here -- else nothing is let go
             (answered 4): a CONNECT the tenant's connection quota admits only in place of a live
             connection of its client id (a frame without flags: 0)
``RELEASED`` req id, code (0: released, 1: the session was not here, 2: refused -- the asker does not
             hold the client id's lock, 3: released or not here, but what this node wrote of it
             is not all in the store yet: the store is slow or failing, 4: not connected here,
             nothing let go -- the answer to ``LIVE_ONLY``)
``HELLO``    version, a fresh 32-byte nonce, the sender's node id (both sides,
             first thing on a new link)
``AUTH``     the sender's proof: HMAC-SHA256 of the cluster secret over both
             node ids and both nonces (``handshake.proof``)
``PING``     nothing: "still here" on a link that carried nothing else lately

Nothing but HELLO and AUTH is accepted on a link before both sides proved
they hold the cluster secret (``link.Link``); before that a frame may be at
most ``PREAUTH_FRAME`` bytes.

A session on the move (``takeover.Takeover.on_takeover``, ``handoff.Handoff``):

``HANDOFF``  req id, JSON ``{"tenant", "client_id", "filters"}``: old owner to
             new owner, "hold what comes for these filters of this session"
``HOLDING``  req id, JSON ``{filter: [subs, durable]}``: the new owner holds
             them, and these are its announced route counts
``SYNC``     req id, a cluster event id: "answer once you applied it"
``SYNCED``   req id, code -- sent on the answering node's own link to the
             asker, so everything it forwarded before arrives first

PUBLISH flag ``TARGET``: for one session only, the client id in the group
field (a message the old owner got for a session that moved). ``REDIRECTED``:
a shared group's message a node passed on to another member of the group
(its member's session ended, or it had none left): a node with no member of
the group for it answers with an error instead of passing it on again.
"""

import struct

PUBLISH, ACK, TAKEOVER, RELEASED, HELLO, HANDOFF, HOLDING, SYNC, SYNCED, AUTH, PING = range(1, 12)
VERSION = 1                  # of the link protocol, in HELLO: a node refuses links of another version
NONCE = 32                   # bytes of a HELLO's nonce
PREAUTH_FRAME = 1024         # largest frame accepted before the link is authenticated

_HEAD = struct.Struct(">IB")
_PUB = struct.Struct(">IBBiHHIHH")
PUB_HEAD = 5 + _PUB.size
RAW = 2                      # PUBLISH flag: the payload part is the 3.x QoS 0 wire form
EXPIRY_MAX = 0x7FFFFFFF      # a PUBLISH's expiry field (i32) at most: a Message Expiry Interval goes up to
                             # 0xFFFFFFFF; one above this is sent as this, its properties saying the rest
TARGET = 4                   # PUBLISH flag: for the session named in the group field only
REDIRECTED = 8               # PUBLISH flag: a shared group's message another node passed on (not passed on again)
RULE = 16                    # PUBLISH flag: a message a rule made (``packets.RulePublish``; earlier nodes ignore it)
LIVE_ONLY = 1                # TAKEOVER flag: let go of the session only if its client is connected here
# what this version's nodes say they do, in their membership information ("features"): a node asks
# LIVE_ONLY only of a node that says it answers it (an earlier version ignores the flag: it would let go
# of an offline session too), so nodes of both versions link and work together while a cluster upgrades
LIVE_ONLY_FEATURE = "takeover-live-only"
FEATURES = (LIVE_ONLY_FEATURE,)
_ACK = struct.Struct(">IB")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")


def _s(text: str) -> bytes:
    raw = text.encode()
    return _U16.pack(len(raw)) + raw


def _long(text: str) -> bytes:
    raw = text.encode()
    return _U32.pack(len(raw)) + raw


def _frame(kind: int, body: bytes) -> bytes:
    return _HEAD.pack(len(body) + 1, kind) + body


def publish(req: int, qos: int, flags: int, expiry: int, tenant: bytes, topic: bytes, props: bytes, payload: bytes,
            group: bytes = b"", gfilter: bytes = b"") -> bytes:
    """``flags``: 1 retain, RAW when ``payload`` is the 3.x QoS 0 wire form of the message."""
    size = PUB_HEAD - 4 + len(tenant) + len(topic) + len(props) + len(group) + len(gfilter) + len(payload)
    return b"".join((_HEAD.pack(size, PUBLISH), _PUB.pack(req, qos, flags, expiry, len(tenant), len(topic),
                                                           len(props), len(group), len(gfilter)),
                     tenant, topic, props, group, gfilter, payload))


def ack(req: int, code: int) -> bytes:
    return _frame(ACK, _ACK.pack(req, code))


def takeover(req: int, tenant: str, client_id: str, flags: int = 0) -> bytes:
    return _frame(TAKEOVER, _U32.pack(req) + _s(tenant) + _s(client_id) + (bytes((flags,)) if flags else b""))


def released(req: int, code: int) -> bytes:
    return _frame(RELEASED, _ACK.pack(req, code))


def handoff(req: int, text: str) -> bytes:
    return _frame(HANDOFF, _U32.pack(req) + _long(text))


def holding(req: int, text: str) -> bytes:
    return _frame(HOLDING, _U32.pack(req) + _long(text))


def sync(req: int, event_id: str) -> bytes:
    return _frame(SYNC, _U32.pack(req) + _s(event_id))


def synced(req: int, code: int = 0) -> bytes:
    return _frame(SYNCED, _ACK.pack(req, code))


def hello(node: str, nonce: bytes) -> bytes:
    return _frame(HELLO, bytes((VERSION,)) + nonce + _s(node))


def auth(proof: bytes) -> bytes:
    return _frame(AUTH, proof)


def ping() -> bytes:
    return _frame(PING, b"")


class FrameError(ValueError):
    pass


def _read_s(buf, i):
    n = _U16.unpack_from(buf, i)[0]
    return buf[i + 2:i + 2 + n].decode(), i + 2 + n


def decode(kind: int, body: bytes) -> tuple:
    """-> (kind, fields...)"""
    try:
        if kind == PUBLISH:
            return decode_publish(body, 0, len(body))
        if kind in (ACK, RELEASED, SYNCED):
            req, code = _ACK.unpack_from(body, 0)
            return kind, req, code
        if kind == TAKEOVER:
            req = _U32.unpack_from(body, 0)[0]
            tenant, i = _read_s(body, 4)
            cid, i = _read_s(body, i)
            if i > len(body):
                raise FrameError("TAKEOVER shorter than its parts")
            return TAKEOVER, req, tenant, cid, body[i] if i < len(body) else 0
        if kind == HELLO:
            if body[:1] != bytes((VERSION,)) or len(body) < 1 + NONCE + 2:
                raise FrameError(f"HELLO of another link protocol version (this node speaks {VERSION})")
            node, end = _read_s(body, 1 + NONCE)
            if end != len(body):
                raise FrameError("HELLO longer than its parts")
            return HELLO, node, body[1:1 + NONCE]
        if kind == AUTH:
            return AUTH, body
        if kind == PING:
            return (PING,)
        if kind == SYNC:
            req = _U32.unpack_from(body, 0)[0]
            text, _ = _read_s(body, 4)
            return kind, req, text
        if kind in (HANDOFF, HOLDING):
            req, n = struct.unpack_from(">II", body, 0)
            if 8 + n > len(body):
                raise FrameError("text longer than its frame")
            return kind, req, body[8:8 + n].decode()
    except (struct.error, UnicodeDecodeError) as exc:
        raise FrameError(f"bad frame of type {kind}: {exc}")
    raise FrameError(f"unknown frame type {kind}")


def decode_publish(buf: bytes, i: int, end: int) -> tuple:
    """(PUBLISH, req, qos, flags, expiry, tenant, topic, props, payload, group, gfilter) of a body at ``buf[i:end]``."""
    req, qos, flags, expiry, lt, lp, lx, lg, lf = _PUB.unpack_from(buf, i)
    i += _PUB.size
    j = i + lt
    tenant = buf[i:j].decode()
    i, j = j, j + lp
    topic = buf[i:j].decode()
    i, j = j, j + lx
    props = buf[i:j]
    i, j = j, j + lg
    group = buf[i:j].decode() if lg else ""
    i, j = j, j + lf
    gfilter = buf[i:j].decode() if lf else ""
    if j > end:
        raise FrameError("PUBLISH frame shorter than its parts")
    return PUBLISH, req, qos, flags, expiry, tenant, topic, props, buf[j:end], group, gfilter


class FrameReader:
    """Splits a byte stream into frames; keeps the incomplete tail.

    Linear in the bytes received: the pieces of an incomplete frame are kept
    in a list and joined once, when the frame is whole (joining them at every
    read was quadratic: a 250 MB frame in 64 KB reads stalled the node for
    seconds). A frame longer than ``max_frame`` fails from its header alone,
    before any of it is buffered.
    """

    __slots__ = ("_parts", "_have", "_need", "max_frame")

    def __init__(self, max_frame: int):
        self._parts: list[bytes] = []
        self._have = 0               # bytes in _parts
        self._need = 5               # bytes _parts must reach before parsing again
        self.max_frame = max_frame

    def feed(self, data: bytes) -> list:
        if self._parts:
            self._parts.append(data)
            self._have += len(data)
            if self._have < self._need:
                return []
            buf = b"".join(self._parts)
            self._parts = []
        else:
            buf = data
        out = []
        pos = 0
        n = len(buf)
        need = 5
        while n - pos >= 5:
            length, kind = _HEAD.unpack_from(buf, pos)
            if length > self.max_frame or length < 1:
                raise FrameError(f"frame of {length} bytes (at most {self.max_frame} here)")
            end = pos + 4 + length
            if end > n:
                need = end - pos
                break
            try:
                if kind == PUBLISH:     # the common frame: decoded in place, no copy of the body
                    out.append(decode_publish(buf, pos + 5, end))
                else:
                    out.append(decode(kind, buf[pos + 5:end]))
            except (struct.error, UnicodeDecodeError) as exc:
                raise FrameError(f"bad frame of type {kind}: {exc}")
            pos = end
        if pos < n:
            self._parts = [buf[pos:] if pos else buf]
            self._have = n - pos
            self._need = need
        else:
            self._have = 0
        return out

    @property
    def buffered(self) -> int:
        return self._have
