"""An authenticated link is still a peer to distrust (issue #16): a member
that misbehaves -- a bug, a compromised host holding the secret -- sends
requests with made-up fields, or more of them than are answered. What a
node holds for such requests is bounded per link, a request it cannot take
is refused (or the link closed), and the node goes on serving its clients
and the other members.

The rogue member is a raw socket that authenticated with the cluster secret
under another member's node id (``RawLink.handshake``).
"""

import re
import threading
import time

from brokerd.cluster import frames

from ..hostile.conftest import Canary, rss_kib
from ..integration.helpers import Client, connect
from ..mqtt import V5, PacketTypes, props
from .conftest import settle, wait_until
from .test_links import RawLink, link_port


def send_what_is_read(raw: RawLink, data: bytes, seconds: float) -> int:
    """Send ``data`` for at most ``seconds`` (the node may not read it all); -> bytes sent."""
    deadline = time.monotonic() + seconds
    view, sent = memoryview(data), 0
    raw.sock.settimeout(0.2)
    while sent < len(data) and time.monotonic() < deadline:
        try:
            sent += raw.sock.send(view[sent:sent + 65536])
        except TimeoutError:
            continue
        except OSError:
            break
    return sent


def persistent(port: int, client_id: str) -> Client:
    c = Client(client_id, V5, clean=False)
    return c.connect(port, properties=props(PacketTypes.CONNECT, SessionExpiryInterval=3600))


def test_syncs_with_made_up_event_ids_do_not_stop_the_node_confirming_route_switches(cluster, tag):
    """SYNC asks a node to answer once it applied an event of the log. One
    SYNC naming no event id ("x") was kept, and every later pass over the
    waiting SYNCs failed on it: the node never confirmed a route switch
    again, so every session that moved waited SYNC_TIMEOUT and was let go
    unconfirmed -- and a SYNC from a rightful member made the node drop that
    member's link. SYNCs naming an event far ahead were kept for ever, and
    each SYNC that came went over all those waiting: 600,000 of them (14 MB
    sent) stalled the node, a canary's PUBLISH went unacknowledged. Now an id
    that is not one closes the link, a SYNC whose event is applied is answered
    at once, and one that waits does so only as long as its asker, at most
    SYNCS_PER_NODE per node."""
    n1, n2, n3 = cluster.start(3)
    rogue = RawLink(link_port(n1))
    rogue.handshake(cluster.secret.encode(), cluster.name(n3))
    rogue.send(frames.sync(1, "x"))
    assert rogue.closed_by_node(5), "a SYNC with no event id in it was taken"
    rogue.close()

    # a session moving from n2 to n3: n2 asks every node, n1 too, to confirm its route switch
    dev = persistent(n2.port(), f"{tag}-dev")
    dev.subscribe(f"{tag}/owned", qos=1)
    pub = connect(n1.port(), f"{tag}-pub", V5)
    settle(pub, f"{tag}/owned", dev)
    moved = persistent(n3.port(), f"{tag}-dev")
    assert moved.session_present
    settle(pub, f"{tag}/owned", moved)
    time.sleep(0.5)
    assert "did not confirm the route switch" not in n2.log, n2.log[-3000:]

    canary = Canary(n1, f"{tag}-c")
    canary.check()
    before = rss_kib(n1)
    flood = b"".join(frames.sync(req, "99999999999999-0") for req in range(1, 20001))
    with canary.running():
        rogue = RawLink(link_port(n1))
        rogue.handshake(cluster.secret.encode(), cluster.name(n3))
        for _ in range(30):
            rogue.send(flood)
        # events for n1 to read meanwhile: route changes
        churn = connect(n2.port(), f"{tag}-churn", V5)
        for n in range(20):
            churn.subscribe(f"{tag}/churn/{n}", qos=0)
        time.sleep(1.0)
        grew = rss_kib(n1) - before

    print(f"RSS +{grew >> 10} MiB; canary worst {canary.worst * 1000:.0f} ms")
    assert grew < 48 * 1024, f"RSS grew by {grew >> 10} MiB for SYNCs no one will see answered"
    assert n1.proc.poll() is None


