"""A socket-free test bed for :class:`brokerd.protocol.channel.Channel`.

``Net`` owns a real :class:`~brokerd.broker.Broker` and a clock; ``net.client()``
opens a server-side Channel and returns a :class:`Client` that talks to it the
way a network peer would: it encodes packets with our codec, feeds the bytes to
``channel.receive_data`` and decodes whatever the channel put in ``channel.out``.

    net = Net()
    a = net.client(version=5)
    a.connect("a")                       # -> the CONNACK, asserted successful
    a.subscribe("t/#", qos=1)
    b = net.connect("b")                 # client() + connect()
    b.publish("t/1", b"x", qos=1)        # -> the PUBACK
    [p] = a.publishes()                  # PUBLISHes received since the last look
"""

from dataclasses import dataclass, field

from brokerd.broker import Broker, BrokerConfig
from brokerd.protocol import properties as P
from brokerd.protocol.channel import Channel, ChannelLimits
from brokerd.protocol.codec import FrameDecoder, encode
from brokerd.protocol.packets import (
    CONNACK,
    DISCONNECT,
    MQTT5,
    MQTT31,
    MQTT311,
    PUBLISH,
    Connack,
    Connect,
    Disconnect,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    SubscriptionRequest,
    Unsuback,
    Unsubscribe,
    Will,
)

__all__ = ["MQTT5", "MQTT31", "MQTT311", "Client", "Hooks", "Net", "Will"]


@dataclass
class Hooks:
    """What the transport would do, recorded."""

    wakes: int = 0
    closed: bool = False
    paused: bool = False
    calls: list = field(default_factory=list)

    def wake(self):
        self.wakes += 1
        self.calls.append("wake")

    def close(self):
        self.closed = True
        self.calls.append("close")

    def pause_reading(self):
        self.paused = True
        self.calls.append("pause")

    def resume_reading(self):
        self.paused = False
        self.calls.append("resume")

    def flush_now(self):
        self.calls.append("flush_now")        # (the harness reads ``out`` itself)

    def end_turn(self):
        self.calls.append("end_turn")


class UnknownAlias(AssertionError):
    """The server used a topic alias it never set up on this connection."""


