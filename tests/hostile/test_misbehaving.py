"""Hostile clients after CONNECT: a subscriber that never reads, 10,000
subscriptions from one client, invalid topic names in PUBLISH, packet ids
reused and acknowledgements for ids nobody sent. Real brokerd, real sockets,
a canary on the same broker during and after each attack."""

import socket
import struct
import threading
import time

import pytest

from ..integration import raw
from ..integration.helpers import V5, V311, connect, wait_until
from ..integration.raw import DISCONNECT, PUBACK, PUBCOMP, PUBLISH, PUBREC, PUBREL, SUBACK, Closed, RawClient
from .conftest import MIB, client_info, metrics, peak_rss_kib, report, rss_kib, sys_value


def _drain(c: RawClient, quiet: float = 1.5, limit: float = 20.0) -> list:
    """Read packets (acknowledging QoS 1 PUBLISHes) until none came for ``quiet`` seconds
    (bounded by ``limit``)."""
    got = []
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            p = c.recv(quiet)
        except TimeoutError:
            break
        if p.type == PUBLISH and p.qos == 1:
            c.ack(PUBACK, p.pid)
        got.append(p)
    return got


def _until(c: RawClient, topic: str, timeout: float = 20.0) -> list:
    """(topic, payload) of the PUBLISHes read (QoS 1 acknowledged) up to the one on ``topic``."""
    got = []
    deadline = time.monotonic() + timeout
    while not got or got[-1][0] != topic:
        p = c.recv(max(0.1, deadline - time.monotonic()))
        if p.type == PUBLISH:
            if p.qos == 1:
                c.ack(PUBACK, p.pid)
            got.append((p.topic, p.payload))
    return got


@pytest.mark.parametrize("budget", ["roomy", "held-by-the-stuck-client"])
def test_subscriber_that_never_reads(hostile_broker, canary_for, request, budget):
    """A 3.1.1 subscriber (keepalive 0) subscribes to a topic at QoS 1 and never reads its socket.
    A raw publisher sends it messages of 1 kB (QoS 0, every tenth QoS 1) as fast as it can; brokerd
    with --max-queued 100:

    - its queue never holds more than 100 messages (admin API, sampled during the flood): its
      window of 32 QoS 1 messages fills, and everything after waits behind them, in order;
    - the rest is dropped and counted: delivered (once it finally reads) + dropped queue_full
      (admin API) == published exactly, and $SYS/broker/publish/messages/dropped says the same;
    - RSS grows by less than 16 MiB; the canary keeps working.

    "roomy": --queue-budget 150000 is above what the stuck queue can hold (100 x (1000 + 256)
    bytes): the flood of 8000 is not slowed at all. "held-by-the-stuck-client": --queue-budget
    100000, so that one queue holds the node over its budget for good: the queues never shrink,
    so publishers are paced -- a socket read every 100 ms -- not stopped: the flood of 3000 still
    completes (slowly) and the canary keeps working, with up to ~0.1 s more latency."""
    roomy = budget == "roomy"
    b = hostile_broker("--max-queued", "100", "--queue-budget", "150000" if roomy else "100000")
    canary = canary_for(b)
    rss0 = rss_kib(b)
    stuck = RawClient(b.port(), timeout=5)
    stuck.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    stuck.connect("never-reads", version=4, keepalive=0)
    stuck.subscribe("stuck/#", qos=1)
    pub = RawClient(b.port(), timeout=5)
    pub.connect("flooder", version=4, keepalive=0)
    n = 8000 if roomy else 3000
    queued_seen = [0]
    stop = threading.Event()

    def sample_queue():
        while not stop.is_set():
            queued_seen[0] = max(queued_seen[0], client_info(b, "never-reads")["queued"])
            stop.wait(0.1)

    sampler = threading.Thread(target=sample_queue, daemon=True)
    sampler.start()
    t0 = time.monotonic()
    qos1 = 0
    with canary.running(interval=0.1):
        pub.sock.settimeout(60)
        for i in range(n):
            q = 1 if i % 10 == 0 else 0
            qos1 += q
            pub.send(raw.publish_packet("stuck/x", b"%06d" % i + b"s" * 994, qos=q, pid=(i % 60000) + 1))
        # the flood is in once every QoS 1 message of it is acknowledged
        acks = 0
        while acks < qos1:
            p = pub.recv(20)
            acks += p.type == PUBACK
        flood_s = time.monotonic() - t0
        peak_rss = rss_kib(b)
        stop.set()
        sampler.join(5)
    canary.check()
    # the subscriber finally reads: what reached it, plus what was dropped, is everything
    got = [p for p in _drain(stuck) if p.type == PUBLISH]
    seqs = [int(p.payload[:6]) for p in got]
    m = metrics(b)
    dropped = m["dropped"]["queue_full"]
    assert len(set(seqs)) == len(seqs) and seqs == sorted(seqs), "duplicates or reordering"
    assert len(seqs) + dropped == n, (len(seqs), dropped)
    assert dropped > n // 2
    assert queued_seen[0] <= 100
    wait_until(lambda: int(sys_value(b, "publish/messages/dropped")) == dropped, timeout=6,
               message="$SYS dropped count differs from the admin API's")
    assert peak_rss - rss0 < 16 * MIB, (rss0, peak_rss)
    assert b.proc.poll() is None
    assert ("pacing" in b.log) != roomy
    report(request, published=n, flood_s=round(flood_s, 2), delivered_to_stuck=len(seqs), dropped_queue_full=dropped,
           max_queued_seen=queued_seen[0], rss_before_kib=rss0, rss_peak_kib=peak_rss,
           canary_worst_s=round(canary.worst, 3))
    stuck.close()
    pub.close()


