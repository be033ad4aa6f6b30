"""Stateful fuzzing of the server side: a FrameDecoder and a Channel on a real
Broker, driven by Hypothesis with sequences of valid and invalid packets and
bytes (3.1, 3.1.1 and 5.0), every send cut into random pieces.

The machine keeps a model of what the server must answer -- acks, PUBREC again
for a reused QoS 2 id, PUBREL/PUBCOMP 0x92 for unknown ids, topic aliases --
and of how each bad input ends the connection: the reason code the spec
demands (0x81 malformed, 0x82 protocol error, 0x90 topic name invalid, 0x93
Receive Maximum exceeded, 0x94 topic alias invalid, 0x95 packet too large,
0x8D keep alive timeout, 0x8E session taken over, CONNACK codes), sent in a v5
DISCONNECT / CONNACK; a 3.1.1 connection is closed without a DISCONNECT.
Where the spec does not name the class of an error (packet identifier 0, DUP on
QoS 0), either 0x81 or 0x82 is accepted, as in test_codec_errors.

The generic invariants are the atheris harness's (fuzz/harness.py): nothing
but the protocol's own errors escapes (the transport catches nothing), the
decoder holds less than one maximum-size packet, the output is well-formed,
nothing is emitted after close, the in-flight windows hold.

300 sequences by default (a few seconds); ``FUZZ_EXAMPLES=2000 .venv/bin/pytest
tests/protocol/test_fuzz_stateful.py`` runs longer.
"""

import importlib.util
import os
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from brokerd.protocol import properties as P
from brokerd.protocol.channel import CLOSED, CONNECTED
from brokerd.protocol.codec import encode, varint
from brokerd.protocol.packets import (
    CONNACK,
    DISCONNECT,
    MQTT5,
    MQTT31,
    MQTT311,
    PINGRESP,
    PUBACK,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    SUBACK,
    UNSUBACK,
    Auth,
    Connack,
    Connect,
    Disconnect,
    Pingreq,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Subscribe,
    SubscriptionRequest,
    Unsubscribe,
    Will,
)

from .wire import EITHER, MALFORMED, PROTOCOL, frame, s
from .wire import props as pprops

_spec = importlib.util.spec_from_file_location("fuzz_harness", Path(__file__).resolve().parents[2] / "fuzz/harness.py")
H = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(H)

MAX_PACKET = 256
CLIENT_RECEIVE_MAX = 2
ALIAS_MAX = 4          # fuzz/harness.Run's topic_alias_maximum
RECEIVE_MAX = H.MAX_INFLIGHT

TOPICS = ["t/a", "t/b", "t/c/d", "u"]
FILTERS = ["t/#", "t/+", "t/a", "u", "#", "+/+", "$share/g/t/#", "t/#/x", "a+", "", "$SYS/#"]


