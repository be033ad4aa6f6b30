"""Auto-subscribe end to end (issue 19): rules added with ``manage.py autosub``
in a real console database, loaded by a real brokerd from its policy snapshot,
observed with paho-mqtt clients (3.1.1 and 5) that never send a SUBSCRIBE."""

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from ..controlplane import ControlPlane
from ..mqtt import V5, V311, PahoClient
from .nodes import client, wait_for

pytestmark = pytest.mark.slow

ACL = [
    {"topic": "cmd/#", "action": "both", "allow": True},
    {"topic": "secret/#", "action": "publish", "allow": True},     # nobody may subscribe to secret/#
]


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    plane = ControlPlane(tmp_path_factory.mktemp("autosub"))
    secrets = plane.provision([{"slug": "acme", "acl": ACL, "devices": ["d1", "d2", "ops"]}])
    node = plane.broker()
    yield plane, node, secrets
    node.stop()


def add(plane, *args) -> int:
    return int(plane.manage("autosub", "add", "acme", *args).stdout.strip())


def gets(node, secrets, who, cid, topic, payload=b"probe", version=V5) -> bool:
    """Does a fresh connection of ``who`` receive what ``ops`` publishes to ``topic``?"""
    dev = client(node, secrets, who, cid, version=version)
    ops = client(node, secrets, "acme/ops", f"ops-{cid}")
    try:
        ops.publish(topic, payload, qos=1)
        try:
            msg = dev.expect(timeout=0.5)
        except AssertionError:
            return False
        return msg.topic == topic and msg.payload == payload
    finally:
        dev.disconnect()
        ops.disconnect()


def test_a_device_gets_its_auto_subscribed_filter_without_subscribing(scene):
    plane, node, secrets = scene
    aid = add(plane, "--filter", "cmd/{device}/#", "--qos", "1", "--device", "d*")
    # the change reaches the node with the snapshot it polls every 0.5 s (bounded wait)
    wait_for(lambda: gets(node, secrets, "acme/d1", "d1-wait", "cmd/d1/ping"), timeout=10,
             what="the auto-subscription on the node")
    ops = client(node, secrets, "acme/ops", "ops-main")
    ops.publish("cmd/d1/config", b"retained-config", qos=1, retain=True)
    for version in (V311, V5):
        d1 = client(node, secrets, "acme/d1", f"d1-{version}", version=version)
        d2 = client(node, secrets, "acme/d2", f"d2-{version}", version=version)
        retained = d1.expect()                        # retained messages per retain handling (0: on connect)
        assert (retained.topic, retained.payload, retained.retain) == ("cmd/d1/config", b"retained-config", True)
        ops.publish("cmd/d1/reboot", b"now", qos=1)
        ops.publish("cmd/d2/reboot", b"later", qos=1)
        got = d1.expect()
        assert (got.topic, got.payload, got.qos) == ("cmd/d1/reboot", b"now", 1)
        d1.expect_none(0.3)                           # {device} is d1: not d2's commands
        got = d2.expect()                             # d2: its own command only
        assert (got.topic, got.payload, got.retain) == ("cmd/d2/reboot", b"later", False)
        d2.expect_none(0.3)
        d1.disconnect()
        d2.disconnect()
    # ops does not match the device glob "d*": it was not subscribed
    assert not gets(node, secrets, "acme/ops", "ops-probe", "cmd/ops/ping")
    ops.publish("cmd/d1/config", b"", qos=1, retain=True)
    ops.disconnect()
    plane.manage("autosub", "delete", "acme", str(aid))
    wait_for(lambda: not gets(node, secrets, "acme/d1", "d1-gone", "cmd/d1/ping"), timeout=10,
             what="the deleted auto-subscription gone from the node")


def test_a_filter_the_acl_denies_is_not_granted(scene):
    plane, node, secrets = scene
    denied = add(plane, "--filter", "secret/{device}")
    allowed = add(plane, "--filter", "cmd/{client_id}/in")
    wait_for(lambda: gets(node, secrets, "acme/d2", "acl-probe", "cmd/acl-probe/in"), timeout=10,
             what="the auto-subscriptions on the node")
    for version in (V311, V5):
        d2 = client(node, secrets, "acme/d2", f"acl-{version}", version=version)
        ops = client(node, secrets, "acme/ops", f"ops-acl-{version}")
        ops.publish("secret/d2", b"never", qos=1)
        ops.publish(f"cmd/acl-{version}/in", b"yes", qos=1)
        got = d2.expect()
        assert (got.topic, got.payload) == (f"cmd/acl-{version}/in", b"yes")
        d2.expect_none(0.3)
        d2.disconnect()
        ops.disconnect()
    for aid in (denied, allowed):
        plane.manage("autosub", "delete", "acme", str(aid))


def test_a_persistent_session_keeps_its_auto_subscription_while_offline(scene):
    plane, node, secrets = scene
    aid = add(plane, "--filter", "cmd/{device}/queued", "--qos", "1", "--device", "d1")
    wait_for(lambda: gets(node, secrets, "acme/d1", "d1-qprobe", "cmd/d1/queued"), timeout=10,
             what="the auto-subscription on the node")
    for version in (V311, V5):
        props = None
        if version == V5:
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = 300
        d1 = PahoClient(f"d1-keep-{version}", version, clean=False, username="acme/d1", password=secrets["acme/d1"])
        d1.connect(node.port(), properties=props)
        d1.disconnect()
        ops = client(node, secrets, "acme/ops", f"ops-keep-{version}")
        ops.publish("cmd/d1/queued", b"while-away", qos=1)
        ops.disconnect()
        d1 = PahoClient(f"d1-keep-{version}", version, clean=False, username="acme/d1", password=secrets["acme/d1"])
        d1.connect(node.port(), properties=props)
        got = d1.expect()
        assert (got.topic, got.payload, got.qos) == ("cmd/d1/queued", b"while-away", 1)
        d1.expect_none(0.3)                            # subscribed again on connect: still one subscription
        d1.disconnect()
    plane.manage("autosub", "delete", "acme", str(aid))
