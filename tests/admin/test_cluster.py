"""Asked on any node, the admin API answers for the whole cluster (three
real nodes on a real Redis, one console database)."""

import time

import pytest

from ..cluster.conftest import Cluster, RedisServer, settle, wait_until
from ..integration.raw import RawClient
from ..mqtt import V5, PahoClient
from .conftest import CONSOLE_TOKEN, Http


@pytest.fixture(scope="module")
def three(plane, tokens, tmp_path_factory):
    redis = RedisServer(tmp_path_factory.mktemp("redis")).start()
    c = Cluster(redis, tmp_path_factory.mktemp("cluster"), flags=("--admin", "127.0.0.1:0"),
                env={**plane.env, "BROKERD_ADMIN_TOKEN": CONSOLE_TOKEN})
    try:
        nodes = c.start(3)
        yield c, nodes
    finally:
        c.stop_all()
        redis.stop()


def test_any_node_answers_for_every_node(three, tokens):
    c, nodes = three
    for node in nodes:
        status, _, body = Http(node.admin_url)("GET", "/api/v1/nodes", token=tokens["read"])
        assert status == 200
        assert [n["id"] for n in body["items"]] == ["n1", "n2", "n3"]
        assert {n["health"] for n in body["items"]} == {"ok"}
        # each node's MQTT listeners as clients reach them (the console's "Connect this device" panel)
        assert [n["mqtt"] for n in body["items"]] == [[f"mqtt://127.0.0.1:{n.port('mqtt')}"] for n in nodes]


def test_clients_of_all_nodes_listed_detailed_and_kicked_from_one(three, tokens):
    c, (n1, n2, n3) = three
    stem = f"cl-{time.monotonic_ns()}"
    devs = [PahoClient(f"{stem}-{i}", version=V5).connect(node.port()) for i, node in enumerate((n1, n2, n3))]
    try:
        devs[2].subscribe("x/#", qos=1)
        api = Http(n1.admin_url)
        page = api("GET", f"/api/v1/clients?client_id={stem}", token=tokens["read"])[2]
        assert [(x["client_id"], x["node"]) for x in page["items"]] == [
            (f"{stem}-0", "n1"), (f"{stem}-1", "n2"), (f"{stem}-2", "n3")]
        assert api("GET", f"/api/v1/clients?client_id={stem}&node=n2", token=tokens["read"])[2]["total"] == 1
        # one client's session, held by n3, asked of n1
        detail = api("GET", f"/api/v1/clients/default/{stem}-2", token=tokens["read"])[2]
        assert (detail["node"], [s["filter"] for s in detail["subscriptions"]]) == ("n3", ["x/#"])
        # kicked through n1: the client on n2 goes
        status, _, _ = api("DELETE", f"/api/v1/clients/default/{stem}-1", token=tokens["write"])
        assert status == 200
        reason, _ = devs[1].expect_disconnect()
        assert reason.value == 0x98
        assert devs[0].client.is_connected() and devs[2].client.is_connected()
    finally:
        for d in devs:
            d.drop()


def test_a_page_of_clients_counts_and_lists_more_than_a_page_of_another_nodes(three, tokens):
    """1,010 clients on n2 and 3 on n1, listed through n1 a thousand at a time: the total is
    1,013 and the two pages hold each client once, in order (n1 asked n2 for its clients a
    whole list at a time, which n2 cut at its page size, 1,000: the 10 after were in no page
    and the total said 1,003)."""
    c, (n1, n2, n3) = three
    stem = f"many-{time.monotonic_ns()}"
    raws = []
    try:
        for i in range(1010):
            raw = RawClient(n2.port())
            raws.append(raw)
            raw.connect(f"{stem}-b{i:04d}")
        for i in range(3):
            raw = RawClient(n1.port())
            raws.append(raw)
            raw.connect(f"{stem}-a{i}")
        api = Http(n1.admin_url)
        first = api("GET", f"/api/v1/clients?client_id={stem}&per_page=1000", token=tokens["read"])[2]
        second = api("GET", f"/api/v1/clients?client_id={stem}&per_page=1000&page=2", token=tokens["read"])[2]
        assert (first["total"], first["pages"], len(first["items"]), len(second["items"])) == (1013, 2, 1000, 13)
        listed = [x["client_id"] for x in first["items"] + second["items"]]
        assert listed == sorted([f"{stem}-a{i}" for i in range(3)] + [f"{stem}-b{i:04d}" for i in range(1010)])
        # a small page deep in the list, and one node's clients alone
        deep = api("GET", f"/api/v1/clients?client_id={stem}&per_page=7&page=145", token=tokens["read"])[2]
        assert [x["client_id"] for x in deep["items"]] == listed[1008:1013]
        only = api("GET", f"/api/v1/clients?client_id={stem}&node=n2&per_page=5&page=202", token=tokens["read"])[2]
        assert (only["total"], [x["client_id"] for x in only["items"]]) == (1010, listed[1008:1013])
    finally:
        for raw in raws:
            raw.close()


