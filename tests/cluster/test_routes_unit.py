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
