"""A will is a PUBLISH the client asks the broker to make for it later: the
tenant's ACL decides it like any other PUBLISH -- at CONNECT (a will on a topic
the client may not publish to is refused, CONNACK 0x87 / 3.1.1: 5, as
Mosquitto does) and again when it is published, with the rights of then (an
ACL changed in the console while the client was connected)."""

import time

import pytest

from ..mqtt import V5, V311, PahoClient
from .test_enforcement import connack_code, wait_until

RULES = [{"topic": "{device}/#", "action": "both", "allow": True}]


def client(secrets, who, version=V5):
    return PahoClient(f"{who.replace('/', '-')}-{time.monotonic_ns()}", version, username=who,
                      password=secrets[who])


@pytest.fixture
def acme(control_plane):
    secrets = control_plane.provision([{"slug": "acme", "acl": RULES, "devices": ["dev1", "dev2"]}])
    node = control_plane.broker()
    yield control_plane, node, secrets
    node.stop()


@pytest.mark.parametrize("version,code", [(V5, 0x87), (V311, 5)])
def test_a_will_on_a_topic_the_acl_denies_is_refused_at_connect(acme, version, code):
    cp, node, secrets = acme
    port = node.port()
    with client(secrets, "acme/dev2").connect(port) as dev2:
        dev2.subscribe("dev2/#", 1)
        intruder = client(secrets, "acme/dev1", version)
        intruder.client.will_set("dev2/cmd", b"open the valve", qos=1)
        assert connack_code(intruder, port) == code
        # and a will it may publish is taken
        ok = client(secrets, "acme/dev1", version)
        ok.client.will_set("dev1/status", b"gone", qos=1)
        assert connack_code(ok, port) == 0
        # (had the first been taken, its will would have gone to dev2 when it closed)
        dropped = client(secrets, "acme/dev1", version)
        try:
            dropped.connect(port, will=("dev2/cmd", b"open the valve", 1))
        except ConnectionError:
            pass
        else:
            dropped.drop()
        dev2.expect_none(1.0)


def test_a_will_is_checked_again_when_it_is_published(acme):
    cp, node, secrets = acme
    port = node.port()
    with client(secrets, "acme/dev1").connect(port) as watcher:
        watcher.subscribe("dev1/#", 1)
        dev1 = client(secrets, "acme/dev1").connect(port, will=("dev1/status", b"gone", 1))
        cp.manage("acl", "add", "acme", "--deny", "--action", "publish", "--topic", "dev1/status",
                  "--position", "1")
        # the node has the new rule once dev1 may no longer publish there itself
        got = {}
        dev1.client.on_publish = lambda c, u, mid, rc, p: got.setdefault(mid, rc.value)

        def refused():
            mid = dev1.client.publish("dev1/status", b"probe", qos=1).mid
            wait_until(lambda: mid in got, what="PUBACK")
            return got[mid] == 0x87

        wait_until(refused, timeout=10, what="the new rule")
        while not watcher.messages.empty():              # the probes sent before the rule arrived
            watcher.messages.get()
        dev1.drop()                                      # no DISCONNECT: the will is due
        watcher.expect_none(1.5)
