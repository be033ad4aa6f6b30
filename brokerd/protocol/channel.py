"""The per-connection MQTT state machine (sans-IO), after EMQX's emqx_channel.

A :class:`Channel` is fed bytes with ``receive_data(data, now)`` and produces
bytes in ``channel.out`` (a list the transport joins and writes once per
event-loop iteration). It never touches a socket, a clock or a task: time is
passed in, and the few things only the transport can do are asked of the
``hooks`` object:

- ``hooks.wake()``: ``out`` went from empty to non-empty, flush it soon;
- ``hooks.close()``: flush ``out``, then close the connection;
- ``hooks.pause_reading()`` / ``hooks.resume_reading()``.

Decisions that need the rest of the broker (authentication, the session,
routing, subscriptions, durability, node-wide budgets) go to ``broker``, an
object with synchronous methods declared in :class:`brokerd.protocol.ports.ChannelBroker`
-- exactly what a channel uses, nothing else (``brokerd.broker.Broker``
implements it). The broker answers a CONNECT by calling ``accept`` or
``refuse`` -- possibly later, in which case packets that follow the CONNECT
wait, and reading is paused. The outgoing QoS 1/2 flows (the inflight
window, packet ids, PUBACK/PUBREC/PUBCOMP) are the session's
(:class:`brokerd.session.session.Session`): the channel moves bytes and asks it.
"""

from collections import deque
from dataclasses import dataclass
from functools import partial
from math import ceil
from struct import Struct

from ..session.session import AWAIT_ACK, NO_IDS, NO_INFLIGHT, Delivery, new_delivery
from . import properties as P
from . import reason as rc
from .codec import (
    MAX_PACKET_SIZE,
    MAX_TOPIC_LEVELS,
    FrameDecoder,
    UnsupportedProtocolVersion,
    encode,
    encode_ack,
    encode_properties,
    publish_head,
    too_deep,
)
from .errors import MalformedPacket, ProtocolError, RemoteProtocolError
from .packets import (
    AUTH,
    CONNECT,
    DISCONNECT,
    MQTT5,
    MQTT31,
    PINGREQ,
    PUBACK,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    SUBSCRIBE,
    UNSUBSCRIBE,
    Connack,
    Connect,
    Disconnect,
    Publish,
    Suback,
    Unsuback,
    publish_q1,
)
from .ports import ChannelBroker, TransportHooks
from .properties import NEVER
from .reason import AFTER_COMMIT, STORE_UNAVAILABLE

# channel states
NEW, CONNECTING, CONNECTED, CLOSED = 0, 1, 2, 3

# a client over its inbound rate for this long is disconnected (0x96)
ABUSE_SECONDS = 10.0

# The loop may hand a connection many reads before its flush (uvloop reads a socket up to 32 times,
# 256 KB each, per wake-up): a flood of tiny packets -- PINGREQs, QoS 1 PUBLISHes, each answered --
# piled up millions of answers in ``out`` between two flushes (one connection took the node from
# 40 MB to 390 MB for a moment). Past OUT_AT_ONCE after a read they are written at once
# (``hooks.flush_now``), and the transport's bound on what the client leaves unread applies read by
# read -- whichever way the read's packets went: the fast way, a rate-limited client's (a PINGREQ is
# no message: the limit does not slow it), the packets held during the CONNECT. (Only a read of several
# packets can get there: one PUBLISH or PUBACK alone is not checked.)
OUT_AT_ONCE = 4096
# libuv reads a socket up to 32 times in one event-loop iteration, 256 KiB each, while it has data: one
# client sending tiny packets as fast as it could had 8 MiB handled -- ~500,000 QoS 1 PUBLISHes, each
# answered -- before any other client was served, which waited 2.6 s on an idle node. A read this big
# ends the connection's turn (``hooks.end_turn``): the others are served before it is read again.
TURN_BYTES = 64 * 1024

# A channel not connected yet asks (handle_timeout) to be looked at again within this many seconds:
# once connected, its keepalive says when (at least 1.5 s after its CONNECT, keepalive 1 being the least).
LOOK_AGAIN = 1.0

_PINGRESP = b"\xd0\x00"
_puback_bytes = Struct(">HH").pack      # (0x4002, pid): a 3.x / 5.0 success PUBACK, one C call
_pid_bytes = Struct(">H").pack

# the QoS 1/2 counters of a channel that has sent (or received) none: shared, a list on first use
_ZEROS = (0, 0, 0)


# Fields most connections never change, kept out of the Channel's slots (8 bytes each on every
# connection): read through a descriptor that gives the default until the first other value is
# set, which makes the connection its own _Rare object. None of them is read per message on the
# plain publish and delivery paths.
_RARE = {
    "valid_until": None,        # wall clock at which its credential expires
    "cert": None,               # DER client certificate on a TLS listener, if any
    "cert_cn": None,            # its subject CN when it was verified
    "client_alias_max": 0,      # Topic Alias Maximum the v5 client allows us
    "problem_info": True,       # v5 Request Problem Information
    "response_requested": False,  # v5 Request Response Information
    "paced": 0,                 # times its input was paused because its messages filled the queue budget
    "_preauth": 0,              # bytes of an incomplete CONNECT charged to the node's pre-auth budget
    "alias_bytes": 0,           # topic characters behind out_aliases
    "expiry_lowered": False,    # v5: the CONNACK lowered the Session Expiry Interval its CONNECT asked for
    "retained_feed": None,      # [[topic filter, iterator]]: retained messages new subscriptions are still owed
}


class _Rare:
    __slots__ = tuple(_RARE)

    def __init__(self):
        for name, default in _RARE.items():
            setattr(self, name, default)


class _RareField:
    __slots__ = ("name", "default")

    def __init__(self, name: str):
        self.name = name
        self.default = _RARE[name]

    def __get__(self, ch, owner=None):
        if ch is None:
            return self
        rare = ch._rare
        return self.default if rare is None else getattr(rare, self.name)

    def __set__(self, ch, value) -> None:
        rare = ch._rare
        if rare is None:
            if value is self.default or (value.__class__ is self.default.__class__ and value == self.default):
                return
            rare = ch._rare = _Rare()
        setattr(rare, self.name, value)

# Reason codes a server may put in DISCONNECT (MQTT 5.0 section 3.14.2.1); a
# peer error with any other code is reported as 0x82 Protocol Error.
DISCONNECT_CODES = frozenset({
    0x00, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F, 0x90, 0x93, 0x94, 0x95, 0x96, 0x97, 0x98,
    0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9E, 0x9F, 0xA0, 0xA1, 0xA2,
})


def _bad_message_property(props: dict) -> str | None:
    """What makes a message's properties (a PUBLISH's, a will's) a Protocol Error, else None. They
    are forwarded as they are, and a server must not send a Response Topic with a wildcard
    ([MQTT-3.3.2-14]) nor a Payload Format Indicator other than 0 or 1 (3.3.2.3.2); Mosquitto and
    EMQX refuse both the same way."""
    pfi = props.get(P.PAYLOAD_FORMAT_INDICATOR)
    if pfi is not None and pfi > 1:
        return f"Payload Format Indicator {pfi} (0 or 1)"
    topic = props.get(P.RESPONSE_TOPIC)
    if topic is not None and ("+" in topic or "#" in topic):
        return f"wildcard in the Response Topic {topic[:100]!r}"
    return None


@dataclass(slots=True)
class ChannelLimits:
    """Server-side limits a channel enforces and advertises."""

    max_packet_size: int = 1024 * 1024
    max_keepalive: int = 3600
    max_inflight: int = 32             # outgoing window cap, and Receive Maximum sent to v5 clients
    max_queued: int = 1000             # per-session queue length
    max_queued_bytes: int = 0          # per-session queue payload bytes (0 = no byte bound)
    topic_alias_maximum: int = 64      # aliases a v5 client may set towards us
    connect_timeout: float = 10.0      # seconds a socket may stay open without a CONNECT
    max_session_expiry: int = NEVER    # cap on the Session Expiry Interval a client asks for
    response_information: str = ""     # prefix sent as Response Information (v5) when asked; "" = none
    queue_qos0: bool = True            # queue QoS 0 messages for offline persistent sessions
    max_pending: int = 64 * 1024       # bytes of output per event-loop iteration before deliveries queue
    max_connect_size: int = 64 * 1024  # largest CONNECT accepted (will included): it comes before authentication
    preauth_budget: int = 16 * 1024 * 1024   # node-wide bytes of incomplete CONNECTs held (PreauthBudget)
    max_alias_bytes: int = 64 * 1024   # topic characters behind the aliases we set towards one client


