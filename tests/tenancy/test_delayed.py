"""Delayed publish with tenants (issue 19): the publisher's ACL is checked on the
target topic, the message stays in the publisher's tenant, the tenant's quota
``max_delayed`` caps its pending messages (0x97; raised with ``manage.py
tenants quota``, it reaches the node), and the admin API counts them."""

import json
import queue
import time
import urllib.request

from ..mqtt import V5, PahoClient

RULES = [{"topic": "{device}/#", "action": "both", "allow": True}]


def client(secrets, who):
    c = PahoClient(f"{who.replace('/', '-')}-{time.monotonic_ns()}", V5, username=who, password=secrets[who])
    c.acks = queue.Queue()
    c.client.on_publish = lambda cl, u, mid, rc, p: c.acks.put((mid, rc.value))
    return c


def puback(c, topic, payload=b"x", retain=False):
    """Publish at QoS 1; -> the PUBACK's reason code."""
    mid = c.client.publish(topic, payload, qos=1, retain=retain).mid
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            got, code = c.acks.get(timeout=0.1)
        except queue.Empty:
            continue
        if got == mid:
            return code
    raise AssertionError(f"no PUBACK for {topic}")


def delayed_api(node, token, tenant):
    req = urllib.request.Request(f"{node.admin_url}/api/v1/tenants/{tenant}/delayed",
                                 headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def test_acl_on_the_target_topic_the_tenants_namespace_and_its_quota(control_plane, tmp_path):
    secrets = control_plane.provision([
        {"slug": "acme", "acl": RULES, "devices": ["dev1", "dev2"], "quota": {"max_delayed": 2}},
        {"slug": "globex", "acl": RULES, "devices": ["dev1"]},
    ])
    token = control_plane.issue_token("delayed", "read")
    node = control_plane.broker("--store", f"sqlite:///{tmp_path}/s.db", "--admin", "127.0.0.1:0")
    try:
        with client(secrets, "acme/dev1").connect(node.port()) as dev1, \
                client(secrets, "globex/dev1").connect(node.port()) as other:
            dev1.subscribe("dev1/#", qos=1)
            other.subscribe("dev1/#", qos=1)             # the same topic names, in another tenant
            # the ACL applies to the target: dev1 may not publish under dev2/
            assert puback(dev1, "$delayed/1/dev2/x") == 0x87
            assert puback(dev1, "$delayed/1/dev1/x", b"mine") == 0
            msg = dev1.expect(timeout=15)
            assert (msg.topic, msg.payload) == ("dev1/x", b"mine")
            other.expect_none(1.0)                           # never into another tenant
            # the cap: 2 pending at once
            assert [puback(dev1, f"$delayed/600/dev1/{i}") for i in range(3)] == [0, 0, 0x97]
            view = delayed_api(node, token, "acme")
            assert (view["pending"], view["limit"]) == (2, 2)
            assert delayed_api(node, token, "globex")["pending"] == 0
            # a larger quota reaches the node
            control_plane.manage("tenants", "quota", "acme", "--max-delayed", "3")
            deadline = time.monotonic() + 10
            while puback(dev1, "$delayed/600/dev1/3") == 0x97:
                assert time.monotonic() < deadline, "the new quota did not reach the node"
                time.sleep(0.2)
            assert puback(dev1, "$delayed/600/dev1/4") == 0x97
            assert delayed_api(node, token, "acme")["pending"] == 3
    finally:
        node.stop()


def test_a_deleted_tenants_delayed_messages_never_reach_a_new_tenant_of_its_name(control_plane, tmp_path):
    """A tenant deleted with delayed messages waiting: they are not published -- not into
    its gone namespace (a retained one would be kept, in the store too), and not to a
    tenant created afterwards under the same slug, whose devices are not its devices."""
    secrets = control_plane.provision([{"slug": "acme", "acl": RULES, "devices": ["dev1"]}])
    node = control_plane.broker("--store", f"sqlite:///{tmp_path}/s.db")
    try:
        old = client(secrets, "acme/dev1").connect(node.port())
        sent = time.monotonic()
        assert puback(old, "$delayed/2/dev1/secret", b"old tenant, retained", retain=True) == 0
        assert puback(old, "$delayed/12/dev1/later", b"old tenant, later") == 0
        control_plane.manage("tenants", "delete", "acme")
        old.expect_disconnect(timeout=10)
        old.client.loop_stop()
        out = control_plane.manage_each(("tenants", "create", "acme"), ("devices", "create", "acme", "dev1"),
                                        ("acl", "add", "acme", "--allow", "--action", "both", "--topic",
                                         "{device}/#"))
        secrets = {"acme/dev1": out[1].strip().splitlines()[-1]}
        deadline = time.monotonic() + 10
        new = client(secrets, "acme/dev1")
        while True:
            try:
                new.connect(node.port())
            except ConnectionError:
                pass
            else:
                if [c.value for c in new.subscribe("dev1/#", qos=1)] == [1]:
                    break
                new.disconnect()
            assert time.monotonic() < deadline, "the new tenant (its device, its ACL) did not reach the node"
            time.sleep(0.2)
            new = client(secrets, "acme/dev1")
        with new:
            new.expect_none(max(1.0, sent + 15 - time.monotonic()))
    finally:
        node.stop()
