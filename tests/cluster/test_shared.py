"""Shared subscriptions across nodes (issue #5): a message for ``$share/G/F``
goes to exactly one member cluster-wide, the nodes taking turns."""

import time

import pytest

from ..integration.helpers import connect
from ..mqtt import V5, V311

N = 90


def settle_group(publisher, topic: str, members, timeout: float = 10.0) -> None:
    """Publish probes until every member got one: each node knows every node's members."""
    seen = [False] * len(members)
    deadline = time.monotonic() + timeout
    while not all(seen):
        assert time.monotonic() < deadline, f"shared group not in place: {seen}"
        publisher.publish(topic, b"probe")
        time.sleep(0.05)
        for i, m in enumerate(members):
            seen[i] = seen[i] or not m.messages.empty()


def collect(members, n: int, timeout: float = 15.0) -> list[list[int]]:
    """The numbered messages each member got (probes left out), until ``n`` in all."""
    got = [[] for _ in members]
    deadline = time.monotonic() + timeout
    while sum(map(len, got)) < n and time.monotonic() < deadline:
        for i, m in enumerate(members):
            while not m.messages.empty():
                payload = m.messages.get_nowait().payload
                if payload != b"probe":
                    got[i].append(int(payload))
        time.sleep(0.02)
    return got


@pytest.mark.parametrize("qos", [0, 1])
def test_each_message_to_exactly_one_member_across_three_nodes(cluster, tag, qos):
    nodes = cluster.start(3)
    group = f"$share/g/{tag}/#"
    members = [connect(node.port(), f"{tag}-m{i}", V5 if i % 2 else V311) for i, node in enumerate(nodes)]
    for m in members:
        m.subscribe(group, qos=1)
    pub = connect(nodes[1].port(), f"{tag}-pub", V5)
    settle_group(pub, f"{tag}/probe", members)
    for n in range(N):
        pub.publish(f"{tag}/m", b"%d" % n, qos=qos)
    got = collect(members, N)
    time.sleep(0.5)
    got = [g + more for g, more in zip(got, collect(members, 0, timeout=0), strict=True)]
    flat = sorted(x for g in got for x in g)
    assert flat == list(range(N)), f"per member: {[len(g) for g in got]}; duplicates or losses"
    shares = [len(g) for g in got]
    assert max(shares) - min(shares) <= 2, f"nodes do not take turns: {shares}"
    for g in got:
        assert g == sorted(g), "a member got its share out of publish order"


def test_group_with_two_members_on_one_node_and_one_on_another(cluster, tag):
    n1, n2 = cluster.start(2)
    group = f"$share/grp/{tag}/+"
    members = [connect(n.port(), f"{tag}-m{i}", V5) for i, n in enumerate((n1, n1, n2))]
    for m in members:
        m.subscribe(group, qos=1)
    plain = connect(n2.port(), f"{tag}-plain", V5)        # a plain subscriber beside the group gets everything
    plain.subscribe(f"{tag}/+", qos=1)
    pub = connect(n2.port(), f"{tag}-pub", V311)
    settle_group(pub, f"{tag}/probe", members)
    for n in range(N):
        pub.publish(f"{tag}/x", b"%d" % n, qos=1)
    got = collect(members, N)
    time.sleep(0.5)
    got = [g + more for g, more in zip(got, collect(members, 0, timeout=0), strict=True)]
    assert sorted(x for g in got for x in g) == list(range(N))
    shares = [len(g) for g in got]
    # the nodes take turns (not the members): node 1's two members share its half
    assert abs(shares[2] - N // 2) <= 2 and abs(shares[0] - shares[1]) <= 2, f"shares {shares}"
    msgs = []
    while len(msgs) < N:
        m = plain.expect(5)
        if m.payload != b"probe":
            msgs.append(int(m.payload))
    assert msgs == list(range(N))