# Bad input on an open connection: (name, v5 bytes, v3.1.1 bytes, expected reason codes).
# None for a version means "not applicable there".
GARBAGE = [
    ("reserved type 0", b"\x00\x00", b"\x00\x00", {MALFORMED}),
    ("reserved type 0 with body", b"\x00\x03abc", b"\x00\x03abc", {MALFORMED}),
    ("remaining length of 5 bytes", b"\x30\xff\xff\xff\xff\x01", b"\x30\xff\xff\xff\xff\x01", {MALFORMED}),
    ("remaining length not minimal", b"\xc0\x80\x00", b"\xc0\x80\x00", {MALFORMED}),
    ("PUBLISH QoS 3", frame(0x36, s("t") + b"\x00\x01\x00"), frame(0x36, s("t") + b"\x00\x01"), {MALFORMED}),
    ("PUBLISH topic not UTF-8", frame(0x30, b"\x00\x02\xc3\x28\x00"), frame(0x30, b"\x00\x02\xc3\x28"), {MALFORMED}),
    ("PUBLISH topic with U+0000", frame(0x30, s(b"a\x00b") + b"\x00"), frame(0x30, s(b"a\x00b")), {MALFORMED}),
    ("PUBLISH topic runs past the packet", frame(0x30, b"\x00\x09ab"), frame(0x30, b"\x00\x09ab"), {MALFORMED}),
    ("PUBLISH QoS 1 packet id 0", frame(0x32, s("t") + b"\x00\x00\x00"), frame(0x32, s("t") + b"\x00\x00"), EITHER),
    ("PUBLISH DUP at QoS 0", frame(0x38, s("t") + b"\x00"), frame(0x38, s("t")), EITHER),
    ("PUBLISH wildcard topic", frame(0x30, s("t/#") + b"\x00"), frame(0x30, s("t/+")), {0x90}),
    ("PUBLISH empty topic, no alias", frame(0x30, s("") + b"\x00x"), frame(0x30, s("") + b"x"), {PROTOCOL}),
    ("PUBREL with flags 0", b"\x60\x02\x00\x01", b"\x60\x02\x00\x01", {MALFORMED}),
    ("SUBSCRIBE with flags 0", frame(0x80, b"\x00\x01\x00" + s("t") + b"\x00"), frame(0x80, b"\x00\x01" + s("t") + b"\x00"),
     {MALFORMED}),
    ("SUBSCRIBE without filters", frame(0x82, b"\x00\x01\x00"), frame(0x82, b"\x00\x01"), {PROTOCOL}),
    ("SUBSCRIBE QoS 3", frame(0x82, b"\x00\x01\x00" + s("t") + b"\x03"), frame(0x82, b"\x00\x01" + s("t") + b"\x03"),
     {PROTOCOL, MALFORMED}),
    ("SUBSCRIBE reserved option bits", frame(0x82, b"\x00\x01\x00" + s("t") + b"\xc0"),
     frame(0x82, b"\x00\x01" + s("t") + b"\x04"), {MALFORMED}),
    ("SUBSCRIBE retain handling 3", frame(0x82, b"\x00\x01\x00" + s("t") + b"\x30"), None, {PROTOCOL}),
    ("UNSUBSCRIBE without filters", frame(0xA2, b"\x00\x01\x00"), frame(0xA2, b"\x00\x01"), {PROTOCOL}),
    ("PINGREQ with a body", b"\xc0\x01\x00", b"\xc0\x01\x00", {MALFORMED}),
    ("second CONNECT", encode(Connect("again", protocol_level=MQTT5)), encode(Connect("again")), {PROTOCOL}),
    ("CONNACK from a client", encode(Connack(), MQTT5), encode(Connack()), {PROTOCOL}),
    ("AUTH without a method", encode(Auth(0x18), MQTT5), b"\xf0\x00", {PROTOCOL, MALFORMED}),
    ("property not allowed in PUBLISH", frame(0x30, s("t") + pprops(b"\x11\x00\x00\x00\x01")), None, {MALFORMED}),
    ("property twice", frame(0x30, s("t") + pprops(b"\x02\x00\x00\x00\x01", b"\x02\x00\x00\x00\x01")), None,
     {PROTOCOL}),
    ("property length past the packet", frame(0x30, s("t") + b"\x09\x01"), None, {MALFORMED}),
    ("Subscription Identifier in PUBLISH", frame(0x30, s("t") + pprops(b"\x0b\x01")), None, {PROTOCOL}),
    ("Subscription Identifier 0", frame(0x82, b"\x00\x01" + pprops(b"\x0b\x00") + s("t") + b"\x00"), None,
     {PROTOCOL, MALFORMED}),
    ("PUBACK longer than 2 bytes", None, b"\x40\x03\x00\x01\x00", {MALFORMED}),
    ("AUTH in 3.1.1", None, b"\xf0\x00", {MALFORMED}),
    ("DISCONNECT Session Expiry after 0", encode(Disconnect(0, {P.SESSION_EXPIRY_INTERVAL: 5}), MQTT5), None,
     {PROTOCOL}),
]

