"""A tenant's rules on a cluster (issue 19): a rule runs on the node that
received the message, its republished message reaches subscribers on the
other nodes, and the admin API of any node sums the rule's counters."""

import json
import urllib.request

import pytest

from ..controlplane import ControlPlane
from ..mqtt import V5, PahoClient
from .conftest import Cluster, wait_until


@pytest.fixture
def plane(tmp_path):
    (tmp_path / "console").mkdir()
    return ControlPlane(tmp_path / "console")


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
        watch = PahoClient(f"{tag}-w", V5, username="acme/watch", password=secrets["acme/watch"]).connect(n2.port())
        clients.append(watch)
        watch.subscribe(f"{tag}-alerts/#", qos=1)
        dev = PahoClient(f"{tag}-d", V5, username="acme/d1", password=secrets["acme/d1"]).connect(n1.port())
        clients.append(dev)
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
