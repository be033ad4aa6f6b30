"""A tiny MQTT client over a plain socket, written from the spec (not from brokerd's codec).

Used where real clients refuse to misbehave: malformed packets, invalid topic
names, not acknowledging, inspecting DUP flags, packet ids and topic aliases
on the wire.

    c = RawClient(port)
    ack = c.connect("dev1", version=5, props={RECEIVE_MAXIMUM: 2})
    c.subscribe("a/#", qos=1)
    pkt = c.expect(PUBLISH)
"""

import socket
import struct
import time
from dataclasses import dataclass, field

# packet types
CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT, AUTH = 8, 9, 10, 11, 12, 13, 14, 15

# MQTT 5 properties used by the tests: id -> wire type
PAYLOAD_FORMAT_INDICATOR = 0x01
MESSAGE_EXPIRY_INTERVAL = 0x02
CONTENT_TYPE = 0x03
RESPONSE_TOPIC = 0x08
CORRELATION_DATA = 0x09
SUBSCRIPTION_IDENTIFIER = 0x0B
SESSION_EXPIRY_INTERVAL = 0x11
ASSIGNED_CLIENT_IDENTIFIER = 0x12
SERVER_KEEP_ALIVE = 0x13
REQUEST_PROBLEM_INFORMATION = 0x17
WILL_DELAY_INTERVAL = 0x18
REQUEST_RESPONSE_INFORMATION = 0x19
RESPONSE_INFORMATION = 0x1A
SERVER_REFERENCE = 0x1C
REASON_STRING = 0x1F
RECEIVE_MAXIMUM = 0x21
TOPIC_ALIAS_MAXIMUM = 0x22
TOPIC_ALIAS = 0x23
MAXIMUM_QOS = 0x24
RETAIN_AVAILABLE = 0x25
USER_PROPERTY = 0x26
MAXIMUM_PACKET_SIZE = 0x27
WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
SHARED_SUBSCRIPTION_AVAILABLE = 0x2A

_BYTE, _U16, _U32, _VAR, _STR, _BIN, _PAIR = range(7)
PROP_TYPES = {
    0x01: _BYTE, 0x02: _U32, 0x03: _STR, 0x08: _STR, 0x09: _BIN, 0x0B: _VAR, 0x11: _U32, 0x12: _STR,
    0x13: _U16, 0x15: _STR, 0x16: _BIN, 0x17: _BYTE, 0x18: _U32, 0x19: _BYTE, 0x1A: _STR, 0x1C: _STR,
    0x1F: _STR, 0x21: _U16, 0x22: _U16, 0x23: _U16, 0x24: _BYTE, 0x25: _BYTE, 0x26: _PAIR, 0x27: _U32,
    0x28: _BYTE, 0x29: _BYTE, 0x2A: _BYTE,
}
MULTI = {USER_PROPERTY, SUBSCRIPTION_IDENTIFIER}


# --------------------------------------------------------------------------- encoding

def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | 0x80 if n else b)
        if not n:
            return bytes(out)


def s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack(">H", len(raw)) + raw


def encode_props(props: dict | None) -> bytes:
    body = bytearray()
    for ident, value in (props or {}).items():
        values = value if ident in MULTI and isinstance(value, list) else [value]
        for v in values:
            body += varint(ident)
            t = PROP_TYPES[ident]
            if t == _BYTE:
                body.append(v)
            elif t == _U16:
                body += struct.pack(">H", v)
            elif t == _U32:
                body += struct.pack(">I", v)
            elif t == _VAR:
                body += varint(v)
            elif t in (_STR, _BIN):
                body += s(v)
            else:
                body += s(v[0]) + s(v[1])
    return varint(len(body)) + bytes(body)


def packet(b0: int, body: bytes) -> bytes:
    return bytes((b0,)) + varint(len(body)) + body


def connect_packet(client_id: str = "", version: int = 4, clean: bool = True, keepalive: int = 60,
                   props: dict | None = None, will: tuple | None = None, username=None, password=None,
                   protocol_name: str | None = None) -> bytes:
    """``will`` = (topic, payload, qos, retain, props)."""
    name = protocol_name or ("MQIsdp" if version == 3 else "MQTT")
    flags = 0x02 if clean else 0
    if will is not None:
        flags |= 0x04 | (will[2] << 3) | (0x20 if will[3] else 0)
    if username is not None:
        flags |= 0x80
    if password is not None:
        flags |= 0x40
    vh = s(name) + bytes((version, flags)) + struct.pack(">H", keepalive)
    if version == 5:
        vh += encode_props(props)
    payload = s(client_id)
    if will is not None:
        if version == 5:
            payload += encode_props(will[4] if len(will) > 4 else None)
        payload += s(will[0]) + s(will[1])
    if username is not None:
        payload += s(username)
    if password is not None:
        payload += s(password)
    return packet(0x10, vh + payload)


