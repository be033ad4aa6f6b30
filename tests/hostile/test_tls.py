"""TLS handshakes gone wrong against `--tls-verify-client required`: an
expired client certificate, one from an unknown CA, none at all, a plain-TCP
MQTT client on the TLS port, and clients that stall in the middle of the
handshake. The broker refuses each and keeps serving: a canary over plain
MQTT and a device with a good certificate keep working throughout.

Already covered in tests/integration/test_transports.py and not repeated:
test_client_certificate_required (no certificate / another CA refused, one
handshake each), test_plain_mqtt_on_tls_port_fails (a paho client without
TLS gets no CONNACK), test_connect_timeout_before_tls_handshake (a socket that
never starts TLS is closed by --connect-timeout)."""

import datetime
import selectors
import socket
import ssl
import time

import pytest
import trustme

from ..integration.helpers import V5, Client
from ..pki import write_cert
from .conftest import MIB, open_fds, report, rss_kib

CONNECT_311 = b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01x"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile-pki")
    ca = trustme.CA()
    now = datetime.datetime.now(datetime.UTC)
    certs = {
        "server": ca.issue_cert("127.0.0.1", "localhost"),
        "good": ca.issue_cert("device-good.example"),
        "expired": ca.issue_cert("device-expired.example", not_before=now - datetime.timedelta(days=30),
                                 not_after=now - datetime.timedelta(days=1)),
        "not-yet-valid": ca.issue_cert("device-future.example", not_before=now + datetime.timedelta(days=1),
                                       not_after=now + datetime.timedelta(days=30)),
        "stranger": trustme.CA().issue_cert("device-stranger.example"),
    }
    paths = {"ca": str(d / "ca.pem")}
    ca.cert_pem.write_to_path(paths["ca"])
    for name, cert in certs.items():
        paths[name], paths[name + "_key"] = write_cert(cert, d, name)
    return paths


@pytest.fixture
def mtls(hostile_broker, pki, canary_for):
    """brokerd with mqtt:// (the canary) and mqtts:// requiring a client certificate from the CA;
    --connect-timeout 2 bounds the TLS handshake too. -> (broker, canary, device with a good cert)."""
    b = hostile_broker("--tls-cert", pki["server"], "--tls-key", pki["server_key"], "--tls-ca", pki["ca"],
                       "--tls-verify-client", "required", listen=("mqtt://127.0.0.1:0", "mqtts://127.0.0.1:0"))
    canary = canary_for(b)
    device = Client("good-cert-device", V5)
    device.client.tls_set(ca_certs=pki["ca"], certfile=pki["good"], keyfile=pki["good_key"])
    device.connect(b.port("mqtts"))
    device.subscribe("tls/device", 1)
    yield b, canary, device
    device.disconnect()


def _device_ok(device) -> None:
    device.publish("tls/device", b"over-mtls", qos=1)
    assert device.expect().payload == b"over-mtls"


def _attempt(port: int, pki, cert: str | None) -> str:
    """One TLS connection presenting ``cert`` that tries to CONNECT; -> "connected" or the error
    the client saw (the TLS alert's name, or "closed")."""
    ctx = ssl.create_default_context(cafile=pki["ca"])
    if cert:
        ctx.load_cert_chain(pki[cert], pki[cert + "_key"])
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw_sock, \
                ctx.wrap_socket(raw_sock, server_hostname="127.0.0.1") as s:
            # TLS 1.3: the server judges the client certificate after the client's handshake is
            # done, so the refusal arrives as an alert on the first read
            s.sendall(CONNECT_311)
            data = s.recv(4)
            return "connected" if data == b"\x20\x02\x00\x00" else ("closed" if not data else repr(data))
    except ssl.SSLError as exc:
        return exc.reason or str(exc)
    except (ConnectionResetError, BrokenPipeError):
        return "reset"


@pytest.mark.parametrize("cert", ["expired", "not-yet-valid", "stranger", None])
def test_bad_client_certificates_are_refused(mtls, pki, request, cert):
    """20 handshakes each presenting an expired certificate (from the right CA), one not valid
    yet, one from an unknown CA, or none: every one fails with the TLS alert naming why
    (certificate expired / bad certificate / unknown CA / certificate required) and never gets a
    CONNACK; the same CA's valid certificate connects; the canary and the connected device keep
    working; descriptors do not leak."""
    b, canary, device = mtls
    port = b.port("mqtts")
    fds0 = open_fds(b)
    with canary.running():
        outcomes = [_attempt(port, pki, cert) for _ in range(20)]
    expected = {"expired": "CERTIFICATE_EXPIRED", "not-yet-valid": "BAD_CERTIFICATE",
                "stranger": "UNKNOWN_CA", None: "CERTIFICATE_REQUIRED"}[cert]
    # the alert itself does not reach the client: asyncio's (and uvloop's) TLS layer drops the
    # connection on a failed handshake without flushing the alert OpenSSL wrote, so the client
    # reads a plain close (or a reset) -- never a CONNACK
    assert all(o in (expected, "closed", "reset") or expected in o for o in outcomes), outcomes
    assert _attempt(port, pki, "good") == "connected"
    _device_ok(device)
    canary.check()
    time.sleep(0.3)
    assert open_fds(b) <= fds0 + 3
    report(request, attempts=len(outcomes), client_saw=sorted(set(outcomes)), canary_worst_s=round(canary.worst, 3))


