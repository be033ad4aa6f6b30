"""Frames between brokerd nodes (pure): encode, and split a byte stream.

Every frame is ``u32 length | u8 type | body``. Strings are ``u16 length |
UTF-8``, byte strings ``u32 length | bytes``. Types:

``PUBLISH``  forward a message: req id (u32, 0 = no answer wanted), qos,
             retain, expiry (i32 seconds left, -1 none), tenant, topic,
             properties (MQTT 5 wire form), payload, shared group and filter
             ("" unless the message is for one member of that group)
``ACK``      req id, code (0: stored by every durable session it went to)
``TAKEOVER`` req id, tenant, client id: hand the session over to the asker
``RELEASED`` req id, code (0: released, 1: the session was not here)
``HELLO``    the node id of the connecting side
"""

import struct

PUBLISH, ACK, TAKEOVER, RELEASED, HELLO = 1, 2, 3, 4, 5

_HEAD = struct.Struct(">IB")
_PUB = struct.Struct(">IBBi")
_ACK = struct.Struct(">IB")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")


def _s(text: str) -> bytes:
    raw = text.encode()
    return _U16.pack(len(raw)) + raw


def _b(raw: bytes) -> bytes:
    return _U32.pack(len(raw)) + raw


def _frame(kind: int, body: bytes) -> bytes:
    return _HEAD.pack(len(body) + 1, kind) + body


def publish(req: int, qos: int, retain: bool, expiry: int, tenant: str, topic: str, props: bytes, payload: bytes,
            group: str = "", gfilter: str = "") -> bytes:
    body = b"".join((_PUB.pack(req, qos, 1 if retain else 0, expiry), _s(tenant), _s(topic), _b(props), _b(payload),
                     _s(group), _s(gfilter)))
    return _frame(PUBLISH, body)


def ack(req: int, code: int) -> bytes:
    return _frame(ACK, _ACK.pack(req, code))


def takeover(req: int, tenant: str, client_id: str) -> bytes:
    return _frame(TAKEOVER, _U32.pack(req) + _s(tenant) + _s(client_id))


def released(req: int, code: int) -> bytes:
    return _frame(RELEASED, _ACK.pack(req, code))


def hello(node: str) -> bytes:
    return _frame(HELLO, _s(node))


class FrameError(ValueError):
    pass


def _read_s(buf, i):
    n = _U16.unpack_from(buf, i)[0]
    return bytes(buf[i + 2:i + 2 + n]).decode(), i + 2 + n


def _read_b(buf, i):
    n = _U32.unpack_from(buf, i)[0]
    return bytes(buf[i + 4:i + 4 + n]), i + 4 + n


def decode(kind: int, body: bytes) -> tuple:
    """-> (kind, fields...)"""
    try:
        if kind == PUBLISH:
            req, qos, retain, expiry = _PUB.unpack_from(body, 0)
            i = _PUB.size
            tenant, i = _read_s(body, i)
            topic, i = _read_s(body, i)
            props, i = _read_b(body, i)
            payload, i = _read_b(body, i)
            group, i = _read_s(body, i)
            gfilter, i = _read_s(body, i)
            return PUBLISH, req, qos, bool(retain), expiry, tenant, topic, props, payload, group, gfilter
        if kind in (ACK, RELEASED):
            req, code = _ACK.unpack_from(body, 0)
            return kind, req, code
        if kind == TAKEOVER:
            req = _U32.unpack_from(body, 0)[0]
            tenant, i = _read_s(body, 4)
            cid, i = _read_s(body, i)
            return TAKEOVER, req, tenant, cid
        if kind == HELLO:
            node, _ = _read_s(body, 0)
            return HELLO, node
    except (struct.error, UnicodeDecodeError) as exc:
        raise FrameError(f"bad frame of type {kind}: {exc}")
    raise FrameError(f"unknown frame type {kind}")


class FrameReader:
    """Splits a byte stream into frames; keeps the incomplete tail."""

    __slots__ = ("_buf", "max_frame")

    def __init__(self, max_frame: int = 512 * 1024 * 1024):
        self._buf = b""
        self.max_frame = max_frame

    def feed(self, data: bytes) -> list:
        buf = self._buf + data if self._buf else data
        out = []
        pos = 0
        n = len(buf)
        while n - pos >= 5:
            length, kind = _HEAD.unpack_from(buf, pos)
            if length > self.max_frame or length < 1:
                raise FrameError(f"frame of {length} bytes")
            end = pos + 4 + length
            if end > n:
                break
            out.append(decode(kind, buf[pos + 5:end]))
            pos = end
        self._buf = buf[pos:]
        return out
