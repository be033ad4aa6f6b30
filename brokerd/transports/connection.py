"""MQTT over a byte stream (TCP or TLS): an asyncio Protocol around a Channel.

The protocol feeds received bytes to the channel and writes what the channel
produced, coalesced: a channel's ``hooks.wake()`` puts the connection on the
server's flush list, and everything a connection was given during one
event-loop iteration leaves in one ``transport.write``.
"""

import asyncio
import logging
import sys

from ..budget import PAUSE_BUDGET as _BUDGET
from ..protocol.channel import LOOK_AGAIN, Channel

log = logging.getLogger("brokerd.connection")

# Why reading from a connection is paused (a bit each; reading resumes when none is left).
PAUSE_CONNECT = 1    # the broker is still deciding on the CONNECT
PAUSE_BUDGET = _BUDGET  # the node's queue budget is exceeded and this connection publishes (brokerd.budget)
PAUSE_RATE = 4       # the client is over its tenant's inbound rate
PAUSE_OUTPUT = 8     # the client does not read what it asked for (its write buffer is past OUTPUT_HELD)
PAUSE_TURN = 16      # the client had its turn: a read of TURN_BYTES or more (read again at the next iteration)

# Past ``write_high`` deliveries queue (Channel.set_congested), but what the client's own packets
# call for -- PUBACK/PUBREC/PUBCOMP, PINGRESP, SUBACK, a WebSocket pong -- is written whatever the
# buffer holds. A client sending those and reading nothing made the broker hold all of it; past
# OUTPUT_HELD times write_high its socket is no longer read until the buffer drains (resume_writing).
OUTPUT_HELD = 4


class Flusher:
    """One write per connection per event-loop iteration.

    ``after`` runs after each round of writes (the server's budget check).
    """

    __slots__ = ("call_soon", "pending", "after", "time")

    def __init__(self, loop: asyncio.AbstractEventLoop, after=None):
        self.call_soon = loop.call_soon
        self.time = loop.time           # one bound method for every connection (64 bytes each otherwise)
        self.pending: list = []
        self.after = after

    def add(self, conn) -> None:
        pending = self.pending
        if not pending:
            self.call_soon(self.flush)
        pending.append(conn)

    def flush(self) -> None:
        pending = self.pending
        self.pending = []
        while pending:
            try:
                for conn in pending:
                    if conn.__class__ is MqttConnection:       # (not WsMqttConnection: it frames)
                        # MqttConnection.flush, written out (two per QoS 1 message at a steady rate)
                        ch = conn.channel
                        out = ch.out
                        transport = conn.transport
                        if out and transport is not None:
                            data = out[0] if len(out) == 1 else b"".join(out)
                            out.clear()
                            ch.bytes_out += len(data)
                            transport.write(data)
                            ch.pending = 0
                            if ch.blocked:
                                ch.flushed(conn.time())
                    else:
                        conn.flush()
            except Exception:
                # one connection's failure is its own: it is closed, and the others of the round are
                # written (they are not woken again while their output waits)
                _write_failed(conn)
                pending = pending[pending.index(conn) + 1:]
                continue
            break
        if self.after is not None:
            self.after()


def _write_failed(conn) -> None:
    log.exception("writing to %s failed: its connection is closed", getattr(conn.channel, "peer", "a client"))
    try:
        conn.channel.out.clear()
        if conn.transport is not None:
            conn.transport.abort()
    except Exception:
        log.exception("closing it failed too")


