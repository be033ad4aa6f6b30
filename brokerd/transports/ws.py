"""MQTT over WebSocket (RFC 6455, subprotocol ``mqtt``), with wsproto.

The HTTP upgrade is answered only on the listener's path; MQTT bytes travel
in binary frames and may be split across frames in any way. Output is
coalesced like the TCP transport: one frame per connection per iteration.
"""

import logging

from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    Pong,
    RejectConnection,
    Request,
    TextMessage,
)
from wsproto.utilities import RemoteProtocolError as WsProtocolError

from ..protocol.channel import TURN_BYTES
from .connection import MqttConnection, close_gently

log = logging.getLogger("brokerd.ws")

SUBPROTOCOLS = ("mqtt", "mqttv3.1")


class WsMqttConnection(MqttConnection):
    __slots__ = ("ws", "open", "listener", "pong", "held")

    def __init__(self, server, listener):
        super().__init__(server, listener)
        self.listener = listener
        self.ws = WSConnection(ConnectionType.SERVER)
        self.open = False
        self.pong = None        # the payload of the last ping not answered yet (the client does not read)
        self.held = 0           # bytes of an incomplete upgrade request charged to the node's pre-auth budget

    def data_received(self, data: bytes) -> None:
        if self.open:
            self._receive(data)
            if self.channel.congested:
                self.hold_output()          # (as MqttConnection.data_received)
            if len(data) >= TURN_BYTES:
                self.end_turn()
            return
        self._receive(data)
        # An upgrade request that did not come whole in this read is held (by h11, up to 16 KiB a
        # socket) until it does: bytes before authentication, counted with the incomplete CONNECTs
        # in --preauth-budget (a request in one read never counts, as a CONNECT in one read)
        held = 0 if self.open or self.closed else self.held + len(data)
        delta = held - self.held
        if delta:
            self.held = held
            if not self.server.broker.preauth_charge(delta):
                self.server.broker.preauth_charge(-held)
                self.held = 0
                self.closed = True
                self.transport.close()

    def connection_lost(self, exc) -> None:
        if self.held:
            self.server.broker.preauth_charge(-self.held)
            self.held = 0
        super().connection_lost(exc)
        # a closed connection stays in the timeout wheel until its slot comes: not with its
        # WebSocket state (an incomplete upgrade request is up to 16 KiB)
        self.ws = None
        self.open = False

    def _receive(self, data: bytes) -> None:
        ws = self.ws
        self.server.pacer.reading = self
        try:
            ws.receive_data(data)
            for event in ws.events():
                if isinstance(event, BytesMessage):
                    self.channel.receive_data(bytes(event.data), self.time())
                elif isinstance(event, Request):
                    self._handshake(event)
                elif isinstance(event, Ping):
                    if self.channel.congested:
                        # A client that sends pings and does not read its pongs: answered they would pile
                        # up in the write buffer without end (before CONNECT too). RFC 6455 5.5.3: only
                        # the most recent ping needs a pong -- sent when the buffer drains.
                        self.pong = event.payload
                    else:
                        self.transport.write(ws.send(event.response()))
                elif isinstance(event, TextMessage):
                    self._ws_close(1003, "MQTT needs binary frames")
                elif isinstance(event, CloseConnection):
                    self.channel.out.clear()
                    self.closed = True
                    if ws.state.name not in ("CLOSED", "LOCAL_CLOSING"):
                        # the client's close, or wsproto's for a frame it refused (1002, 1007, 1009):
                        # answered behind what was already written, half-closed and drained -- closed
                        # with the client's input unread the socket would reset and lose both
                        self.transport.write(ws.send(event.response()))
                        close_gently(self.transport, self, self.server.loop)
                    else:
                        self.transport.close()
                    return
                if self.closed:
                    return
        except (WsProtocolError, UnicodeError) as exc:
            # a bad upgrade request (frames' errors are CloseConnection events); wsproto decodes
            # Host (idna), Connection and Sec-WebSocket-Protocol/-Extensions as ASCII without
            # catching the error: a byte over 0x7f there was an unhandled exception, logged by
            # the event loop as an ERROR with its traceback for every such request
            log.debug("websocket error from %s: %s", self.channel.peer, exc)
            hint = getattr(exc, "event_hint", None) or RejectConnection(status_code=400, has_body=False)
            if not self.open and isinstance(hint, RejectConnection):
                # the HTTP answer RFC 6455 4.2.2 asks for: 426 with the versions we speak for an
                # unknown Sec-WebSocket-Version, 400 for the rest -- not a bare close
                self._reject(hint)
            else:
                self.closed = True
                self.transport.close()
        finally:
            self.server.pacer.reading = None
        if self.channel.congested and not self.closed:
            self.hold_output()

    def _handshake(self, req: Request) -> None:
        path = req.target.split("?", 1)[0]
        if path != self.listener.path:
            self._reject(RejectConnection(status_code=404, has_body=False))
            return
        offered = [p for p in req.subprotocols if p in SUBPROTOCOLS]
        if req.subprotocols and not offered:
            self._reject(RejectConnection(status_code=400, has_body=False))
            return
        # [MQTT-6.0.0-4]: "mqtt" whenever offered, whatever the client's order; "mqttv3.1" (MQTT 3.1's) otherwise
        chosen = "mqtt" if "mqtt" in offered else offered[0] if offered else None
        # bytes that came after the request in the same read (a client that sent its CONNECT without
        # waiting for the 101): h11 keeps them, and wsproto's server side does not pass them on to
        # the WebSocket it opens -- fed here, their events follow in the caller's loop (at most one
        # read, then checked as any frames)
        leftover = self.ws.handshake._h11_connection.trailing_data[0]
        self.transport.write(self.ws.send(AcceptConnection(subprotocol=chosen)))
        self.open = True
        if leftover:
            self.ws.receive_data(bytes(leftover))

    def _reject(self, answer: RejectConnection) -> None:
        """Answer the upgrade request with an HTTP error and close (half-closed and drained, as
        after a DISCONNECT: closed with input unread the socket would reset and lose the answer)."""
        self.closed = True
        try:
            data = self.ws.send(answer)
        except Exception:                       # (h11 may not let us answer: close only)
            self.transport.close()
            return
        self.transport.write(data)
        close_gently(self.transport, self, self.server.loop)

    def resume_writing(self) -> None:
        pong = self.pong
        if pong is not None:
            self.pong = None
            if self.open and not self.closed and self.transport is not None:
                self.transport.write(self.ws.send(Pong(payload=pong)))
        super().resume_writing()

    def flush(self) -> None:
        """MqttConnection.flush, the bytes framed (``write``)."""
        ch = self.channel
        out = ch.out
        if not out or self.transport is None:
            return
        if self.closed:
            # closed by the WebSocket side (a text or close frame): the channel hears it only at
            # connection_lost, up to DRAIN_SECONDS later, and its output has nowhere to go --
            # framed, wsproto raises (the socket is past OPEN) and the flusher's round stops there
            out.clear()
            return
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        ch.bytes_out += len(data)
        self.write(data)
        ch.pending = 0
        if ch.blocked:
            ch.flushed(self.time())

    def write(self, data: bytes) -> None:
        if self.open:
            self.transport.write(self.ws.send(BytesMessage(data=data)))

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.flush()
            self._ws_close(1000, "")

    def _ws_close(self, code: int, reason: str) -> None:
        self.closed = True
        if self.open:
            try:
                self.transport.write(self.ws.send(CloseConnection(code=code, reason=reason)))
            except Exception:  # the websocket may already be closing
                pass
            else:
                # our last bytes (a DISCONNECT, the close frame) must reach the client: half-close
                # and drain, as over TCP -- closed at once with its input unread, the socket answers
                # with RST and the kernel drops what it had not sent yet
                close_gently(self.transport, self, self.server.loop)
                return
        self.transport.close()
