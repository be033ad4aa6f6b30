"""Protocol errors, split as in h11: a peer's fault vs our own misuse.

A ``RemoteProtocolError`` carries the MQTT 5 reason code to put in the
DISCONNECT (or CONNACK, during the handshake) before the connection closes;
3.1.1 connections are simply closed.
"""

from . import reason as rc


class ProtocolError(Exception):
    reason_code = rc.UNSPECIFIED_ERROR

    def __init__(self, message: str = "", reason_code: int | None = None):
        super().__init__(message or type(self).__name__)
        if reason_code is not None:
            self.reason_code = reason_code


class LocalProtocolError(ProtocolError):
    """We were asked to do something the protocol does not allow."""


class RemoteProtocolError(ProtocolError):
    """The peer sent something the protocol does not allow (0x82)."""

    reason_code = rc.PROTOCOL_ERROR


class MalformedPacket(RemoteProtocolError):
    """Bytes that cannot be parsed as the packet they claim to be (0x81)."""

    reason_code = rc.MALFORMED_PACKET


class PacketTooLarge(RemoteProtocolError):
    """The fixed header announces more than the negotiated maximum (0x95)."""

    reason_code = rc.PACKET_TOO_LARGE