def test_a_handoff_that_is_not_one_closes_the_link(cluster, tag):
    """HANDOFF carries JSON naming the session that moves and its filters.
    Text that was not that JSON raised in the task handling it: the link
    stayed open and the node logged "Task exception was never retrieved"
    for each (a member could fill the log at will). Now the link is closed,
    as for any frame that is not one, and the node goes on."""
    n1, n2, n3 = cluster.start(3)
    for text in ("not json", '{"tenant": 1}', '{"tenant": "t", "client_id": "c", "filters": "x/#"}',
                 '{"tenant": "t", "client_id": "c", "filters": [7]}', "[]", "[" * 100000,
                 '{"tenant": ' * 50000):
        rogue = RawLink(link_port(n1))
        rogue.handshake(cluster.secret.encode(), cluster.name(n3))
        rogue.send(frames.handoff(5, text))
        assert rogue.closed_by_node(5), f"a HANDOFF of {text!r} was taken"
        rogue.close()
    time.sleep(0.2)
    assert "Task exception" not in n1.log and "Traceback" not in n1.log, n1.log[-3000:]
    sub = connect(n2.port(), f"{tag}-sub", V5)
    sub.subscribe(f"{tag}/t", qos=1)
    pub = connect(n1.port(), f"{tag}-pub", V5)
    settle(pub, f"{tag}/t", sub)


def test_a_holding_nested_too_deep_closes_the_link(cluster, tag):
    """A member holding a client id's lock takes its session over: the node
    asks it to hold the session's messages (HANDOFF) and reads its answer
    (HOLDING, JSON). An answer nested deeper than the JSON parser recurses
    raised RecursionError in the takeover's task: no RELEASED came, the link
    stayed open and the session's filters stayed frozen (their counts never
    announced again). Now it is an answer that is not one: the link is
    closed, saying so in one line."""
    n1, n2, n3 = cluster.start(3)
    dev = persistent(n1.port(), f"{tag}-dev")
    dev.subscribe(f"{tag}/owned", qos=1)
    time.sleep(0.3)
    rogue = RawLink(link_port(n1))
    rogue.handshake(cluster.secret.encode(), cluster.name(n3))
    # the rogue's node id holds the client id's lock, as a CONNECT's claim there would
    cluster.redis.client().set(f"{cluster.prefix}:lock:default:{tag}-dev", f"{cluster.name(n3)}:1", px=10000)
    rogue.send(frames.takeover(9, "default", f"{tag}-dev"))
    kind, req, text = rogue.read_decoded()
    assert kind == frames.HANDOFF and f"{tag}/owned" in text
    rogue.send(frames.holding(req, "[" * 100000))
    assert rogue.closed_by_node(5), "a HOLDING nested too deep was taken"
    wait_until(lambda: "that is no answer to its HANDOFF" in n1.log, timeout=5, message=n1.log[-3000:])
    assert "Task exception" not in n1.log and "Traceback" not in n1.log, n1.log[-3000:]
    sub = connect(n2.port(), f"{tag}-sub", V5)
    sub.subscribe(f"{tag}/t", qos=1)
    pub = connect(n1.port(), f"{tag}-pub", V5)
    settle(pub, f"{tag}/t", sub)


def test_a_flood_of_takeovers_from_a_member_leaves_the_node_in_the_cluster(cluster, tag):
    """Each TAKEOVER a link brought started a task asking Redis who holds the
    client id's lock, as many at once as came: 500,000 of them (15 MB sent)
    queued on the node's Redis connections, its heartbeat waited behind them,
    the other nodes took it for dead ("node n1 left the cluster": its
    sessions adopted while it still held them) and a canary's PUBLISH went
    unacknowledged. Now a link has at most MAX_IN_PROGRESS lock checks in
    progress on the node; it is not read meanwhile."""
    n1, n2, n3 = cluster.start(3)
    canary = Canary(n1, f"{tag}-c")
    canary.check()
    flood = b"".join(frames.takeover(req, "default", f"{tag}-{req}") for req in range(1, 500001))
    rogue = RawLink(link_port(n1))
    rogue.handshake(cluster.secret.encode(), cluster.name(n3))
    sender = threading.Thread(target=send_what_is_read, args=(rogue, flood, 10.0), daemon=True)
    with canary.running():
        sender.start()
        sender.join(20)
    print(f"canary worst {canary.worst * 1000:.0f} ms")
    assert "fenc" not in n1.log, n1.log[-3000:]
    assert "node n1 left the cluster" not in n2.log + n3.log
    assert n1.proc.poll() is None
    rogue.close()