def test_ten_thousand_subscriptions_from_one_client(hostile_broker, canary_for, request):
    """One 5.0 client sends 10,000 subscriptions in 100 pipelined SUBSCRIBE packets; another one
    sends 10,000 in a single SUBSCRIBE (~170 kB). brokerd has no per-client subscription limit
    without a control plane (a tenant quota, max_subscriptions, caps it with one): every filter
    is granted (QoS 1), the admin API counts 20,000, a publish matching one filter reaches each
    client once, a non-matching one nobody, the canary works throughout, RSS grows by less than
    48 MiB, and disconnecting frees them."""
    b = hostile_broker()
    canary = canary_for(b)
    rss0 = rss_kib(b)
    subs0 = metrics(b)["subscriptions"]
    with canary.running(), RawClient(b.port(), timeout=20) as many, RawClient(b.port(), timeout=20) as one:
        many.connect("many-subscribes", version=5)
        t0 = time.monotonic()
        many.send(b"".join(raw.subscribe_packet(k + 1, [(f"many/{k * 100 + j}/+", 1) for j in range(100)], 5)
                           for k in range(100)))
        codes = []
        for k in range(100):
            ack = many.expect(SUBACK, timeout=20)
            assert ack.pid == k + 1
            codes += ack.codes
        many_s = time.monotonic() - t0
        assert codes == [1] * 10_000
        one.connect("one-subscribe", version=5)
        big = raw.subscribe_packet(1, [(f"one/{j}/+", 1) for j in range(10_000)], 5)
        t0 = time.monotonic()
        one.send(big)
        assert one.expect(SUBACK, timeout=20).codes == [1] * 10_000
        one_s = time.monotonic() - t0
        peak_rss = rss_kib(b)
        assert client_info(b, "many-subscribes")["subscription_count"] == 10_000
        assert client_info(b, "one-subscribe")["subscription_count"] == 10_000
        assert metrics(b)["subscriptions"] - subs0 == 20_000
        p = connect(b.port(), "sub10k-publisher", V311)
        p.publish("many/4321/x", b"m", qos=1)
        p.publish("one/9999/x", b"o", qos=1)
        p.publish("many/10000/x", b"nobody", qos=1)
        # then a marker for each client: what it gets from the publisher before its marker is what came of
        # the three (in publish order: the non-matching one too, had it matched anything)
        p.publish("many/0/end", b"end", qos=1)
        p.publish("one/0/end", b"end", qos=1)
        assert _until(many, "many/0/end") == [("many/4321/x", b"m"), ("many/0/end", b"end")]
        assert _until(one, "one/0/end") == [("one/9999/x", b"o"), ("one/0/end", b"end")]
        p.disconnect()
        many.disconnect()
        one.disconnect()
    canary.check()
    wait_until(lambda: metrics(b)["subscriptions"] == subs0, timeout=5, message="subscriptions not freed")
    assert peak_rss - rss0 < 48 * MIB, (rss0, peak_rss)
    report(request, subscriptions=20_000, pipelined_100x100_s=round(many_s, 2), single_packet_s=round(one_s, 2),
           single_packet_bytes=len(big), rss_before_kib=rss0, rss_peak_kib=peak_rss,
           canary_worst_s=round(canary.worst, 3))


