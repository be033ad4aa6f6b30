"""Transports: MQTT over WebSocket (ws://HOST:PORT/mqtt), TLS (mqtts://) and WebSocket over TLS
(wss://), with and without client certificates."""

import base64
import os
import socket
import ssl
import subprocess
import threading
import time

import pytest
import trustme
from paho.mqtt.client import WebsocketConnectionError
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, BytesMessage, CloseConnection, Ping, Pong, Request, TextMessage

from ..pki import write_cert
from ..procs import ROOT, BrokerProcess
from . import raw
from .helpers import V5, V311, Client, MosqSub, connect, mosq_pub


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("device-1.example")
    other_ca = trustme.CA()
    stranger = other_ca.issue_cert("stranger.example")
    paths = {}
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    paths["ca"] = str(d / "ca.pem")
    for name, cert in (("server", server), ("client", client), ("stranger", stranger)):
        paths[name], paths[name + "_key"] = write_cert(cert, d, name)
    return paths


@pytest.fixture(scope="module")
def tls_broker(pki):
    with BrokerProcess("--tls-cert", pki["server"], "--tls-key", pki["server_key"],
                       listen=("mqtt://127.0.0.1:0", "mqtts://127.0.0.1:0", "wss://127.0.0.1:0/mqtt")) as b:
        yield b


@pytest.fixture(scope="module")
def mtls_broker(pki):
    with BrokerProcess("--tls-cert", pki["server"], "--tls-key", pki["server_key"], "--tls-ca", pki["ca"],
                       "--tls-verify-client", "required",
                       listen=("mqtts://127.0.0.1:0", "wss://127.0.0.1:0/mqtt")) as b:
        yield b


def tls_client(client_id, version, pki, transport="tcp", cert=None):
    c = Client(client_id, version, transport=transport)
    kw = {}
    if cert:
        kw = {"certfile": pki[cert], "keyfile": pki[cert + "_key"]}
    c.client.tls_set(ca_certs=pki["ca"], **kw)
    return c


# --------------------------------------------------------------------------- WebSocket

@pytest.mark.parametrize("version", [V311, V5])
def test_websocket_pubsub(broker, client_id, topic, version):
    with connect(broker.port("ws"), client_id + "s", version, transport="websockets") as sub, \
            connect(broker.port("ws"), client_id + "p", version, transport="websockets") as pub:
        sub.subscribe(topic, 2)
        for q in (0, 1, 2):
            pub.publish(topic, b"ws%d" % q, qos=q)
        assert [(m.payload, m.qos) for m in sub.expect_n(3)] == [(b"ws0", 0), (b"ws1", 1), (b"ws2", 2)]


def test_websocket_and_tcp_clients_share_topics(broker, client_id, topic):
    with connect(broker.port("ws"), client_id + "ws", V5, transport="websockets") as ws, \
            MosqSub(broker.port(), topic + "/to-tcp", version="mqttv5") as tcp:
        ws.subscribe(topic + "/to-ws", 1)
        mosq_pub(broker.port(), topic + "/to-ws", "over-tcp", qos=1)
        assert ws.expect().payload == b"over-tcp"
        ws.publish(topic + "/to-tcp", b"over-ws", qos=1)
        assert tcp.messages(1)[0]["payload"] == "over-ws"


def test_websocket_large_message(broker, client_id, topic):
    """A 200 kB message crosses the WebSocket framing intact both ways."""
    body = os.urandom(200_000)
    with connect(broker.port("ws"), client_id, V311, transport="websockets") as c:
        c.subscribe(topic, 1)
        c.publish(topic, body, qos=1)
        assert c.expect().payload == body


def test_websocket_will_on_drop(broker, client_id, topic):
    with connect(broker.port(), client_id + "w", V311) as watch:
        watch.subscribe(topic, 1)
        c = Client(client_id, V311, transport="websockets")
        c.connect(broker.port("ws"), will=(topic, b"ws-gone", 1, False, None))
        c.drop()
        assert watch.expect().payload == b"ws-gone"


