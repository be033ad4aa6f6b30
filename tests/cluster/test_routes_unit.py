"""The cluster route table (pure): what a node knows of the other nodes' subscriptions."""

from brokerd.cluster.routes import ClusterRoutes


def test_exact_and_wildcard_routes_of_several_nodes_match_snapshot_and_drop():
    r = ClusterRoutes("me")
    r.set_route("me", "t", "a/b", 1, 0)                  # this node's own: kept elsewhere
    r.set_route("n1", "t", "a/b", 1, 0)
    r.set_route("n2", "t", "a/b", 2, 1)                  # a second node on the same exact filter, durable
    r.set_route("n3", "t", "a/+", 1, 0)
    r.set_group("n3", "t", "g", "a/b", 2)
    assert r.match("t", "a/b") == ({"n1": False, "n2": True, "n3": False}, [("g", "a/b", {"n3": 2})])
    assert r.match("u", "a/b") == ({}, [])
    assert r.nodes() == {"n1", "n2", "n3"}
    copy = ClusterRoutes("me")
    copy.load(r.snapshot(), exclude={"n3"})
    assert sorted(copy.snapshot()["routes"]) == [["n1", "t", "a/b", 1, 0], ["n2", "t", "a/b", 2, 1]]
    # a dead node's durable routes are kept (one per durable subscription), the rest dropped
    assert r.drop_node("n2", keep_durable=True) is True
    assert sorted(r.snapshot()["routes"]) == [["n1", "t", "a/b", 1, 0], ["n2", "t", "a/b", 1, 1], ["n3", "t", "a/+", 1, 0]]
    assert r.drop_node("n1", keep_durable=True) is False
    # a dead node's shared groups' members too (they may be stored sessions), until it is dropped for good
    r.set_group("n4", "t", "g", "a/b", 1)
    assert r.drop_node("n4", keep_durable=True) is True
    assert r.match("t", "a/b")[1] == [("g", "a/b", {"n3": 2, "n4": 1})]
    r.drop_node("n4")
    assert r.match("t", "a/b")[1] == [("g", "a/b", {"n3": 2})]
    r.set_route("n2", "t", "a/b", 0, 0)
    r.drop_node("n3")
    assert r.match("t", "a/b") == ({}, []) and r.nodes() == set() and r.snapshot() == {"routes": [], "groups": []}


def test_a_group_with_no_member_online_keeps_its_members_for_nodes_of_the_version_before():
    """A node whose members of a group are all offline counts them negative; its event and the snapshot
    carry their number as it was ("m", "groups": a node of the version before read a negative number as
    none, and sent the group's messages to no node) and say apart that none is online."""
    from brokerd.cluster.announce import event_members, group_event

    e = group_event("n1", "t", "g", "a/#", -2)
    assert e["m"] == 2 and event_members(e) == -2
    assert event_members(group_event("n1", "t", "g", "a/#", 3)) == 3
    r = ClusterRoutes("me")
    r.set_group("n1", "t", "g", "a/#", -2)
    r.set_group("n2", "t", "g", "a/#", 1)
    snap = r.snapshot()
    assert sorted(snap["groups"]) == [["n1", "t", "g", "a/#", 2], ["n2", "t", "g", "a/#", 1]]
    copy = ClusterRoutes("me")
    copy.load(snap, exclude=set())
    assert copy.match("t", "a/b")[1] == [("g", "a/#", {"n1": -2, "n2": 1})]
