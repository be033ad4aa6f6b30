"""Shared subscriptions across nodes (issue #5): a message for ``$share/G/F``
goes to exactly one member cluster-wide, the nodes taking turns."""

import time

import pytest

from ..integration.helpers import connect
from ..mqtt import V5, V311, PacketTypes, props
from .conftest import PacedPublisher
from .test_failover import adopted_by

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


def collect(members, n: int, timeout: float = 15.0, until: set[int] | None = None) -> list[list[int]]:
    """The numbered messages each member got (probes left out), until ``n`` in all -- or, given
    ``until``, once each of those numbers came; what has come at least (``timeout=0``: what is there)."""
    got = [[] for _ in members]
    deadline = time.monotonic() + timeout
    while True:
        for i, m in enumerate(members):
            while not m.messages.empty():
                payload = m.messages.get_nowait().payload
                if payload != b"probe":
                    got[i].append(int(payload))
        if sum(map(len, got)) >= n or until is not None and until <= {x for g in got for x in g}:
            return got
        if time.monotonic() >= deadline:
            return got
        time.sleep(0.02)


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


def test_a_members_queued_messages_go_to_a_member_on_another_node_when_its_session_ends(cluster, tag):
    """m1 (a session of 2 s) on node 1 goes away; node 1's share of the group's messages
    queues for it meanwhile. When its session expires, those messages go to another member
    of the group -- m2, on node 2 (before: to another member on node 1 only; with none
    there they were lost, acknowledged to their publisher)."""
    n1, n2 = cluster.start(2)
    group = f"$share/g/{tag}/#"
    m1 = connect(n1.port(), f"{tag}-m1", V5, properties=props(PacketTypes.CONNECT, SessionExpiryInterval=2))
    m2 = connect(n2.port(), f"{tag}-m2", V5)
    for m in (m1, m2):
        m.subscribe(group, qos=1)
    pub = connect(n2.port(), f"{tag}-pub", V5)
    settle_group(pub, f"{tag}/probe", [m1, m2])
    m1.drop()
    time.sleep(0.3)
    for n in range(N):
        code, _ = pub.publish_result(pub.publish(f"{tag}/m", b"%d" % n, qos=1))
        assert code.value < 0x80, code
    got = collect([m2], N, timeout=15)[0]
    assert sorted(got) == list(range(N)), f"m2 got {len(got)} of {N}: missing {sorted(set(range(N)) - set(got))}"


