"""A deny rule with ``{client_id}`` fails closed (issue 16), end to end: rules
provisioned through the Django layer, enforced by a running brokerd, and
``manage.py acl check`` (the console's checker) saying the same.

A client id holding ``/``, ``+`` or ``#`` cannot be written into a filter
level. Such a deny rule used to be skipped for that client, so the tenant's
default (or a later allow) let it publish exactly what the rule denies."""

import pytest

from ..mqtt import V5, V311, PahoClient
from .test_enforcement import wait_until

RULES = [
    {"topic": "cmd/{client_id}/#", "action": "publish", "allow": False},
    {"topic": "{client_id}/secret", "action": "subscribe", "allow": False},
]


@pytest.fixture
def acme(control_plane):
    secrets = control_plane.provision([{"slug": "acme", "default_acl": "allow", "acl": RULES,
                                        "devices": ["dev1", "watcher"]}])
    node = control_plane.broker()
    yield control_plane, node, secrets
    node.stop()


def _puback_code(c: PahoClient, topic: str) -> int:
    got = {}
    c.client.on_publish = lambda client, userdata, mid, rc, props: got.setdefault(mid, rc.value)
    mid = c.client.publish(topic, b"reboot", qos=1).mid
    wait_until(lambda: mid in got, what="PUBACK")
    return got[mid]


@pytest.mark.parametrize("client_id", ["x/y", "x+y", "x#"])
def test_a_deny_rule_with_an_unusable_client_id_still_denies(acme, client_id):
    cp, node, secrets = acme
    port = node.port()
    with PahoClient("watcher", V5, username="acme/watcher", password=secrets["acme/watcher"]).connect(port) as w, \
            PahoClient(client_id, V5, username="acme/dev1", password=secrets["acme/dev1"]).connect(port) as d, \
            PahoClient(client_id + "-v3", V311, username="acme/dev1",
                       password=secrets["acme/dev1"]).connect(port) as d3:
        w.subscribe("#", 1)
        # what the rule means for it, and -- widened from that level -- every cmd/ topic
        assert _puback_code(d, "cmd/x/y/reboot") == 0x87
        assert _puback_code(d, "cmd/other/reboot") == 0x87
        d3.publish("cmd/anything", b"v3", qos=1)          # 3.1.1: acknowledged, dropped
        w.expect_none(0.5)
        # the default (allow) still holds outside what the rule covers
        assert _puback_code(d, "tele/1") == 0
        assert w.expect().topic == "tele/1"
        # subscribe: "{client_id}/secret" in the first level -> every filter is denied it
        assert [c.value for c in d.subscribe("anything/#", 1)] == [0x87]
    cmd, sub, tele = cp.manage_each(("acl", "check", "acme", "dev1", client_id, "publish", "cmd/other/reboot"),
                                    ("acl", "check", "acme", "dev1", client_id, "subscribe", "anything/#"),
                                    ("acl", "check", "acme", "dev1", client_id, "publish", "tele/1"))
    assert cmd.startswith("denied by rule")
    assert sub.startswith("denied by rule")
    assert tele.startswith("allowed by the tenant's default")


def test_a_client_id_that_fits_gets_the_rule_as_written(acme):
    cp, node, secrets = acme
    with PahoClient("ok", V5, username="acme/dev1", password=secrets["acme/dev1"]).connect(node.port()) as d:
        assert _puback_code(d, "cmd/ok/reboot") == 0x87
        assert _puback_code(d, "cmd/other/reboot") == 0x10          # allowed (no subscriber)
        assert [c.value for c in d.subscribe("ok/secret", 1)] == [0x87]
        assert [c.value for c in d.subscribe("anything/#", 1)] == [1]


@pytest.mark.parametrize("client_id", ["+", "#", "a/b", "$SYS", "x" * 30000])
def test_an_allow_rule_with_a_hostile_client_id_never_widens(control_plane, client_id):
    """A default-deny tenant whose devices may use ``{client_id}/#`` (and ``in/{client_id}``): a
    client id that is a wildcard, holds a level separator, names the system tree or is 30,000
    characters long gets nothing it could not get anyway -- no ``#``, no other client's subtree --
    and a well-behaved client beside it keeps its rights."""
    secrets = control_plane.provision([{"slug": "acme", "default_acl": "deny", "devices": ["dev1", "canary"],
                                        "acl": [{"topic": "{client_id}/#", "action": "both", "allow": True},
                                                {"topic": "in/{client_id}", "action": "both", "allow": True}]}])
    node = control_plane.broker()
    try:
        port = node.port()
        with PahoClient("canary", V5, username="acme/canary", password=secrets["acme/canary"]).connect(port) as c, \
                PahoClient(client_id, V5, username="acme/dev1", password=secrets["acme/dev1"]).connect(port) as d:
            assert [x.value for x in c.subscribe("canary/#", 1)] == [1]
            assert [x.value for x in c.subscribe("in/canary", 1)] == [1]
            # a filter wider than its rights is granted only where a rule of its own applies (a
            # wildcard that meets one is checked message by message), never onto another's topics
            for filt in ("canary/#", "in/canary", "a/#"):
                assert [x.value for x in d.subscribe(filt, 1)] == [0x87], filt
            for filt in ("#", "+/#", "in/+"):
                d.subscribe(filt, 1)
            for topic in ("canary/cmd", "in/canary", "a/b/c", "x" * 100 + "/t"):
                assert _puback_code(d, topic) == 0x87, topic
            c.publish("canary/cmd", b"mine", qos=1)
            c.publish("in/canary", b"for me", qos=1)
            assert sorted(m.payload for m in c.expect_n(2)) == [b"for me", b"mine"]
            c.expect_none(0.3)
            d.expect_none(0.5)
    finally:
        node.stop()
