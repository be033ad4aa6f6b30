"""What the admin API shows and does about clients, sessions, subscriptions,
messages and retained messages -- checked against real MQTT clients."""

import base64
import time

import paho.mqtt.client as mqtt
import pytest

from ..mqtt import V5, V311, PahoClient, props


@pytest.fixture
def api(http, tokens):
    def call(method, path, body=None, token="write"):
        return http(method, path, token=tokens[token], body=body)
    return call


def test_client_list_search_and_paging(node, api, client_id):
    clients = [PahoClient(f"{client_id}-{i}").connect(node.port()) for i in range(5)]
    try:
        status, _, page = api("GET", f"/api/v1/clients?client_id={client_id}&per_page=2&page=1")
        assert status == 200
        assert (page["total"], page["pages"], page["page"], page["per_page"]) == (5, 3, 1, 2)
        assert [c["client_id"] for c in page["items"]] == [f"{client_id}-0", f"{client_id}-1"]
        last = api("GET", f"/api/v1/clients?client_id={client_id}&per_page=2&page=3")[2]
        assert [c["client_id"] for c in last["items"]] == [f"{client_id}-4"]
        assert api("GET", f"/api/v1/clients?client_id={client_id}&ip=127.0.0.1")[2]["total"] == 5
        assert api("GET", f"/api/v1/clients?client_id={client_id}&ip=10.9.9.9")[2]["total"] == 0
        assert api("GET", f"/api/v1/clients?client_id={client_id}&tenant=default")[2]["total"] == 5
        assert api("GET", f"/api/v1/clients?client_id={client_id}&tenant=acme")[2]["total"] == 0
        assert api("GET", f"/api/v1/clients?client_id={client_id}&node=n1")[2]["total"] == 5
        assert api("GET", f"/api/v1/clients?client_id={client_id}&node=n9")[2]["total"] == 0
        one = page["items"][0]
        assert (one["tenant"], one["node"], one["ip"], one["protocol"], one["connected"]) == (
            "default", "n1", "127.0.0.1", "3.1.1", True)
    finally:
        for c in clients:
            c.disconnect()


def test_devices_of_a_tenant_by_username(node, api, secrets, client_id):
    devs = [PahoClient(f"{client_id}-{i}", username=f"acme/d{i}", password=secrets[f"acme/d{i}"]).connect(
        node.port()) for i in range(3)]
    try:
        page = api("GET", "/api/v1/clients?tenant=acme&username=acme/d1")[2]
        assert [(c["client_id"], c["device"], c["tenant"]) for c in page["items"]] == [
            (f"{client_id}-1", "d1", "acme")]
        assert api("GET", "/api/v1/clients?tenant=acme")[2]["total"] == 3
        detail = api("GET", f"/api/v1/clients/acme/{client_id}-2", token="read")[2]
        assert (detail["username"], detail["device"]) == ("acme/d2", "d2")
        # the same client id in another tenant is another client
        assert api("GET", f"/api/v1/clients/default/{client_id}-2")[0] == 404
    finally:
        for c in devs:
            c.disconnect()


def test_bad_paging_is_a_clear_400(api):
    status, _, body = api("GET", "/api/v1/clients?page=two")
    assert status == 400 and "page" in body["error"]


def test_session_detail_of_a_live_v5_client(node, api, client_id):
    c = PahoClient(client_id, version=V5).connect(
        node.port(), keepalive=42, properties=props(mqtt.PacketTypes.CONNECT, SessionExpiryInterval=300))
    try:
        c.subscribe("sensors/+/temp", qos=1)
        c.subscribe("cmd/#", qos=2)
        before = time.time()
        status, _, s = api("GET", f"/api/v1/clients/default/{client_id}", token="read")
        assert status == 200
        assert (s["protocol"], s["keepalive"], s["session_expiry"], s["connected"]) == ("5.0", 42, 300, True)
        assert s["connected_at"] <= before
        assert {(x["filter"], x["qos"]) for x in s["subscriptions"]} == {("sensors/+/temp", 1), ("cmd/#", 2)}
        assert (s["queued"], s["inflight"], s["persistent"]) == (0, 0, True)
    finally:
        c.disconnect()


def test_offline_session_shows_its_queue(node, api, client_id):
    sub = PahoClient(client_id, clean=False).connect(node.port())
    sub.subscribe("q/#", qos=1)
    sub.disconnect()
    pub = PahoClient(client_id + "-pub").connect(node.port())
    for i in range(7):
        pub.publish("q/x", b"%d" % i, qos=1)
    pub.disconnect()
    status, _, s = api("GET", f"/api/v1/clients/default/{client_id}")
    assert status == 200
    assert (s["connected"], s["queued"]) == (False, 7)
    listed = api("GET", f"/api/v1/clients?client_id={client_id}&connected=false")[2]["items"]
    assert [c["client_id"] for c in listed] == [client_id]
    # the queue is what the device gets when it comes back
    back = PahoClient(client_id, clean=False).connect(node.port())
    assert [m.payload for m in back.expect_n(7)] == [b"%d" % i for i in range(7)]
    back.disconnect()


def test_unknown_client_is_404(api):
    assert api("GET", "/api/v1/clients/default/no-such-client")[0] == 404
    assert api("DELETE", "/api/v1/clients/default/no-such-client")[0] == 404
    assert api("GET", "/api/v1/clients/no-such-tenant/x")[0] == 404


