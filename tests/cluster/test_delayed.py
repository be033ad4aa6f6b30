"""Delayed publish on a cluster (issue 19): the nodes share the store, every
node looks for due messages, and each message is published by exactly one of
them -- subscribers on both nodes get every message once; a message whose
node was SIGKILLed before it was due is published by the survivor."""

import time

from ..mqtt import V311, PahoClient
from .conftest import settle

N = 20


def test_each_delayed_message_is_delivered_once_with_two_nodes(cluster, tag):
    n1, n2 = cluster.start(2)
    subs = [PahoClient(f"{tag}-s{i}", V311).connect(n.port()) for i, n in enumerate((n1, n2))]
    pubs = [PahoClient(f"{tag}-p{i}", V311).connect(n.port()) for i, n in enumerate((n1, n2))]
    try:
        for s in subs:
            s.subscribe(f"{tag}/#", qos=1)
        for p in pubs:                       # whichever node publishes a due message reaches both
            settle(p, f"{tag}/probe", *subs)
        t0 = time.monotonic()
        for i in range(N):
            pubs[i % 2].publish(f"$delayed/2/{tag}/m", b"%02d" % i, qos=1)
        for s in subs:
            s.expect_none(max(0.0, 1.0 - (time.monotonic() - t0)))          # not before
        for s in subs:
            got = s.expect_n(N, timeout=20)
            assert sorted(m.payload for m in got) == [b"%02d" % i for i in range(N)]
        for s in subs:
            s.expect_none(2.0)                                             # and never a second copy
    finally:
        for c in subs + pubs:
            c.disconnect()


def test_a_delayed_message_of_a_killed_node_is_published_by_the_other(cluster, tag):
    n1, n2 = cluster.start(2)
    sub = PahoClient(f"{tag}-s", V311).connect(n2.port())
    try:
        sub.subscribe(f"{tag}/#", qos=1)
        with PahoClient(f"{tag}-p", V311).connect(n1.port()) as pub:
            settle(pub, f"{tag}/probe", sub)
            for i in range(5):
                pub.publish(f"$delayed/3/{tag}/k", b"%d" % i, qos=1)      # PUBACK: in the shared store
        n1.kill()
        got = sub.expect_n(5, timeout=20)
        assert sorted(m.payload for m in got) == [b"0", b"1", b"2", b"3", b"4"]
        sub.expect_none(2.0)
    finally:
        sub.disconnect()
