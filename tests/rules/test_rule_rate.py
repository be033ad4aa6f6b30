"""A rule's republish counts against the rate quota of the client whose message (or event) triggered
it, as a message that client published: rules cannot multiply what a tenant's rate lets in. Before,
a device at ``client_msgs_in`` 10/s whose every message five rules republished put 60 messages a
second into the tenant, all at once, and waited for none of them."""

import time

from ..controlplane import ControlPlane
from .nodes import add_each, client, loaded


def test_republishes_are_charged_to_the_triggering_clients_rate_and_nothing_is_lost(tmp_path):
    plane = ControlPlane(tmp_path)
    secrets = plane.provision([{"slug": "acme", "default_acl": "allow", "devices": ["d1", "watch"],
                                "quota": {"client_msgs_in": 10}}])
    token = plane.issue_token("rules-reader", "read")
    node = plane.broker("--admin", "127.0.0.1:0")
    try:
        ids = add_each(plane, "acme", *(("--sql", 'SELECT * FROM "sensors/#"', "--republish", f"copies/{i}")
                                        for i in range(5)))
        for rid in ids:
            loaded(node, token, "acme", rid)
        watch = client(node, secrets, "acme/watch", "watch")
        watch.subscribe("#", qos=1)
        dev = client(node, secrets, "acme/d1", "dev")
        t0 = time.monotonic()
        for i in range(10):
            dev.client.publish("sensors/t", b"%d" % i, qos=1)
        got = watch.expect_n(60, timeout=30)
        elapsed = time.monotonic() - t0
        originals = [m.payload for m in got if m.topic == "sensors/t"]
        assert originals == [b"%d" % i for i in range(10)]
        assert sorted(m.topic for m in got if m.topic != "sensors/t") == sorted([f"copies/{i}" for i in range(5)] * 10)
        # 60 messages of the client's rate of 10/s, 10 of them its bucket's burst: about 5 s (was all at once)
        assert elapsed > 3.0, f"60 messages at 10/s took only {elapsed:.2f} s"
        for c in (dev, watch):
            c.disconnect()
    finally:
        node.stop()
