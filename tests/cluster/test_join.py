"""A node joining a cluster that already routes 10,000 subscriptions loads
the route snapshot from the store, replays the event log after it, and routes
every topic at once -- to the right node, exactly once. (The snapshot is
taken every BROKERD_COMPACT_INTERVAL seconds: 2 here, 30 by default.)"""

import os
import random
import re
import time

import paho.mqtt.client as mqtt

from ..mqtt import V5, PahoClient
from .conftest import Cluster, settle, wait_until

FILTERS = 10_000


def subscribe_many(client: PahoClient, filters: list[str], batch: int = 500) -> None:
    for i in range(0, len(filters), batch):
        chunk = filters[i:i + batch]
        result, mid = client.client.subscribe([(f, mqtt.SubscribeOptions(qos=1)) for f in chunk])
        assert result == mqtt.MQTT_ERR_SUCCESS
        codes = client._wait(client.subacks, mid, 20)
        assert len(codes) == len(chunk) and all(c.value < 0x80 for c in codes)


def test_new_node_routes_10000_existing_subscriptions(redis_server, tmp_path, tag):
    env = dict(os.environ, BROKERD_COMPACT_INTERVAL="2")
    c = Cluster(redis_server, tmp_path, env=env)
    try:
        n1, n2 = c.start(2)
        many = PahoClient(f"{tag}-many", version=V5).connect(n1.port())
        filters = [f"{tag}/f/{i}" for i in range(FILTERS - 200)] + [f"{tag}/w/{i}/+" for i in range(200)]
        subscribe_many(many, filters)
        few = PahoClient(f"{tag}-few", version=V5).connect(n2.port())
        few.subscribe(f"{tag}/f/#", qos=1)
        # a snapshot holding them is written ...
        wait_until(lambda: any(int(m) >= FILTERS for m in re.findall(r"route snapshot written \((\d+) routes",
                                                                   n1.log + n2.log)),
                   timeout=15, message="no route snapshot with every subscription")
        # ... and more change after it: only the event log has these
        later = [f"{tag}/late/{i}" for i in range(50)]
        subscribe_many(many, later)
        many.unsubscribe(f"{tag}/f/0")
        time.sleep(0.3)
        n3 = c.node()
        m = re.search(r"route snapshot loaded \((\d+) routes", n3.log)
        assert m and int(m.group(1)) >= FILTERS, n3.log
        pub = PahoClient(f"{tag}-pub", version=V5).connect(n3.port())
        settle(pub, f"{tag}/late/49", many)
        rng = random.Random(7)
        picked = rng.sample(range(1, FILTERS - 200), 300)
        topics = ([f"{tag}/f/{i}" for i in picked] + [f"{tag}/w/{i}/x" for i in rng.sample(range(200), 50)]
                  + later)
        for t in topics:
            pub.publish(t, t.encode(), qos=1)
        pub.publish(f"{tag}/f/0", b"unsubscribed", qos=1)
        got = [msg.payload.decode() for msg in many.expect_n(len(topics), timeout=20)]
        assert sorted(got) == sorted(topics)                       # each exactly once, in the right place
        many.expect_none(0.5)                                      # and not f/0, unsubscribed after the snapshot
        few_got = [msg.payload.decode() for msg in few.expect_n(len(picked) + 1, timeout=20)]
        assert sorted(few_got) == sorted([f"{tag}/f/{i}" for i in picked] + ["unsubscribed"])
    finally:
        c.stop_all()


def test_a_compaction_interval_under_a_second_and_a_quarter_still_writes_snapshots(redis_server, tmp_path, tag):
    """The lease lasts 0.8 of the interval in whole seconds: with an interval of 1 s that was 0, which
    Redis refuses ("invalid expire time"), so no snapshot was ever written and the log never trimmed."""
    c = Cluster(redis_server, tmp_path, env=dict(os.environ, BROKERD_COMPACT_INTERVAL="1"))
    try:
        (n1,) = c.start(1)
        sub = PahoClient(f"{tag}-sub", version=V5).connect(n1.port())
        sub.subscribe(f"{tag}/a", qos=1)
        wait_until(lambda: "route snapshot written" in n1.log, timeout=15, message="no route snapshot written")
        assert "route snapshot failed" not in n1.log
    finally:
        c.stop_all()
