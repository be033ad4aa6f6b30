"""Topic-keyed caches bounded by bytes (issue 16).

The route cache of a namespace and a client's ACL verdict caches were
bounded by their number of entries (100,000 and 4,096), and a topic may be
64 KiB: one device publishing 60,000 QoS 0 messages to distinct 60 KB topics
nobody subscribes to took RSS from 84 MB to 3.6 GB, still held after it
left. Here the same attack at a scale that runs in seconds -- 3,000 topics
of 60 KB, 180 MB of topic names -- on a node like ``make run``'s (anonymous
clients, usage log on) and on a node with a control plane whose ACL makes
both the publisher's and a subscriber's verdicts cached; a canary works
throughout, and RSS stays within the bound each test states, during the
attack and after the attacker has left.
"""

import socket
import threading
import time

from ..integration import raw
from ..integration.raw import RawClient
from .conftest import MIB, Canary, report, rss_kib

TOPICS = 3000
TOPIC_BYTES = 60_000
RSS_BOUND = 48 * MIB          # the attack sends 180 MB of distinct topic names


def _flood(port: int, client_id: str, version: int = 4, prefix: str = "flood", **login) -> int:
    """Publish TOPICS QoS 0 messages, each to its own TOPIC_BYTES-long topic; -> bytes sent."""
    pad = "x" * (TOPIC_BYTES - 20)
    sent = 0
    with RawClient(port, timeout=10) as c:
        assert c.connect(client_id, version=version, **login).code == 0
        batch = []
        for i in range(TOPICS):
            batch.append(raw.publish_packet(f"{prefix}/{i:06d}/{pad}", b"v", version=version))
            if len(batch) == 50:
                data = b"".join(batch)
                c.send(data)
                sent += len(data)
                batch = []
        c.send(b"".join(batch))
        # a round trip: everything before it has been handled
        c.send(raw.packet(0xC0, b""))
        c.expect(raw.PINGRESP, timeout=30)
        c.disconnect()
    return sent


def _flood_within_bound(b, canary, request, client_id: str, **login) -> None:
    """``_flood`` while the canary keeps its round trips; the node's RSS stays within RSS_BOUND of
    before, during the flood and once the flooder left."""
    rss0 = rss_kib(b)
    with canary.running():
        sent = _flood(b.port(), client_id, **login)
        during = rss_kib(b)
    canary.check()
    time.sleep(0.5)
    after = rss_kib(b)
    assert during - rss0 < RSS_BOUND, (rss0, during)
    assert after - rss0 < RSS_BOUND, (rss0, after)
    report(request, topics=TOPICS, topic_bytes=TOPIC_BYTES, sent_mb=round(sent / 1e6), rss_before_kib=rss0,
           rss_after_attack_kib=during, rss_after_leaving_kib=after, canary_worst_s=round(canary.worst, 3))


def test_distinct_long_topics_nobody_subscribes_to(hostile_broker, canary_for, tmp_path, request):
    """An anonymous client on a node with --usage-dir (as ``make run`` starts it) publishes 3,000
    QoS 0 messages to distinct 60 KB topics nobody subscribes to. Topics longer than 512
    characters are not cached (routed every time); the usage log counts a tenant's topics up to
    4 MiB a minute, then under "(other)". RSS grows by less than 48 MiB during the attack and
    after the client has gone (before the fix: by the 180 MB of topic names, and it stayed)."""
    b = hostile_broker("--usage-dir", str(tmp_path / "usage"))
    canary = canary_for(b)
    _flood_within_bound(b, canary, request, "flooder")


def _drain(sock: socket.socket, stop: threading.Event, got: list) -> None:
    sock.settimeout(0.2)
    while not stop.is_set():
        try:
            data = sock.recv(1 << 20)
        except TimeoutError:
            continue
        except OSError:
            return
        if not data:
            return
        got[0] += len(data)


