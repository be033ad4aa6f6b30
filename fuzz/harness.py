"""One fuzz input -> a FrameDecoder and a server-side Channel on a real Broker, with the invariants checked.

Shared by the atheris harness (``fuzz/fuzz_broker.py``) and the corpus replay
test (``tests/protocol/test_fuzz_corpus.py``); it imports nothing but brokerd.

Input format. A file starting with ``0x10`` (a CONNECT, as every capture in
``fuzz/corpus`` does) is a raw client->broker byte stream, fed in one piece.
Otherwise the first byte is a mode and the rest is the stream:

    bits 0-1  0: raw stream (the client's own CONNECT decides 3.1 / 3.1.1 / 5.0)
              1: a 3.1.1 CONNECT is sent first
              2: a 5.0 CONNECT is sent first (Topic Alias Maximum 2, Receive Maximum 3,
                 Maximum Packet Size 512)
              3: as 2, then SUBSCRIBE '#' at QoS 2 (the client gets its own messages back)
    bits 2-4  how the stream is cut into ``receive_data`` calls: whole, 1, 2, 3, 5, 8, 13 or 64 bytes
    bit 5     max packet size 128 instead of 4096
    bit 6     a second client publishes to 'fuzz/peer' (QoS 0, 1, 2 in turn) after every piece
    bit 7     the preluded CONNECT asks for a persistent session; after the stream the
              client reconnects to it (in-flight messages are sent again)

Invariants (any violation raises :class:`Violation`; any other exception is a
bug too, since the transport calls ``receive_data`` unguarded):

- the decoder raises nothing but ``RemoteProtocolError`` (and subclasses);
- the decoder never holds more than one maximum-size packet (plus a header);
- the channel's output is well-formed MQTT for its version: one CONNACK first,
  no DISCONNECT to a 3.x client, v5 DISCONNECT codes the spec allows a server,
  nothing larger than the client's Maximum Packet Size, and a v5 connection
  closed for an error carries that error's reason code;
- nothing is emitted after the channel asked the transport to close;
- outgoing QoS 1/2 in flight <= the window (the client's Receive Maximum);
  incoming (v5) <= our Receive Maximum;
- a stream the decoder rejects leaves the channel closed.
"""

from brokerd.broker import Broker, BrokerConfig
from brokerd.protocol import properties as P
from brokerd.protocol.channel import CLOSED, CONNECTED, DISCONNECT_CODES, Channel, ChannelLimits
from brokerd.protocol.codec import FrameDecoder, encode
from brokerd.protocol.errors import RemoteProtocolError
from brokerd.protocol.packets import (
    CONNACK,
    DISCONNECT,
    MQTT5,
    MQTT311,
    PUBLISH,
    SUBACK,
    UNSUBACK,
    Connect,
    Publish,
    Subscribe,
    SubscriptionRequest,
)

CHUNKS = (0, 1, 2, 3, 5, 8, 13, 64)
MAX_INFLIGHT = 4          # our Receive Maximum and the outgoing window cap
CLIENT_MAX_PACKET = 512   # the preluded v5 client's Maximum Packet Size
TICK = 0.01               # seconds of clock per piece fed


class Violation(AssertionError):
    """An invariant of the protocol core does not hold."""


class Transport:
    """The channel's hooks, doing what MqttConnection does: on close, flush ``out`` once, then nothing."""

    def __init__(self, name: str):
        self.name = name
        self.channel: Channel | None = None
        self.closed = False
        self.written = b""       # every byte 'written to the socket'
        self.after_close = b""   # bytes produced after close() (a violation)

    def wake(self):
        pass

    def close(self):
        if not self.closed:
            self.flush()
            self.closed = True

    def flush(self):
        ch = self.channel
        if not ch.out:
            return
        data = b"".join(ch.out)
        ch.out.clear()
        if self.closed:
            self.after_close += data
            return
        self.written += data
        ch.pending = 0

    def pause_reading(self, why=0):
        pass

    def resume_reading(self, why=0):
        pass

    def throttle(self, wait):
        pass

    def throttle_output(self, wait):
        pass