# Already covered exactly, not repeated here:
#   tests/integration/test_limits.py::test_malformed_packet_v5_gets_disconnect_and_close
#     [topic-invalid-utf8] (C3 28 -> 0x81), [topic-with-nul] (-> 0x81);
#   tests/integration/test_limits.py::test_malformed_packet_v311_closes_connection[topic-invalid-utf8];
#   tests/integration/test_topics.py::test_publish_to_wildcard_topic_closes_only_that_connection
#     (a/+, a/#, +, #, a/b/# in 3.1.1 and 5.0 -> close / DISCONNECT 0x90).
BAD_TOPICS = {
    "nul": b"bad/a\x00b",                  # [MQTT-1.5.4-2] U+0000
    "surrogate": b"bad/\xed\xa0\x80",      # [MQTT-1.5.4-1] U+D800 encoded: not well-formed UTF-8
    "overlong-slash": b"bad/\xc0\xaf",     # '/' in two bytes: not well-formed, must not split levels
    "truncated": b"bad/\xe2\x82",          # a three-byte sequence cut short
    "lone-continuation": b"bad/\x80",
    "wildcard-plus-in-level": b"bad/a+b",  # not a wildcard level, but '+' anywhere is forbidden
    "wildcard-hash-inside": b"bad/#/x",
}
CODES_V5 = {"wildcard-plus-in-level": 0x90, "wildcard-hash-inside": 0x90}


@pytest.mark.parametrize("version", [4, 5])
def test_invalid_topic_names_in_publish(hostile_broker, canary_for, request, version):
    """Each PUBLISH (QoS 1) whose topic name is not well-formed UTF-8, holds U+0000 or a wildcard
    character closes that connection -- 5.0: DISCONNECT 0x81 Malformed Packet (0x90 Topic Name
    invalid for wildcards) first, 3.1.1: a plain close -- with no PUBACK; a subscriber to
    bad/# gets none of them, the canary works."""
    b = hostile_broker()
    canary = canary_for(b)
    watcher = connect(b.port(), "bad-topic-watcher", V5)
    watcher.subscribe("bad/#", 1)
    outcomes = {}
    with canary.running():
        for name, topic in BAD_TOPICS.items():
            with RawClient(b.port()) as c:
                c.connect(f"bad-{name}", version=version)
                c.send(raw.publish_packet(topic, b"poison", qos=1, pid=1, version=version))
                got = c.expect_closed()
                outcomes[name] = [(p.type, p.code) for p in got]
    for name, got in outcomes.items():
        if version == 5:
            assert got == [(DISCONNECT, CODES_V5.get(name, 0x81))], (name, got)
        else:
            assert got == [], (name, got)
    watcher.expect_none(0.5)
    canary.check()
    watcher.disconnect()
    report(request, cases=len(outcomes), outcomes={k: [hex(c) for _, c in v] for k, v in outcomes.items()})


