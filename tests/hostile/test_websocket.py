"""Hostile clients on the WebSocket listener (ws://): what they can make the broker hold before
and after CONNECT, and how it answers a broken upgrade request. Real brokerd, real sockets, the
client side of the WebSocket protocol from wsproto; a canary on the same broker keeps working."""

import socket
import time

from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, BytesMessage, Ping, Pong, Request

from ..integration import raw
from .conftest import MIB, peak_rss_kib, report, rss_kib
from .test_connect_phase import _closed_by_peer


class WsPeer:
    """A WebSocket client over a raw socket (wsproto, client side) that reads only when told to."""

    def __init__(self, port: int, rcvbuf: int | None = None):
        self.sock = socket.socket()
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(30)
        self.sock.connect(("127.0.0.1", port))
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.sock.sendall(self.ws.send(Request(host="127.0.0.1", target="/mqtt", subprotocols=["mqtt"])))
        events = []
        while not events:
            self.ws.receive_data(self.sock.recv(65536))
            events = list(self.ws.events())
        assert isinstance(events[0], AcceptConnection), events

    def read_until(self, want, timeout: float = 15.0) -> list:
        """Events until ``want(event)`` is true for one of them; -> all of them."""
        got = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            data = self.sock.recv(1 << 20)
            self.ws.receive_data(data or None)
            for ev in self.ws.events():
                got.append(ev)
                if want(ev):
                    return got
            if not data:
                break
        raise AssertionError(f"not received; {len(got)} events, the last {got[-3:]}")

    def close(self):
        self.sock.close()


def test_websocket_pings_not_read_do_not_pile_up(hostile_broker, canary_for, request):
    """A WebSocket client that completed the upgrade but sent no CONNECT sends 40 MB of pings
    (125 bytes of payload each) and reads nothing. Each ping's pong went into the socket's write
    buffer whatever its size: the unauthenticated socket made the broker hold more than its own
    size in pongs (about 50 MiB here; --preauth-budget and --max-connect-size do not see them),
    and an authenticated one could go on for ever. RFC 6455 5.5.3 lets an endpoint answer only
    the latest ping: while the socket's buffer is full the broker keeps only the latest ping and
    answers it when the client reads. RSS grows by less than 16 MiB; once the client reads it
    gets the pong of its last ping, and its CONNECT is then answered; the canary works."""
    b = hostile_broker("--connect-timeout", "120")
    canary = canary_for(b)
    peer = WsPeer(b.port("ws"), rcvbuf=4096)
    chunk = b"".join(peer.ws.send(Ping(payload=b"p" * 125)) for _ in range(500))
    rss0 = peak = rss_kib(b)
    sent = 0
    with canary.running():
        while sent < 40_000_000:
            peer.sock.sendall(chunk)
            sent += len(chunk)
            if sent % (len(chunk) * 20) == 0:
                peak = max(peak, rss_kib(b))
        peer.sock.sendall(peer.ws.send(Ping(payload=b"the last one")))
        time.sleep(0.5)
        peak = max(peak, rss_kib(b))
    try:
        pongs = peer.read_until(lambda ev: isinstance(ev, Pong) and ev.payload == b"the last one")
        assert all(isinstance(ev, Pong) for ev in pongs)
        peer.sock.sendall(peer.ws.send(BytesMessage(data=raw.connect_packet("ws-pinger", version=4))))
        got = peer.read_until(lambda ev: isinstance(ev, BytesMessage))
        assert got[-1].data == b"\x20\x02\x00\x00"                       # CONNACK, accepted
    finally:
        peer.close()
    canary.check()
    report(request, sent_mb=sent // 1_000_000, pongs_read=len(pongs), rss_before_kib=rss0, rss_peak_kib=peak,
           canary_worst_s=round(canary.worst, 3))
    assert peak - rss0 < 16 * MIB, f"RSS grew by {(peak - rss0) // 1024} MiB"


