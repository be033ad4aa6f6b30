"""An authenticated link is still a peer to distrust (issue #16): a member
that misbehaves -- a bug, a compromised host holding the secret -- sends
requests with made-up fields, or more of them than are answered. What a
node holds for such requests is bounded per link, a request it cannot take
is refused (or the link closed), and the node goes on serving its clients
and the other members.

The rogue member is a raw socket that authenticated with the cluster secret
under another member's node id (``RawLink.handshake``).
"""

import time

from brokerd.cluster import frames

from ..hostile.conftest import Canary, rss_kib
from ..integration.helpers import Client, connect
from ..mqtt import V5, PacketTypes, props
from .conftest import settle
from .test_links import RawLink, link_port


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