def test_no_message_is_lost_while_a_member_on_another_node_unsubscribes(cluster, tag):
    """A QoS 1 stream to a group whose member on node 1 unsubscribes in the middle of it: every
    message acknowledged reaches a member (before: those node 2 still sent to node 1 by its routes
    once node 1 had no member left were acknowledged and dropped there)."""
    n1, n2 = cluster.start(2)
    group = f"$share/g/{tag}/#"
    m1 = connect(n1.port(), f"{tag}-m1", V5)
    m2 = connect(n2.port(), f"{tag}-m2", V5)
    for m in (m1, m2):
        m.subscribe(group, qos=1)
    pub = connect(n2.port(), f"{tag}-pub", V5)
    settle_group(pub, f"{tag}/probe", [m1, m2])
    total = 600
    stream = PacedPublisher(n2.port(), f"{tag}/s", total=total, rate=400).start()
    stream.wait_acked(total // 3)
    m1.unsubscribe(group)
    stream.finish()
    acked = stream.acked
    assert len(acked) == total, stream.by_code()
    got = collect([m1, m2], total, timeout=15)
    flat = [int(x) for g in got for x in g]
    missing = sorted(acked - set(flat))
    assert not missing, f"{len(missing)} acknowledged messages reached no member: {missing[:20]}"


@pytest.mark.slow
@pytest.mark.parametrize("then", ["reconnects", "expires"])
def test_sigkill_of_a_members_node_loses_no_acknowledged_message_of_the_group(cluster, tag, then):
    """m1 (a stored session) on node 1 takes its share of a QoS 1 stream published on node 3 and
    acknowledges none of it (in flight, then queued); m2 is on node 2. Node 1 is SIGKILLed mid-stream.
    Every message acknowledged to the publisher reaches a member: m1's share when m1 comes back on
    node 3 (``reconnects``: its session as the adopter restored it), or m2 once m1's session expires
    on the node that adopted it (``expires``: that node may have no member of its own). Afterwards
    the group is m1 and m2, each once: a new stream goes to one of them per message, to both."""
    n1, n2, n3 = cluster.start(3)
    group = f"$share/g/{tag}/#"
    expiry = 300 if then == "reconnects" else 3
    m1 = connect(n1.port(), f"{tag}-m1", V5, clean=False, manual_ack=True,
                 properties=props(PacketTypes.CONNECT, SessionExpiryInterval=expiry))
    m2 = connect(n2.port(), f"{tag}-m2", V5)
    for m in (m1, m2):
        m.subscribe(group, qos=1)
    settle_group(connect(n3.port(), f"{tag}-probe", V5), f"{tag}/probe", [m1, m2])
    total = 1500
    stream = PacedPublisher(n3.port(), f"{tag}/s", total=total, rate=300).start()
    stream.wait_acked(total // 3)
    n1.kill()
    stream.finish()
    acked = stream.acked
    adopted_by([n2, n3], cluster.name(n1))
    got = collect([m1, m2], 10 ** 6, timeout=0)        # what m1 had read before its node died (and m2 so far)
    first = [int(x) for x in got[0]]
    if then == "reconnects":
        again = connect(n3.port(), f"{tag}-m1", V5, clean=False,
                        properties=props(PacketTypes.CONNECT, SessionExpiryInterval=expiry))
        assert again.session_present
        members = [again, m2]
    else:
        members = [m2]
    late = collect(members, len(acked), timeout=10, until=acked - {x for g in got for x in g})
    seen = set(first) | {int(x) for g in got[1:] + late for x in g}
    missing = sorted(acked - seen)
    assert not missing, f"{len(missing)} acknowledged messages reached no member: {missing[:20]}; {stream.by_code()}"
    assert len(acked) > total // 2, stream.by_code()
    if then == "reconnects":
        time.sleep(1)
        collect(members, 10 ** 6, timeout=0.5)
        pub = connect(n3.port(), f"{tag}-pub2", V5)
        for n in range(N):
            pub.publish(f"{tag}/after", b"%d" % n, qos=1)
        after = collect(members, N, timeout=15)
        time.sleep(0.5)
        after = [g + more for g, more in zip(after, collect(members, 0, timeout=0), strict=True)]
        flat = sorted(x for g in after for x in g)
        assert flat == list(range(N)), f"per member {[len(g) for g in after]}: duplicates or losses"
        assert all(after), f"a member got none of the group's messages: {[len(g) for g in after]}"


@pytest.mark.slow
def test_a_group_whose_only_member_is_a_stored_session_on_a_dead_node_loses_nothing(cluster, tag):
    """The group's only member, m1, a stored session, offline, on node 1; node 1 is SIGKILLed
    while a QoS 1 stream goes on from node 2. Until node 2 adopted m1's session, the stream's
    messages are refused (the publisher sends them again), as those of a plain subscription of
    a stored session are -- never acknowledged for no member: m1, back on node 2, has every
    message acknowledged."""
    n1, n2 = cluster.start(2, "--max-queued", "10000")
    group = f"$share/g/{tag}/#"
    p = props(PacketTypes.CONNECT, SessionExpiryInterval=300)
    m1 = connect(n1.port(), f"{tag}-m1", V5, clean=False, properties=p)
    m1.subscribe(group, qos=1)
    settle_group(connect(n2.port(), f"{tag}-probe", V5), f"{tag}/probe", [m1])
    m1.disconnect()
    time.sleep(0.3)
    total = 2000
    stream = PacedPublisher(n2.port(), f"{tag}/s", total=total, rate=200).start()
    stream.wait_acked(200)
    n1.kill()
    stream.finish(timeout=60)
    acked = stream.acked
    adopted_by([n2], cluster.name(n1))
    again = connect(n2.port(), f"{tag}-m1", V5, clean=False, properties=p)
    assert again.session_present
    # (until every acknowledged number came: a message refused to its publisher may reach the session too)
    got = set(collect([again], 10**9, timeout=30, until=acked)[0])
    missing = sorted(acked - got)
    assert not missing, (f"{len(missing)} acknowledged messages lost: {missing[:20]}; codes {stream.by_code()}; "
                         f"0x10 for {stream.numbers_with(0x10)[:10]}")
    assert max(acked) > total - 100, f"the stream did not go on: {stream.by_code()}"


def test_no_message_is_lost_while_the_groups_only_member_moves_to_another_node(cluster, tag):
    """The group's only member, a stored session on node 1, reconnects on node 2 (taking its
    session over) in the middle of a QoS 1 stream published on node 2: every message
    acknowledged reaches it -- those node 2 still sent to node 1 after node 1 let the session
    go, before either node knew where the member was, are refused and sent again (before:
    acknowledged and dropped on node 1)."""
    n1, n2 = cluster.start(2)
    group = f"$share/g/{tag}/#"
    p = props(PacketTypes.CONNECT, SessionExpiryInterval=300)
    m1 = connect(n1.port(), f"{tag}-m1", V5, clean=False, properties=p)
    m1.subscribe(group, qos=1)
    settle_group(connect(n2.port(), f"{tag}-probe", V5), f"{tag}/probe", [m1])
    total = 800
    stream = PacedPublisher(n2.port(), f"{tag}/s", total=total, rate=400).start()
    stream.wait_acked(total // 3)
    m1.drop()
    before = collect([m1], 10 ** 6, timeout=0.2)[0]     # what it had read before
    again = connect(n2.port(), f"{tag}-m1", V5, clean=False, properties=p)
    assert again.session_present
    stream.finish()
    acked = stream.acked
    got = set(before) | {int(x) for x in collect([again], len(acked), timeout=15, until=acked - set(before))[0]}
    time.sleep(0.5)
    got |= {int(x) for x in collect([again], 0, timeout=0)[0]}
    missing = sorted(acked - got)
    assert not missing, f"{len(missing)} acknowledged messages lost: {missing[:20]}; codes {stream.by_code()}"


def test_a_groups_messages_go_to_its_online_member_not_to_an_offline_one_on_another_node(cluster, tag):
    """Group g: m1 a stored session on n1, its client gone; m2 online on n2. The nodes took turns
    whatever their members' state: n1's turns waited in m1's queue until it came back (its session
    may last a day), m2 idle meanwhile. Now a node with a member online is chosen first, as a node
    chooses among its own members: m2 gets every message at once, m1 none when it comes back."""
    n1, n2 = cluster.start(2)
    p = props(PacketTypes.CONNECT, SessionExpiryInterval=300)
    group = f"$share/g/{tag}/#"
    m1 = connect(n1.port(), f"{tag}-m1", V5, clean=False, properties=p)
    m1.subscribe(group, qos=1)
    m2 = connect(n2.port(), f"{tag}-m2", V5)
    m2.subscribe(group, qos=1)
    pub = connect(n1.port(), f"{tag}-pub", V5)
    settle_group(pub, f"{tag}/probe", [m1, m2])
    m1.disconnect()
    deadline = time.monotonic() + 10
    in_a_row, k = 0, 1000
    while in_a_row < 6:                      # n1's "offline" known on both nodes: the probes all go to m2
        assert time.monotonic() < deadline, "the offline member's node still takes turns"
        k += 1
        pub.publish(f"{tag}/probe", b"%d" % k)
        in_a_row = in_a_row + 1 if collect([m2], 1, timeout=0.3, until={k}) == [[k]] else 0
    for n in range(40):
        pub.publish(f"{tag}/m", b"%d" % n, qos=1)
    assert collect([m2], 40, timeout=10) == [list(range(40))]
    back = connect(n1.port(), f"{tag}-m1", V5, clean=False, properties=p)
    time.sleep(0.5)
    held = [x for x in collect([back], 0, timeout=0)[0] if x < 1000]
    assert held == [], "messages held for the offline member"


def test_a_node_of_the_previous_version_still_sends_a_groups_messages_to_its_offline_member(cluster, tmp_path, tag):
    """A cluster upgrading node by node: n1 of the version before members' presence was announced
    (e3ed242), n2 of this one. Group g's only member, m1, a stored session on n2, goes offline; a
    QoS 1 stream is published on n1. n2 announced the group's members as negative (none online),
    which n1 read as none at all: the group left its route table, the stream went to no member
    (PUBACK 0x10) and m1, back, had none of it. n1 sends them to n2 still, which keeps them for m1."""
    from .test_tenancy import old_node

    old = old_node(cluster, tmp_path)
    n2 = cluster.node(wait=False)
    cluster.wait_connected()
    p = props(PacketTypes.CONNECT, SessionExpiryInterval=300)
    group = f"$share/g/{tag}/#"
    m1 = connect(n2.port(), f"{tag}-m1", V5, clean=False, properties=p)
    m1.subscribe(group, qos=1)
    pub = connect(old.port(), f"{tag}-pub", V5)
    settle_group(pub, f"{tag}/probe", [m1])
    m1.disconnect()
    time.sleep(1.0)                                  # its going announced, and read on n1
    for n in range(20):
        pub.publish(f"{tag}/m", b"%d" % n, qos=1)
    back = connect(n2.port(), f"{tag}-m1", V5, clean=False, properties=p)
    assert back.session_present
    assert collect([back], 20, timeout=10) == [list(range(20))]


def test_what_a_members_ended_session_owed_goes_to_an_online_member_not_an_offline_one(cluster, tag):
    """Group g: on n1 m1 (a clean session, its client reading but acknowledging none: its share of a
    QoS 1 stream waits in its session) and m3 (a stored session, its client gone); on n2 m2, online.
    m1's connection drops, its session ends: what it owed goes to another member -- n1 counted m3 as a
    member online and took turns with n2, so half of it waited in m3's queue until m3 came back (its
    session may last a day) while m2 idled. It goes to m2, as the stream's other messages do."""
    n1, n2 = cluster.start(2)
    group = f"$share/g/{tag}/#"
    p = props(PacketTypes.CONNECT, SessionExpiryInterval=300)
    m3 = connect(n1.port(), f"{tag}-m3", V5, clean=False, properties=p)
    m3.subscribe(group, qos=1)
    m1 = connect(n1.port(), f"{tag}-m1", V5, manual_ack=True, properties=props(PacketTypes.CONNECT, ReceiveMaximum=1))
    m1.subscribe(group, qos=1)
    m2 = connect(n2.port(), f"{tag}-m2", V5)
    m2.subscribe(group, qos=1)
    pub = connect(n2.port(), f"{tag}-pub", V5)
    settle_group(pub, f"{tag}/probe", [m1, m2, m3])
    m3.disconnect()
    time.sleep(1.0)                                  # m3 offline, known on both nodes
    for n in range(40):
        code, _ = pub.publish_result(pub.publish(f"{tag}/m", b"%d" % n, qos=1))
        assert code.value < 0x80, code
    time.sleep(0.5)
    m1.drop()                                        # nothing acknowledged: its session owes its whole share
    got = collect([m2], 40, timeout=10)[0]
    back = connect(n1.port(), f"{tag}-m3", V5, clean=False, properties=p)
    time.sleep(0.5)
    held = [x for x in collect([back], 0, timeout=0)[0] if x < 1000]
    assert sorted(got) == list(range(40)), f"m2 got {len(got)} of 40; held for the offline m3: {sorted(held)}"