def test_refused_takeovers_are_summed_up_in_the_log(cluster, tag):
    """A TAKEOVER from a member that does not hold the client id's lock is
    refused, and each refusal was a line in the node's log: a member sending
    them without end wrote the node's log as fast as it sent (3,000 TAKEOVERs,
    3,000 lines). Now the first refusal from a node is logged at once, and the
    ones after it in one line per node every few seconds, with their count."""
    n1, n2, n3 = cluster.start(3)
    canary = Canary(n1, f"{tag}-c")
    canary.check()
    total = 3000
    rogue = RawLink(link_port(n1))
    rogue.handshake(cluster.secret.encode(), cluster.name(n3))
    with canary.running():
        rogue.send(b"".join(frames.takeover(req, "default", f"{tag}-{req}") for req in range(1, total + 1)))
        answers = [rogue.read_decoded(10) for _ in range(total)]
    assert {a[0] for a in answers} == {frames.RELEASED} and {a[2] for a in answers} == {2}
    lines = lambda: [line for line in n1.output if "brokerd.cluster: " in line and " refused" in line]  # noqa: E731

    def counted() -> int:
        n = 0
        for line in lines():
            m = re.search(r"(\d+) more takeovers? refused", line)
            n += int(m.group(1)) if m else 1
        return n

    wait_until(lambda: counted() == total, timeout=15,
               message=f"the refusals logged do not add up to {total}: {lines()[:5]} ({len(lines())} lines)")
    print("\n".join(lines()))
    assert len(lines()) <= 4, f"{len(lines())} log lines for {total} refused TAKEOVERs"
    assert n1.proc.poll() is None
    rogue.close()


def test_sockets_that_never_start_tls_on_the_link_port_are_capped(redis_server, tmp_path, tag):
    """With --cluster-tls-*, a socket counted against the caps on sockets not
    yet authenticated (8 per address, 64 in all) only once its TLS handshake
    was done: sockets that never sent a ClientHello were all kept, each for
    the 5 s of the handshake timeout -- 600 of them held 600 descriptors,
    and a flood of them would take every descriptor the node has. Now a
    socket counts from its accept, as on a link without TLS."""
    import trustme

    from ..hostile.conftest import open_fds
    from ..pki import write_cert
    from .conftest import Cluster

    ca = trustme.CA()
    ca_file = str(tmp_path / "ca.pem")
    ca.cert_pem.write_to_path(ca_file)
    c = Cluster(redis_server, tmp_path)
    idle = []
    try:
        nodes = []
        for i in range(2):
            cert, key = write_cert(ca.issue_cert(f"node{i}"), tmp_path, f"node{i}")
            nodes.append(c.node("--cluster-tls-cert", cert, "--cluster-tls-key", key, "--cluster-tls-ca", ca_file,
                                wait=False))
        c.wait_connected()
        n1 = nodes[0]
        port = link_port(n1)
        fds = open_fds(n1)
        idle = [RawLink(port, source="127.0.0.2") for _ in range(600)]
        time.sleep(0.5)
        held = open_fds(n1) - fds
        closed_at_once = [s for s in idle if s.closed_by_node(0.05)]
        print(f"{held} descriptors held, {len(closed_at_once)} of {len(idle)} sockets closed at once")
        assert held < 64, f"{held} descriptors held by sockets that never started TLS"
        assert len(closed_at_once) >= len(idle) - 8
        cert, key = write_cert(ca.issue_cert("node2"), tmp_path, "node2")
        c.node("--cluster-tls-cert", cert, "--cluster-tls-key", key, "--cluster-tls-ca", ca_file)
        c.wait_connected()                         # a node joins and links with both meanwhile
    finally:
        for s in idle:
            s.close()
        c.stop_all()
