"""A tenant's queue quota (``max_queued``) holds for its persistent sessions restored
from the store (a restart, a session moved to another node) as it does for the
sessions opened on this node: the offline queue keeps that many, the newest."""

import time

from ..mqtt import V311, PahoClient

RULES = [{"topic": "t/#", "action": "both", "allow": True}]


def test_a_restored_offline_session_keeps_its_tenants_queue_quota(control_plane, tmp_path):
    secrets = control_plane.provision([
        {"slug": "acme", "acl": RULES, "devices": ["dev", "pub"], "quota": {"max_queued": 3}},
    ])
    store = f"sqlite:///{tmp_path}/s.db"

    def client(who, **kw):
        return PahoClient(f"{who.replace('/', '-')}-quota", V311, username=who, password=secrets[who], **kw)

    node = control_plane.broker("--store", store)
    try:
        dev = client("acme/dev", clean=False).connect(node.port())
        dev.subscribe("t/q", qos=1)
        dev.disconnect()
        time.sleep(0.3)                     # the disconnect is written behind
    finally:
        node.kill()
    node = control_plane.broker("--store", store)
    try:
        with client("acme/pub").connect(node.port()) as pub:
            for i in range(6):
                pub.publish("t/q", b"%d" % i, qos=1)
        dev = client("acme/dev", clean=False).connect(node.port())
        got = [m.payload for m in dev.expect_n(3)]
        dev.expect_none(0.5)
        assert got == [b"3", b"4", b"5"]
        dev.disconnect()
    finally:
        node.stop()