class Observer:
    """Decodes what the server wrote to one client, and checks each packet."""

    def __init__(self, transport: Transport):
        self.t = transport
        self.decoder = FrameDecoder()
        self.seen = 0
        self.packets: list = []
        self.connacks = 0
        # Outgoing QoS 1/2 messages resent on resuming a session: all of them go again, even
        # past a smaller Receive Maximum of the new connection ([MQTT-4.4.0-1], as Mosquitto
        # does); no new message joins them until the window has room.
        self.resumed: set[int] = set()

    def check(self):
        ch = self.t.channel
        if self.t.after_close:
            raise Violation(f"{self.t.name}: {len(self.t.after_close)} bytes emitted after close: "
                            f"{self.t.after_close[:40]!r}")
        data = self.t.written[self.seen:]
        self.seen = len(self.t.written)
        if not data:
            return
        if not self.packets and not self.decoder.buffered:
            # the refusal of an unsupported version is always in the 3.1.1 format
            self.decoder.version = ch.version if ch.version in (3, 4, 5) else MQTT311
        try:
            pkts = self.decoder.feed(data)
        except RemoteProtocolError as exc:
            raise Violation(f"{self.t.name}: server sent bytes a client cannot decode: {exc} in {data[:60]!r}")
        if self.decoder.error is not None:
            raise Violation(f"{self.t.name}: server sent bytes a client cannot decode: {self.decoder.error}")
        v5 = ch.version == MQTT5
        for p in pkts:
            if not self.packets and p.type != CONNACK:
                raise Violation(f"{self.t.name}: first packet sent is {p!r}, not a CONNACK")
            if p.type == CONNACK:
                self.connacks += 1
                if ch.session is not None:
                    self.resumed = set(ch.session.inflight)
                if self.connacks > 1:
                    raise Violation(f"{self.t.name}: a second CONNACK")
            elif p.type == DISCONNECT:
                if not v5:
                    raise Violation(f"{self.t.name}: DISCONNECT sent to a {ch.version} client")
                if p.reason_code not in DISCONNECT_CODES:
                    raise Violation(f"{self.t.name}: DISCONNECT with reason 0x{p.reason_code:02x}")
            elif p.type == PUBLISH and not p.topic and not (p.properties or {}).get(P.TOPIC_ALIAS):
                raise Violation(f"{self.t.name}: PUBLISH without topic or alias")
            self.packets.append(p)
        if v5 and len(data) > ch.client_max_packet:
            # Exact per-packet sizes only when it could matter. Not checked: a SUBACK or
            # UNSUBACK is sent even when it exceeds a (tiny) client Maximum Packet Size, as
            # Mosquitto 2.0 does, and so is a bare 5-byte refusal CONNACK.
            for b0, size in _frames(data):
                kind = b0 >> 4
                if size > ch.client_max_packet and kind not in (SUBACK, UNSUBACK) and (kind, size) != (CONNACK, 5):
                    raise Violation(f"{self.t.name}: sent a packet of {size} bytes (type {b0 >> 4}), "
                                    f"above the client's maximum of {ch.client_max_packet}")

    def final(self):
        """Once the connection is closed: the last word is the right one."""
        ch = self.t.channel
        if ch.version != MQTT5 or ch.close_reason is None or not self.packets:
            return
        code, why = ch.close_reason
        last = self.packets[-1]
        if code < 0x80 or why == "client disconnected":
            return
        if self.connacks and self.packets[0].reason_code >= 0x80:
            if self.packets[0].reason_code != code:
                raise Violation(f"{self.t.name}: refused with 0x{self.packets[0].reason_code:02x}, "
                                f"reason was 0x{code:02x} {why}")
            return
        if last.type != DISCONNECT:
            raise Violation(f"{self.t.name}: v5 connection closed for 0x{code:02x} {why!r} "
                            f"without a DISCONNECT (last sent: {last!r})")
        want = code if code in DISCONNECT_CODES else 0x82
        if last.reason_code != want:
            raise Violation(f"{self.t.name}: DISCONNECT 0x{last.reason_code:02x}, reason was 0x{code:02x} {why}")


def _frames(data: bytes):
    """(first byte, total size) of each complete packet in ``data``."""
    pos, n = 0, len(data)
    while pos + 2 <= n:
        rl, shift, i = 0, 0, pos + 1
        while True:
            b = data[i]
            i += 1
            rl |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        yield data[pos], i - pos + rl
        pos = i + rl


def _prelude(kind: int, persistent: bool) -> bytes:
    if kind == 1:
        return encode(Connect("fz", clean_start=not persistent, keepalive=30, protocol_level=MQTT311))
    props = {P.TOPIC_ALIAS_MAXIMUM: 2, P.RECEIVE_MAXIMUM: 3, P.MAXIMUM_PACKET_SIZE: CLIENT_MAX_PACKET}
    if persistent:
        props[P.SESSION_EXPIRY_INTERVAL] = 300
    data = encode(Connect("fz", clean_start=not persistent, keepalive=30, protocol_level=MQTT5,
                          properties=props))
    if kind == 3:
        data += encode(Subscribe(1, [SubscriptionRequest("#", 2)]), MQTT5)
    return data


def _pieces(data: bytes, size: int):
    if not size:
        return [data] if data else []
    return [data[i:i + size] for i in range(0, len(data), size)]