def _http_upgrade(port, path, protocol="mqtt") -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    req = (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n")
    if protocol:
        req += f"Sec-WebSocket-Protocol: {protocol}\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
        s.sendall((req + "\r\n").encode())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        return data


def test_websocket_upgrade_only_on_listener_path(broker):
    ok = _http_upgrade(broker.port("ws"), "/mqtt")
    assert ok.startswith(b"HTTP/1.1 101") and b"sec-websocket-protocol: mqtt" in ok.lower()
    assert _http_upgrade(broker.port("ws"), "/other").startswith(b"HTTP/1.1 404")
    assert _http_upgrade(broker.port("ws"), "/mqtt", protocol="chat").startswith(b"HTTP/1.1 400")


def test_websocket_subprotocol_mqtt_is_chosen_whenever_offered(broker):
    """[MQTT-6.0.0-4] (3.1.1 and 5.0): the subprotocol the server selects MUST be "mqtt".
    A client offering "mqttv3.1, mqtt" (the legacy name first) got "mqttv3.1" back: the first
    offered name the broker knew, in the client's order. Now "mqtt" whenever it is offered;
    "mqttv3.1" alone is still accepted and echoed (Mosquitto accepts both)."""
    def selected(protocol):
        answer = _http_upgrade(broker.port("ws"), "/mqtt", protocol=protocol)
        assert answer.startswith(b"HTTP/1.1 101"), answer
        return [line.split(b":", 1)[1].strip() for line in answer.split(b"\r\n")
                if line.lower().startswith(b"sec-websocket-protocol:")]
    assert selected("mqttv3.1, mqtt") == [b"mqtt"]
    assert selected("chat, mqtt") == [b"mqtt"]
    assert selected("mqttv3.1") == [b"mqttv3.1"]


def _http_exchange(port, request: bytes) -> bytes:
    """What the listener answers to ``request``, up to its close."""
    with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
        s.sendall(request)
        data = b""
        while True:
            chunk = s.recv(4096)
            if not chunk:
                return data
            data += chunk


def test_websocket_bad_upgrade_requests_get_an_http_answer(broker):
    """RFC 6455 4.2.2: a handshake the server does not accept gets an HTTP error -- for a
    Sec-WebSocket-Version it does not speak, 426 with the version it does. The broker closed
    these sockets without a word: a client (or its operator) saw "connection closed" and no
    reason, and a client that falls back to another version could not learn which."""
    port = broker.port("ws")
    head = "Host: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Protocol: mqtt\r\n"
    key = "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    old_version = _http_exchange(port, f"GET /mqtt HTTP/1.1\r\n{head}{key}Sec-WebSocket-Version: 8\r\n\r\n".encode())
    assert old_version.startswith(b"HTTP/1.1 426 ")
    assert b"sec-websocket-version: 13\r\n" in old_version.lower()
    for request in (f"GET /mqtt HTTP/1.1\r\n{head}Sec-WebSocket-Version: 13\r\n\r\n",          # no key
                    f"POST /mqtt HTTP/1.1\r\n{head}{key}Sec-WebSocket-Version: 13\r\n\r\n",    # not GET
                    "GET /mqtt HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",                          # no upgrade
                    "hello\r\n\r\n"):                                                         # not HTTP
        assert _http_exchange(port, request.encode()).startswith(b"HTTP/1.1 400 "), request
    assert _http_upgrade(port, "/mqtt").startswith(b"HTTP/1.1 101")        # and the listener still upgrades


def test_websocket_upgrade_with_non_ascii_header_bytes():
    """Bytes over 0x7f in Host, Connection or Sec-WebSocket-Protocol (HTTP allows them in a field
    value) made wsproto raise UnicodeDecodeError, which the transport did not catch: the socket
    closed without an answer and the event loop logged "Fatal error on transport" with a
    traceback, at ERROR, for each such request -- anyone could fill the broker's log before
    authenticating. Now: 400, nothing logged above DEBUG, and the listener keeps upgrading."""
    key = "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
    with BrokerProcess() as b:
        port = b.port("ws")
        for host, connection, protocol in ((b"\xff", b"Upgrade", b"mqtt"), (b"127.0.0.1", b"Upgrade\xe9", b"mqtt"),
                                           (b"127.0.0.1", b"Upgrade", b"mqtt\xe9")):
            request = (b"GET /mqtt HTTP/1.1\r\nHost: " + host + b"\r\nUpgrade: websocket\r\nConnection: " + connection
                       + b"\r\nSec-WebSocket-Protocol: " + protocol + b"\r\n" + key.encode() + b"\r\n")
            assert _http_exchange(port, request).startswith(b"HTTP/1.1 400 "), request
        assert _http_upgrade(port, "/mqtt").startswith(b"HTTP/1.1 101")
        time.sleep(0.3)
        assert "Traceback" not in b.log and "ERROR" not in b.log, b.log[-2000:]


class WsClient:
    """MQTT bytes over a WebSocket driven by wsproto (client side), frame by frame."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=3)
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.sock.sendall(self.ws.send(Request(host="127.0.0.1", target="/mqtt", subprotocols=["mqtt"])))
        assert isinstance(self.events()[0], AcceptConnection)

    def events(self):
        data = self.sock.recv(65536)
        self.ws.receive_data(data or None)
        return list(self.ws.events())

    def send_frames(self, *chunks):
        out = b""
        for i, chunk in enumerate(chunks):
            out += self.ws.send(BytesMessage(data=chunk, message_finished=i == len(chunks) - 1))
        self.sock.sendall(out)

    def mqtt_bytes(self, n, timeout=3):
        """Read frames until n bytes of MQTT data arrived."""
        data = b""
        deadline = time.monotonic() + timeout
        while len(data) < n and time.monotonic() < deadline:
            for ev in self.events():
                if isinstance(ev, BytesMessage):
                    data += ev.data
        return data

    def close(self):
        self.sock.close()


def test_websocket_mqtt_split_and_packed_across_frames(broker):
    """MQTT packets may be split across WebSocket frames and several may share one frame."""
    c = WsClient(broker.port("ws"))
    try:
        conn = raw.connect_packet("ws-frames", version=4)
        c.send_frames(conn[:3], conn[3:7], conn[7:])
        assert c.mqtt_bytes(4) == b"\x20\x02\x00\x00"
        c.send_frames(raw.subscribe_packet(1, [("wsf/t", 1)]) + raw.publish_packet("wsf/t", b"hi", 1, pid=5))
        got = c.mqtt_bytes(5 + 4 + 11)
        assert got.startswith(b"\x90\x03\x00\x01\x01")           # SUBACK granted QoS 1
        assert b"\x40\x02\x00\x05" in got                       # PUBACK for packet 5
        assert b"\x00\x05wsf/t" in got and b"hi" in got              # the message itself
    finally:
        c.close()


def test_websocket_mqtt_sent_with_the_upgrade_request_is_read(broker):
    """A client that sends its CONNECT in the same write as the upgrade request, not waiting for
    the 101 (RFC 6455 4.1 says it should wait; some embedded clients do not): the frames that
    followed the request were dropped (wsproto's server handshake does not hand h11's leftover
    bytes to the WebSocket), and the client waited for a CONNACK that never came. Now they are
    read as if they had come after the answer."""
    port = broker.port("ws")
    def masked(payload):                                # a client's binary frame (payload < 126 bytes)
        mask = os.urandom(4)
        return bytes([0x82, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))

    pipelined = masked(raw.connect_packet("ws-pipelined", version=4)) + masked(raw.subscribe_packet(1, [("wsp/t", 0)]))
    ws = WSConnection(ConnectionType.CLIENT)
    request = ws.send(Request(host="127.0.0.1", target="/mqtt", subprotocols=["mqtt"]))
    with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
        s.sendall(request + pipelined)
        mqtt, deadline = b"", time.monotonic() + 3
        while len(mqtt) < 4 + 5 and time.monotonic() < deadline:
            try:
                data = s.recv(65536)
            except TimeoutError:
                break
            ws.receive_data(data or None)
            mqtt += b"".join(e.data for e in ws.events() if isinstance(e, BytesMessage))
            if not data:
                break
    assert mqtt == b"\x20\x02\x00\x00" + b"\x90\x03\x00\x01\x00"   # CONNACK, then SUBACK granted QoS 0


def test_websocket_ping_and_text_frame(broker):
    """A WebSocket ping gets a pong; a text frame closes the connection ([MQTT-6.0.0-1])."""
    c = WsClient(broker.port("ws"))
    try:
        c.sock.sendall(c.ws.send(Ping(payload=b"p")))
        assert any(isinstance(e, Pong) for e in c.events())
        c.sock.sendall(c.ws.send(TextMessage(data="not mqtt")))
        closes = [e for e in c.events() if isinstance(e, CloseConnection)]
        assert closes and closes[0].code == 1003
    finally:
        c.close()


def test_websocket_closed_for_a_text_frame_does_not_stall_other_clients(client_id, topic):
    """A WebSocket subscriber sends a text frame (closed with 1003, [MQTT-6.0.0-1]), then neither
    reads nor closes its socket. Until its socket went (2 s of draining), messages routed to it
    were still framed: wsproto raised LocalProtocolError out of the flusher, which then skipped
    every other connection of that round -- their output stayed queued and, never woken again,
    they got nothing more: the publisher's PUBACK and the other subscriber's messages were lost
    for good. Now that socket's output is dropped and everyone else carries on."""
    with BrokerProcess() as b:
        c = WsClient(b.port("ws"))
        c.send_frames(raw.connect_packet(client_id + "-ws", version=4))
        assert c.mqtt_bytes(4) == b"\x20\x02\x00\x00"
        c.send_frames(raw.subscribe_packet(1, [(topic, 0)]))
        assert c.mqtt_bytes(5).startswith(b"\x90\x03\x00\x01")
        with connect(b.port(), client_id + "-sub", V311) as sub, connect(b.port(), client_id + "-pub", V311) as pub:
            sub.subscribe(topic, 0)
            c.sock.sendall(c.ws.send(TextMessage(data="not mqtt")))
            time.sleep(0.2)
            for n in range(3):
                pub.publish(topic, b"m%d" % n, qos=1, timeout=3)      # its PUBACK arrives
            assert [m.payload for m in sub.expect_n(3, timeout=3)] == [b"m0", b"m1", b"m2"]
        c.close()
        time.sleep(0.2)
        assert "Traceback" not in b.log, b.log[-2000:]


class WsRawClient(raw.RawClient):
    """raw.RawClient over a WebSocket (wsproto, client side): MQTT bytes in binary frames."""

    def __init__(self, port, sock):
        super().__init__(port, sock=sock)
        self.ws = WSConnection(ConnectionType.CLIENT)
        sock.sendall(self.ws.send(Request(host="127.0.0.1", target="/mqtt", subprotocols=["mqtt"])))
        self.ws.receive_data(sock.recv(65536))
        assert any(isinstance(e, AcceptConnection) for e in self.ws.events())
        self.ws_close = None            # the server's CloseConnection, once read

    def frame(self, data: bytes) -> bytes:
        return self.ws.send(BytesMessage(data=data))

    def send(self, data: bytes) -> None:
        self.sock.sendall(self.frame(data))

    def received(self, data: bytes) -> None:
        if self.ws_close is not None:
            return                      # (nothing may follow a close frame)
        self.ws.receive_data(data)
        for ev in self.ws.events():
            if isinstance(ev, BytesMessage):
                self.buf += ev.data
            elif isinstance(ev, CloseConnection):
                self.ws_close = ev


def _slow_ws_client(port: int) -> "WsRawClient":
    """A WebSocket client whose socket takes its input slowly (a 4 KiB receive buffer)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    return WsRawClient(port, sock)


def _owed_2_mb(pub, topic) -> None:
    """200 messages of 10 kB (QoS 0) and one "end" (QoS 1) to ``topic``'s slow subscriber."""
    for _ in range(200):
        pub.publish(topic, b"m" * 10_000, qos=0)
    pub.publish(topic, b"end", qos=1)


def _flood_then_read_to_the_close(c, flood: bytes) -> list:
    """Send ``flood`` from a thread, not reading for a second (the server answers and closes
    meanwhile), then read everything up to the close."""
    def send():
        try:
            c.sock.sendall(flood)
        except OSError:
            pass

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    time.sleep(1.0)
    got = c.expect_closed(timeout=15)
    sender.join(5)
    return got


def test_a_websocket_client_that_keeps_sending_after_a_protocol_error_reads_the_disconnect(client_id, topic):
    """As over TCP (tests/integration/test_qos.py::test_a_client_that_keeps_sending_after_a_protocol_error_reads_the_disconnect):
    a v5 client over ws:// past Receive Maximum whose PUBLISHes keep arriving, and which is slow
    to read, must read DISCONNECT 0x93 and the WebSocket close, not a connection reset. The
    WebSocket transport closed its socket at once, with the client's input unread: the kernel
    answered with RST and dropped the DISCONNECT queued behind the messages not yet read."""
    with BrokerProcess("--max-inflight", "2") as b:
        c = _slow_ws_client(b.port("ws"))
        with c:
            c.send(raw.connect_packet(client_id, version=5))
            c.version = 5
            assert c.recv().type == raw.CONNACK
            c.send(raw.subscribe_packet(1, [(topic, 0)], version=5))
            assert c.recv().type == raw.SUBACK
            # the 3rd QoS 2 PUBLISH breaks the window (2); 1 MB more follows
            flood = b"".join(c.frame(raw.publish_packet(topic, b"x" * 1000, qos=2, pid=pid, version=5))
                             for pid in range(1, 1000))
            with connect(b.port(), client_id + "-pub", V311) as pub:
                _owed_2_mb(pub, topic)
                got = _flood_then_read_to_the_close(c, flood)
            kinds = [p.type for p in got]
            assert kinds and kinds[-1] == raw.DISCONNECT, f"{len(kinds)} packets, the last {kinds[-3:]}"
            assert got[-1].code == 0x93
            assert c.ws_close is not None


def test_a_websocket_client_that_breaks_the_framing_reads_the_close_frame(client_id, topic):
    """A frame wsproto refuses (a reserved opcode: close code 1002) from a client with 2 MB of
    messages still to read and more frames on their way: the server's close frame goes out behind
    the messages, and the socket was closed at once with the client's input unread -- the kernel
    answered with RST and the client read neither the rest of its messages nor why it was closed.
    Now half-closed and drained, as after a DISCONNECT."""
    with BrokerProcess() as b:
        c = _slow_ws_client(b.port("ws"))
        with c:
            c.send(raw.connect_packet(client_id, version=4))
            assert c.recv().type == raw.CONNACK
            c.send(raw.subscribe_packet(1, [(topic, 0)]))
            assert c.recv().type == raw.SUBACK
            with connect(b.port(), client_id + "-pub", V311) as pub:
                _owed_2_mb(pub, topic)
            mask = os.urandom(4)
            bad = bytes([0x83, 0x80 | 4]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(b"oops"))
            got = _flood_then_read_to_the_close(c, bad + c.frame(b"\xc0\x00") * 100_000)     # then PINGREQs
            assert len(got) == 201 and got[-1].body.endswith(b"end")
            assert c.ws_close is not None and c.ws_close.code == 1002


def test_paho_websocket_wrong_path_fails(broker, client_id):
    c = Client(client_id, V311, transport="websockets")
    c.client.ws_set_options(path="/nope")
    with pytest.raises(WebsocketConnectionError):      # the server answered 404, not 101
        c.connect(broker.port("ws"))
    c.stop_loop()


# --------------------------------------------------------------------------- TLS

@pytest.mark.parametrize("version", [V311, V5])
def test_mqtts_pubsub(tls_broker, pki, client_id, topic, version):
    sub = tls_client(client_id + "s", version, pki).connect(tls_broker.port("mqtts"))
    pub = tls_client(client_id + "p", version, pki).connect(tls_broker.port("mqtts"))
    sub.subscribe(topic, 1)
    pub.publish(topic, b"secret", qos=1)
    assert sub.expect().payload == b"secret"
    sub.disconnect()
    pub.disconnect()


def test_wss_pubsub(tls_broker, pki, client_id, topic):
    sub = tls_client(client_id + "s", V5, pki, transport="websockets").connect(tls_broker.port("wss"))
    sub.subscribe(topic, 1)
    with connect(tls_broker.port("mqtt"), client_id + "p", V311) as pub:
        pub.publish(topic, b"via-wss", qos=1)
    assert sub.expect().payload == b"via-wss"
    sub.disconnect()


@pytest.mark.parametrize("scheme", ["mqtts", "wss"])
def test_a_tls_client_that_sends_a_burst_and_closes_has_all_of_it_handled(tls_broker, pki, client_id, topic, scheme):
    """A client over TLS sends 1 MiB of PUBLISHes (64 of 16 KiB), one more, its DISCONNECT, and
    closes its socket at once (``mosquitto_pub -l`` with a file). A read of 64 KiB or more ends a
    connection's turn (TURN_BYTES): the TLS transport then stopped handing data to the connection
    but went on reading the socket, and at its end (the FIN) closed with what it held undelivered:
    the subscriber got part of the burst, never the last message, and the will was published
    although the client had said DISCONNECT. Over plain TCP the rest waits in the kernel."""
    sub = raw.RawClient(tls_broker.port("mqtt"), timeout=10)
    sub.connect(client_id + "s", version=4, keepalive=0)
    sub.subscribe(topic + "/#", qos=0)
    ctx = ssl.create_default_context(cafile=pki["ca"])
    sock = ctx.wrap_socket(socket.create_connection(("127.0.0.1", tls_broker.port(scheme)), timeout=10),
                           server_hostname="127.0.0.1")
    pub = WsRawClient(0, sock) if scheme == "wss" else raw.RawClient(0, sock=sock)
    pub.connect(client_id + "p", version=4, keepalive=0, will=(topic + "/will", b"gone", 0, False))
    burst = b"".join(raw.publish_packet(topic + "/burst", b"%02d" % i + b"b" * 16_382) for i in range(64))
    burst += raw.publish_packet(topic + "/last", b"last") + raw.disconnect_packet(4)
    if scheme == "wss":
        burst = b"".join(pub.frame(burst[i:i + 4096]) for i in range(0, len(burst), 4096))
    sock.sendall(burst)
    sock.close()
    got = []
    while not got or got[-1][0] != topic + "/last":
        try:
            p = sub.recv(5)
        except TimeoutError:
            break
        if p.type == raw.PUBLISH:
            got.append((p.topic, p.payload[:2]))
    assert got[:-1] == [(topic + "/burst", b"%02d" % i) for i in range(64)] and got[-1] == (topic + "/last", b"la"), \
        f"{len(got)} of 65 messages, the last {got[-1:]}"
    with pytest.raises(TimeoutError):
        p = sub.recv(1)                 # no will: the client disconnected
        raise AssertionError(f"got {p}")
    sub.close()


@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
def test_mosquitto_clients_over_tls(tls_broker, pki, topic, version):
    tls = ["--cafile", pki["ca"]]
    with MosqSub(tls_broker.port("mqtts"), topic, version=version, qos=1, args=tls) as sub:
        mosq_pub(tls_broker.port("mqtts"), topic, "tls-cli", *tls, version=version, qos=1)
        assert sub.messages(1)[0]["payload"] == "tls-cli"


def test_tls_with_untrusted_ca_is_rejected_by_client(tls_broker, pki, tmp_path, topic):
    other = trustme.CA()
    other.cert_pem.write_to_path(str(tmp_path / "other-ca.pem"))
    proc = mosq_pub(tls_broker.port("mqtts"), topic, "x", "--cafile", str(tmp_path / "other-ca.pem"), check=False)
    assert proc.returncode != 0


def test_plain_mqtt_on_tls_port_fails(tls_broker, client_id):
    c = Client(client_id, V311)
    try:
        c.connect(tls_broker.port("mqtts"), wait=False)
        with pytest.raises(AssertionError):
            c.connack_result(timeout=1.5)
    except OSError:
        pass
    c.stop_loop()
    assert tls_broker.proc.poll() is None


# --------------------------------------------------------------------------- client certificates

def _handshake(port, pki, cert=None) -> bool:
    """True if a TLS connection with (or without) a client certificate can exchange MQTT."""
    ctx = ssl.create_default_context(cafile=pki["ca"])
    if cert:
        ctx.load_cert_chain(pki[cert], pki[cert + "_key"])
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3) as raw_sock, \
                ctx.wrap_socket(raw_sock, server_hostname="127.0.0.1") as s:
            s.sendall(b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01x")
            return s.recv(4) == b"\x20\x02\x00\x00"
    except (ssl.SSLError, OSError):
        return False


def test_client_certificate_required(mtls_broker, pki):
    """--tls-verify-client required: no certificate or one from another CA -> the handshake fails;
    a certificate from --tls-ca -> connected."""
    port = mtls_broker.port("mqtts")
    assert _handshake(port, pki, cert="client")
    assert not _handshake(port, pki)
    assert not _handshake(port, pki, cert="stranger")


def test_paho_with_and_without_client_certificate(mtls_broker, pki, client_id, topic):
    good = tls_client(client_id, V5, pki, cert="client").connect(mtls_broker.port("mqtts"))
    good.subscribe(topic, 1)
    good.publish(topic, b"mtls", qos=1)
    assert good.expect().payload == b"mtls"
    good.disconnect()
    bad = tls_client(client_id + "nocert", V5, pki)
    try:
        bad.connect(mtls_broker.port("mqtts"), wait=False)
        with pytest.raises(AssertionError):
            bad.connack_result(timeout=1.5)
    except (ssl.SSLError, OSError):
        pass
    bad.stop_loop()


def test_mosquitto_clients_with_client_certificate(mtls_broker, pki, topic):
    port = mtls_broker.port("mqtts")
    creds = ["--cafile", pki["ca"], "--cert", pki["client"], "--key", pki["client_key"]]
    with MosqSub(port, topic, version="mqttv5", args=creds) as sub:
        mosq_pub(port, topic, "with-cert", *creds, version="mqttv5")
        assert sub.messages(1)[0]["payload"] == "with-cert"
    proc = mosq_pub(port, topic, "no-cert", "--cafile", pki["ca"], check=False)
    assert proc.returncode != 0


def test_wss_with_client_certificate(mtls_broker, pki, client_id, topic):
    c = tls_client(client_id, V311, pki, transport="websockets", cert="client").connect(mtls_broker.port("wss"))
    c.subscribe(topic, 0)
    c.publish(topic, b"wss-mtls")
    assert c.expect().payload == b"wss-mtls"
    c.disconnect()


def test_tls_listener_needs_cert_and_key():
    proc = subprocess.run(BrokerProcess(listen=("mqtts://127.0.0.1:0",)).command(), capture_output=True, text=True,
                          timeout=20, cwd=ROOT)
    assert proc.returncode == 2
    assert "--tls-cert" in proc.stderr


@pytest.fixture(scope="module")
def tls_timeout_broker(pki):
    with BrokerProcess("--tls-cert", pki["server"], "--tls-key", pki["server_key"], "--connect-timeout", "1",
                       listen=("mqtts://127.0.0.1:0",)) as b:
        yield b


def test_connect_timeout_after_tls_handshake(tls_timeout_broker, pki):
    """A TLS client that completes the handshake but never sends CONNECT is closed by --connect-timeout."""
    ctx = ssl.create_default_context(cafile=pki["ca"])
    with socket.create_connection(("127.0.0.1", tls_timeout_broker.port("mqtts")), timeout=4) as raw_sock, \
            ctx.wrap_socket(raw_sock, server_hostname="127.0.0.1") as s:
        assert s.recv(10) == b""


def test_connect_timeout_before_tls_handshake(tls_timeout_broker):
    """--connect-timeout 1 ("close sockets that send no CONNECT in time") must also close a socket
    on the mqtts listener that never even starts TLS -- otherwise idle sockets pile up for a
    minute each (asyncio's ssl_handshake_timeout), whatever --connect-timeout says."""
    with socket.create_connection(("127.0.0.1", tls_timeout_broker.port("mqtts")), timeout=3) as s:
        assert s.recv(10) == b""


def test_a_connection_whose_write_fails_does_not_stop_the_flushers_round():
    """The flusher writes every connection with output once per loop iteration, and a connection
    is not woken again while its output waits. One whose write raised (as wsproto did for a
    WebSocket closed by a text frame, 220a1ca) ended the round: the connections after it kept
    their output -- PUBACKs and messages -- for good. Now the failing one is closed and the others
    are written. (In-process: the flusher with connections that only record.)"""
    from types import SimpleNamespace

    from brokerd.transports.connection import Flusher

    class Conn:
        def __init__(self, fails):
            self.fails, self.flushed, self.aborted = fails, 0, 0
            self.channel = SimpleNamespace(out=[b"x"], peer="127.0.0.1:1")
            self.transport = SimpleNamespace(abort=self.abort)

        def abort(self):
            self.aborted += 1

        def flush(self):
            if self.fails:
                raise RuntimeError("cannot send in state LOCAL_CLOSING")
            self.flushed += 1

    soon = []
    flusher = Flusher(SimpleNamespace(call_soon=soon.append, time=lambda: 0.0))
    conns = [Conn(False), Conn(True), Conn(False), Conn(False)]
    for c in conns:
        flusher.add(c)
    soon.pop()()
    assert [c.flushed for c in conns] == [1, 0, 1, 1]
    assert [c.aborted for c in conns] == [0, 1, 0, 0] and conns[1].channel.out == []