def test_partial_upgrade_requests_are_bounded_node_wide(hostile_broker, canary_for, request):
    """As tests/hostile/test_connect_phase.py::test_partial_connects_are_bounded_node_wide, on
    the WebSocket listener: 1,000 sockets each send an upgrade request of 15 KB (under h11's 16 KiB
    a request) without its final blank line, and wait. These bytes are held before anyone is
    authenticated, but --preauth-budget did not count them: the node held all 15 MB, whatever
    the budget (1 MiB here). Now they count with the incomplete CONNECTs: the sockets whose
    bytes would pass the budget are closed at once (at least 1,000 - 1 MiB / 15 KB of them), RSS
    grows by less than 8 MiB, the canary works, and after the connect timeout (2 s) a paho
    client connects over ws:// (the budget was given back)."""
    from ..integration.helpers import V311, connect

    budget = 1024 * 1024
    b = hostile_broker("--preauth-budget", str(budget))
    canary = canary_for(b)
    rss0 = rss_kib(b)
    data = b"GET /mqtt HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + b"a" * 15_000 + b"\r\n"
    socks = []
    open_socks = []
    cut = 0
    with canary.running():
        for _ in range(1000):
            s = socket.create_connection(("127.0.0.1", b.port("ws")), timeout=5)
            socks.append(s)
            try:
                s.sendall(data)
            except OSError:
                cut += 1
                continue
            s.setblocking(False)
            open_socks.append(s)
        time.sleep(1.0)                               # let the broker read what is in flight
        still = []
        for s in open_socks:
            if _closed_by_peer(s):
                cut += 1
            else:
                still.append(s)
        peak = rss_kib(b)
        held_max = budget // len(data)
        assert cut >= 1000 - held_max, f"only {cut} cut; at most {held_max} may be held"
        deadline = time.monotonic() + 6               # the held ones go at the connect timeout
        while still and time.monotonic() < deadline:
            time.sleep(0.2)
            still = [s for s in still if not _closed_by_peer(s)]
    for s in socks:
        s.close()
    assert not still, "partial upgrade requests still open after the connect timeout"
    with connect(b.port("ws"), "ws-after", V311, transport="websockets") as c:
        c.subscribe("ws/after", 1)
        c.publish("ws/after", b"ok", qos=1)
        assert c.expect().payload == b"ok"
    canary.check()
    assert peak - rss0 < 8 * MIB, (rss0, peak)
    report(request, sockets=1000, request_bytes=len(data), cut_at_once=cut, held_at_most=1000 - cut,
           rss_before_kib=rss0, rss_peak_kib=peak, canary_worst_s=round(canary.worst, 3))


def test_a_flood_of_tiny_mqtt_packets_over_websocket_does_not_swell_the_node(hostile_broker, canary_for, request):
    """test_misbehaving's flood of PINGREQs over ws://: frames of 32,768 PINGREQs each, sent as
    fast as the socket takes them (default buffers), nothing read. Before, the answers of many
    reads piled up between two writes and nothing paused the socket: the node's peak RSS rose by
    hundreds of MB. Now they are written once 4,096 wait and the socket is no longer read while
    its write buffer is past its bound."""
    b = hostile_broker()
    canary = canary_for(b)
    peer = WsPeer(b.port("ws"))
    peer.sock.sendall(peer.ws.send(BytesMessage(data=raw.connect_packet("ws-tiny", version=4, keepalive=0))))
    assert peer.read_until(lambda ev: isinstance(ev, BytesMessage))[-1].data == b"\x20\x02\x00\x00"
    frame = peer.ws.send(BytesMessage(data=b"\xc0\x00" * 32768))
    peer.sock.settimeout(0.5)
    stop = time.monotonic() + 4
    sent = 0
    peak0 = peak_rss_kib(b)
    with canary.running():
        while time.monotonic() < stop:
            try:
                peer.sock.sendall(frame)
                sent += len(frame)
            except TimeoutError:
                pass
    grown = peak_rss_kib(b) - peak0
    peer.close()
    canary.check()
    report(request, sent_mb=sent // 1_000_000, peak_grown_kib=grown, canary_worst_s=round(canary.worst, 3))
    assert grown < 32 * MIB, f"the node's peak RSS grew by {grown // 1024} MiB"
