"""Raw MQTT bytes for tests that must send what our encoder would refuse to make."""

from brokerd.protocol.codec import varint

MALFORMED = 0x81
PROTOCOL = 0x82
EITHER = {MALFORMED, PROTOCOL}


def frame(b0: int, body: bytes) -> bytes:
    """A packet: first byte, Remaining Length, body."""
    return bytes([b0]) + varint(len(body)) + body


def s(x) -> bytes:
    """A UTF-8 string (or raw bytes) with its two-byte length."""
    raw = x.encode() if isinstance(x, str) else x
    return len(raw).to_bytes(2, "big") + raw


def props(*items: bytes) -> bytes:
    """A v5 property block: its length, then the encoded properties."""
    body = b"".join(items)
    return varint(len(body)) + body