def test_subscription_added_on_another_node_and_publish_through_any(three, tokens):
    c, (n1, n2, n3) = three
    stem = f"sub-{time.monotonic_ns()}"
    dev = PahoClient(stem).connect(n3.port())
    other = PahoClient(stem + "-other").connect(n2.port())
    try:
        status, _, _ = Http(n1.admin_url)("POST", f"/api/v1/clients/default/{stem}/subscriptions",
                                          token=tokens["write"], body={"filter": f"{stem}/#", "qos": 1})
        assert status == 201
        other.subscribe(f"{stem}/#", qos=1)
        pub = PahoClient(stem + "-pub").connect(n1.port())
        settle(pub, f"{stem}/probe", dev, other)
        pub.disconnect()
        status, _, _ = Http(n2.admin_url)("POST", "/api/v1/publish", token=tokens["write"],
                                          body={"tenant": "default", "topic": f"{stem}/cmd", "payload": "go",
                                                "qos": 1})
        assert status == 200
        assert dev.expect().payload == b"go"
        assert other.expect().payload == b"go"
    finally:
        dev.disconnect()
        other.disconnect()


def test_a_console_token_works_on_every_node_and_its_revocation_too(three, plane):
    c, nodes = three
    secret = plane.issue_token("cluster-wide", "read")
    for node in nodes:
        wait_until(lambda node=node: Http(node.admin_url)("GET", "/api/v1/nodes", token=secret)[0] == 200, timeout=10,
                   message="new token not accepted")
    plane.revoke_token("cluster-wide")
    for node in nodes:
        wait_until(lambda node=node: Http(node.admin_url)("GET", "/api/v1/nodes", token=secret)[0] == 401, timeout=10,
                   message="revoked token still accepted")


def test_metrics_from_any_node_sum_the_cluster_and_each_tenant(three, tokens):
    c, (n1, n2, n3) = three
    stem = f"met-{time.monotonic_ns()}"
    sub = PahoClient(stem + "-sub").connect(n2.port())
    pub = PahoClient(stem + "-pub").connect(n1.port())
    try:
        sub.subscribe(f"{stem}/#", qos=1)
        settle(pub, f"{stem}/probe", sub)
        before = Http(n3.admin_url)("GET", "/api/v1/metrics", token=tokens["read"])[2]
        for i in range(25):
            pub.publish(f"{stem}/x", b"%d" % i, qos=1)
        sub.expect_n(25)
        after = Http(n3.admin_url)("GET", "/api/v1/metrics", token=tokens["read"])[2]
        assert [n["node"] for n in after["nodes"]] == ["n1", "n2", "n3"]
        by_node = {n["node"]: n for n in after["nodes"]}
        old = {n["node"]: n for n in before["nodes"]}
        assert by_node["n1"]["messages_in"]["1"] - old["n1"]["messages_in"]["1"] == 25      # read where published
        assert by_node["n2"]["messages_out"]["1"] - old["n2"]["messages_out"]["1"] == 25    # sent where subscribed
        assert after["cluster"]["messages_in"]["1"] == sum(n["messages_in"]["1"] for n in after["nodes"])
        assert after["tenants"]["default"]["connections"] == sum(
            n["tenants"].get("default", {}).get("connections", 0) for n in after["nodes"]) >= 2
        # a node that stops answering is shown as such, the others still add up
        n3.proc.send_signal(19)           # SIGSTOP
        try:
            late = Http(n1.admin_url)("GET", "/api/v1/metrics", token=tokens["read"])[2]
        finally:
            n3.proc.send_signal(18)       # SIGCONT
        assert {n["node"]: n["health"] for n in late["nodes"]} == {"n1": "ok", "n2": "ok", "n3": "unreachable"}
        assert late["cluster"]["messages_in"]["1"] >= by_node["n1"]["messages_in"]["1"]
    finally:
        sub.disconnect()
        pub.disconnect()