class Client:
    def __init__(self, net: "Net", version: int = MQTT311):
        self.net = net
        self.version = version
        self.hooks = Hooks()
        self.channel = Channel(net.broker, net.limits, self.hooks, now=net.now)
        self.decoder = FrameDecoder(version=version)
        self.inbox: list = []  # decoded, not yet looked at
        self.history: list = []  # everything ever received
        self.aliases: dict[int, str] = {}
        self.next_pid = 1
        self.client_id = None
        self.auto_flush = True  # False: never report a write, so output piles up as on a stuck socket

    # ------------------------------------------------------------------ raw I/O

    def send(self, *pkts) -> list:
        """Encode and deliver ``pkts`` in one chunk; -> the packets received in reply."""
        return self.send_raw(b"".join(encode(p, self.version) for p in pkts))

    def send_raw(self, data: bytes) -> list:
        self.channel.receive_data(data, self.net.now)
        return self.recv()

    def recv(self) -> list:
        """Decode what the channel has written since the last call; -> those packets."""
        ch = self.channel
        data = b""
        while ch.out:
            # what the transport does: write out everything, then tell the channel
            data += b"".join(ch.out)
            ch.out.clear()
            if self.auto_flush and hasattr(ch, "flushed"):
                ch.flushed(self.net.now)
        pkts = self.decoder.feed(data) if data else []
        for p in pkts:
            if p.type == PUBLISH and self.version == MQTT5:
                self._resolve_alias(p)
        self.inbox.extend(pkts)
        self.history.extend(pkts)
        return pkts

    def _resolve_alias(self, p: Publish) -> None:
        alias = (p.properties or {}).get(P.TOPIC_ALIAS)
        if alias is None:
            return
        if p.topic:
            self.aliases[alias] = p.topic
        elif alias in self.aliases:
            p.topic = self.aliases[alias]
        else:
            raise UnknownAlias(f"server sent topic alias {alias} it never set; known: {self.aliases}")

    def take(self) -> list:
        """Every packet received and not yet taken."""
        self.recv()
        pkts, self.inbox = self.inbox, []
        return pkts

    def take_one(self, cls=None):
        pkts = self.take()
        assert len(pkts) == 1, pkts
        if cls is not None:
            assert isinstance(pkts[0], cls), pkts[0]
        return pkts[0]

    def publishes(self) -> list:
        """PUBLISHes received and not yet taken (other packets stay in the inbox)."""
        self.recv()
        pubs = [p for p in self.inbox if p.type == PUBLISH]
        self.inbox = [p for p in self.inbox if p.type != PUBLISH]
        return pubs

    def payloads(self) -> list:
        return [p.payload for p in self.publishes()]

    @property
    def closed(self) -> bool:
        return self.hooks.closed

    def lose(self) -> None:
        """The network connection drops (no DISCONNECT)."""
        self.channel.connection_lost(self.net.now)

    def pid(self) -> int:
        pid = self.next_pid
        self.next_pid = pid % 65535 + 1
        return pid

    # ------------------------------------------------------------------ MQTT verbs

    def connect(
        self,
        client_id="",
        clean=True,
        keepalive=60,
        will=None,
        properties=None,
        username=None,
        password=None,
        expect=0,
    ):
        """Send CONNECT; -> the CONNACK. ``expect`` is the reason/return code asserted (None: don't)."""
        self.client_id = client_id
        level = self.version
        c = Connect(
            client_id,
            clean,
            keepalive,
            username,
            password,
            will,
            level,
            properties,
            "MQIsdp" if level == MQTT31 else "MQTT",
        )
        pkts = self.send(c)
        assert pkts and pkts[0].type == CONNACK, pkts
        self.inbox.remove(pkts[0])
        if expect is not None:
            assert pkts[0].reason_code == expect, pkts[0]
        return pkts[0]

    def subscribe(self, *filters, qos=0, properties=None, expect=None, **opts) -> Suback:
        """SUBSCRIBE to ``filters`` (str or SubscriptionRequest); -> the SUBACK."""
        reqs = [
            f if isinstance(f, SubscriptionRequest) else SubscriptionRequest(f, qos, **opts) for f in filters
        ]
        pid = self.pid()
        self.send(Subscribe(pid, reqs, properties))
        acks = [p for p in self.inbox if isinstance(p, Suback)]
        assert len(acks) == 1, self.inbox
        self.inbox.remove(acks[0])
        assert acks[0].packet_id == pid
        if expect is not None:
            assert acks[0].reason_codes == expect
        return acks[0]

    def unsubscribe(self, *filters, properties=None) -> Unsuback:
        pid = self.pid()
        self.send(Unsubscribe(pid, list(filters), properties))
        acks = [p for p in self.inbox if isinstance(p, Unsuback)]
        assert len(acks) == 1, self.inbox
        self.inbox.remove(acks[0])
        return acks[0]

    def publish(self, topic, payload=b"", qos=0, retain=False, properties=None, pid=None, dup=False):
        """PUBLISH; for QoS 1 -> the PUBACK, for QoS 2 -> the PUBREC (the flow is not completed)."""
        if qos and pid is None:
            pid = self.pid()
        self.send(Publish(topic, payload, qos, retain, dup, pid or 0, properties))
        if not qos:
            return None
        cls = Puback if qos == 1 else Pubrec
        acks = [p for p in self.inbox if isinstance(p, cls) and p.packet_id == pid]
        if not acks:
            return None
        self.inbox.remove(acks[0])
        return acks[0]

    def publish2(self, topic, payload=b"", **kw) -> Pubcomp:
        """A complete QoS 2 exchange: PUBLISH, PUBREC, PUBREL, PUBCOMP."""
        rec = self.publish(topic, payload, qos=2, **kw)
        assert isinstance(rec, Pubrec), rec
        comp = [p for p in self.send(Pubrel(rec.packet_id)) if isinstance(p, Pubcomp)]
        assert len(comp) == 1
        self.inbox.remove(comp[0])
        return comp[0]

    def ack(self, pub: Publish) -> list:
        """Acknowledge a received PUBLISH (QoS 2: the whole PUBREC/PUBREL/PUBCOMP exchange)."""
        if pub.qos == 1:
            return self.send(Puback(pub.packet_id))
        if pub.qos == 2:
            rel = [p for p in self.send(Pubrec(pub.packet_id)) if isinstance(p, Pubrel)]
            assert [p.packet_id for p in rel] == [pub.packet_id], rel
            self.inbox.remove(rel[0])
            return self.send(Pubcomp(pub.packet_id))
        return []

    def disconnect(self, reason_code=0, properties=None) -> None:
        self.send(Disconnect(reason_code, properties))

    def server_disconnect(self) -> Disconnect | None:
        """The DISCONNECT the server sent, if any (taken from the inbox)."""
        self.recv()
        ds = [p for p in self.inbox if p.type == DISCONNECT]
        for d in ds:
            self.inbox.remove(d)
        assert len(ds) <= 1
        return ds[0] if ds else None


class Net:
    def __init__(self, limits: ChannelLimits | None = None, now: float = 1000.0, **config):
        self.limits = limits or ChannelLimits()
        config.setdefault("allow_anonymous", True)
        self.broker = Broker(BrokerConfig(limits=self.limits, **config), now=now)
        self.now = now
        self.clients: list[Client] = []

    def client(self, version=MQTT311) -> Client:
        c = Client(self, version)
        self.clients.append(c)
        return c

    def connect(self, client_id="", version=MQTT311, **kw) -> Client:
        c = self.client(version)
        c.connect(client_id, **kw)
        return c

    def advance(self, seconds: float) -> None:
        """Move the clock; fire broker timers and every channel's timeout check."""
        self.now += seconds
        self.broker.tick(self.now)
        for c in self.clients:
            c.channel.handle_timeout(self.now)

    @property
    def stats(self):
        return self.broker.stats


def v5_connack_props(connack: Connack) -> dict:
    return connack.properties or {}