def publish_packet(topic: str | bytes, payload: bytes = b"", qos: int = 0, retain: bool = False, dup: bool = False,
                   pid: int = 0, version: int = 4, props: dict | None = None) -> bytes:
    b0 = 0x30 | (qos << 1) | (1 if retain else 0) | (8 if dup else 0)
    vh = s(topic)
    if qos:
        vh += struct.pack(">H", pid)
    if version == 5:
        vh += encode_props(props)
    return packet(b0, vh + payload)


def ack_packet(kind: int, pid: int, version: int = 4, code: int = 0) -> bytes:
    b0 = (kind << 4) | (2 if kind == PUBREL else 0)
    body = struct.pack(">H", pid)
    if version == 5 and code:
        body += bytes((code,))
    return packet(b0, body)


def subscribe_packet(pid: int, topics: list, version: int = 4, props: dict | None = None) -> bytes:
    """``topics``: [(filter, options byte)]."""
    body = struct.pack(">H", pid)
    if version == 5:
        body += encode_props(props)
    for filt, opts in topics:
        body += s(filt) + bytes((opts,))
    return packet(0x82, body)


def disconnect_packet(version: int = 4, code: int = 0, props: dict | None = None) -> bytes:
    if version != 5 or (code == 0 and not props):
        return b"\xe0\x00"
    body = bytes((code,))
    if props:
        body += encode_props(props)
    return packet(0xE0, body)


# --------------------------------------------------------------------------- decoding

def _decode_props(buf: bytes, i: int) -> tuple[dict, int]:
    length, i = _read_varint(buf, i)
    end = i + length
    props: dict = {}
    while i < end:
        ident, i = _read_varint(buf, i)
        t = PROP_TYPES[ident]
        if t == _BYTE:
            v, i = buf[i], i + 1
        elif t == _U16:
            v, i = struct.unpack_from(">H", buf, i)[0], i + 2
        elif t == _U32:
            v, i = struct.unpack_from(">I", buf, i)[0], i + 4
        elif t == _VAR:
            v, i = _read_varint(buf, i)
        elif t in (_STR, _BIN):
            n = struct.unpack_from(">H", buf, i)[0]
            raw = buf[i + 2:i + 2 + n]
            v, i = (raw.decode() if t == _STR else raw), i + 2 + n
        else:
            n = struct.unpack_from(">H", buf, i)[0]
            k = buf[i + 2:i + 2 + n].decode()
            i += 2 + n
            n = struct.unpack_from(">H", buf, i)[0]
            v = (k, buf[i + 2:i + 2 + n].decode())
            i += 2 + n
        if ident in MULTI:
            props.setdefault(ident, []).append(v)
        else:
            props[ident] = v
    return props, end


def _read_varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7


@dataclass
class Packet:
    type: int
    flags: int
    body: bytes
    version: int = 4
    # decoded fields (filled per type)
    pid: int = 0
    code: int = 0
    codes: list = field(default_factory=list)
    props: dict = field(default_factory=dict)
    topic: str = ""
    payload: bytes = b""
    session_present: bool = False

    @property
    def qos(self) -> int:
        return (self.flags >> 1) & 3

    @property
    def dup(self) -> bool:
        return bool(self.flags & 8)

    @property
    def retain(self) -> bool:
        return bool(self.flags & 1)

    def decode(self) -> "Packet":
        b, v5 = self.body, self.version == 5
        t = self.type
        if t == CONNACK:
            self.session_present = bool(b[0] & 1)
            self.code = b[1]
            if v5 and len(b) > 2:
                self.props, _ = _decode_props(b, 2)
        elif t == PUBLISH:
            n = struct.unpack_from(">H", b, 0)[0]
            self.topic = b[2:2 + n].decode()
            i = 2 + n
            if self.qos:
                self.pid = struct.unpack_from(">H", b, i)[0]
                i += 2
            if v5:
                self.props, i = _decode_props(b, i)
            self.payload = b[i:]
        elif t in (PUBACK, PUBREC, PUBREL, PUBCOMP):
            self.pid = struct.unpack_from(">H", b, 0)[0]
            if len(b) > 2:
                self.code = b[2]
            if len(b) > 3:
                self.props, _ = _decode_props(b, 3)
        elif t in (SUBACK, UNSUBACK):
            self.pid = struct.unpack_from(">H", b, 0)[0]
            i = 2
            if v5:
                self.props, i = _decode_props(b, i)
            self.codes = list(b[i:])
        elif t == DISCONNECT:
            if b:
                self.code = b[0]
            if len(b) > 1:
                self.props, _ = _decode_props(b, 1)
        return self