class Run:
    def __init__(self, max_packet_size: int):
        self.now = 1000.0
        self.limits = ChannelLimits(max_packet_size=max_packet_size, max_inflight=MAX_INFLIGHT,
                                    topic_alias_maximum=4, max_queued=16, connect_timeout=10.0)
        self.broker = Broker(BrokerConfig(allow_anonymous=True, limits=self.limits), now=self.now)
        self.peer = None
        self.peer_pid = 0

    def channel(self, name: str) -> tuple[Channel, Transport, Observer]:
        t = Transport(name)
        ch = Channel(self.broker, self.limits, t, now=self.now, peer="127.0.0.1:1")
        t.channel = ch
        return ch, t, Observer(t)

    def connect_peer(self):
        ch, t, obs = self.channel("peer")
        ch.receive_data(encode(Connect("peer", protocol_level=MQTT311)), self.now)
        t.flush()
        self.peer = (ch, t, obs)

    def peer_publish(self, n: int):
        ch, t, obs = self.peer
        if ch.state != CONNECTED:
            return
        qos = n % 3
        if qos:
            self.peer_pid = self.peer_pid % 65535 + 1
        ch.receive_data(encode(Publish("fuzz/peer", b"p%d" % n, qos, False, False, self.peer_pid if qos else 0)),
                        self.now)
        if qos == 2:
            ch.receive_data(bytes((0x62, 2, self.peer_pid >> 8, self.peer_pid & 0xFF)), self.now)
        t.flush()
        obs.check()


def check_window(ch: Channel, limits: ChannelLimits, resumed=()):
    s = ch.session
    if s is None or ch.state == CLOSED:
        return
    if len(s.inflight) > max(ch.send_window, len(s.inflight.keys() & resumed)):
        raise Violation(f"{len(s.inflight)} outgoing messages in flight, window {ch.send_window}")
    if len(s.queue) > limits.max_queued:
        raise Violation(f"{len(s.queue)} messages queued, max_queued {limits.max_queued}")
    if ch.version == MQTT5 and ch.inbound_pending + len(s.awaiting_rel) > limits.max_inflight:
        raise Violation(f"{ch.inbound_pending + len(s.awaiting_rel)} incoming QoS 1/2 messages pending, "
                        f"Receive Maximum {limits.max_inflight}")


def feed_channel(run: Run, ch: Channel, t: Transport, obs: Observer, pieces, peer: bool) -> None:
    limits = run.limits
    bound = max(limits.max_packet_size, 5)
    for n, piece in enumerate(pieces):
        ch.receive_data(piece, run.now)       # the transport does not catch anything
        if ch.decoder.buffered >= bound:
            raise Violation(f"decoder holds {ch.decoder.buffered} bytes, max packet size {limits.max_packet_size}")
        t.flush()
        if ch.blocked and ch.state == CONNECTED:
            ch.flushed(run.now)
            t.flush()
        obs.check()
        check_window(ch, limits, obs.resumed)
        if peer:
            run.peer_publish(n)
            t.flush()
            obs.check()
            check_window(ch, limits, obs.resumed)
        run.now += TICK
        ch.handle_timeout(run.now)
        run.broker.tick(run.now)
        t.flush()
        obs.check()


def decoder_verdict(pieces, max_packet_size: int) -> RemoteProtocolError | None:
    """Feed the pieces to a bare FrameDecoder: its error, if the stream is bad (or None)."""
    dec = FrameDecoder(max_packet_size)
    bound = max(max_packet_size, 5)
    for piece in pieces:
        try:
            dec.feed(piece)
        except RemoteProtocolError as exc:
            return exc
        if dec.error is not None:
            return dec.error
        if dec.buffered >= bound:
            raise Violation(f"decoder holds {dec.buffered} bytes, max packet size {max_packet_size}")
    return None


def run_one(data: bytes) -> None:
    """The fuzz target: raises on any invariant violation or unexpected exception."""
    if not data:
        return
    if data[0] == 0x10:
        mode, stream = 0, data
    else:
        mode, stream = data[0], data[1:]
    kind = mode & 3
    persistent = bool(mode & 0x80) and kind != 0
    max_packet = 128 if mode & 0x20 else 4096
    peer = bool(mode & 0x40)
    pieces = _pieces(stream, CHUNKS[(mode >> 2) & 7])
    if kind:
        pieces.insert(0, _prelude(kind, persistent))

    verdict = decoder_verdict(pieces, max_packet)

    run = Run(max_packet)
    if peer:
        run.connect_peer()
    ch, t, obs = run.channel("client")
    feed_channel(run, ch, t, obs, pieces, peer)
    if verdict is not None and ch.state != CLOSED:
        raise Violation(f"decoder rejects the stream ({verdict!r}) but the channel is still open")
    # more bytes after close: ignored, nothing emitted
    if ch.state == CLOSED:
        ch.receive_data(b"\xc0\x00", run.now)
        t.flush()
        obs.check()
        obs.final()
    ch.connection_lost(run.now)
    t.flush()
    obs.check()

    if persistent:
        ch2, t2, obs2 = run.channel("client-again")
        feed_channel(run, ch2, t2, obs2, [_prelude(kind if kind != 3 else 2, True)], peer)
        ch2.connection_lost(run.now)
        t2.flush()
        obs2.check()
    if run.peer is not None:
        run.peer[0].connection_lost(run.now)