class TimeoutWheel:
    """When each connection's CONNECT timeout or keepalive is next looked at.

    Connections wait in slots of ``step`` seconds (the server's sweep) and
    the sweep looks only at those whose slot is due -- not at every
    connection every time: an idle client with keepalive 60 is looked at
    once in its 90 s, not 180 times (at 100,000 connections the sweep was
    a loop over all of them twice a second). Looked at, a connection says
    when to look next (``Channel.handle_timeout``). A connection that closed
    stays in its slot until then, unless too many have: past 1,024 and a
    quarter of those held, the slots are rebuilt without them."""

    __slots__ = ("step", "slots", "at", "held", "dead")

    def __init__(self, step: float, now: float):
        self.step = step
        self.slots: dict[int, list] = {}
        self.at = int(now / step)       # the last slot served
        self.held = 0                   # connections in the slots
        self.dead = 0                   # of which closed (at most: see gone)

    def add(self, conn, when: float) -> None:
        """Look at ``conn`` at the first sweep at or after ``when`` (the next one at the earliest)."""
        k = -int(-when // self.step)            # the first slot at or after ``when``
        if k <= self.at:
            k = self.at + 1
        slot = self.slots.get(k)
        if slot is None:
            self.slots[k] = [conn]
        else:
            slot.append(conn)
        self.held += 1

    def gone(self) -> None:
        """A connection closed (one not in the slots counts too: a rebuild comes a little sooner)."""
        self.dead += 1
        if self.dead > 1024 and 4 * self.dead > self.held:
            slots = {}
            held = 0
            for k, conns in self.slots.items():
                live = [c for c in conns if not c.closed]
                if live:
                    slots[k] = live
                    held += len(live)
            self.slots = slots
            self.held = held
            self.dead = 0

    def due(self, now: float) -> list:
        """The connections whose slot came, taken out of the wheel (closed ones included)."""
        end = int(now / self.step)
        slots = self.slots
        out: list = []
        for k in range(self.at + 1, end + 1):
            conns = slots.pop(k, None)
            if conns is not None:
                out += conns
        self.at = max(self.at, end)
        self.held -= len(out)
        return out

    def __len__(self) -> int:
        return self.held


DRAIN_SECONDS = 2.0            # a closed connection's input is read and dropped this long at most ...
DRAIN_BYTES = 4 * 1024 * 1024  # ... and this much: then the socket closes whatever the peer does


class _Drain(asyncio.Protocol):
    """What a connection becomes when the server closed it: its last bytes
    (a DISCONNECT, a refusing CONNACK) are on their way and our FIN follows
    them (``write_eof``); whatever the peer still sends is read and dropped
    until it closes too, DRAIN_SECONDS pass or DRAIN_BYTES arrive. Closing a
    socket with unread input makes the kernel answer with RST and drop what
    it had not sent yet -- the client would read a reset instead of the
    DISCONNECT (a client over its Receive Maximum whose PUBLISHes were still
    on the wire, one slow to read). The protocol it replaces hears
    ``connection_lost`` as before."""

    __slots__ = ("transport", "owner", "left", "timer")

    def __init__(self, transport, owner, loop):
        self.transport = transport
        self.owner = owner
        self.left = DRAIN_BYTES
        self.timer = loop.call_later(DRAIN_SECONDS, transport.close)

    def data_received(self, data: bytes) -> None:
        self.left -= len(data)
        if self.left < 0:
            self.transport.close()

    def eof_received(self):
        return False                   # the peer is done too: close now

    def connection_lost(self, exc) -> None:
        self.timer.cancel()
        self.owner.connection_lost(exc)


def close_gently(transport, owner, loop) -> None:
    """Close a connection whose last bytes must reach the peer: half-close and
    drain where the transport can (plain TCP), else close at once (TLS has no
    half-close). A connection closed with nothing to say (a CONNECT that never
    came, one over the pre-authentication budget) is closed at once."""
    if not transport.can_write_eof():
        transport.close()
        return
    try:
        transport.write_eof()
    except (OSError, RuntimeError):
        transport.close()
        return
    transport.set_protocol(_Drain(transport, owner, loop))
    transport.resume_reading()          # a paused connection (CONNECT pending, rate, budget) is drained too


class _Closed:
    """The hooks of a channel whose connection is gone: everything is a no-op."""

    def wake(self):
        pass

    def close(self):
        pass

    def pause_reading(self, why=0):
        pass

    def resume_reading(self, why=0):
        pass

    def throttle(self, wait):
        pass

    def throttle_output(self, wait):
        pass

    def flush_now(self):
        pass

    def end_turn(self):
        pass

    def peer_address(self):
        return ""


_CLOSED = _Closed()


class MqttConnection(asyncio.Protocol):
    # 8 slots: 96 bytes a connection (the listener, the flusher and ws_free were 3 more, 24 bytes)
    __slots__ = ("server", "transport", "channel", "time", "closed", "paused", "rate_timer", "fed")

    def __init__(self, server, listener):
        self.server = server
        self.transport = None
        self.time = server.flusher.time
        self.closed = False
        self.paused = 0
        self.rate_timer = None
        self.fed = -1 << 30            # the server's sweep in which a message of ours was last queued
        # the listener's URL: one string for all its connections
        self.channel = Channel(server.broker, server.limits, self, self.time(), None, sys.intern(listener.url))

    # ----------------------------------------------------------- asyncio side

    def connection_made(self, transport) -> None:
        self.transport = transport
        server = self.server
        ch = self.channel
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is not None:
            ch.cert = ssl_object.getpeercert(binary_form=True)
            if ch.cert:
                # the parsed form is only there when the certificate was verified
                for rdn in (ssl_object.getpeercert() or {}).get("subject", ()):
                    for key, value in rdn:
                        if key == "commonName":
                            ch.cert_cn = value
            # Paused (a turn ended, the rate, the budget, output held, a CONNECT being decided) a
            # TLS transport stops handing us data but goes on reading the socket into its own
            # buffer, up to 256 KiB -- and uvloop's drops that buffer when the peer's FIN comes: a
            # client that sent a burst, its DISCONNECT and closed lost the burst's end and had its
            # will published. Any byte held now stops the socket's reading, as over plain TCP (a
            # TLS record read in part is not held: OpenSSL takes it out of the buffer)
            transport.set_read_buffer_limits(high=1, low=0)
        server.connections.add(self)
        server.timeouts.add(self, ch.created_at + min(LOOK_AGAIN, server.limits.connect_timeout))
        transport.set_write_buffer_limits(high=server.write_high, low=server.write_high // 4)

    def data_received(self, data: bytes) -> None:
        pacer = self.server.pacer
        pacer.reading = self                 # whose PUBLISHes fill the queues, for the queue budget
        try:
            self.channel.receive_data(data, self.time())
        finally:
            pacer.reading = None
        if self.channel.congested:
            self.hold_output()

    def end_turn(self) -> None:
        """Not read again in this event-loop iteration (``TURN_BYTES``, the channel says): the other
        clients' turn."""
        if not self.paused & PAUSE_TURN and not self.closed:
            self.pause_reading(PAUSE_TURN)
            self.server.loop.call_soon(self.resume_reading, PAUSE_TURN)

    def flush_now(self) -> None:
        """Many answers wait in ``channel.out`` (a flood of tiny packets): written now, and the socket
        no longer read while the client does not read them (``Channel.OUT_AT_ONCE``)."""
        self.flush()
        if self.channel.congested:
            self.hold_output()

    def hold_output(self) -> None:
        """A congested connection that keeps sending: stop reading it while its answers are not read."""
        transport = self.transport
        if transport is not None and transport.get_write_buffer_size() > OUTPUT_HELD * self.server.write_high:
            self.pause_reading(PAUSE_OUTPUT)

    def eof_received(self):
        return False

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self.rate_timer is not None:
            self.rate_timer.cancel()
            self.rate_timer = None
        server = self.server
        server.connections.discard(self)
        server.timeouts.gone()
        ch = self.channel
        ch.out.clear()
        ch.connection_lost(self.time())
        reason = ch.close_reason
        if reason is not None and reason[0] >= 0x80 and ch.client_id:
            log.info("client %r (%s) disconnected: %s (0x%02x)", ch.client_id, ch.peer, reason[1], reason[0])
        self.transport = None
        # no reference cycle left behind: freed by reference counting, not the cyclic GC
        ch.hooks = _CLOSED

    def pause_writing(self) -> None:
        self.channel.set_congested(True, self.time())

    def resume_writing(self) -> None:
        self.channel.set_congested(False, self.time())
        self.resume_reading(PAUSE_OUTPUT)

    # ------------------------------------------------------- channel's hooks

    def wake(self) -> None:
        # Flusher.add, written out (twice per QoS 1 message: the PUBACK out, the PUBLISH out)
        flusher = self.server.flusher
        pending = flusher.pending
        if not pending:
            flusher.call_soon(flusher.flush)
        pending.append(self)

    def peer_address(self) -> str:
        """The client's "host:port", built when asked (auth throttle, logs): not kept per connection."""
        transport = self.transport
        peer = transport.get_extra_info("peername") if transport is not None else None
        return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer or "")

    def flush(self) -> None:
        ch = self.channel
        out = ch.out
        if not out or self.transport is None:
            return
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        ch.bytes_out += len(data)
        self.transport.write(data)             # (WsMqttConnection.flush frames it: write)
        ch.pending = 0
        if ch.blocked:
            ch.flushed(self.time())

    def write(self, data: bytes) -> None:
        self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            last_words = bool(self.channel.out)        # a DISCONNECT or a refusing CONNACK
            self.flush()
            self.closed = True
            if last_words:
                close_gently(self.transport, self, self.server.loop)
            else:
                self.transport.close()

    def pause_reading(self, why: int = PAUSE_CONNECT) -> None:
        was = self.paused
        self.paused = was | why
        if not was and self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume_reading(self, why: int = PAUSE_CONNECT) -> None:
        if not self.paused & why:
            return
        self.paused &= ~why
        if not self.paused and self.transport is not None and not self.closed:
            self.transport.resume_reading()
            # the time it was not read does not count against its keepalive (its pings waited unread)
            self.channel.last_rx = max(self.channel.last_rx, self.time())

    def throttle(self, wait: float) -> None:
        """Over the inbound rate: do not read this socket for ``wait`` seconds,
        then let the channel handle what waited."""
        if not self.paused & PAUSE_RATE:
            self.pause_reading(PAUSE_RATE)
        if self.rate_timer is None:
            self.rate_timer = self.server.loop.call_later(wait, self._rate_resume)

    def _rate_resume(self) -> None:
        self.rate_timer = None
        if self.closed:
            return
        server = self.server
        server.pacer.reading = self
        try:
            self.channel.resume_input(self.time())
        finally:
            server.pacer.reading = None
        if self.rate_timer is None:          # the channel did not have to wait again
            self.resume_reading(PAUSE_RATE)

    def throttle_output(self, wait: float) -> None:
        """Over the outbound rate: deliveries wait ``wait`` seconds."""
        self.server.loop.call_later(wait, self._resume_output)

    def _resume_output(self) -> None:
        if not self.closed:
            self.channel.resume_output(self.time())