def test_plain_tcp_mqtt_client_on_the_tls_port(mtls, request):
    """20 clients send a plain MQTT CONNECT to the mqtts port: TLS reads it as a broken record,
    the broker closes the connection at once (no CONNACK; whatever comes back is not MQTT), and
    keeps serving TLS and plain clients."""
    b, canary, device = mtls
    answers = []
    t0 = time.monotonic()
    with canary.running():
        for _ in range(20):
            with socket.create_connection(("127.0.0.1", b.port("mqtts")), timeout=5) as s:
                s.sendall(CONNECT_311)
                data = b""
                try:
                    while True:
                        chunk = s.recv(4096)
                        if not chunk:
                            break
                        data += chunk
                except ConnectionResetError:
                    pass
                answers.append(data)
    elapsed = time.monotonic() - t0
    assert all(not a.startswith(b"\x20") for a in answers), answers
    assert elapsed < 10, "plain clients were left hanging until a timeout"
    _device_ok(device)
    canary.check()
    report(request, clients=20, seconds=round(elapsed, 2), answers=sorted({a[:7].hex() for a in answers}))


def _client_hello() -> bytes:
    ctx = ssl.create_default_context()
    out = ssl.MemoryBIO()
    obj = ctx.wrap_bio(ssl.MemoryBIO(), out, server_hostname="127.0.0.1")
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return out.read()


@pytest.mark.parametrize("stall", ["half-client-hello", "after-server-hello"])
def test_tls_handshake_stalled_midway(mtls, request, stall):
    """30 sockets start a TLS handshake and stall: half a ClientHello, or a whole one and then
    nothing after the server's answer. --connect-timeout 2 also bounds the handshake: each is
    closed after about 2 s; the canary works meanwhile; RSS and descriptors come back."""
    b, canary, device = mtls
    hello = _client_hello()
    rss0, fds0 = rss_kib(b), open_fds(b)
    sel = selectors.DefaultSelector()
    socks = []
    t0 = time.monotonic()
    closed_at = {}
    with canary.running():
        for _ in range(30):
            s = socket.create_connection(("127.0.0.1", b.port("mqtts")), timeout=5)
            s.sendall(hello[: len(hello) // 2] if stall == "half-client-hello" else hello)
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ)
            socks.append(s)
        while len(closed_at) < len(socks) and time.monotonic() - t0 < 10:
            for key, _ in sel.select(0.2):
                try:
                    data = key.fileobj.recv(65536)     # the ServerHello flight: read, never answered
                except ConnectionResetError:
                    data = b""
                if not data:
                    closed_at[key.fileobj] = time.monotonic() - t0
                    sel.unregister(key.fileobj)
    for s in socks:
        s.close()
    assert len(closed_at) == 30, f"{30 - len(closed_at)} stalled handshakes still open after 10 s"
    assert min(closed_at.values()) >= 1.5 and max(closed_at.values()) <= 5, sorted(closed_at.values())
    _device_ok(device)
    canary.check()
    time.sleep(0.3)
    assert open_fds(b) <= fds0 + 3
    assert rss_kib(b) - rss0 < 8 * MIB
    report(request, sockets=30, closed_after_s=[round(min(closed_at.values()), 2), round(max(closed_at.values()), 2)],
           rss_before_kib=rss0, rss_after_kib=rss_kib(b), canary_worst_s=round(canary.worst, 3))


def test_sockets_that_never_start_tls_count_against_the_connection_cap(hostile_broker, pki, canary_for, request):
    """--max-connections 50: 1,400 sockets on the TLS port that never send a ClientHello. The
    listener counts each from its accept: beyond the cap and its slack (1,024 sockets) they
    are closed at once, and the broker holds no more descriptors than that (a TLS server
    made by asyncio counted a socket only once its handshake was done, and closed one over
    the cap only after it: every socket was held for the handshake's timeout, however many
    there were). A client with a certificate and the canary connect and work meanwhile."""
    from brokerd.server import SOCKET_SLACK

    b = hostile_broker("--tls-cert", pki["server"], "--tls-key", pki["server_key"], "--tls-ca", pki["ca"],
                       "--max-connections", "50", listen=("mqtt://127.0.0.1:0", "mqtts://127.0.0.1:0"))
    canary = canary_for(b)
    fds0 = open_fds(b)
    socks = []
    with canary.running():
        try:
            for _ in range(1400):
                socks.append(socket.create_connection(("127.0.0.1", b.port("mqtts")), timeout=5))
            time.sleep(0.5)
            held = open_fds(b) - fds0
            assert held <= 50 + SOCKET_SLACK + 10, f"the broker holds {held} sockets that never started TLS"
        finally:
            for s in socks:
                s.close()
    time.sleep(2.5)                         # the held ones' handshake timeout (--connect-timeout 2)
    device = Client("tls-after-flood", V5)
    device.client.tls_set(ca_certs=pki["ca"])
    device.connect(b.port("mqtts"))
    device.subscribe("tls/device", 1)
    _device_ok(device)
    device.disconnect()
    canary.check()
    report(request, sockets=1400, held=held, canary_worst_s=round(canary.worst, 3))