@pytest.mark.parametrize("version", [4, 5])
def test_packet_id_reuse_and_acks_for_unknown_ids(hostile_broker, canary_for, request, version):
    """Packet ids misused by a client (tests/integration/test_qos.py::test_inbound_qos2_duplicate_
    is_delivered_once covers a DUP resend of a QoS 2 id and test_mqtt5.py the single v5 PUBREL
    0x92; this adds the rest):

    - a QoS 2 id reused for a *different* message before its PUBREL: PUBREC again, not delivered
      ([MQTT-4.3.3-10], method B); after PUBCOMP the id is free: a new message under it is
      delivered;
    - a QoS 1 id reused before its PUBACK was read: both acknowledged and both delivered;
    - PUBREL for an unknown id: PUBCOMP (5.0: 0x92 Packet Identifier not found); PUBREC for an
      id the server never sent: PUBREL (5.0: 0x92); PUBACK / PUBCOMP for unknown ids: ignored;
    - 5000 PUBRELs for unknown ids in one burst: 5000 PUBCOMPs, the connection stays open;
    and the canary works throughout."""
    b = hostile_broker()
    canary = canary_for(b)
    rss0 = rss_kib(b)
    sub = connect(b.port(), f"ids-watch-{version}", V311)
    sub.subscribe("ids/#", 2)
    with canary.running(), RawClient(b.port()) as c:
        c.connect(f"ids-{version}", version=version)
        c.publish("ids/q2", b"first", qos=2, pid=9)
        assert c.expect(PUBREC).pid == 9
        c.publish("ids/q2", b"second-same-id", qos=2, pid=9)
        assert c.expect(PUBREC).pid == 9
        c.ack(PUBREL, 9)
        assert c.expect(PUBCOMP).pid == 9
        c.publish("ids/q2", b"third-id-free-again", qos=2, pid=9)
        assert c.expect(PUBREC).pid == 9
        c.ack(PUBREL, 9)
        assert c.expect(PUBCOMP).pid == 9
        assert [m.payload for m in sub.expect_n(2)] == [b"first", b"third-id-free-again"]
        sub.expect_none(0.3)

        c.send(raw.publish_packet("ids/q1", b"a", qos=1, pid=5, version=version)
               + raw.publish_packet("ids/q1", b"b", qos=1, pid=5, version=version))
        assert [c.expect(PUBACK).pid, c.expect(PUBACK).pid] == [5, 5]
        assert [m.payload for m in sub.expect_n(2)] == [b"a", b"b"]

        c.ack(PUBREL, 77)
        comp = c.expect(PUBCOMP)
        assert (comp.pid, comp.code) == (77, 0x92 if version == 5 else 0)
        c.ack(PUBREC, 78)
        rel = c.expect(PUBREL)
        assert (rel.pid, rel.code) == (78, 0x92 if version == 5 else 0)
        c.ack(PUBACK, 79)
        c.ack(PUBCOMP, 80)
        assert c.is_open(0.3)

        t0 = time.monotonic()
        c.send(b"".join(raw.ack_packet(PUBREL, pid) for pid in range(1000, 6000)))
        comps = [c.expect(PUBCOMP, timeout=10) for _ in range(5000)]
        burst_s = time.monotonic() - t0
        assert [p.pid for p in comps] == list(range(1000, 6000))
        assert {p.code for p in comps} == {0x92 if version == 5 else 0}
        c.send(b"\xc0\x00")                                  # PINGREQ: still served
        assert c.expect(13).type == 13
    canary.check()
    sub.disconnect()
    rss1 = rss_kib(b)
    assert rss1 - rss0 < 16 * MIB
    report(request, unknown_pubrel_burst=5000, burst_s=round(burst_s, 3), rss_before_kib=rss0, rss_after_kib=rss1,
           canary_worst_s=round(canary.worst, 3))


__all__ = ["Closed", "struct"]