# CONNECT variants: (name, versions, packet factory, outcome) where outcome is
# 0 (accepted), a CONNACK code (v5 reason code / 3.1.1 return code), or None
# (closed without a CONNACK).
CONNECTS = [
    ("3.1.1 empty id, clean 0", {MQTT311}, lambda v: Connect("", clean_start=False), 2),
    ("3.1.1 keepalive above the maximum", {MQTT311}, lambda v: Connect("k", keepalive=7200), 2),
    ("3.1.1 wildcard will topic", {MQTT311}, lambda v: Connect("w", will=Will("w/+", b"x")), None),
    ("5.0 wildcard will topic", {MQTT5}, lambda v: Connect("w", will=Will("w/#", b"x"), protocol_level=MQTT5), 0x90),
    ("5.0 Receive Maximum 0", {MQTT5},
     lambda v: Connect("r", protocol_level=MQTT5, properties={P.RECEIVE_MAXIMUM: 0}), PROTOCOL),
    ("5.0 Maximum Packet Size 0", {MQTT5},
     lambda v: Connect("r", protocol_level=MQTT5, properties={P.MAXIMUM_PACKET_SIZE: 0}), PROTOCOL),
    ("5.0 authentication method", {MQTT5},
     lambda v: Connect("a", protocol_level=MQTT5, properties={P.AUTHENTICATION_METHOD: "SCRAM"}), 0x8C),
    ("5.0 will payload not UTF-8", {MQTT5},
     lambda v: Connect("w", protocol_level=MQTT5, will=Will("w", b"\xff", 0, False, {P.PAYLOAD_FORMAT_INDICATOR: 1})),
     0x99),
]


class ChannelMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.run = H.Run(MAX_PACKET)
        self.run.connect_peer()
        self.peer_pid = 0
        self.peer_seq = 0          # payload b"peer:N" of the peer's Nth message
        self.last_peer_seq = 0     # the highest N the client has received
        self.ch = self.t = self.obs = None
        self.generation = 0

    # ------------------------------------------------------------------ plumbing

    def open(self, version: int):
        """A new connection (its CONNECT not yet sent); the previous one, if any, stays as it is."""
        self.old = (self.ch, self.t, self.obs)
        self.ch, self.t, self.obs = self.run.channel(f"client{self.generation}")
        self.generation += 1
        self.version = version
        self.seen = 0
        self.state = "new"
        self.aliases: set[int] = set()
        self.awaiting_rel: set[int] = set()    # incoming QoS 2 ids before PUBREL (the model)
        self.out_pending: dict[int, int] = {}  # outgoing QoS 1/2 ids -> qos, before their ack
        self.out_released: set[int] = set()    # outgoing QoS 2 ids PUBREC'd, waiting for our PUBCOMP
        self.subscribed = False

    def send(self, data: bytes, cuts) -> list:
        """Feed ``data`` in pieces; -> the packets the server wrote in reply."""
        points = sorted({c % (len(data) + 1) for c in cuts}) if data else []
        pieces, last = [], 0
        for c in points + [len(data)]:
            if c > last:
                pieces.append(data[last:c])
                last = c
        H.feed_channel(self.run, self.ch, self.t, self.obs, pieces, False)
        return self.new_packets()

    def new_packets(self) -> list:
        self.t.flush()
        self.obs.check()
        pkts = self.obs.packets[self.seen:]
        self.seen = len(self.obs.packets)
        for p in pkts:
            if p.type == PUBLISH and p.qos:
                assert p.packet_id not in self.out_pending or p.dup, p
                self.out_pending[p.packet_id] = p.qos
            if p.type == PUBLISH and p.payload.startswith(b"peer:") and not p.dup:
                # one publisher's messages reach the subscriber in the order sent, whatever
                # their QoS, the window and the queue (drops aside); a copy per matching
                # subscription may repeat one
                seq = int(p.payload[5:])
                assert seq >= self.last_peer_seq, (seq, self.last_peer_seq)
                self.last_peer_seq = seq
        return pkts

    def expect_close(self, pkts, codes, what):
        assert self.ch.state == CLOSED, f"{what}: connection still open"
        assert self.t.closed, f"{what}: transport not asked to close"
        if self.version == MQTT5:
            assert pkts and pkts[-1].type == DISCONNECT, f"{what}: v5 close without DISCONNECT: {pkts}"
            assert pkts[-1].reason_code in codes, (
                f"{what}: DISCONNECT 0x{pkts[-1].reason_code:02x}, expected {sorted(map(hex, codes))}")
        else:
            assert not any(p.type == DISCONNECT for p in pkts), pkts
        self.state = "closed"

    # ------------------------------------------------------------------ connect

    @initialize(v=st.sampled_from([MQTT31, MQTT311, MQTT5]))
    def start(self, v):
        self.open(v)

    @precondition(lambda self: self.state == "new")
    @rule(persistent=st.booleans(), keepalive=st.sampled_from([0, 5, 60]), cuts=st.lists(st.integers(0, 200)))
    def connect(self, persistent, keepalive, cuts):
        v = self.version
        props = None
        if v == MQTT5:
            props = {P.RECEIVE_MAXIMUM: CLIENT_RECEIVE_MAX, P.TOPIC_ALIAS_MAXIMUM: 2}
            if persistent:
                props[P.SESSION_EXPIRY_INTERVAL] = 60
        c = Connect("fz", clean_start=not persistent, keepalive=keepalive, protocol_level=v, properties=props)
        pkts = self.send(encode(c), cuts)
        assert [p.type for p in pkts][:1] == [CONNACK] and pkts[0].reason_code == 0, pkts
        assert self.ch.state == CONNECTED
        self.state = "connected"
        self.keepalive = keepalive
        self.persistent = persistent
        # a resumed session keeps its incoming QoS 2 ids awaiting PUBREL
        self.awaiting_rel = set(self.ch.session.awaiting_rel)
        # a resumed session may resend what it had in flight
        assert all(p.type in (PUBLISH, PUBREL) for p in pkts[1:]), pkts
        if self.old[0] is not None and self.old[0].state != CLOSED:
            # session takeover: the old connection is closed, v5 with 0x8E
            old_ch, old_t, old_obs = self.old
            old_t.flush()
            old_obs.check()
            assert old_ch.state == CLOSED
            if old_ch.version == MQTT5:
                assert old_obs.packets[-1].type == DISCONNECT and old_obs.packets[-1].reason_code == 0x8E

    @precondition(lambda self: self.state == "new")
    @rule(variant=st.sampled_from(CONNECTS), cuts=st.lists(st.integers(0, 200)))
    def bad_connect(self, variant, cuts):
        name, versions, make, outcome = variant
        if self.version not in versions:
            return
        c = make(self.version)
        c.protocol_level = self.version
        pkts = self.send(encode(c), cuts)
        assert self.ch.state == CLOSED, name
        if outcome is None:
            assert pkts == [], (name, pkts)
        else:
            assert len(pkts) == 1 and pkts[0].type == CONNACK, (name, pkts)
            assert pkts[0].reason_code == outcome, (name, pkts[0])
        self.state = "closed"

    @precondition(lambda self: self.state == "new")
    @rule(level=st.sampled_from([0, 1, 2, 6, 7, 255]))
    def unsupported_level(self, level):
        data = frame(0x10, s("MQTT") + bytes([level, 2]) + b"\x00\x3c" + s("x"))
        pkts = self.send(data, [])
        assert self.ch.state == CLOSED
        assert pkts == [Connack(False, 1)], pkts  # 3.1.1 format: return code 1, any client reads it
        self.state = "closed"

    @precondition(lambda self: self.state == "new")
    @rule()
    def first_packet_not_connect(self):
        pkts = self.send(encode(Pingreq()), [])
        assert pkts == [] and self.ch.state == CLOSED
        self.state = "closed"

    @precondition(lambda self: self.state in ("closed", "connected"))
    @rule(v=st.sampled_from([MQTT31, MQTT311, MQTT5]))
    def new_connection(self, v):
        """Another connection; with the same client id, it takes the session over once it connects."""
        self.open(v)

    # ------------------------------------------------------------------ subscribe

    @precondition(lambda self: self.state == "connected")
    @rule(filters=st.lists(st.sampled_from(FILTERS), min_size=1, max_size=3), qos=st.integers(0, 2),
          pid=st.integers(1, 3), cuts=st.lists(st.integers(0, 100), max_size=3))
    def subscribe(self, filters, qos, pid, cuts):
        reqs = [SubscriptionRequest(f, qos) for f in filters]
        pkts = self.send(encode(Subscribe(pid, reqs), self.version), cuts)
        acks = [p for p in pkts if p.type == SUBACK]
        if "" in filters and self.ch.state == CLOSED:
            # a zero-length topic filter: [MQTT-4.7.3-1]
            self.expect_close(pkts, EITHER, "empty filter")
            return
        assert len(acks) == 1 and acks[0].packet_id == pid, pkts
        assert len(acks[0].reason_codes) == len(filters)
        for f, code in zip(filters, acks[0].reason_codes, strict=True):
            if f in ("t/#/x", "a+", ""):
                assert code == (0x8F if self.version == MQTT5 else 0x80), (f, code)
            elif not f.startswith("$share") or self.version == MQTT5:
                assert code == qos, (f, code)
        if any(f in ("t/#", "t/+", "t/a", "#", "+/+", "$share/g/t/#") for f in filters):
            self.subscribed = True

    @precondition(lambda self: self.state == "connected")
    @rule(filters=st.lists(st.sampled_from(FILTERS[:8]), min_size=1, max_size=3), pid=st.integers(1, 3))
    def unsubscribe(self, filters, pid):
        pkts = self.send(encode(Unsubscribe(pid, filters), self.version), [])
        acks = [p for p in pkts if p.type == UNSUBACK]
        assert len(acks) == 1 and acks[0].packet_id == pid, pkts

    # ------------------------------------------------------------------ publish in

    @precondition(lambda self: self.state == "connected")
    @rule(topic=st.sampled_from(TOPICS), qos=st.integers(0, 2), pid=st.integers(1, 6), dup=st.booleans(),
          payload=st.binary(max_size=40), alias=st.none() | st.integers(0, ALIAS_MAX + 1), alias_only=st.booleans(),
          cuts=st.lists(st.integers(0, 120), max_size=4))
    def publish(self, topic, qos, pid, dup, payload, alias, alias_only, cuts):
        v5 = self.version == MQTT5
        props = None
        if v5 and alias is not None:
            props = {P.TOPIC_ALIAS: alias}
            if alias_only:
                topic = ""
        p = Publish(topic, payload, qos, False, dup and qos > 0, pid if qos else 0, props)
        pkts = self.send(encode(p, self.version), cuts)
        if v5 and alias is not None:
            if alias == 0 or alias > ALIAS_MAX:
                return self.expect_close(pkts, {0x94}, "topic alias out of range")
            if alias_only:
                if alias not in self.aliases:
                    return self.expect_close(pkts, {PROTOCOL}, "unknown topic alias")
            else:
                self.aliases.add(alias)
        if qos == 1 and v5 and len(self.awaiting_rel) >= RECEIVE_MAX:
            # QoS 2 messages count against Receive Maximum until their PUBCOMP
            return self.expect_close(pkts, {0x93}, "Receive Maximum exceeded")
        if qos == 1:
            # 0x10 No matching subscribers is a success too
            assert any(a.type == PUBACK and a.packet_id == pid and a.reason_code in (0, 0x10) for a in pkts), pkts
        elif qos == 2:
            if pid in self.awaiting_rel:
                # packet id reuse before PUBREL: PUBREC again, not delivered again
                assert any(a.type == PUBREC and a.packet_id == pid for a in pkts), pkts
            elif v5 and len(self.awaiting_rel) >= RECEIVE_MAX:
                return self.expect_close(pkts, {0x93}, "Receive Maximum exceeded")
            else:
                assert any(a.type == PUBREC and a.packet_id == pid and a.reason_code in (0, 0x10) for a in pkts), pkts
                self.awaiting_rel.add(pid)
        assert self.ch.state == CONNECTED

    @precondition(lambda self: self.state == "connected" and self.version == MQTT5)
    @rule(qos=st.integers(1, 2), pid=st.integers(100, 110))
    def publish_not_utf8(self, qos, pid):
        """Payload Format Indicator 1 with a payload that is not UTF-8: refused with 0x99, not closed."""
        p = Publish("t/a", b"\xff\xfe", qos, False, False, pid, {P.PAYLOAD_FORMAT_INDICATOR: 1})
        pkts = self.send(encode(p, MQTT5), [])
        kind = PUBACK if qos == 1 else PUBREC
        assert any(a.type == kind and a.packet_id == pid and a.reason_code == 0x99 for a in pkts), pkts
        assert self.ch.state == CONNECTED

    @precondition(lambda self: self.state == "connected")
    @rule(pid=st.integers(1, 8))
    def pubrel(self, pid):
        pkts = self.send(encode(Pubrel(pid), self.version), [])
        comps = [p for p in pkts if p.type == PUBCOMP and p.packet_id == pid]
        assert len(comps) == 1, pkts
        if self.version == MQTT5:
            assert comps[0].reason_code == (0 if pid in self.awaiting_rel else 0x92), comps
        self.awaiting_rel.discard(pid)

    # ------------------------------------------------------------------ publish out

    @precondition(lambda self: self.state == "connected")
    @rule(topic=st.sampled_from(TOPICS), qos=st.integers(0, 2), n=st.sampled_from([1, 2, 4, 20]))
    def peer_publishes(self, topic, qos, n):
        """Another client publishes; 20 at once fill the window and the queue (16), which drops."""
        ch, t, obs = self.run.peer
        for _ in range(n):
            pid = 0
            if qos:
                self.peer_pid = pid = self.peer_pid % 65535 + 1
            self.peer_seq += 1
            ch.receive_data(encode(Publish(topic, b"peer:%d" % self.peer_seq, qos, False, False, pid)),
                            self.run.now)
            if qos == 2:
                ch.receive_data(encode(Pubrel(pid)), self.run.now)
            t.flush()
            obs.check()
        self.new_packets()

    @precondition(lambda self: self.state == "connected" and self.out_pending)
    @rule(data=st.data())
    def ack_delivery(self, data):
        pid = data.draw(st.sampled_from(sorted(self.out_pending)))
        qos = self.out_pending[pid]
        if qos == 1:
            self.send(encode(Puback(pid), self.version), [])
            del self.out_pending[pid]
            return
        pkts = self.send(encode(Pubrec(pid), self.version), [])
        assert [(p.type, p.packet_id, p.reason_code) for p in pkts if p.type == PUBREL] == [(PUBREL, pid, 0)], pkts
        del self.out_pending[pid]
        self.out_released.add(pid)

    @precondition(lambda self: self.state == "connected" and self.out_released)
    @rule(data=st.data())
    def complete_delivery(self, data):
        pid = data.draw(st.sampled_from(sorted(self.out_released)))
        pkts = self.send(encode(Pubcomp(pid), self.version), [])
        self.out_released.discard(pid)
        assert all(p.type == PUBLISH for p in pkts), pkts

    @precondition(lambda self: self.state == "connected")
    @rule(kind=st.sampled_from([PUBACK, PUBREC, PUBCOMP]), pid=st.integers(200, 210))
    def ack_unknown_id(self, kind, pid):
        cls = {PUBACK: Puback, PUBREC: Pubrec, PUBCOMP: Pubcomp}[kind]
        pkts = self.send(encode(cls(pid), self.version), [])
        rels = [p for p in pkts if p.type == PUBREL]
        if kind == PUBREC:
            assert len(rels) == 1 and rels[0].packet_id == pid, pkts
            if self.version == MQTT5:
                assert rels[0].reason_code == 0x92
        else:
            assert rels == [], pkts
        assert self.ch.state == CONNECTED

    # ------------------------------------------------------------------ misc

    @precondition(lambda self: self.state == "connected")
    @rule()
    def ping(self):
        pkts = self.send(encode(Pingreq()), [])
        assert any(p.type == PINGRESP for p in pkts), pkts

    @precondition(lambda self: self.state == "connected")
    @rule(code=st.sampled_from([0, 4]))
    def disconnect(self, code):
        pkts = self.send(encode(Disconnect(code), self.version), [])
        assert self.ch.state == CLOSED and not any(p.type == DISCONNECT for p in pkts)
        self.state = "closed"

    @precondition(lambda self: self.state == "connected" and self.keepalive)
    @rule()
    def keepalive_expires(self):
        self.run.now += self.keepalive * 1.5 + 1
        self.ch.handle_timeout(self.run.now)
        self.expect_close(self.new_packets(), {0x8D}, "keep alive timeout")

    @precondition(lambda self: self.state == "new")
    @rule()
    def connect_timeout(self):
        self.run.now += 11
        self.ch.handle_timeout(self.run.now)
        assert self.new_packets() == [] and self.ch.state == CLOSED
        self.state = "closed"

    @precondition(lambda self: self.state in ("new", "connected"))
    @rule(announced=st.sampled_from([MAX_PACKET + 1, 4096, 268_435_455]), body=st.integers(0, 300),
          cuts=st.lists(st.integers(0, 300), max_size=3))
    def oversize(self, announced, body, cuts):
        """A packet above the maximum packet size: closed on its fixed header (v5: 0x95), nothing buffered."""
        data = b"\x30" + varint(announced) + b"\x00\x01t" + bytes(body)
        was = self.state
        pkts = self.send(data, cuts)
        if was == "new":
            assert self.ch.state == CLOSED and pkts == [], pkts
            self.state = "closed"
        else:
            self.expect_close(pkts, {0x95}, "oversize")

    @precondition(lambda self: self.state == "connected")
    @rule(case=st.sampled_from(GARBAGE), cuts=st.lists(st.integers(0, 40), max_size=3))
    def garbage(self, case, cuts):
        name, v5_bytes, v3_bytes, codes = case
        data = v5_bytes if self.version == MQTT5 else v3_bytes
        if data is None:
            return
        if name == "PUBLISH empty topic, no alias" and self.version != MQTT5:
            codes = EITHER
        pkts = self.send(data, cuts)
        if name == "DISCONNECT Session Expiry after 0" and self.persistent:
            # not an error after a non-zero Session Expiry Interval on CONNECT: a normal DISCONNECT
            assert self.ch.state == CLOSED and not any(p.type == DISCONNECT for p in pkts), pkts
            self.state = "closed"
            return
        self.expect_close(pkts, codes, name)

    @precondition(lambda self: self.state == "closed")
    @rule(data=st.binary(max_size=20))
    def after_close(self, data):
        assert self.send(encode(Pingreq()) + data, []) == []

    # ------------------------------------------------------------------ invariants

    @invariant()
    def windows(self):
        if self.ch is None:
            return
        H.check_window(self.ch, self.run.limits, self.obs.resumed)
        if self.ch.state == CONNECTED and self.version == MQTT5:
            assert self.ch.send_window <= CLIENT_RECEIVE_MAX
        assert self.ch.decoder.buffered < MAX_PACKET

    @invariant()
    def closed_means_closed(self):
        if self.ch is not None and self.ch.state == CLOSED:
            assert self.t.closed
            assert not self.ch.out

    def teardown(self):
        for ch in (self.ch, self.run.peer[0]):
            if ch is not None:
                ch.connection_lost(self.run.now)


ChannelMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "300")),
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestChannelMachine = ChannelMachine.TestCase