def test_a_kick_through_another_node_is_audited_under_the_console_user(three, plane):
    """The console asks n1 to kick a client whose session is on n2: n2 does it and writes
    the audit row, naming the console user (X-On-Behalf-Of passed on with the request; it
    was lost on the way) and the console's token."""
    from core.brokerd_client import BrokerdClient

    c, (n1, n2, n3) = three
    stem = f"aud-{time.monotonic_ns()}"
    dev = PahoClient(stem, version=V5).connect(n2.port())
    api = BrokerdClient(base_url=n1.admin_url, token=CONSOLE_TOKEN, actor="console:erin")
    assert api.kick("default", stem)["kicked"] is True
    dev.expect_disconnect()
    rows: list = []
    wait_until(lambda: rows.extend(plane.query("SELECT actor FROM console_auditevent WHERE object_id = ?",
                                               (stem,))) or rows, timeout=5, message="no audit row")
    assert rows == [("erin",)]


def test_a_publish_refused_for_its_expiry_is_retained_on_no_node(three, tokens):
    """message_expiry 2**32 once gave 500 after the message was retained on the node asked
    (and on no other): now 400 before anything is done, on every node."""
    c, nodes = three
    topic = f"exp-{time.monotonic_ns()}"
    status, _, answer = Http(nodes[0].admin_url)("POST", "/api/v1/publish", token=tokens["write"], body={
        "tenant": "default", "topic": topic, "payload": "p", "retain": True, "message_expiry": 2 ** 32})
    assert status == 400 and "message_expiry" in answer["error"]
    for node in nodes:
        assert Http(node.admin_url)("GET", f"/api/v1/retained?tenant=default&topic={topic}",
                                    token=tokens["read"])[0] == 404


def test_a_retained_message_deleted_through_another_node_is_gone_everywhere_and_sends_nothing(three, tokens):
    """The console says of deleting a retained message: "new subscribers no longer receive
    it. Current subscribers are not affected." But the delete was a publish of an empty
    retained message: every current subscriber, on every node, was sent a zero-byte message
    on the topic (a device reading its configuration from it got an empty one). Now the
    message is taken out of every node's retained messages and nothing is sent."""
    c, (n1, n2, n3) = three
    stem = f"rdel-{time.monotonic_ns()}"
    topic = f"{stem}/config"
    subs = [PahoClient(f"{stem}-s{i}", version=V5).connect(node.port()) for i, node in enumerate((n1, n2))]
    pub = PahoClient(f"{stem}-pub").connect(n2.port())
    try:
        for s in subs:
            s.subscribe(f"{stem}/#", qos=1)
        settle(pub, f"{stem}/probe", *subs)
        pub.publish(topic, b'{"mode": "eco"}', qos=1, retain=True)
        for s in subs:
            assert s.expect().payload == b'{"mode": "eco"}'
        for node in (n1, n3):            # the copy of every node
            wait_until(lambda node=node: Http(node.admin_url)(
                "GET", f"/api/v1/retained?tenant=default&topic={topic}", token=tokens["read"])[0] == 200,
                timeout=5, message="retained message not copied to every node")
        status, _, body = Http(n1.admin_url)("DELETE", f"/api/v1/retained?tenant=default&topic={topic}",
                                             token=tokens["write"])
        assert (status, body) == (200, {"deleted": topic})
        for node in (n1, n2, n3):
            wait_until(lambda node=node: Http(node.admin_url)(
                "GET", f"/api/v1/retained?tenant=default&topic={topic}", token=tokens["read"])[0] == 404,
                timeout=5, message="deleted retained message still on a node")
        for s in subs:
            s.expect_none(0.5)
        late = PahoClient(f"{stem}-late").connect(n3.port())
        late.subscribe(f"{stem}/#", qos=1)
        late.expect_none(0.5)
        late.disconnect()
    finally:
        for s in subs:
            s.disconnect()
        pub.disconnect()