def test_distinct_long_topics_through_a_tenants_acl(tmp_path, request):
    """With a control plane, a tenant whose ACL is not open (a deny rule) has every client's
    verdicts cached: the publisher's (publish) and those of a subscriber to "#" that the deny
    rule grants only in part (read, checked on each delivery). The device publishes 3,000 QoS 0
    messages to distinct 60 KB topics, delivered to that subscriber (with a 4 MiB queue budget
    and 20 messages per queue, so that queued deliveries do not hide the caches). ACL caches hold at most
    128 KiB per client (topics longer than 512 characters are checked every time); RSS grows by
    less than 48 MiB during the attack and after both have gone (before the fix: by about the
    180 MB of topic names, held by the caches until the clients left)."""
    from ..controlplane import ControlPlane

    plane = ControlPlane(tmp_path)
    secrets = plane.provision([{"slug": "acme", "default_acl": "allow", "devices": ["pub", "sub"],
                                "acl": [{"topic": "secret/#", "action": "both", "allow": False}]}])
    # the deliveries' own memory kept small, so that what is measured is the caches
    b = plane.broker("--connect-timeout", "2", "--queue-budget", str(4 * MIB * 1024), "--max-queued", "20",
                     anonymous=True)
    canary = Canary(b, f"acl-caches-{time.monotonic_ns()}")
    stop = threading.Event()
    try:
        canary.check()
        sub = RawClient(b.port(), timeout=10)
        assert sub.connect("sub", version=4, username="acme/sub", password=secrets["acme/sub"]).code == 0
        assert sub.subscribe("#", 0) == [0]
        received = [0]
        drainer = threading.Thread(target=_drain, args=(sub.sock, stop, received), daemon=True)
        drainer.start()
        rss0 = rss_kib(b)
        with canary.running():
            sent = _flood(b.port(), "pub", username="acme/pub", password=secrets["acme/pub"])
            during = rss_kib(b)
        stop.set()
        drainer.join(5)
        sub.close()
        assert received[0] > 10 * TOPIC_BYTES, "the subscriber got nothing: no read check was made"
        canary.check()
        time.sleep(0.5)
        after = rss_kib(b)
        assert during - rss0 < RSS_BOUND, (rss0, during)
        assert after - rss0 < RSS_BOUND, (rss0, after)
        report(request, topics=TOPICS, topic_bytes=TOPIC_BYTES, sent_mb=round(sent / 1e6),
               delivered_mb=round(received[0] / 1e6), rss_before_kib=rss0, rss_after_attack_kib=during, rss_after_leaving_kib=after, canary_worst_s=round(canary.worst, 3))
    finally:
        stop.set()
        canary.close()
        b.stop()


def test_distinct_long_topics_of_a_tenant_with_rules(tmp_path, request):
    """A tenant with one rule (on topics the flood does not even match) had each distinct topic it
    published remembered with the rules it matches -- 4,096 topics at a time, whatever their length:
    3,000 topics of 60 KB held ~180 MB until the table filled. Now the table is bounded in bytes and
    topics longer than 512 characters are matched every time, as the route and ACL caches are."""
    from ..controlplane import ControlPlane
    from ..rules.nodes import loaded

    plane = ControlPlane(tmp_path)
    secrets = plane.provision([{"slug": "acme", "default_acl": "allow", "devices": ["pub"]}])
    token = plane.issue_token("rules-reader", "read")
    rid = int(plane.manage("rules", "add", "acme", "--sql", 'SELECT clientid FROM "sensors/+/temp"',
                           "--republish", "alerts/x").stdout.strip())
    b = plane.broker("--connect-timeout", "2", "--admin", "127.0.0.1:0", anonymous=True)
    canary = Canary(b, f"rule-cache-{time.monotonic_ns()}")
    try:
        loaded(b, token, "acme", rid)
        canary.check()
        _flood_within_bound(b, canary, request, "pub", username="acme/pub", password=secrets["acme/pub"])
    finally:
        canary.close()
        b.stop()