def test_kick_a_v5_client_says_administrative_action(node, api, client_id):
    c = PahoClient(client_id, version=V5).connect(node.port())
    status, _, body = api("DELETE", f"/api/v1/clients/default/{client_id}")
    assert (status, body) == (200, {"kicked": True, "session_cleared": False})
    reason, _ = c.expect_disconnect()
    assert reason.value == 0x98
    assert api("GET", f"/api/v1/clients/default/{client_id}")[0] == 404     # clean session: gone


def test_kick_keeps_or_clears_a_persistent_session(node, api, client_id):
    c = PahoClient(client_id, clean=False).connect(node.port())
    c.subscribe("keep/#", qos=1)
    api("DELETE", f"/api/v1/clients/default/{client_id}")
    c.expect_disconnect()
    s = api("GET", f"/api/v1/clients/default/{client_id}")[2]
    assert (s["connected"], [x["filter"] for x in s["subscriptions"]]) == (False, ["keep/#"])
    again = PahoClient(client_id, clean=False).connect(node.port())
    assert again.session_present
    status, _, body = api("DELETE", f"/api/v1/clients/default/{client_id}?clear_session=1")
    assert body["session_cleared"] is True
    again.expect_disconnect()
    assert api("GET", f"/api/v1/clients/default/{client_id}")[0] == 404
    third = PahoClient(client_id, clean=False).connect(node.port())
    assert not third.session_present
    third.disconnect()


def test_add_and_remove_a_subscription_for_a_client(node, api, client_id):
    c = PahoClient(client_id).connect(node.port())
    pub = PahoClient(client_id + "-pub").connect(node.port())
    try:
        status, _, body = api("POST", f"/api/v1/clients/default/{client_id}/subscriptions",
                              {"filter": "added/#", "qos": 1})
        assert (status, body) == (201, {"filter": "added/#", "qos": 1})
        pub.publish("added/1", b"hello", qos=1)
        assert c.expect().payload == b"hello"
        status, _, _ = api("DELETE", f"/api/v1/clients/default/{client_id}/subscriptions?filter=added/%23")
        assert status == 200
        pub.publish("added/1", b"after", qos=1)
        c.expect_none()
        assert api("DELETE", f"/api/v1/clients/default/{client_id}/subscriptions?filter=added/%23")[0] == 404
        status, _, body = api("POST", f"/api/v1/clients/default/{client_id}/subscriptions",
                              {"filter": "bad/#/x", "qos": 0})
        assert status == 400 and "refused" in body["error"]
        assert api("POST", f"/api/v1/clients/default/{client_id}/subscriptions", {"qos": 0})[0] == 400
    finally:
        c.disconnect()
        pub.disconnect()


def test_publish_reaches_subscribers_text_and_base64(node, api, client_id):
    c = PahoClient(client_id, version=V5).connect(node.port())
    try:
        c.subscribe("api/#", qos=1)
        status, _, body = api("POST", "/api/v1/publish",
                              {"tenant": "default", "topic": "api/text", "payload": "héllo", "qos": 1,
                               "content_type": "text/plain", "user_properties": {"k": "v"}})
        assert status == 200 and body["deliveries"] == 1
        m = c.expect()
        assert (m.topic, m.payload, m.qos) == ("api/text", "héllo".encode(), 1)
        assert m.properties.ContentType == "text/plain" and ("k", "v") in m.properties.UserProperty
        raw = bytes(range(256))
        api("POST", "/api/v1/publish", {"tenant": "default", "topic": "api/bin",
                                        "payload": base64.b64encode(raw).decode(), "payload_encoding": "base64"})
        assert c.expect().payload == raw
        for bad in ({"tenant": "default", "topic": "api/#", "payload": "x"},
                    {"tenant": "default", "topic": "api/x", "qos": 3},
                    {"topic": "api/x"},
                    {"tenant": "default", "topic": "api/x", "payload": "@@", "payload_encoding": "base64"}):
            status, _, body = api("POST", "/api/v1/publish", bad)
            assert status == 400 and body["error"], bad
        c.expect_none()
    finally:
        c.disconnect()


def test_retained_list_view_delete(node, api, client_id):
    pub = PahoClient(client_id + "-pub").connect(node.port())
    for i in range(3):
        pub.publish(f"ret/{client_id}/{i}", b"value %d" % i, qos=1, retain=True)
    pub.publish(f"other/{client_id}", b"\xff\x00", qos=1, retain=True)
    pub.disconnect()
    status, _, page = api("GET", f"/api/v1/retained?tenant=default&prefix=ret/{client_id}/&per_page=2")
    assert status == 200 and (page["total"], len(page["items"])) == (3, 2)
    assert page["items"][0]["topic"] == f"ret/{client_id}/0" and page["items"][0]["size"] == 7
    one = api("GET", f"/api/v1/retained?tenant=default&topic=ret/{client_id}/1")[2]
    assert (one["payload"], one["payload_encoding"]) == ("value 1", "utf8")
    binary = api("GET", f"/api/v1/retained?tenant=default&topic=other/{client_id}")[2]
    assert (binary["payload"], binary["payload_encoding"]) == ("/wA=", "base64")
    status, _, _ = api("DELETE", f"/api/v1/retained?tenant=default&topic=ret/{client_id}/1")
    assert status == 200
    assert api("DELETE", f"/api/v1/retained?tenant=default&topic=ret/{client_id}/1")[0] == 404
    late = PahoClient(client_id, version=V311).connect(node.port())
    late.subscribe(f"ret/{client_id}/#", qos=1)
    got = sorted(m.topic for m in late.expect_n(2))
    assert got == [f"ret/{client_id}/0", f"ret/{client_id}/2"]
    late.expect_none()
    late.disconnect()
    assert api("GET", "/api/v1/retained")[0] == 400
