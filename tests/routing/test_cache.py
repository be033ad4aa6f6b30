"""Topic-keyed caches bounded by bytes (brokerd.routing.cache), and the caches
built on them: a namespace's route cache and a client's ACL verdicts (issue 16)."""

import gc

from brokerd.broker import Broker
from brokerd.routing.cache import MAX_CACHED_TOPIC, STR_COST, CacheBudget, TopicCache, topic_cost
from brokerd.routing.router import ROUTE_CACHE_BYTES
from brokerd.tenancy.acl import ACL_CACHE_BYTES, ClientAcl


def test_topic_cost_counts_characters_at_their_width():
    assert topic_cost("abc") == STR_COST + 3
    assert topic_cost("ab\u00e9") == STR_COST + 12          # not ASCII: up to 4 bytes a character


def test_long_topics_are_not_cached():
    cache = TopicCache(1 << 20)
    cache.put("a" * MAX_CACHED_TOPIC, 1, 0)
    cache.put("a" * (MAX_CACHED_TOPIC + 1), 2, 0)
    assert list(cache.values()) == [1]


def test_the_cache_clears_when_its_bytes_would_pass_the_limit():
    cache = TopicCache(1000)
    for i in range(100):
        cache.put(f"t/{i:04d}", i, 100)
        assert cache.held <= 1000
        assert cache.held == sum(topic_cost(t) + 100 for t in cache)
    assert 0 < len(cache) <= 1000 // (STR_COST + 6 + 100)
    cache.put("big" * 100, 0, 5000)                          # larger than the whole cache: not kept
    assert "big" * 100 not in cache
    cache.clear()
    assert cache.held == 0 and not cache


def test_a_shared_budget_bounds_every_cache_together_and_gets_its_bytes_back():
    budget = CacheBudget(10_000)
    caches = [TopicCache(4000, budget) for _ in range(5)]
    for c in caches:
        for i in range(50):
            c.put(f"topic/{i}", True, 50)
    assert budget.used <= 10_000 and budget.skipped > 0
    assert budget.used == sum(c.held for c in caches)
    caches[0].clear()
    assert budget.used == sum(c.held for c in caches)
    del caches[1]
    gc.collect()
    assert budget.used == sum(c.held for c in caches)       # a freed cache gives its bytes back
    caches[2].put("one/more", True, 50)
    assert "one/more" in caches[2]


def test_the_route_cache_of_a_namespace_is_bounded_by_bytes():
    broker = Broker()
    ns = broker.namespace("t")
    topic = "x" * 400
    n = ROUTE_CACHE_BYTES // (topic_cost(topic) + 200) + 1000         # past the bound
    for i in range(n):
        ns.route(f"{i:08d}/{topic}")
    assert ns.cache.held <= ROUTE_CACHE_BYTES
    assert len(ns.cache) < n
    assert broker.route_budget.used == ns.cache.held
    ns.route("y" * 10_000)
    assert "y" * 10_000 not in ns.cache                               # routed, not kept
    ns.cache.clear()                       # as a subscription change does: the bytes go back
    assert broker.route_budget.used == 0


def test_acl_verdict_caches_are_bounded_by_bytes():
    acl = ClientAcl([{"topic": "secret/#", "allow": False}], True, "d", "c")
    for i in range(20_000):
        assert acl.can_publish(f"t/{i:06d}/{'p' * 100}")
        assert acl.can_read(f"t/{i:06d}/{'r' * 100}")
    assert acl._pub.held <= ACL_CACHE_BYTES and acl._read.held <= ACL_CACHE_BYTES
    long_topic = "secret/" + "x" * 60_000
    assert not acl.can_publish(long_topic) and not acl.can_read(long_topic)
    assert long_topic not in acl._pub and long_topic not in acl._read


def test_the_usage_log_counts_long_topics_under_other_past_its_bytes(tmp_path):
    """The usage log's per-minute rows are keyed by topic too: past MAX_TOPIC_BYTES of a tenant's
    topics in a minute (or MAX_NODE_TOPIC_BYTES for all) the rest are counted under "(other)"."""
    from brokerd.metrics import usage

    log = usage.UsageLog(str(tmp_path), "n1", 0.0)
    long_topic = "t/" + "x" * 60_000
    n = usage.MAX_TOPIC_BYTES // (topic_cost(long_topic) + usage.ROW_COST)
    for i in range(n + 50):
        log.published("acme", f"{i:05d}/{long_topic}", 0, 10)
    rows = log.traffic["acme"]
    assert len(rows) == n + 1 and rows[usage.OTHER][0] == 50
    assert log.topic_bytes["acme"] <= usage.MAX_TOPIC_BYTES
    log.published("globex", "short", 1, 10)                  # another tenant has its own bytes
    assert "short" in log.traffic["globex"]
    log._take(0)
    log.published("acme", long_topic, 0, 10)                 # a new minute, a new allowance
    assert long_topic in log.traffic["acme"]


def test_the_cluster_route_table_cache_is_bounded_by_bytes():
    """On a clustered node every publish also matches the cluster's route
    table: its cache was bounded by 100,000 entries, i.e. up to 6.4 GB of
    64 KiB topics; now like the node's own route cache."""
    from brokerd.cluster.routes import ROUTE_CACHE_BYTES as CLUSTER_BYTES
    from brokerd.cluster.routes import ClusterRoutes

    routes = ClusterRoutes("n1")
    routes.set_route("n2", "t", "#", 1, 0)
    topic = "x" * 400
    n = CLUSTER_BYTES // (topic_cost(topic) + 264) + 1000
    for i in range(n):
        assert routes.match("t", f"{i:08d}/{topic}")[0] == {"n2": False}
    cache = routes.caches["t"]
    assert cache.held <= CLUSTER_BYTES and len(cache) < n
    assert routes.match("t", "y" * 60_000)[0] == {"n2": False}
    assert "y" * 60_000 not in cache                                  # matched, not kept
    routes.set_route("n3", "t", "a/#", 1, 0)                          # a route change clears it
    assert routes.cache_budget.used == 0
