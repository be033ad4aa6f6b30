"""What the admin API takes: every value checked against MQTT's range for it before
anything is done (400 saying what was wrong), tenants that exist, no '$' topics,
and request bodies that are JSON objects of a sane depth.

Found by an attack run: ``message_expiry: -1`` was answered 200 and poisoned the
node's store until a restart (every persistent QoS 1 message of every tenant got
0x83), ``2**32`` gave 500 after the message was retained on that node only; a
publish into a tenant that does not exist, or into ``$SYS/...`` inside a tenant, was
accepted; deeply nested JSON gave 500.
"""

import json
import time
import urllib.error
import urllib.request

import pytest

from ..mqtt import V5, PacketTypes, PahoClient, props
from ..procs import BrokerProcess
from .conftest import Http

U32 = 4294967295


@pytest.fixture
def api(http, tokens):
    def call(method, path, body=None, token="write"):
        return http(method, path, token=tokens[token], body=body)
    return call


def _raw(node, path: str, data: bytes, token: str) -> tuple[int, dict]:
    req = urllib.request.Request(node.admin_url + path, data=data, method="POST",
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _audit_count(plane) -> int:
    return plane.query("SELECT count(*) FROM console_auditevent")[0][0]


BAD_PUBLISH = [
    ({"message_expiry": -1}, "message_expiry"),
    ({"message_expiry": U32 + 1}, "message_expiry"),
    ({"message_expiry": 1.5}, "message_expiry"),
    ({"message_expiry": "60"}, "message_expiry"),
    ({"message_expiry": True}, "message_expiry"),
    ({"qos": True}, "qos"),
    ({"qos": "1"}, "qos"),
    ({"qos": -1}, "qos"),
    ({"retain": "false"}, "retain"),
    ({"retain": 1}, "retain"),
    ({"payload": 42}, "payload"),
    ({"payload": {"a": 1}}, "payload"),
    ({"payload": "x", "payload_encoding": "hex"}, "payload_encoding"),
    ({"content_type": 7}, "content_type"),
    ({"content_type": "a\u0000b"}, "content_type"),
    ({"user_properties": [["k", "v"]]}, "user_properties"),
    ({"user_properties": {"k": 1}}, "user_properties"),
    ({"user_properties": {"k": "\ud800"}}, "user_properties"),
    ({"mesage_expiry": 10}, "mesage_expiry"),                  # a misspelt field is not ignored
    ({"topic": "$SYS/broker/uptime"}, "$"),
    ({"topic": "$share/g/t"}, "$"),
    ({"payload": "x" * (1024 * 1024)}, "maximum packet size"),  # the node's --max-packet-size: 1 MiB
]


@pytest.mark.parametrize(("change", "named"), BAD_PUBLISH, ids=[f"{c}"[:60] for c, _ in BAD_PUBLISH])
def test_a_publish_with_a_value_out_of_range_is_400_and_does_nothing(plane, node, api, client_id, change, named):
    """Each field out of what MQTT allows for it: 400 naming the field, nothing delivered,
    nothing retained, no audit row."""
    sub = PahoClient(client_id, version=V5).connect(node.port())
    try:
        sub.subscribe(f"v/{client_id}", qos=1)
        sub.subscribe("$SYS/broker/uptime", qos=1)
        audit = _audit_count(plane)
        body = {"tenant": "default", "topic": f"v/{client_id}", "payload": "p", "qos": 1, "retain": True, **change}
        status, _, answer = api("POST", "/api/v1/publish", body)
        assert status == 400, answer
        assert named in answer["error"]
        sub.expect_none(0.3)
        assert api("GET", f"/api/v1/retained?tenant=default&topic=v/{client_id}")[0] == 404
        assert _audit_count(plane) == audit
    finally:
        sub.disconnect()


def test_values_at_the_edges_of_their_range_are_taken(node, api, client_id):
    """message_expiry 0 and 4294967295, every QoS, retain true, user properties, a payload
    just inside the maximum packet size.

    4294967295 is sent several times: delivering it failed about one time in three (the
    remaining interval, ``ceil(expiry_at - now)``, came out as 2**32 in floating point and
    the encoder raised, dropping the connection)."""
    cases = [(0, 0), (U32 - 1, 1), (None, 2)] + [(U32, 1)] * 6
    sub = PahoClient(client_id, version=V5).connect(node.port())
    try:
        sub.subscribe(f"edge/{client_id}/#", qos=2)
        for i, (expiry, qos) in enumerate(cases):
            body = {"tenant": "default", "topic": f"edge/{client_id}/{i}", "payload": "p", "qos": qos,
                    "retain": True, "user_properties": {"k": "v"}, "content_type": "text/plain",
                    **({"message_expiry": expiry} if expiry is not None else {})}
            status, _, answer = api("POST", "/api/v1/publish", body)
            assert status == 200, answer
            assert answer["deliveries"] == 1, answer
            assert sub.expect().topic == f"edge/{client_id}/{i}"
        status, _, _ = api("POST", "/api/v1/publish", {"tenant": "default", "topic": f"edge/{client_id}/big",
                                                        "payload": "x" * (1024 * 1024 - 200)})
        assert status == 200
        assert len(sub.expect().payload) == 1024 * 1024 - 200
    finally:
        sub.disconnect()
        for i in range(len(cases)):
            api("DELETE", f"/api/v1/retained?tenant=default&topic=edge/{client_id}/{i}")


BAD_SUBSCRIPTION = [
    ({"retain_handling": 3}, "retain_handling"),
    ({"retain_handling": -1}, "retain_handling"),
    ({"retain_handling": "1"}, "retain_handling"),
    ({"qos": True}, "qos"),
    ({"qos": 3}, "qos"),
    ({"no_local": "yes"}, "no_local"),
    ({"retain_as_published": 1}, "retain_as_published"),
    ({"filter": ""}, "filter"),
    ({"filter": 5}, "filter"),
    ({"subscription_identifier": 7}, "subscription_identifier"),
]


def test_a_subscription_with_a_value_out_of_range_is_400_and_adds_nothing(node, api, client_id):
    c = PahoClient(client_id, version=V5).connect(node.port())
    path = f"/api/v1/clients/default/{client_id}/subscriptions"
    try:
        for change, named in BAD_SUBSCRIPTION:
            status, _, answer = api("POST", path, {"filter": "s/#", "qos": 1, **change})
            assert status == 400 and named in answer["error"], (change, answer)
        assert api("GET", f"/api/v1/clients/default/{client_id}")[2]["subscriptions"] == []
        status, _, answer = api("POST", path, {"filter": "s/#", "qos": 1, "no_local": True,
                                               "retain_as_published": True, "retain_handling": 2})
        assert status == 201, answer
    finally:
        c.disconnect()


def test_a_switch_in_the_query_that_is_neither_true_nor_false_is_400_and_does_nothing(node, api, client_id):
    """``DELETE /api/v1/clients/...?clear_session=on`` (or ``=True``, ``=2``: anything but 1,
    true, yes) kicked the client, kept its session and answered 200: the administrator had
    asked for the session to go. And ``connected=yes`` listed every client. Now a value that
    is not a yes or a no (1/true/yes, 0/false/no, any case) is 400 naming the parameter, and
    nothing is done."""
    c = PahoClient(client_id, clean=False).connect(node.port())
    c.subscribe("keep/#", qos=1)
    try:
        for value in ("on", "2", "maybe"):
            status, _, answer = api("DELETE", f"/api/v1/clients/default/{client_id}?clear_session={value}")
            assert status == 400 and "clear_session" in answer["error"], (value, answer)
            c.expect_none(0.1)
            assert c.disconnects.empty() and c.client.is_connected()
        status, _, answer = api("GET", f"/api/v1/clients?client_id={client_id}&connected=yes-please")
        assert status == 400 and "connected" in answer["error"], answer
        status, _, answer = api("GET", "/api/v1/retained?tenant=default&sys=all")
        assert status == 400 and "sys" in answer["error"], answer
        assert api("GET", f"/api/v1/clients?client_id={client_id}&connected=FALSE")[2]["total"] == 0
        assert api("GET", f"/api/v1/clients?client_id={client_id}&connected=True")[2]["total"] == 1
        status, _, answer = api("DELETE", f"/api/v1/clients/default/{client_id}?clear_session=True")
        assert (status, answer) == (200, {"kicked": True, "session_cleared": True})
        c.expect_disconnect()
        assert api("GET", f"/api/v1/clients/default/{client_id}")[0] == 404
    finally:
        c.disconnect()


def test_a_publish_to_a_tenant_that_does_not_exist_is_404(node, api, client_id):
    """With a control plane the tenants are its tenants (and the anonymous one, when
    anonymous clients are allowed): "acme" exists, "ghost" does not."""
    status, _, answer = api("POST", "/api/v1/publish", {"tenant": "ghost", "topic": "t", "payload": "x"})
    assert status == 404 and "ghost" in answer["error"]
    assert api("GET", "/api/v1/retained?tenant=ghost")[2]["total"] == 0
    status, _, answer = api("POST", "/api/v1/publish", {"tenant": "acme", "topic": f"t/{client_id}",
                                                        "payload": "x"})
    assert status == 200, answer
    assert api("POST", "/api/v1/publish", {"tenant": "default", "topic": "t", "payload": "x"})[0] == 200


def test_without_a_control_plane_the_known_tenants_are_the_anonymous_one_and_those_the_node_holds():
    with BrokerProcess("--admin", "127.0.0.1:0", "--sys-interval", "0",
                       env={"BROKERD_ADMIN_TOKEN": "no-plane-token"}) as b:
        http = Http(b.admin_url)
        ok = http("POST", "/api/v1/publish", token="no-plane-token",
                  body={"tenant": "default", "topic": "t", "payload": "x", "retain": True})
        assert ok[0] == 200
        status, _, answer = http("POST", "/api/v1/publish", token="no-plane-token",
                                 body={"tenant": "ghost", "topic": "t", "payload": "x", "retain": True})
        assert status == 404 and "ghost" in answer["error"]


def test_dollar_topics_cannot_be_published_or_cleared(node, api, client_id):
    """$SYS inside a tenant is the broker's to publish."""
    sub = PahoClient(client_id, version=V5).connect(node.port())
    try:
        sub.subscribe("$SYS/#", qos=1)
        status, _, answer = api("POST", "/api/v1/publish", {"tenant": "default", "topic": "$SYS/broker/version",
                                                            "payload": "evil", "retain": True})
        assert status == 400 and "$" in answer["error"]
        status, _, answer = api("DELETE", "/api/v1/retained?tenant=default&topic=%24SYS%2Fbroker%2Fversion")
        assert status == 400 and "$" in answer["error"]
        sub.expect_none(0.3)
    finally:
        sub.disconnect()


@pytest.mark.parametrize(("data", "named"), [
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'{"a":' * 100_000 + b"1" + b"}" * 100_000, "nested too deeply"),
    (b'{"tenant": "default", "topic": "t", "payload": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", "nested too deeply"),
    (b'{"tenant": "default", "topic": "t", "payload": "x"', "not valid JSON"),
    (b'["tenant", "default"]', "JSON object"),
    (b'{"tenant": "\xff\xfe"}', "not valid JSON"),
    (b'{"tenant": "default", "topic": "t", "message_expiry": NaN}', "message_expiry"),
], ids=["array", "object", "inside-a-field", "cut", "not-an-object", "not-utf8", "nan"])
def test_bodies_that_are_not_sane_json_objects_are_400(node, tokens, data, named):
    status, answer = _raw(node, "/api/v1/publish", data, tokens["write"])
    assert status == 400 and named in answer["error"], answer
    status, answer = _raw(node, "/api/v1/clients/default/nobody/subscriptions", data, tokens["write"])
    assert status in (400, 404), answer


def test_a_bad_expiry_cannot_poison_the_store(tmp_path, client_id):
    """The attack: an admin publish with message_expiry -1 (retained) on a node with a SQLite
    store. It is refused (400) before anything is done, and the store keeps taking writes: a
    persistent session's QoS 1 messages are acknowledged with Success (they got 0x83, for as
    long as the node ran, when the store writer kept retrying the poisoned write)."""
    token = "poison-test-token"
    with BrokerProcess("--admin", "127.0.0.1:0", "--sys-interval", "0", "--store", f"sqlite:///{tmp_path}/s.db",
                       env={"BROKERD_ADMIN_TOKEN": token}) as b:
        http = Http(b.admin_url)
        owed = PahoClient(client_id, version=V5, clean=False)
        owed.connect(b.port(), properties=props(PacketTypes.CONNECT, SessionExpiryInterval=3600))
        owed.subscribe("plant/#", qos=1)
        owed.disconnect()
        for expiry in (-1, U32 + 1):
            status, _, answer = http("POST", "/api/v1/publish", token=token,
                                     body={"tenant": "default", "topic": "plant/x", "payload": "p", "retain": True,
                                           "message_expiry": expiry})
            assert status == 400 and "message_expiry" in answer["error"]
        from ..integration.helpers import Client

        pub = Client(f"{client_id}-pub", V5).connect(b.port())
        try:
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline:
                code, _ = pub.publish_result(pub.publish("plant/y", b"m", qos=1, wait=False))
                assert code.value == 0, f"PUBACK {code}: the store refuses writes"
                time.sleep(0.2)
        finally:
            pub.disconnect()
        store = http("GET", "/api/v1/metrics?local=1", token=token)[2]["nodes"][0]["store"]
        assert (store["backend"], store["healthy"], store["writes_dropped"]) == ("sqlite", True, 0)
