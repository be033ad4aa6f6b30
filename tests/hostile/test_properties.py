"""User-property floods (issue 16): a 1 MiB PUBLISH of 209,000 empty user
properties cost ~200 ms of event-loop time to decode (a 1 MiB payload: 3 ms),
and as CONNECTs with wrong credentials it happened before authentication,
even after the failed-login throttle had started answering 0x9F.

Now at most 256 user properties are accepted per packet (the rest of the
packet is not decoded: DISCONNECT / CONNACK 0x95), and an address the
throttle holds is refused from the first bytes of its CONNECT, before any of
it is decoded. The canary keeps its round trips within their timeout."""

import time

import pytest

from ..integration import raw
from ..integration.raw import CONNACK, DISCONNECT, RawClient
from .conftest import Canary, report

FLOOD = b"\x26\x00\x00\x00\x00" * 209_000          # 209,000 empty user properties: 1,045,000 bytes


def _flood_publish() -> bytes:
    body = raw.s("flood/t") + raw.varint(len(FLOOD)) + FLOOD
    return raw.packet(0x30, body)


def test_user_property_floods_do_not_stall_the_canary(hostile_broker, canary_for, request):
    """30 MQTT 5 connections each send 4 of those PUBLISHes at once (120 MiB of properties;
    before the fix about 24 s of decoding, in loop iterations of several seconds). Each is
    disconnected with 0x95 at its first one, once past 256 user properties; the canary's round
    trips all succeed within their 5 s timeout."""
    b = hostile_broker()
    canary = canary_for(b)
    data = _flood_publish()
    assert len(data) > 1_000_000
    clients = []
    with canary.running():
        for i in range(30):
            c = RawClient(b.port(), timeout=10)
            assert c.connect(f"flood-{i}", version=5).code == 0
            clients.append(c)
        for c in clients:
            c.sock.setblocking(False)
            try:
                c.sock.send(data * 4)          # as much as the kernel takes at once
            except (BlockingIOError, BrokenPipeError, ConnectionResetError):
                pass
            c.sock.setblocking(True)
        answers = [[(p.type, p.code) for p in c.expect_closed(timeout=30)] for c in clients]
    for c in clients:
        c.close()
    canary.check()
    assert all(a == [(DISCONNECT, 0x95)] for a in answers), answers[:3]
    report(request, connections=30, packet_bytes=len(data), canary_rounds=len(canary.latencies),
           canary_worst_s=round(canary.worst, 3))


def _flood_connect(client_id: str) -> bytes:
    """An MQTT 5 CONNECT with 12,000 empty user properties (60 KB: under --max-connect-size)
    and then a property id that does not exist. Decoded, it is refused at the 257th user
    property (CONNACK 0x95; before the cap: malformed at the end, a plain close)."""
    props = b"\x26\x00\x00\x00\x00" * 12_000 + b"\xff"
    body = raw.s("MQTT") + bytes([5, 0xC2, 0, 60]) + raw.varint(len(props)) + props
    body += raw.s(client_id) + raw.s("acme/d2") + raw.s(b"wrong")
    return raw.packet(0x10, body)


@pytest.mark.slow
def test_a_throttled_address_is_refused_before_its_connect_is_decoded(tmp_path, request):
    """With a control plane, after 10 wrong passwords from 127.0.0.1 (CONNACK 0x86), 200 CONNECTs
    full of user properties from that address each get CONNACK 0x9F Connection rate exceeded --
    deterministic proof that none was decoded: decoding one answers 0x95 (too many user
    properties), which is what the same CONNECT gets before the throttle starts (before the fix:
    a plain close, for the malformed property at its end, before the throttle and after it).
    The canary's sessions, established before, keep working."""
    from ..controlplane import ControlPlane

    plane = ControlPlane(tmp_path)
    plane.provision([{"slug": "acme", "default_acl": "allow", "devices": ["d1", "d2"]}])
    b = plane.broker("--connect-timeout", "2", anonymous=True)
    canary = Canary(b, f"throttle-{time.monotonic_ns()}")
    try:
        canary.check()
        with RawClient(b.port()) as c:                 # not throttled yet: decoded
            c.send(_flood_connect("first"))
            assert [(p.type, p.code) for p in c.expect_closed()] == [(CONNACK, 0x95)]
        for i in range(10):
            with RawClient(b.port()) as c:
                assert c.connect(f"guess-{i}", version=5, username="acme/d2", password="wrong").code == 0x86
        codes = []
        t0 = time.monotonic()
        with canary.running():
            for i in range(200):
                with RawClient(b.port()) as c:
                    try:
                        c.send(_flood_connect(f"flood-{i}"))
                    except (BrokenPipeError, ConnectionResetError):
                        pass
                    codes.append([(p.type, p.code) for p in c.expect_closed()])
        elapsed = time.monotonic() - t0
        assert all(got == [(CONNACK, 0x9F)] for got in codes), codes[:3]
        canary.check()
        report(request, connects=len(codes), connect_bytes=len(_flood_connect("x")), seconds=round(elapsed, 2),
               canary_worst_s=round(canary.worst, 3))
    finally:
        canary.close()
        b.stop()

