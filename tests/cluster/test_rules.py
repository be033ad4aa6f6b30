"""A tenant's rules on a cluster (issue 19): a rule runs on the node that
received the message, its republished message reaches subscribers on the
other nodes, and the admin API of any node sums the rule's counters."""

import json
import time
import urllib.request

import pytest

from ..controlplane import ControlPlane
from ..mqtt import V5, PahoClient
from .conftest import Cluster, wait_until


@pytest.fixture
def plane(tmp_path):
    (tmp_path / "console").mkdir()
    return ControlPlane(tmp_path / "console")


def device(secrets, who: str, client_id: str, node, clients: list) -> PahoClient:
    """``who``'s device connected to ``node`` as ``client_id`` (MQTT 5), kept in ``clients`` to close."""
    c = PahoClient(client_id, V5, username=who, password=secrets[who]).connect(node.port())
    clients.append(c)
    return c


def rules_api(node, token):
    req = urllib.request.Request(f"{node.admin_url}/api/v1/tenants/acme/rules",
                                 headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())["items"]


def test_a_rule_runs_where_the_message_arrived_and_its_output_reaches_every_node(redis_server, tmp_path, plane,
                                                                                 tag):
    secrets = plane.provision([{"slug": "acme", "default_acl": "allow", "devices": ["d1", "watch"]}])
    rid = int(plane.manage("rules", "add", "acme", "--sql",
                           f'SELECT payload.temp AS t FROM "{tag}/+/temp" WHERE t > 30',
                           "--republish", f"{tag}-alerts/${{clientid}}").stdout)
    token = plane.issue_token("cluster-rules", "read")
    c = Cluster(redis_server, tmp_path, env=plane.env)
    clients = []
    try:
        n1, n2 = c.start(2, "--admin", "127.0.0.1:0")
        watch = device(secrets, "acme/watch", f"{tag}-w", n2, clients)
        watch.subscribe(f"{tag}-alerts/#", qos=1)
        dev = device(secrets, "acme/d1", f"{tag}-d", n1, clients)
        sent = 0

        def arrived():                  # until n1 knows n2's subscription: one hot reading at a time
            nonlocal sent
            dev.publish(f"{tag}/room/temp", json.dumps({"temp": 40 + sent}).encode(), qos=1)
            sent += 1
            try:
                return watch.expect(timeout=0.5)
            except AssertionError:
                return None
        msg = wait_until(arrived, timeout=10, interval=0, message="no republished message on the other node")
        assert msg.topic == f"{tag}-alerts/{tag}-d" and json.loads(msg.payload)["t"] >= 40
        dev.publish(f"{tag}/room/temp", b'{"temp": 3}', qos=1)
        watch.expect_none(0.5)
        [row] = rules_api(n2, token)                     # asked on the node that received nothing
        assert row["id"] == rid
        assert (row["matched"], row["no_result"]) == (sent + 1, 1)
        assert row["nodes"]["n1"]["matched"] == sent + 1 and row["nodes"]["n2"]["matched"] == 0
    finally:
        for cl in clients:
            cl.disconnect()
        c.stop_all()


def test_a_qos2_publish_whose_delivery_raised_a_rule_event_still_waits_for_the_other_nodes_store(
        redis_server, tmp_path, plane, tag):
    """A QoS 2 PUBLISH on a node with a store is acknowledged (PUBREC) only once every node holding a
    stored session it goes to has stored it. One of its deliveries here dropped (a subscriber whose
    Maximum Packet Size it is above) runs the tenant's ``$events/delivery_dropped`` rule in the middle
    of the dispatch; the rule's republish must not make the publisher's PUBREC forget the other node.
    With that node stopped, the publisher is told its message was not stored (0x80 and up), not 0x00."""
    import os
    import signal

    from ..integration.raw import PUBLISH, PUBREC, RawClient
    from ..procs import sigstop
    from ..rules.nodes import loaded

    secrets = plane.provision([{"slug": "acme", "default_acl": "allow", "devices": ["d1", "tiny", "far"]}])
    rid = int(plane.manage("rules", "add", "acme", "--sql", 'SELECT topic FROM "$events/delivery_dropped"',
                           "--republish", f"{tag}-alerts/dropped").stdout)
    token = plane.issue_token("cluster-rules-waits", "read")
    c = Cluster(redis_server, tmp_path, env=plane.env)
    stopped = None
    try:
        n1, n2 = c.start(2, "--admin", "127.0.0.1:0")
        loaded(n1, token, "acme", rid)
        topic = f"{tag}/x"

        def login(port, who, cid, props=None):
            cl = RawClient(port)
            ack = cl.connect(cid, version=5, clean=False, props=props, username=f"acme/{who}",
                             password=secrets[f"acme/{who}"])
            assert ack.code == 0, ack
            return cl

        far = login(n2.port(), "far", f"{tag}-far", {0x11: 300})
        far.subscribe(topic, qos=1)
        tiny = login(n1.port(), "tiny", f"{tag}-tiny", {0x27: 64})       # Maximum Packet Size 64
        tiny.subscribe(topic, qos=0)
        pub = login(n1.port(), "d1", f"{tag}-pub")
        pid = 0

        def far_has_it():                 # until n1 knows far's route on n2
            nonlocal pid
            pid += 1
            pub.publish(topic, b"probe", qos=1, pid=pid)
            pub.expect(4)
            try:
                p = far.expect(PUBLISH, timeout=0.5)
            except Exception:
                return False
            far.ack(4, p.pid)
            return True
        wait_until(far_has_it, timeout=10, interval=0, message="n1 never forwarded to n2")

        sigstop(n2.proc.pid)
        stopped = n2
        pub.publish(topic, b"x" * 200, qos=2, pid=pid + 1)        # above tiny's 64 bytes: dropped for it
        ack = pub.expect(PUBREC, timeout=15)
        assert ack.code >= 0x80, (f"PUBREC {ack.code:#x}: acknowledged as stored while the node of a stored "
                                  "session it goes to is stopped")
        assert rule_view_matched(n1, token, rid) >= 1
    finally:
        if stopped is not None:
            os.kill(stopped.proc.pid, signal.SIGCONT)
        c.stop_all()