@pytest.mark.parametrize("kind", ["pingreq", "qos1"])
def test_a_flood_of_tiny_packets_does_not_swell_the_node_between_two_writes(hostile_broker, canary_for, request,
                                                                           kind):
    """A client sends tiny packets that each get an answer (PINGREQ -> PINGRESP, a QoS 1 PUBLISH
    to nobody -> PUBACK) as fast as it can, with the kernel's default buffers (megabytes the
    socket takes before the client must read). The event loop hands a socket up to 32 reads of
    256 KB between two writes of its answers: 4 million PINGRESPs piled up in the connection's
    output at once and the node went from 40 MB to 390 MB for a moment (QoS 1: +70 MB), one
    client doing it. Now a connection's answers are written once 4,096 are waiting, and its
    socket is no longer read while they are not read (the bound of the test above). Those 32
    reads were handled before any other client was: the canary waited up to 2.6 s (QoS 1), past
    its 5 s under the whole suite's load; a big read now ends the connection's turn (0.1 s)."""
    b = hostile_broker()
    canary = canary_for(b)
    s = socket.create_connection(("127.0.0.1", b.port()), timeout=5)
    s.sendall(raw.connect_packet(f"tiny-{kind}", version=4, keepalive=0))
    assert s.recv(4) == b"\x20\x02\x00\x00"
    if kind == "pingreq":
        chunk = b"\xc0\x00" * 32768
    else:
        chunk = b"".join(raw.publish_packet("nobody/here", b"", 1, pid=i + 1) for i in range(8192))
    s.settimeout(0.5)
    stop = time.monotonic() + 4
    sent = [0]

    def flood():
        while time.monotonic() < stop:
            try:
                s.sendall(chunk)
                sent[0] += len(chunk)
            except TimeoutError:
                pass                                  # the broker stopped reading: it is not read either

    peak0 = peak_rss_kib(b)
    sender = threading.Thread(target=flood, daemon=True)
    with canary.running():
        sender.start()
        sender.join(10)
    grown = peak_rss_kib(b) - peak0
    s.close()
    canary.check()
    report(request, sent_mb=sent[0] // 1_000_000, peak_grown_kib=grown, canary_worst_s=round(canary.worst, 3))
    assert grown < 32 * MIB, f"the node's peak RSS grew by {grown // 1024} MiB"


def test_pingreqs_not_read_do_not_pile_up(hostile_broker, canary_for, request):
    """A connected client (keepalive 0) sends 40 MB of PINGREQ and reads nothing. Deliveries
    queue when a socket's write buffer is full, but answers to the client's own packets
    (PINGRESP, PUBACK, ...) were written whatever it held: the broker read all 40 MB and kept the
    20 million PINGRESPs (RSS +80 MiB and more, without end). Now a connection whose write buffer
    passes 4 x its high mark (64 KiB) is no longer read until it drains: the client's sends block,
    RSS settles under +40 MiB, and once the client reads it gets one PINGRESP per PINGREQ."""
    b = hostile_broker()
    canary = canary_for(b)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", b.port()))
    s.sendall(raw.connect_packet("pinger", version=4, keepalive=0))
    s.settimeout(5)
    assert s.recv(4) == b"\x20\x02\x00\x00"
    s.settimeout(30)                                  # (the sender waits while nothing is read)
    chunk = b"\xc0\x00" * 50_000
    rounds = 400                                      # 40 MB
    sent = [0]

    def flood():
        for _ in range(rounds):
            s.sendall(chunk)
            sent[0] += len(chunk)

    rss0 = rss_kib(b)
    sender = threading.Thread(target=flood, daemon=True)
    with canary.running():
        sender.start()
        sender.join(6)
        time.sleep(1.0)
        settled = rss_kib(b)
    got = 0
    deadline = time.monotonic() + 60
    while got < rounds * len(chunk) and time.monotonic() < deadline:
        data = s.recv(1 << 20)
        if not data:
            break
        got += len(data)
    sender.join(10)
    s.close()
    canary.check()
    report(request, sent_mb=sent[0] // 1_000_000, rss_before_kib=rss0, rss_settled_kib=settled,
           pingresp_bytes=got, canary_worst_s=round(canary.worst, 3))
    assert got == rounds * len(chunk), "a PINGRESP for every PINGREQ"
    assert settled - rss0 < 40 * MIB, f"RSS grew by {(settled - rss0) // 1024} MiB"