class Closed(Exception):
    """The server closed the connection."""


class RawClient:
    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 5.0, sock=None):
        self.sock = sock or socket.create_connection((host, port), timeout=timeout)
        self.sock.settimeout(timeout)
        self.timeout = timeout
        self.buf = b""
        self.version = 4

    # -- io
    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no packet in time")
        self.sock.settimeout(left)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            raise TimeoutError("no packet in time")
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        if not data:
            raise Closed()
        self.received(data)

    def received(self, data: bytes) -> None:
        """Bytes read from the socket: MQTT bytes here (a WebSocket client unwraps them)."""
        self.buf += data

    def recv(self, timeout: float | None = None) -> Packet:
        """The next packet; TimeoutError if none, Closed if the server closed the socket."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            if len(self.buf) >= 2:
                i = 1
                rl = shift = 0
                complete = False
                while i < len(self.buf) and i <= 4:
                    b = self.buf[i]
                    rl |= (b & 0x7F) << shift
                    shift += 7
                    i += 1
                    if not b & 0x80:
                        complete = True
                        break
                if complete and len(self.buf) >= i + rl:
                    b0 = self.buf[0]
                    body = self.buf[i:i + rl]
                    self.buf = self.buf[i + rl:]
                    return Packet(b0 >> 4, b0 & 0x0F, body, self.version).decode()
            self._fill(deadline)

    def expect(self, ptype: int, timeout: float | None = None, skip=(PINGRESP,)) -> Packet:
        """The next packet that is not in ``skip``; it must be of type ``ptype``."""
        while True:
            p = self.recv(timeout)
            if p.type in skip and p.type != ptype:
                continue
            assert p.type == ptype, f"expected packet type {ptype}, got {p.type} ({p})"
            return p

    def expect_closed(self, timeout: float | None = None) -> list:
        """Read until the server closes the socket; returns the packets received before that."""
        got = []
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            try:
                got.append(self.recv(max(0.01, deadline - time.monotonic())))
            except Closed:
                return got
            except TimeoutError:
                raise AssertionError(f"connection still open; received {got}")

    def is_open(self, wait: float = 0.3) -> bool:
        """True if the socket is still open after ``wait`` seconds (packets read meanwhile are kept)."""
        try:
            p = self.recv(wait)
        except TimeoutError:
            return True
        except Closed:
            return False
        # not expected by caller: put it back
        self._pushback(p)
        return True

    def _pushback(self, p: Packet) -> None:
        self.buf = bytes(((p.type << 4) | p.flags,)) + varint(len(p.body)) + p.body + self.buf

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- protocol
    def connect(self, client_id: str = "", version: int = 4, clean: bool = True, keepalive: int = 60,
                props: dict | None = None, will: tuple | None = None, **kw) -> Packet:
        self.version = version
        self.send(connect_packet(client_id, version, clean, keepalive, props, will, **kw))
        return self.expect(CONNACK)

    def subscribe(self, topic: str, qos: int = 0, pid: int = 1, options: int | None = None,
                  props: dict | None = None) -> list:
        self.send(subscribe_packet(pid, [(topic, qos if options is None else options)], self.version, props))
        ack = self.expect(SUBACK)
        assert ack.pid == pid
        return ack.codes

    def publish(self, topic, payload: bytes = b"", qos: int = 0, retain: bool = False, pid: int = 0,
                dup: bool = False, props: dict | None = None) -> None:
        self.send(publish_packet(topic, payload, qos, retain, dup, pid, self.version, props))

    def ack(self, kind: int, pid: int) -> None:
        self.send(ack_packet(kind, pid, self.version))

    def disconnect(self, code: int = 0, props: dict | None = None) -> None:
        self.send(disconnect_packet(self.version, code, props))
        self.close()