def rule_view_matched(node, token, rid) -> int:
    return next(r["matched"] for r in rules_api(node, token) if r["id"] == rid)


def test_a_delivery_dropped_alert_does_not_bounce_between_two_nodes_full_queues(redis_server, tmp_path, plane, tag):
    """A ``$events/delivery_dropped`` rule republishing into the topics of full queues on two nodes: its
    alert, forwarded to the other node (still a rule's message there), pushes a client's message out of
    the queue there. That drop raised the event on that node, whose alert pushed one out here, and so on
    from node to node until every queue held alerts only. One message into the two full queues raises
    one event per queue it was dropped from; what the alerts push out raises none."""
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    from ..rules.nodes import loaded

    secrets = plane.provision([{"slug": "acme", "default_acl": "allow", "devices": ["d1", "watch"]}])
    token = plane.issue_token("cluster-rules-bounce", "read")
    topic = f"{tag}/q"
    rid = int(plane.manage("rules", "add", "acme", "--sql",
                           'SELECT clientid, topic FROM "$events/delivery_dropped"',
                           "--republish", f"{topic}/alert/${{clientid}}", "--qos", "1").stdout)
    c = Cluster(redis_server, tmp_path, env=plane.env)
    clients = []
    try:
        n1, n2 = c.start(2, "--admin", "127.0.0.1:0", "--max-queued", "3")
        loaded(n1, token, "acme", rid)
        loaded(n2, token, "acme", rid)
        expiry = Properties(PacketTypes.CONNECT)
        expiry.SessionExpiryInterval = 300
        watch = device(secrets, "acme/watch", f"{tag}-w", n1, clients)
        watch.subscribe(f"{topic}/alert/#", qos=1)
        dev = device(secrets, "acme/d1", f"{tag}-d", n1, clients)
        n = 0

        def seen():                       # until n1 knows watch's... and n2's routes: a probe reaches n2
            nonlocal n
            n += 1
            dev.publish(f"{tag}/probe/{n}", b"p", qos=1)
            try:
                return probe.expect(timeout=0.5)
            except AssertionError:
                return None
        probe = PahoClient(f"{tag}-p", V5, username="acme/watch", password=secrets["acme/watch"]).connect(n2.port())
        clients.append(probe)
        probe.subscribe(f"{tag}/probe/#", qos=1)
        away = []
        for i, node in enumerate((n1, n2)):
            a = PahoClient(f"{tag}-away{i}", V5, clean=False, username="acme/d1", password=secrets["acme/d1"])
            a.connect(node.port(), properties=expiry)
            a.subscribe(f"{topic}/#", qos=1)
            a.disconnect()
            away.append(a)
        wait_until(seen, timeout=10, interval=0, message="n2's routes never reached n1")
        time.sleep(0.5)                   # (and n2's route of its offline session)
        for i in range(3):
            dev.publish(f"{topic}/m/{i}", b"x", qos=1)
        time.sleep(0.5)
        watch.expect_none(0.3)            # full, nothing dropped yet
        dev.publish(f"{topic}/m/3", b"x", qos=1)           # pushes m/0 out of both queues
        got = sorted((json.loads(m.payload)["clientid"], json.loads(m.payload)["topic"])
                     for m in watch.expect_n(2))
        # (on n2, n1's alert may come before m/3 -- forwarded after n1's own deliveries -- and push m/0 out:
        # m/3 then pushes out m/1)
        assert got[0] == (f"{tag}-away0", f"{topic}/m/0")
        assert got[1] in [(f"{tag}-away1", f"{topic}/m/0"), (f"{tag}-away1", f"{topic}/m/1")]
        watch.expect_none(1.5)
        [row] = rules_api(n1, token)
        assert row["matched"] == 2, row
    finally:
        for cl in clients:
            cl.disconnect()
        c.stop_all()