class Channel:
    __slots__ = (
        "broker", "limits", "hooks", "_peer", "listener", "decoder", "out", "state", "version",
        "client_id", "username", "session", "ns", "will", "keepalive", "created_at", "last_rx",
        "connected_at", "in_aliases", "out_aliases", "client_max_packet",
        "send_window", "congested", "blocked", "pending", "max_pending", "inbound_pending", "_acks", "_held", "_stored",
        "close_reason",
        "msgs_in", "msgs_out", "bytes_in", "bytes_out", "qos_in", "qos_out", "tenant", "identity",
        "acl", "quota", "limit_in", "limit_out", "throttled_since", "shaping",
        "_rate_held", "_rare", "_last_pub",
        "__weakref__",
    )

    def __init__(self, broker: ChannelBroker, limits: ChannelLimits, hooks: TransportHooks, now: float = 0.0,
                 peer: str | None = "", listener: str = ""):
        self.broker = broker
        self.limits = limits
        self.hooks = hooks
        self._peer = peer               # None: asked of the transport when needed (hooks.peer_address)
        self.listener = listener
        self.decoder = FrameDecoder(limits.max_packet_size, max_connect_size=limits.max_connect_size)
        self.out: list[bytes] = []
        self.state = NEW
        self.version = 0
        self.client_id = ""
        self.username = None
        self.session = None
        self.ns = None                  # namespace (tenant) assigned by the broker on accept
        self.tenant = None
        self.identity = None            # what authentication established (broker-defined)
        self.acl = None                 # the client's ACL (None: everything allowed)
        self.quota = None               # its tenant's quota (dict) or None
        self.limit_in = None            # inbound rate limiter (msgs and bytes per second)
        self.limit_out = None           # outbound rate limiter
        self.throttled_since = None     # inbound over its rate since (abuse detection)
        self.shaping = False            # outbound over its rate: deliveries wait
        self._rare = None               # the fields of _RARE, once one differs from its default
        self._rate_held = None          # packets waiting for the inbound rate limit
        self._last_pub = None           # (length, bytes up to the packet id, their length, topic) of the
                                        # last QoS 1 PUBLISH read alone: a steady publisher's next is alike
        self.will = None
        self.keepalive = 0
        self.created_at = now
        self.last_rx = now
        self.connected_at = None
        self.in_aliases: dict[int, str] | None = None   # made by the client's first Topic Alias
        self.out_aliases: dict[str, int] | None = None
        self.client_max_packet = MAX_PACKET_SIZE
        self.send_window = limits.max_inflight
        self.congested = False          # the transport's write buffer is above its high mark
        self.blocked = False            # deliveries must queue: congested, or the queue is not empty
        self.pending = 0                # bytes added to ``out`` since the transport last wrote it
        self.max_pending = limits.max_pending
        self.inbound_pending = 0        # PUBACKs and PUBCOMPs waiting in _acks (our Receive Maximum)
        self._acks = None               # acks to the client waiting for the store, in arrival order
        self._held = None               # packets received while the broker decides on the CONNECT
        self._stored = None             # stored deliveries sent straight after their commit (queue_delivery)
        self.close_reason: tuple[int, str] | None = None
        self.msgs_in = 0
        self.msgs_out = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.qos_in = _ZEROS            # PUBLISHes at QoS 1 and 2 (index 0 unused: QoS 0 = msgs - the others);
        self.qos_out = _ZEROS           # a list from the first (an idle connection shares _ZEROS)

    def __repr__(self):
        return f"<Channel {self.client_id!r} {self.peer} state={self.state}>"

    @property
    def peer(self) -> str:
        """The client's address ("host:port"): built when asked, not kept on every connection."""
        peer = self._peer
        return self.hooks.peer_address() if peer is None else peer

    @peer.setter
    def peer(self, value: str) -> None:
        self._peer = value

    # ------------------------------------------------------------------ input

    def receive_data(self, data: bytes, now: float) -> None:
        self.bytes_in += len(data)
        state = self.state
        if state != CONNECTED:
            if state == NEW:
                self._receive_before_connect(data, now)
                return
            if state == CLOSED:
                return
        elif self.limit_in is None and self._held is None and not self.decoder._buf:
            n = len(data)
            last = self._last_pub
            if last is not None and last[0] == n and data[:last[2]] == last[1]:
                # One QoS 1 PUBLISH with the fixed header and topic of this client's last one (a
                # publisher at a steady rate sends the same), alone in its read: its topic was
                # decoded and checked then
                topic = last[3]
            elif n == 4 and data[0] == 0x40 and data[1] == 2:
                # One PUBACK, alone in its read (a subscriber at a steady rate): acknowledged
                # here, without a packet object -- unless the decoder holds an error, or the
                # packet id is 0 (the decoder's error). (_puback and Session.puback, written out.)
                pid = (data[2] << 8) | data[3]
                if pid and self.decoder.error is None:
                    self.last_rx = now
                    session = self.session
                    inflight = session.inflight
                    d = inflight.get(pid)
                    if d is not None and d.qos == 1:
                        del inflight[pid]
                        if d.entry:
                            self.broker.acked(session, d)
                        if self.broker.rules:
                            self.broker.message_acked(self, d, now)
                        queue = session.queue
                        if queue._q0 or queue._q12 or self._stored:
                            self._pump(now)
                    return
                topic = None
            elif n > 6 and data[0] == 0x32:
                # One QoS 1 PUBLISH (no DUP, no retain; 5.0: no properties), alone in its
                # read (a publisher at a steady rate): decoded here, without the decoder's
                # loop and list. Anything it would refuse, or not decode alike, goes to it.
                topic = None
                b = data[1]
                if b < 0x80:
                    s, end = 2, 2 + b
                elif 0 < data[2] < 0x80:            # 2 bytes of length, in their shortest form
                    s, end = 3, 3 + ((b & 0x7F) | (data[2] << 7))
                else:
                    s, end = 3, 0
                i = s + 2 + ((data[s] << 8) | data[s + 1])         # the packet id's offset
                if end == n and i + 2 <= n and n <= self.decoder.max_packet_size:
                    try:
                        topic = data[s + 2:i].decode("utf-8")
                    except UnicodeDecodeError:
                        topic = None
                    # a topic the decoder or _on_publish would refuse goes to them
                    if topic and ("\x00" in topic or "+" in topic or "#" in topic):
                        topic = None
                    if topic:
                        # head31: a 3.x PUBLISH as received up to its packet id, what 3.x subscribers get
                        head = data[:i]
                        last = self._last_pub = (n, head, i, topic, None if self.version == MQTT5 else head)
                        if self.qos_in is _ZEROS:
                            self.qos_in = [0, 0, 0]
                    else:
                        topic = None
            else:
                topic = None
            if topic is not None:
                i = last[2]
                pid = (data[i] << 8) | data[i + 1]
                head31 = last[4]
                j = i + 2
                if head31 is None:                      # 5.0: a property length of 0
                    j = i + 3 if j < n and not data[j] else n + 1
                if pid and j <= n and self.decoder.error is None:
                    self.last_rx = now
                    p = publish_q1(topic, data[j:], pid, head31)
                    # _on_publish for a QoS 1 PUBLISH without properties, its topic checked above
                    self.msgs_in += 1
                    self.qos_in[1] += 1                 # (a list since the PUBLISH that made ``last``)
                    try:
                        if (head31 is None       # 5.0: Receive Maximum
                                and self.inbound_pending + len(self.session.awaiting_rel) >= self.limits.max_inflight):
                            raise RemoteProtocolError("Receive Maximum exceeded", rc.RECEIVE_MAXIMUM_EXCEEDED)
                        code = self.broker.publish(p, self, now)
                        if code == 0 and not self._acks:
                            out = self.out
                            if not out:
                                self.hooks.wake()
                            out.append(_puback_bytes(0x4002, pid))
                        else:
                            self._answer_q1(p, code)
                    except RemoteProtocolError as exc:
                        self._peer_error(exc, now)
                    return
        try:
            pkts = self.decoder.feed(data)
        except RemoteProtocolError as exc:
            self._peer_error(exc, now)
            return
        if len(data) >= TURN_BYTES:          # (here, not on the one-packet paths above: their reads are small)
            self.hooks.end_turn()
        if pkts:
            # Keep Alive counts Control Packets, not bytes: a packet trickled in a byte at a
            # time does not keep a connection alive (MQTT 3.1.1 / 5.0 section 3.1.2.10)
            self.last_rx = now
        if self.limit_in is not None and self.state == CONNECTED:
            self._run_limited(pkts, now)
            if len(self.out) > OUT_AT_ONCE and self.state == CONNECTED:
                self.hooks.flush_now()
            return
        if self.state == CONNECTED and self._held is None:
            try:
                for pkt in pkts:
                    if pkt.type == PUBLISH:
                        self._on_publish(pkt, now)
                    else:
                        _HANDLERS[pkt.type](self, pkt, now)
                    if self.state != CONNECTED:
                        return
                if self.decoder.error is not None:
                    raise self.decoder.error
            except RemoteProtocolError as exc:
                self._peer_error(exc, now)
                return
            if len(self.out) > OUT_AT_ONCE:
                self.hooks.flush_now()
            return
        self._process(pkts, now)
        if len(self.out) > OUT_AT_ONCE and self.state == CONNECTED:
            self.hooks.flush_now()          # (the packets held while the CONNECT was decided, and after them)

    # Before its CONNECT the peer is not authenticated, and what it may cost is
    # bounded: an address the broker refuses before any decoding (the failed-
    # login throttle) is answered from the first bytes; a CONNECT larger than
    # ``limits.max_connect_size`` is refused from its fixed header (the
    # decoder; v5: CONNACK 0x95); and the bytes of incomplete CONNECTs held by
    # all the node's connections are bounded by the broker's PreauthBudget:
    # the connection whose bytes would pass it is closed (a CONNECT that
    # arrives whole in one read is never held, so only partial ones count).

    def _receive_before_connect(self, data: bytes, now: float) -> None:
        decoder = self.decoder
        refusal = self.broker.admit(self, now)
        if refusal is not None:
            self.version = decoder.peek_connect_level(data)    # the refusal's format; 0: plain close
            self._preauth_release()
            self.refuse(*refusal)
            return
        try:
            pkts = decoder.feed(data)
        except RemoteProtocolError as exc:
            self._preauth_release()
            self._peer_error(exc, now)
            return
        if pkts:
            self.last_rx = now
            self._process(pkts, now)
        held = decoder.buffered if self.state == NEW else 0
        before = self._preauth
        if held == before:
            return
        self._preauth = held
        if not self.broker.preauth_charge(held - before):
            self._preauth_release()
            self.close_reason = (rc.SERVER_BUSY, "the node holds too many unauthenticated bytes")
            self.state = CLOSED
            self.hooks.close()

    def _preauth_release(self) -> None:
        if self._preauth:
            self.broker.preauth_charge(-self._preauth)
            self._preauth = 0

    # A client over its inbound rate is slowed before anything is dropped: the
    # PUBLISH that empties its bucket is handled, the packets after it wait
    # (with its socket unread) until the bucket allows again; a client still
    # over its rate after ABUSE_SECONDS is disconnected (v5: 0x96).

    def _run_limited(self, pkts: list, now: float) -> None:
        limit = self.limit_in
        wait = 0.0
        try:
            for i, pkt in enumerate(pkts):
                if self.state != CONNECTED:
                    return
                if pkt.type == PUBLISH:
                    if i == 0 and self.throttled_since is None:
                        # a new connection of a client id still owing (its buckets outlive its
                        # connections): its first PUBLISH waits too
                        wait = limit.owing(now)
                        if wait > 0:
                            self._rate_held = pkts
                            break
                    self._on_publish(pkt, now)
                    wait = limit.charge(1, len(pkt.payload) + len(pkt.topic), now)
                    if wait > 0 and i + 1 < len(pkts):
                        self._rate_held = pkts[i + 1:]
                        break
                else:
                    _HANDLERS[pkt.type](self, pkt, now)
            else:
                if self.decoder.error is not None and self.state == CONNECTED:
                    raise self.decoder.error
        except RemoteProtocolError as exc:
            self._peer_error(exc, now)
            return
        if self.state != CONNECTED:
            return
        if wait <= 0:
            self.throttled_since = None
            return
        if self.throttled_since is None:
            self.throttled_since = now
        elif now - self.throttled_since > ABUSE_SECONDS:
            self._rate_held = None
            self.disconnect(rc.MESSAGE_RATE_TOO_HIGH, "publishing above the tenant's rate limit", now)
            return
        self.hooks.throttle(wait)

    def resume_input(self, now: float) -> None:
        """The rate limiter's wait is over: handle the packets that waited."""
        held, self._rate_held = self._rate_held, None
        if held and self.state == CONNECTED:
            self._run_limited(held, now)
            if len(self.out) > OUT_AT_ONCE and self.state == CONNECTED:
                self.hooks.flush_now()

    def _process(self, pkts, now):
        try:
            for i, pkt in enumerate(pkts):
                state = self.state
                if state == CONNECTED:
                    if pkt.type == PUBLISH:
                        self._on_publish(pkt, now)
                    else:
                        _HANDLERS[pkt.type](self, pkt, now)
                elif state == NEW:
                    if pkt.type != CONNECT:
                        raise RemoteProtocolError("the first packet must be CONNECT")
                    self._on_connect(pkt, now)
                elif state == CONNECTING:
                    held = pkts[i:]
                    if self._held is None:
                        self._held = held
                        self.hooks.pause_reading()
                    else:
                        self._held.extend(held)
                    return
                else:
                    return
            if self.decoder.error is not None and self.state != CLOSED:
                raise self.decoder.error
        except RemoteProtocolError as exc:
            self._peer_error(exc, now)

    # -------------------------------------------------------------- handshake

    def _on_connect(self, p: Connect, now: float) -> None:
        self.version = v = p.protocol_level
        self.client_id = p.client_id
        self.username = p.username
        limits = self.limits
        props = p.properties or {}
        self.state = CONNECTING
        if v == MQTT5:
            # known first, so that even a refusal respects it
            self.client_max_packet = props.get(P.MAXIMUM_PACKET_SIZE) or MAX_PACKET_SIZE
            if props.get(P.RECEIVE_MAXIMUM, 1) == 0:
                raise RemoteProtocolError("Receive Maximum of 0")
            if props.get(P.MAXIMUM_PACKET_SIZE, 1) == 0:
                raise RemoteProtocolError("Maximum Packet Size of 0")
            if props.get(P.REQUEST_PROBLEM_INFORMATION, 0) > 1 or props.get(P.REQUEST_RESPONSE_INFORMATION, 0) > 1:
                raise RemoteProtocolError("Request Problem/Response Information must be 0 or 1")
            self.send_window = min(props.get(P.RECEIVE_MAXIMUM, 65535), limits.max_inflight)
            self.client_alias_max = props.get(P.TOPIC_ALIAS_MAXIMUM, 0)
            self.problem_info = props.get(P.REQUEST_PROBLEM_INFORMATION, 1) == 1
            self.response_requested = props.get(P.REQUEST_RESPONSE_INFORMATION, 0) == 1
            if P.AUTHENTICATION_METHOD in props:
                return self.refuse(rc.BAD_AUTHENTICATION_METHOD, "enhanced authentication is not supported")
        # client identifier
        if not p.client_id:
            if v == MQTT31 or (v != MQTT5 and not p.clean_start):
                return self.refuse(rc.CLIENT_IDENTIFIER_NOT_VALID, "a client identifier is required")
        elif v == MQTT31 and len(p.client_id) > 23:
            return self.refuse(rc.CLIENT_IDENTIFIER_NOT_VALID, "MQTT 3.1 client identifiers are 1-23 characters")
        # keepalive
        ka = p.keepalive
        if limits.max_keepalive and ka > limits.max_keepalive and v != MQTT5:
            return self.refuse(rc.CLIENT_IDENTIFIER_NOT_VALID, "keepalive above the server maximum")
        # will
        will = p.will
        if will is not None:
            if not will.topic or "+" in will.topic or "#" in will.topic or too_deep(will.topic):
                if v != MQTT5:
                    raise RemoteProtocolError("invalid will topic")
                return self.refuse(rc.TOPIC_NAME_INVALID, "invalid will topic")
            bad = _bad_message_property(will.properties) if will.properties else None
            if bad is not None:
                return self.refuse(rc.PROTOCOL_ERROR, "will: " + bad)
            if will.properties and will.properties.get(P.PAYLOAD_FORMAT_INDICATOR) == 1:
                try:
                    will.payload.decode("utf-8")
                except UnicodeDecodeError:
                    return self.refuse(rc.PAYLOAD_FORMAT_INVALID, "will payload is not UTF-8")
        self.will = will
        self.keepalive = ka
        self.broker.connect(self, p, now)

    def accept(self, session, session_present: bool, now: float, assigned_client_id: str | None = None,
               properties: dict | None = None) -> None:
        """Called by the broker: the CONNECT is accepted into ``session``."""
        if self.state != CONNECTING:
            return
        self.session = session
        self.ns = session.ns
        session.channel = self
        session.queue.attach_budget(session.budget)
        self.connected_at = now
        self.created_at = now          # (read only before the CONNECT: one float object, not two, from now on)
        self.state = CONNECTED
        if assigned_client_id:
            self.client_id = assigned_client_id
        if self.version == MQTT5:
            limits = self.limits
            props = dict(properties) if properties else {}
            if assigned_client_id:
                props[P.ASSIGNED_CLIENT_IDENTIFIER] = assigned_client_id
            if limits.max_inflight < 65535:
                props[P.RECEIVE_MAXIMUM] = limits.max_inflight
            if limits.topic_alias_maximum:
                props[P.TOPIC_ALIAS_MAXIMUM] = limits.topic_alias_maximum
            if limits.max_packet_size < MAX_PACKET_SIZE:
                props[P.MAXIMUM_PACKET_SIZE] = limits.max_packet_size
            if limits.max_keepalive and (self.keepalive == 0 or self.keepalive > limits.max_keepalive):
                self.keepalive = limits.max_keepalive
                props[P.SERVER_KEEP_ALIVE] = limits.max_keepalive
            if session.expiry_interval > limits.max_session_expiry:
                session.expiry_interval = limits.max_session_expiry
                props[P.SESSION_EXPIRY_INTERVAL] = limits.max_session_expiry
            if P.SESSION_EXPIRY_INTERVAL in props:
                # lowered (here or by the tenant's quota): the CONNECT's was not 0, even if this is
                self.expiry_lowered = True
            if limits.response_information and self.response_requested:
                props[P.RESPONSE_INFORMATION] = limits.response_information + self.client_id
            if self.client_alias_max:
                self.out_aliases = {}
            data = encode(Connack(session_present, rc.SUCCESS, props or None), MQTT5)
            if len(data) > self.client_max_packet:
                # [MQTT-3.1.2-24]: never send more than the client's Maximum Packet Size,
                # not even the CONNACK; like Mosquitto, close without it
                self.close_reason = (rc.PACKET_TOO_LARGE, "CONNACK above the client's Maximum Packet Size")
                self._close(now, True)
                return
            self._send(data)
        else:
            # MQTT 3.1 has no session-present flag: the byte is reserved
            self._send(encode(Connack(session_present and self.version != MQTT31, 0), self.version))
        # resume the session: unacknowledged deliveries first, then the queue
        if session.inflight:
            inflight = session.inflight
            # [MQTT-4.9.0-2]: no more unacknowledged PUBLISHes than this connection's Receive
            # Maximum, QoS 2 ones whose PUBREL is owed included: those past it wait at the head of
            # the queue, with their packet id (reserved) and DUP, sent as the window frees
            room = self.send_window - sum(1 for d in inflight.values() if d.state != AWAIT_ACK)
            later = None
            for d in list(inflight.values()):
                if d.state == AWAIT_ACK:
                    if room <= 0:
                        del inflight[d.pid]
                        d.dup = True
                        if later is None:
                            later = []
                        later.append(d)
                        continue
                    if self._write_publish(d.msg, d.qos, d.retain, d.pid, True, d.sub_ids, now):
                        room -= 1
                    else:
                        # too large for this connection: as if delivered ([MQTT-3.1.2-25])
                        del session.inflight[d.pid]
                        if d.entry:
                            self.broker.acked(session, d)
                elif d.entry:
                    self._pubrel_when_durable(d.pid)      # (its state change may not be durable yet)
                else:
                    self._send(encode_ack(PUBREL, d.pid, version=self.version))
            if later:
                reserved = session.reserved
                if reserved is None:
                    reserved = session.reserved = set()
                reserved.update(d.pid for d in later)
                session.queue.put_front(later)
        if session.queue:
            self._pump(now)
        held = self._held
        if held is not None:
            self._held = None
            self.hooks.resume_reading()
            self._process(held, now)
            if len(self.out) > OUT_AT_ONCE and self.state == CONNECTED:
                self.hooks.flush_now()

    def refuse(self, code: int, reason: str | None = None) -> None:
        """Answer the CONNECT with a refusal and close."""
        if self.state not in (NEW, CONNECTING):
            return
        self.close_reason = (code, reason or rc.NAMES.get(code, ""))
        if self.version == MQTT5:
            self._send(self._connack_refusal(code, reason))
        elif self.version:
            self._send(encode(Connack(False, rc.connack_v3(code)), self.version))
        self.state = CLOSED
        self.hooks.close()

    def _connack_refusal(self, code: int, reason: str | None) -> bytes:
        """A v5 refusal CONNACK; the reason string only if it fits the client's maximum packet size."""
        if reason:
            data = encode(Connack(False, code, {P.REASON_STRING: reason}), MQTT5)
            if len(data) <= self.client_max_packet:
                return data
        return encode(Connack(False, code), MQTT5)

    # ---------------------------------------------------------------- publish

    def _on_publish(self, p: Publish, now: float) -> None:
        self.msgs_in += 1
        if p.qos:
            counts = self.qos_in
            if counts is _ZEROS:
                counts = self.qos_in = [0, 0, 0]
            counts[p.qos] += 1
        props = p.properties
        if props is not None:
            alias = props.pop(P.TOPIC_ALIAS, None)
            if alias is not None:
                if alias == 0 or alias > self.limits.topic_alias_maximum:
                    raise RemoteProtocolError("topic alias out of range", rc.TOPIC_ALIAS_INVALID)
                aliases = self.in_aliases
                if p.topic:
                    if aliases is None:
                        aliases = self.in_aliases = {}
                    aliases[alias] = p.topic
                else:
                    topic = aliases.get(alias) if aliases is not None else None
                    if topic is None:
                        raise RemoteProtocolError("unknown topic alias")
                    p.topic = topic
            if P.SUBSCRIPTION_IDENTIFIER in props:
                raise RemoteProtocolError("PUBLISH from a client with a Subscription Identifier")
            bad = _bad_message_property(props)
            if bad is not None:
                raise RemoteProtocolError(bad)
            expiry = props.get(P.MESSAGE_EXPIRY_INTERVAL)
            if expiry is not None:
                p.expiry_at = now + expiry
            if props.get(P.PAYLOAD_FORMAT_INDICATOR) == 1:
                try:
                    p.payload.decode("utf-8")
                except UnicodeDecodeError:
                    return self._refuse_publish(p, rc.PAYLOAD_NOT_UTF8)
            if not props:
                p.properties = None
        topic = p.topic
        if "+" in topic or "#" in topic or (p.retain and len(topic) >= MAX_TOPIC_LEVELS and too_deep(topic)):
            # levels are bounded where they cost memory, a retained message's (a node of the retained
            # tree each); a message passing through costs time in its length, as any (asked of every
            # PUBLISH, the check cost 2.5 % of a QoS 0 message)
            raise RemoteProtocolError(f"invalid topic name {topic[:100]!r}", rc.TOPIC_NAME_INVALID)
        if not topic:
            raise RemoteProtocolError("PUBLISH without a topic name or topic alias")
        qos = p.qos
        if qos == 0:
            if self.broker.publish(p, self, now) == rc.PACKET_TOO_LARGE:
                raise RemoteProtocolError("payload above the tenant's maximum", rc.PACKET_TOO_LARGE)
            return
        if qos == 1:
            # Receive Maximum: QoS 1 until its PUBACK, QoS 2 until its PUBCOMP (awaiting_rel)
            if (self.version == MQTT5
                    and self.inbound_pending + len(self.session.awaiting_rel) >= self.limits.max_inflight):
                raise RemoteProtocolError("Receive Maximum exceeded", rc.RECEIVE_MAXIMUM_EXCEEDED)
            code = self.broker.publish(p, self, now)
            if code == 0 and not self._acks:
                # the common case, written out: a plain PUBACK
                out = self.out
                if not out:
                    self.hooks.wake()
                out.append(_puback_bytes(0x4002, p.packet_id))
                return
            self._answer_q1(p, code)
            return
        # QoS 2, method B: route on PUBLISH, remember the id until PUBREL
        pid = p.packet_id
        awaiting = self.session.awaiting_rel
        if pid in awaiting:
            # [MQTT-4.3.3-10]: acknowledge again, do not deliver again -- with a store, once what
            # the first copy wrote (its id, its queue rows) is durable: its batch may not have
            # committed yet (it may be in flight now), and a PUBREC before that, then a crash,
            # loses the message (the publisher sends PUBREL, never the message again)
            if self.broker.committed_generation() is not None:
                self._queue_ack(PUBREC, pid, None)
                self.broker.after_commit(partial(self._rel_stored, pid, PUBREC))
            else:
                self._queue_ack(PUBREC, pid, 0)
            return
        if self.version == MQTT5 and len(awaiting) + self.inbound_pending >= self.limits.max_inflight:
            raise RemoteProtocolError("Receive Maximum exceeded", rc.RECEIVE_MAXIMUM_EXCEEDED)
        code = self.broker.publish(p, self, now, pid)
        if code is None or code < 0x80:
            # counted against Receive Maximum from now until its PUBCOMP (also while the PUBREC waits)
            if awaiting is NO_IDS:
                awaiting = self.session.awaiting_rel = set()
            awaiting.add(pid)
        self._queue_ack(PUBREC, pid, code)

    def _answer_q1(self, p: Publish, code: int | None) -> None:
        """The broker's answer to a QoS 1 PUBLISH: its PUBACK, now or once known."""
        if code is None:
            # the broker finishes it later (publish_done): its PUBACK waits in line
            self._queue_ack(PUBACK, p.packet_id, None)
        elif code == 0 and not self._acks:
            out = self.out
            if not out:
                self.hooks.wake()
            out.append(_puback_bytes(0x4002, p.packet_id))
        elif code & AFTER_COMMIT:
            # waits for the store's next commit (acks_committed), in line with the others
            self.inbound_pending += 1
            acks = self._acks
            if acks is None:
                acks = self._acks = deque()
            acks.append([PUBACK, p.packet_id, None, code ^ AFTER_COMMIT])
        else:
            self._queue_ack(PUBACK, p.packet_id, code)

    def publish_done(self, packet_id: int, qos: int, code: int) -> None:
        """The broker finished a PUBLISH it answered ``None`` for: its ack may go."""
        if self.state != CONNECTED:
            return
        self._ack_ready(PUBACK if qos == 1 else PUBREC, packet_id, code)

    def acks_committed(self, n: int, ok: bool) -> None:
        """The store committed the batch the oldest ``n`` acks of PUBLISHes the
        broker answered with ``AFTER_COMMIT`` waited for (``ok``: durable)."""
        if self.state != CONNECTED:
            return
        acks = self._acks
        if ok and self.version != MQTT5:
            # the usual case, once per batch a publisher had a PUBLISH in: its PUBACKs at the
            # head of the line, sent as they come off it (what the loop below and _acks_out do)
            out = self.out
            while acks:
                entry = acks[0]
                if entry[2] is not None or entry[3] is None or entry[0] != PUBACK or entry[3] >= 0x80:
                    break
                acks.popleft()
                self.inbound_pending -= 1
                if not out:
                    self.hooks.wake()
                out.append(_puback_bytes(0x4002, entry[1]))
                n -= 1
                if not n:
                    if acks and acks[0][2] is not None:
                        self._acks_out(acks)
                    return
        for entry in acks:
            if entry[2] is None and entry[3] is not None:
                entry[2] = entry[3] if ok else STORE_UNAVAILABLE
                n -= 1
                if not n:
                    break
        self._acks_out(acks)

    # Acks to the client leave in the order of the packets they answer
    # ([MQTT-4.6.0-2..4]); one that waits for the store holds back the rest.
    # An entry: [kind, packet id, reason code (None: not known yet), the code
    # once the store's commit comes (AFTER_COMMIT), else None]. The PUBACKs
    # and PUBCOMPs in line count against our Receive Maximum (inbound_pending)
    # until they are sent, known or not ([MQTT-3.3.4-8]: "not sent a PUBACK or
    # PUBCOMP").

    def _queue_ack(self, kind: int, pid: int, code: int | None) -> None:
        acks = self._acks
        if code is not None and not acks:
            self._final_ack(kind, pid, code)
            return
        if acks is None:
            acks = self._acks = deque()
        if kind in (PUBACK, PUBCOMP):
            self.inbound_pending += 1
        acks.append([kind, pid, code, None])

    def _ack_ready(self, kind: int, pid: int, code: int) -> None:
        acks = self._acks
        if not acks:
            return
        for entry in acks:
            if entry[2] is None and entry[3] is None and entry[0] == kind and entry[1] == pid:
                entry[2] = code
                break
        self._acks_out(acks)

    def _acks_out(self, acks) -> None:
        """Send the acks at the head of ``acks`` that are known."""
        v3 = self.version != MQTT5
        while acks and acks[0][2] is not None and self.state == CONNECTED:
            k, p, c, _ = acks.popleft()
            if k in (PUBACK, PUBCOMP):
                self.inbound_pending -= 1
            if v3 and k == PUBACK and c < 0x80:
                out = self.out
                if not out:
                    self.hooks.wake()
                out.append(_puback_bytes(0x4002, p))
            else:
                self._final_ack(k, p, c)

    def _final_ack(self, kind: int, pid: int, code: int) -> None:
        if code >= 0x80:
            if kind == PUBREC and pid in self.session.awaiting_rel:
                # a negative PUBREC ends the flow: the id is the client's to use again -- in the
                # store too, or the node the session moves to (or this one, restarted) would take
                # the next message under it for a duplicate of this one, and not deliver it
                self.session.awaiting_rel.discard(pid)
                self.broker.rel_refused(self.session, pid)
            if code == rc.PACKET_TOO_LARGE:
                self.disconnect(code, "payload above the tenant's maximum", self.last_rx)
                return
            if code > 0xFF:
                reason = rc.REFUSALS.get(code)
                if self.version != MQTT5:
                    self.disconnect(code & 0xFF, reason, self.last_rx)
                    return
                self._send_ack(kind, pid, code & 0xFF, reason)
                return
            if code == STORE_UNAVAILABLE:
                if self.version != MQTT5 or kind in (PUBCOMP, PUBREL):
                    # no negative ack in 3.x (nor in PUBCOMP, PUBREL): the client must not
                    # take it as done; it sends again after reconnecting
                    self.disconnect(code, "session store unavailable", self.last_rx)
                    return
                self._send_ack(kind, pid, code, "session store unavailable")
                return
        self._send_ack(kind, pid, code)

    def _rel_stored(self, pid: int, kind: int, ok: bool) -> None:
        self._ack_ready(kind, pid, 0 if ok else STORE_UNAVAILABLE)

    def _refuse_publish(self, p: Publish, code: int) -> None:
        """A PUBLISH the channel refuses itself (``code``: one of ``rc.REFUSALS``): its negative
        ack in line behind the acks still waiting ([MQTT-4.6.0-2/3]), with its reason string."""
        if p.qos:
            self._queue_ack(PUBACK if p.qos == 1 else PUBREC, p.packet_id, code)
        self.broker.dropped(self, p, code & 0xFF)

    def _send_ack(self, kind: int, pid: int, code: int, reason: str | None = None) -> None:
        if self.version == MQTT5:
            props = {P.REASON_STRING: reason} if reason and self.problem_info else None
            data = encode_ack(kind, pid, code, props, MQTT5)
            if props and len(data) > self.client_max_packet:
                data = encode_ack(kind, pid, code, None, MQTT5)
        else:
            data = bytes(((kind << 4) | (2 if kind == PUBREL else 0), 2, pid >> 8, pid & 0xFF))
        out = self.out
        if not out:
            self.hooks.wake()
        out.append(data)

    def _on_puback(self, p, now):
        self._puback(p.packet_id, now)

    def _puback(self, pid: int, now: float) -> None:
        session = self.session
        d = session.puback(pid)
        if d is not None:
            broker = self.broker
            if d.entry:
                broker.acked(session, d)
            if broker.rules:
                broker.message_acked(self, d, now)
            queue = session.queue
            if queue._q0 or queue._q12 or self._stored:   # (MessageQueue.__bool__ without its call)
                self._pump(now)

    def _on_pubrec(self, p, now):
        session = self.session
        d, released = session.pubrec(p.packet_id, p.reason_code)
        if d is None:
            # (in line behind the PUBRELs waiting for the store: [MQTT-4.6.0-4])
            self._queue_ack(PUBREL, p.packet_id, rc.PACKET_IDENTIFIER_NOT_FOUND)
            return
        if p.reason_code >= 0x80:
            if d.entry:
                self.broker.acked(session, d)
            if session.queue:
                self._pump(now)
            return
        if d.entry:
            if released:
                self.broker.released(session, d)
            self._pubrel_when_durable(p.packet_id)
            return
        self._queue_ack(PUBREL, p.packet_id, 0)

    def _pubrel_when_durable(self, pid: int) -> None:
        """PUBREL for a stored QoS 2 delivery, once its row's state ("PUBREL owed") is durable:
        sent before, the subscriber completes the flow (PUBCOMP, its id freed) while the row
        still says "PUBLISH owed", and after a crash the PUBLISH goes again -- a new message
        to the subscriber, delivered twice."""
        self._queue_ack(PUBREL, pid, None)
        self.broker.after_commit(partial(self._rel_stored, pid, PUBREL))

    def _on_pubrel(self, p, now):
        pid = p.packet_id
        session = self.session
        awaiting = session.awaiting_rel
        if pid in awaiting:
            awaiting.discard(pid)
            if self.broker.rel_done(session, pid, partial(self._rel_stored, pid, PUBCOMP)):
                self._queue_ack(PUBCOMP, pid, None)
            else:
                self._queue_ack(PUBCOMP, pid, 0)
        else:
            self._queue_ack(PUBCOMP, pid, rc.PACKET_IDENTIFIER_NOT_FOUND)

    def _on_pubcomp(self, p, now):
        session = self.session
        d = session.pubcomp(p.packet_id)
        if d is not None:
            broker = self.broker
            if d.entry:
                broker.acked(session, d)
            if broker.rules:
                broker.message_acked(self, d, now)
            if session.queue:
                self._pump(now)

    # ---------------------------------------------------- subscribe / unsubscribe

    def _on_subscribe(self, p, now):
        sub_id = None
        if p.properties:
            sub_id = p.properties.get(P.SUBSCRIPTION_IDENTIFIER)
            if sub_id == 0:
                raise RemoteProtocolError("Subscription Identifier of 0")
        if self.version == MQTT5 and not self._answer_fits("SUBACK", len(p.topics), now):
            return
        codes, retained = self.broker.subscribe(self, p.topics, sub_id, p.properties, now)
        if self.version != MQTT5:
            codes = [c if c < 0x80 else rc.V3_SUBACK_FAILURE for c in codes]
        if self.broker.durable_pending(self.session):
            # a stored session's subscriptions are acknowledged once stored
            self.broker.after_commit(partial(self._suback, p.packet_id, codes, retained))
            return
        self._suback(p.packet_id, codes, retained, True, now)

    def _answer_fits(self, kind: str, filters: int, now: float) -> bool:
        """A SUBACK / UNSUBACK holds a reason code per filter and nothing of it may be left out: one
        above the client's Maximum Packet Size cannot be sent ([MQTT-3.1.2-24]). False: the SUBSCRIBE /
        UNSUBSCRIBE is refused before anything is (un)subscribed, with DISCONNECT 0x95, rather than
        answered with a packet the client must not get, or with silence."""
        n = filters + 3                         # packet id, empty properties, the codes
        size = n + (2 if n < 128 else 3 if n < 16384 else 4 if n < 2097152 else 5)
        if size <= self.client_max_packet:
            return True
        self.disconnect(rc.PACKET_TOO_LARGE, f"the {kind} for {filters} topic filters would be {size} bytes, "
                        "above your Maximum Packet Size", now)
        return False

    def _suback(self, pid: int, codes: list, retained: list, ok: bool, now: float | None = None) -> None:
        if self.state != CONNECTED:
            return
        now = self.last_rx if now is None else now
        if not ok:
            # the store did not take the subscriptions (it is retried): not acknowledged as
            # granted -- a crash before the retry got through would lose them, and with them the
            # messages the client counts on. (They may still take effect, as a refused PUBLISH may.)
            failed = STORE_UNAVAILABLE if self.version == MQTT5 else rc.V3_SUBACK_FAILURE
            self._send(encode(Suback(pid, [c if c >= 0x80 else failed for c in codes]), self.version))
            return
        self._send(encode(Suback(pid, codes), self.version))
        self.send_retained(retained, now)

    def send_retained(self, feeds: list, now: float) -> None:
        """Retained messages for new subscriptions: ``feeds`` = [(topic filter, iterator of
        (message, qos, subscription ids))]. They are taken from the iterators as the connection
        can send them -- while nothing waits in the session's queue, the socket is not congested
        and this iteration's output is under its mark (QoS 1/2: while the window has room) -- so
        a subscription matching millions of them holds no list of them and overflows no queue.
        A filter subscribed to again starts again; one unsubscribed stops (``stop_retained``);
        what a connection had not taken when it closed goes to its session's queue if the
        session lives on (``Broker.retained_owed``)."""
        if not feeds or self.state != CONNECTED:
            return
        feed = self.retained_feed
        if feed is None:
            # fed at once; kept (a _rare field) only if the connection cannot take them all now
            feed = [[f, it] for f, it in feeds]
            self._feed_retained(now, feed)
            if feed:
                self.retained_feed = feed
            return
        again = {f for f, _ in feeds}
        feed[:] = [e for e in feed if e[0] not in again]
        feed.extend([f, it] for f, it in feeds)
        self._feed_retained(now, feed)
        if not feed:
            self.retained_feed = None

    def stop_retained(self, filters) -> None:
        """``filters`` were unsubscribed: no more of their retained messages ([MQTT-3.10.4-2])."""
        feed = self.retained_feed
        if feed:
            feed[:] = [e for e in feed if e[0] not in filters]
            if not feed:
                self.retained_feed = None

    def _feed_retained(self, now: float, feed: list) -> None:
        session = self.session
        queue = session.queue
        deliver = self.broker.deliver_retained
        while feed:
            if (self.state != CONNECTED or self.congested or self.shaping or self.pending > self.max_pending
                    or queue._q0 or queue._q12):
                break
            if not self._stored:
                self.blocked = False        # nothing waits: what comes next may go straight out
            item = next(feed[0][1], None)
            if item is None:
                del feed[0]
                continue
            deliver(self, item[0], item[1], item[2], now)
        if feed:
            self.blocked = True             # flushed / acks / commits come back here through _pump
        elif self._rare is not None:
            self.retained_feed = None

    def _on_unsubscribe(self, p, now):
        if self.version == MQTT5 and not self._answer_fits("UNSUBACK", len(p.topics), now):
            return
        codes = self.broker.unsubscribe(self, p.topics, now)
        if self._rare is not None and self._rare.retained_feed:
            self.stop_retained(set(p.topics))
        if self.broker.durable_pending(self.session):
            # as a SUBACK: once stored, or a crash after the UNSUBACK would bring the subscription back
            self.broker.after_commit(partial(self._unsuback, p.packet_id, codes))
            return
        self._unsuback(p.packet_id, codes, True)

    def _unsuback(self, pid: int, codes: list, ok: bool) -> None:
        if self.state != CONNECTED:
            return
        if not ok:
            # as for a SUBACK: the unsubscribe is not stored (a crash would bring the subscription
            # back); 3.1.1's UNSUBACK has no reason code: the client is disconnected, as for a PUBACK
            if self.version != MQTT5:
                self.disconnect(STORE_UNAVAILABLE, "session store unavailable", self.last_rx)
                return
            codes = [c if c >= 0x80 else STORE_UNAVAILABLE for c in codes]
        self._send(encode(Unsuback(pid, codes if self.version == MQTT5 else []), self.version))

    def _on_pingreq(self, p, now):
        self._send(_PINGRESP)

    def _on_disconnect(self, p, now):
        props = p.properties
        if props and P.SESSION_EXPIRY_INTERVAL in props:
            new = props[P.SESSION_EXPIRY_INTERVAL]
            # [MQTT-3.14.2-2]: an error after 0 in the CONNECT -- not after a CONNECT's value the
            # CONNACK lowered to 0
            if self.session.expiry_interval == 0 and new != 0 and not self.expiry_lowered:
                raise RemoteProtocolError("Session Expiry Interval set on DISCONNECT after 0 on CONNECT")
            # bounded as on CONNECT: by the node's cap and the tenant's quota
            cap = self.limits.max_session_expiry
            quota = self.quota
            if quota is not None:
                tenant_cap = quota.get("max_session_expiry")
                if tenant_cap is not None and tenant_cap < cap:
                    cap = tenant_cap
            self.session.expiry_interval = min(new, cap)
        # [MQTT-3.1.2-8] / [MQTT-3.14.4-3]: only a Normal disconnection (0x00; every 3.x DISCONNECT)
        # deletes the will -- 0x04 asks for it, and so does leaving with an error code (0x80 ...)
        will = p.reason_code != rc.NORMAL_DISCONNECTION
        if not will:
            self.will = None
        self.close_reason = (p.reason_code, "client disconnected")
        self._close(now, will=will)

    def _on_connect_again(self, p, now):
        raise RemoteProtocolError("second CONNECT")

    def _on_auth(self, p, now):
        raise RemoteProtocolError("AUTH without an authentication method")

    def _on_server_only(self, p, now):
        raise RemoteProtocolError("packet type only a server may send")

    # --------------------------------------------------------------- delivery

    def deliver(self, msg: Publish, qos: int, retain: bool, sub_ids, now: float, share=None) -> None:
        """Send ``msg`` at ``qos`` (already downgraded to the subscription's).

        It goes straight out unless something is already waiting (the socket
        is congested, this iteration's output passed the write mark, or the
        queue is not empty -- order is kept), or, for QoS 1/2, the inflight
        window is full; then it joins the session's bounded queue.
        """
        if self.blocked or self.pending > self.max_pending:
            self._enqueue(Delivery(msg, qos, retain, sub_ids, share))
            return
        if qos == 0:
            if msg.expiry_at is not None and now > msg.expiry_at:
                self.broker.expired(self, msg, retain)
                return
            self._write_publish(msg, 0, retain, 0, False, sub_ids, now)
            return
        session = self.session
        inflight = session.inflight
        if len(inflight) >= self.send_window:
            self._enqueue(Delivery(msg, qos, retain, sub_ids, share))
            return
        # _send_inflight, written out for a new delivery (not stored: no entry; not a DUP)
        if msg.expiry_at is not None and now > msg.expiry_at:
            self.broker.discarded(session, Delivery(msg, qos, retain, sub_ids, share), True)
            return
        # Session.take_pid for a delivery with no reserved id, written out
        pid = session.next_pid
        reserved = session.reserved
        if pid in inflight or (reserved is not None and pid in reserved):
            pid = session.allocate_pid()
        else:
            session.next_pid = pid + 1 if pid < 65535 else 1
        d = new_delivery(msg, qos, retain, sub_ids, share, pid)
        head = msg.head31
        if head is not None and qos == 1 and not retain and self.version != MQTT5 and self.limit_out is None:
            # _write_publish of a 3.x QoS 1 PUBLISH to a 3.x client, written out: the bytes it came
            # in, with our packet id
            head += _pid_bytes(pid)
            payload = msg.payload
            counts = self.qos_out
            if counts is _ZEROS:
                counts = self.qos_out = [0, 0, 0]
            counts[1] += 1
            out = self.out
            if not out:
                self.hooks.wake()
            out.append(head)
            out.append(payload)
            self.pending += len(head) + len(payload)
            self.msgs_out += 1
        elif not self._write_publish(msg, qos, retain, pid, False, sub_ids, now):
            return
        if inflight is NO_INFLIGHT:
            inflight = session.inflight = {}
        inflight[pid] = d

    def _enqueue(self, d) -> None:
        self.blocked = True
        dropped = self.session.queue.put(d)
        if dropped:
            self.broker.queue_dropped(self.session, dropped, d)

    def queue_delivery(self, d) -> None:
        """A stored delivery: it waits until its write is durable (``resume_output``
        after the commit). While nothing waits in the session's queue and the
        window has room for it, it waits in ``_stored`` -- sent from there, before
        anything queued after it, without going through the queue -- else in the queue."""
        session = self.session
        queue = session.queue
        stored = self._stored
        if stored is None:
            stored = self._stored = []
        if not (queue._q0 or queue._q12) and len(session.inflight) + len(stored) < self.send_window:
            stored.append(d)
            self.blocked = True                 # whatever comes next queues behind it
            return
        self._enqueue(d)

    def _stored_back(self) -> None:
        """The connection is closing: what ``_stored`` holds goes back to the head of the queue."""
        stored = self._stored
        if stored:
            self._stored = None
            self.session.queue.put_front(stored)

    def resume_output(self, now: float) -> None:
        """Send what waited: for a commit, or for the outbound rate limit."""
        self.shaping = False
        if self.state == CONNECTED and self.blocked and not self.congested:
            self._pump(now)

    def _rate_out(self, nbytes: int, now: float) -> None:
        """Past its outbound rate, deliveries queue (bounded) until the rate allows."""
        wait = self.limit_out.charge(1, nbytes, now)
        if wait > 0 and not self.shaping:
            self.shaping = True
            self.blocked = True
            self.hooks.throttle_output(wait)

    def _send_inflight(self, d, now) -> None:
        msg = d.msg
        session = self.session
        if msg.expiry_at is not None and now > msg.expiry_at and not d.dup:
            # (one sent before -- DUP -- is not: its delivery started, and a QoS 2 receiver holds
            # its packet id until the flow ends; dropped, the id went to the next message, which
            # the receiver took for this one again, [MQTT-4.3.3-10])
            self.broker.discarded(session, d, True)
            return
        pid = session.take_pid(d)
        if self._write_publish(msg, d.qos, d.retain, pid, d.dup, d.sub_ids, now):
            inflight = session.inflight
            if inflight is NO_INFLIGHT:
                inflight = session.inflight = {}
            inflight[pid] = d
        elif d.entry:
            self.broker.acked(session, d)     # too large: as if delivered

    def _pump(self, now: float) -> None:
        """Move queued deliveries out while the window and the socket allow."""
        session = self.session
        queue = session.queue
        inflight = session.inflight          # _send_inflight adds to it: the session's own dict
        if inflight is NO_INFLIGHT:          # (Session.window(), without its call: once per pump)
            inflight = session.inflight = {}
        window = self.send_window
        limit = self.max_pending
        committed = self.broker.committed_generation()
        stored = self._stored
        if stored:
            # stored deliveries older than anything queued, in the order of their batches
            sent = 0
            reserved = session.reserved
            for d in stored:
                if d.gen > committed:
                    self.broker.gate(self)            # its write is not durable yet
                    break
                if self.congested or self.pending > limit or self.shaping or len(inflight) >= window:
                    break
                sent += 1
                # _send_inflight, written out: a stored delivery has its packet id (reserved when stored)
                msg = d.msg
                if msg.expiry_at is not None and now > msg.expiry_at:
                    self.broker.discarded(session, d, True)
                    continue
                pid = d.pid
                reserved.discard(pid)
                if self._write_publish(msg, d.qos, d.retain, pid, d.dup, d.sub_ids, now):
                    inflight[pid] = d
                elif d.entry:
                    self.broker.acked(session, d)     # too large: as if delivered
            if sent == len(stored):
                stored.clear()
            else:
                del stored[:sent]
                self.blocked = True
                return
        while (queue._q0 or queue._q12) and not self.congested and self.pending <= limit and not self.shaping:
            if committed is not None and queue.peek().gen > committed:
                self.broker.gate(self)            # its write is not durable yet
                break
            if len(inflight) >= window:
                # QoS 0 messages may still go out past a full window, unless
                # an older QoS 1/2 message waits before them
                q0, q12 = queue._q0, queue._q12
                if not q0 or (q12 and q12[0][0] < q0[0][0]):
                    break
            d = queue.pop()
            if d.qos == 0:
                msg = d.msg
                if msg.expiry_at is not None and now > msg.expiry_at:
                    self.broker.discarded(session, d, True)
                    continue
                self._write_publish(msg, 0, d.retain, 0, False, d.sub_ids, now)
            else:
                self._send_inflight(d, now)
        self.blocked = self.congested or self.shaping or bool(queue._q0 or queue._q12)
        rare = self._rare
        if rare is not None and rare.retained_feed and not self.blocked:
            self._feed_retained(now, rare.retained_feed)

    def flushed(self, now: float) -> None:
        """The transport wrote ``out``: carry on with anything that waited."""
        self.pending = 0
        if self.blocked and not self.congested and self.state == CONNECTED:
            self._pump(now)

    def _write_publish(self, msg: Publish, qos: int, retain: bool, pid: int, dup: bool, sub_ids,
                       now: float) -> bool:
        """Encode and queue one PUBLISH; False if the client's maximum packet size forbids it."""
        payload = msg.payload
        if self.version != MQTT5:
            if not qos and not retain:
                data = msg.enc3
                if data is None:
                    data = msg.enc3 = publish_head(msg.topic.encode(), 0, False, False, 0, None,
                                                   len(payload)) + payload
                out = self.out
                if not out:
                    self.hooks.wake()
                out.append(data)
                self.pending += len(data)
                self.msgs_out += 1
                if self.limit_out is not None:
                    self._rate_out(len(data), now)
                return True
            head = msg.head31
            if head is None or qos != 1 or retain or dup:
                head = publish_head(msg.topic.encode(), qos, retain, dup, pid, None, len(payload))
            else:
                head += _pid_bytes(pid)      # the PUBLISH as received (3.x, QoS 1), with our packet id
            counts = self.qos_out
            if counts is _ZEROS:
                counts = self.qos_out = [0, 0, 0]
            counts[qos] += 1
            out = self.out
            if not out:
                self.hooks.wake()
            out.append(head)
            out.append(payload)
            self.pending += len(head) + len(payload)
            self.msgs_out += 1
            if self.limit_out is not None:
                self._rate_out(len(head) + len(payload), now)
            return True
        # MQTT 5
        if not qos and not retain and sub_ids is None and msg.expiry_at is None and self.out_aliases is None:
            data = msg.enc5
            if data is None:
                props = encode_properties(msg.properties)
                data = msg.enc5 = publish_head(msg.topic.encode(), 0, False, False, 0, props, len(payload)) + payload
            if len(data) > self.client_max_packet:
                self.broker.too_large(self, msg, qos, retain)
                return False
            out = self.out
            if not out:
                self.hooks.wake()
            out.append(data)
            self.pending += len(data)
            self.msgs_out += 1
            if self.limit_out is not None:
                self._rate_out(len(data), now)
            return True
        props = dict(msg.properties) if msg.properties else {}
        if msg.expiry_at is not None:
            # rounded up, and never past the u32 the property is: expiry_at - now of a message
            # sent at once with 4294967295 can come out a hair above it in floating point
            props[P.MESSAGE_EXPIRY_INTERVAL] = min(0xFFFFFFFF, max(0, ceil(msg.expiry_at - now)))
        if sub_ids:
            props[P.SUBSCRIPTION_IDENTIFIER] = list(sub_ids)
        topic = msg.topic
        aliases = self.out_aliases
        topic_b = None
        new_alias = None
        if aliases is not None:
            alias = aliases.get(topic)
            if alias is not None:
                props[P.TOPIC_ALIAS] = alias
                topic_b = b""
            elif (len(aliases) < self.client_alias_max
                  and self.alias_bytes + len(topic) <= self.limits.max_alias_bytes):
                # bounded in bytes too: a client may allow 65,535 aliases and topics are up to 64 KiB
                new_alias = props[P.TOPIC_ALIAS] = len(aliases) + 1
        if topic_b is None:
            topic_b = topic.encode()
        head = publish_head(topic_b, qos, retain, dup, pid, encode_properties(props), len(payload))
        if len(head) + len(payload) > self.client_max_packet:
            if new_alias is None:
                self.broker.too_large(self, msg, qos, retain)
                return False
            # too large only with the alias we would set up: sent without it ([MQTT-3.1.2-25]
            # drops what does not fit, not what we made not fit)
            del props[P.TOPIC_ALIAS]
            new_alias = None
            head = publish_head(topic_b, qos, retain, dup, pid, encode_properties(props), len(payload))
            if len(head) + len(payload) > self.client_max_packet:
                self.broker.too_large(self, msg, qos, retain)
                return False
        if new_alias is not None:
            # the alias is established only by a PUBLISH that is actually sent
            aliases[topic] = new_alias
            self.alias_bytes += len(topic)
        counts = self.qos_out
        if counts is _ZEROS:
            counts = self.qos_out = [0, 0, 0]
        counts[qos] += 1
        out = self.out
        if not out:
            self.hooks.wake()
        out.append(head)
        out.append(payload)
        self.pending += len(head) + len(payload)
        self.msgs_out += 1
        if self.limit_out is not None:
            self._rate_out(len(head) + len(payload), now)
        return True

    def set_congested(self, congested: bool, now: float) -> None:
        """The transport's write buffer crossed its high (True) or low (False) mark.

        A congested connection holds about ``max_pending`` bytes in its
        transport; that much is charged to the node's queue budget.
        """
        if congested == self.congested:
            return
        self.congested = congested
        if congested:
            self.broker.congestion(self.max_pending)
            self.blocked = True
        else:
            self.broker.congestion(-self.max_pending)
            if self.state == CONNECTED:
                self._pump(now)

    # ----------------------------------------------------------------- closing

    def _send(self, data: bytes) -> None:
        out = self.out
        if not out:
            self.hooks.wake()
        out.append(data)

    def _peer_error(self, exc: ProtocolError, now: float) -> None:
        code = exc.reason_code
        self.close_reason = (code, str(exc))
        if self.state in (NEW, CONNECTING):
            if isinstance(exc, UnsupportedProtocolVersion):
                # answer in the 3.1.1 format, which every client version can read
                self._send(encode(Connack(False, rc.V3_UNACCEPTABLE_PROTOCOL_VERSION), 4))
            elif self.version == MQTT5 or (code == rc.PACKET_TOO_LARGE and self.decoder.version == MQTT5):
                # (a CONNECT too large, or with too many user properties, is refused before
                # _on_connect: its level is what the decoder saw)
                self._send(self._connack_refusal(code, str(exc)))
            self.state = CLOSED
            self.hooks.close()
            return
        if code not in DISCONNECT_CODES:
            code = rc.PROTOCOL_ERROR
        self.disconnect(code, str(exc), now)

    def disconnect(self, code: int, reason: str | None, now: float, will: bool = True,
                   server_reference: str | None = None) -> None:
        """Server-initiated close: v5 clients get DISCONNECT ``code`` first."""
        if self.state == CLOSED:
            return
        if self.state != CONNECTED:
            self.refuse(code, reason)
            return
        if self.close_reason is None:
            self.close_reason = (code, reason or rc.NAMES.get(code, ""))
        if self.version == MQTT5:
            props = {}
            if reason:
                props[P.REASON_STRING] = reason
            if server_reference:
                props[P.SERVER_REFERENCE] = server_reference
            data = encode(Disconnect(code, props or None), MQTT5)
            if len(data) > self.client_max_packet and reason and server_reference:
                # [MQTT-3.14.2-3]: the Reason String is what goes to fit, not the Server Reference
                # (a client told 0x9C / 0x9D without it has nowhere to go)
                data = encode(Disconnect(code, {P.SERVER_REFERENCE: server_reference}), MQTT5)
            if len(data) > self.client_max_packet:
                data = encode(Disconnect(code), MQTT5)
            self._send(data)
        self._close(now, will)

    def _close(self, now: float, will: bool) -> None:
        self.state = CLOSED
        self.hooks.close()
        if self.session is not None:
            self._stored_back()
            self.broker.channel_closed(self, now, will)     # (what retained_feed still owed goes to the session)
        self.retained_feed = None

    def connection_lost(self, now: float) -> None:
        """The transport is gone (network error, peer closed, or after our close)."""
        self._preauth_release()
        # nothing more is read: a partial packet (up to the maximum packet size) and packets that waited
        # go now, not when the last reference to the channel does (the server's timeout wheel holds it
        # until its slot comes)
        self.decoder.discard()
        self._held = self._rate_held = None
        if self.congested:
            self.congested = False
            self.broker.congestion(-self.max_pending)
        if self.state == CLOSED:
            return
        was_connecting = self.state in (NEW, CONNECTING)
        self.state = CLOSED
        if self.close_reason is None:
            self.close_reason = (rc.UNSPECIFIED_ERROR, "connection lost")
        if self.session is not None:
            self._stored_back()
            self.broker.channel_closed(self, now, True)
        elif was_connecting and self.version:
            self.broker.connect_aborted(self)
        self.retained_feed = None

    def detach(self):
        """Unbind from the session without telling the broker (session takeover)."""
        self.retained_feed = None
        if self.session is not None:
            self._stored_back()
        session, self.session = self.session, None
        if session is not None and session.channel is self:
            session.channel = None
        return session

    def handle_timeout(self, now: float) -> float | None:
        """CONNECT timeout and keepalive. -> when to call it again at the earliest (before then
        nothing can have timed out; None: nothing will -- closed, or connected without keepalive)."""
        state = self.state
        if state == CONNECTED:
            ka = self.keepalive
            if not ka:
                return None
            due = self.last_rx + ka * 1.5
            if now > due:
                self.disconnect(rc.KEEP_ALIVE_TIMEOUT, "keep alive timeout", now)
                return None
            return due
        if state == NEW:
            due = self.created_at + self.limits.connect_timeout
            if now > due:
                self._preauth_release()
                self.close_reason = (rc.MAXIMUM_CONNECT_TIME, "no CONNECT in time")
                self.state = CLOSED
                self.hooks.close()
                return None
            return min(due, now + LOOK_AGAIN)
        if state == CONNECTING:
            return now + LOOK_AGAIN
        return None


for _name in _RARE:
    setattr(Channel, _name, _RareField(_name))

_HANDLERS = [None] * 16
_HANDLERS[CONNECT] = Channel._on_connect_again
_HANDLERS[PUBACK] = Channel._on_puback
_HANDLERS[PUBREC] = Channel._on_pubrec
_HANDLERS[PUBREL] = Channel._on_pubrel
_HANDLERS[PUBCOMP] = Channel._on_pubcomp
_HANDLERS[SUBSCRIBE] = Channel._on_subscribe
_HANDLERS[UNSUBSCRIBE] = Channel._on_unsubscribe
_HANDLERS[PINGREQ] = Channel._on_pingreq
_HANDLERS[DISCONNECT] = Channel._on_disconnect
_HANDLERS[AUTH] = Channel._on_auth
for _t in (2, 9, 11, 13):  # CONNACK, SUBACK, UNSUBACK, PINGRESP
    _HANDLERS[_t] = Channel._on_server_only

__all__ = ["CLOSED", "CONNECTED", "CONNECTING", "NEVER", "NEW", "STORE_UNAVAILABLE", "Channel", "ChannelLimits",
           "MalformedPacket"]
