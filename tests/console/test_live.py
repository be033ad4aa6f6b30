"""The live pages (clients, sessions, kick, subscriptions, retained messages,
test publishes) against a real brokerd node and real MQTT clients.

As in ``tests/admin``: brokerd runs with ``--admin 127.0.0.1:0`` and a
console database of its own as its control plane (``tests.controlplane``:
tenants "acme" and "globex" with their devices, made through the Django
layer), its admin token given as ``BROKERD_ADMIN_TOKEN``. The console under
test (Django's test client, the test database with alice and bob) is pointed
at that node through ``settings.BROKERD_ADMIN_URL``/``BROKERD_ADMIN_TOKEN``.
"""

import re

import paho.mqtt.client as mqtt
import pytest
from django.urls import reverse

from console import live_views
from core.brokerd_client import BrokerdClient

from ..controlplane import ControlPlane
from ..integration import raw
from ..integration.helpers import Client, wait_until
from ..mqtt import V5, props
from ..procs import free_port
from .conftest import HTMX

TOKEN = "live-console-token"
ACME_DEVICES = [f"d{i}" for i in range(6)]


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    plane = ControlPlane(tmp_path_factory.mktemp("live"))
    plane.env["BROKERD_ADMIN_TOKEN"] = TOKEN
    return plane


@pytest.fixture(scope="module")
def secrets(plane):
    """{"acme/d0": secret, ..., "globex/plant-1": secret}; both tenants allow everything."""
    return plane.provision([{"slug": "acme", "default_acl": "allow", "devices": ACME_DEVICES},
                            {"slug": "globex", "default_acl": "allow", "devices": ["plant-1"]}])


@pytest.fixture(scope="module")
def node(plane, secrets):
    b = plane.broker("--admin", "127.0.0.1:0", "--node-id", "live1")
    yield b
    b.stop()


@pytest.fixture(autouse=True)
def brokerd_up(brokerd_down, settings, node):
    """The console's admin API settings point at the live node (after the
    suite's default, which points them at a closed port)."""
    settings.BROKERD_ADMIN_URL = node.admin_url
    settings.BROKERD_ADMIN_TOKEN = TOKEN


@pytest.fixture
def device(node, secrets, client_id):
    """connect(device="d0", suffix="", version=4, **connect kwargs) -> a connected
    paho client of acme (client id = the test's id + suffix); all disconnected afterwards."""
    made = []

    def connect(dev="d0", suffix="", tenant="acme", version=mqtt.MQTTv311, **kwargs):
        c = Client(client_id + suffix, version=version, username=f"{tenant}/{dev}",
                   password=secrets[f"{tenant}/{dev}"])
        made.append(c)
        try:
            return c.connect(node.port(), **kwargs)
        except (AssertionError, ConnectionError) as exc:
            raise AssertionError(f"{tenant}/{dev} could not connect ({exc}); brokerd said:\n{node.log[-3000:]}")

    yield connect
    for c in made:
        try:
            c.disconnect()
        except Exception:
            pass


def text(response) -> str:
    return response.content.decode()


def session_of(client, slug, cid):
    """The client detail page's answer (status, body)."""
    r = client.get(f"/tenants/{slug}/clients/{cid}/")
    return r.status_code, text(r)


# ---------------------------------------------------------------- lists and scoping


def test_a_connected_device_is_listed_for_the_platform_and_its_tenant(as_admin, as_alice, device, client_id):
    device("d0")
    everything = text(as_admin.get("/clients/"))
    assert client_id in everything and "acme/d0" in everything
    assert "brokerd's admin API is unreachable" not in everything
    mine = text(as_alice.get("/tenants/acme/clients/"))
    assert client_id in mine and "connected" in mine
    # the row links to the client's page
    assert f'href="/tenants/acme/clients/{client_id}/"' in mine


def test_search_by_client_id(as_admin, as_alice, device, client_id):
    device("d0", "-alpha")
    device("d1", "-beta")
    found = text(as_admin.get("/clients/", {"client_id": f"{client_id}-beta"}))
    assert f"{client_id}-beta" in found and f"{client_id}-alpha" not in found
    found = text(as_alice.get("/tenants/acme/clients/", {"client_id": "alpha"}))
    assert f"{client_id}-alpha" in found and f"{client_id}-beta" not in found
    # htmx: only the table comes back
    frag = text(as_alice.get("/tenants/acme/clients/", {"client_id": "beta"}, **HTMX))
    assert f"{client_id}-beta" in frag and "<html" not in frag
    none = text(as_alice.get("/tenants/acme/clients/", {"client_id": f"{client_id}-gamma"}))
    assert "No client matches" in none


def test_paging_with_several_clients(as_alice, device, client_id, monkeypatch):
    monkeypatch.setattr(live_views, "PER_PAGE", 2)
    for i in range(5):
        device(f"d{i}", f"-{i}")
    ids = [f"{client_id}-{i}" for i in range(5)]

    def listed(page):
        body = text(as_alice.get("/tenants/acme/clients/", {"client_id": client_id, "page": page}))
        return [cid for cid in ids if f">{cid}<" in body], body

    first, body = listed(1)
    assert first == ids[:2]
    assert "Page 1 of 3" in body and "5 in all" in body
    # the pager keeps the search
    assert re.search(r'href="\?client_id=[^"]*&amp;page=2"', body) or "page=2" in body
    assert f"client_id={client_id}" in body
    assert listed(2)[0] == ids[2:4]
    last, body = listed(3)
    assert last == ids[4:] and "Next" not in body


def test_other_tenants_users_see_nothing_of_it(as_bob, device, client_id, secrets):
    device("d0")
    assert client_id not in text(as_bob.get("/tenants/globex/clients/"))
    assert as_bob.get("/tenants/acme/clients/").status_code == 404
    assert as_bob.get(f"/tenants/acme/clients/{client_id}/").status_code == 404
    assert as_bob.get(f"/tenants/acme/clients/{client_id}/kick/").status_code == 404
    assert as_bob.post(f"/tenants/acme/clients/{client_id}/kick/", {}).status_code == 404
    # the same client id in bob's tenant is another (absent) client
    status, body = session_of(as_bob, "globex", client_id)
    assert status == 404 and "no stored session" in body
    # bob's own device is there for him, and he may only look
    device("plant-1", "-plant", tenant="globex")
    assert f"{client_id}-plant" in text(as_bob.get("/tenants/globex/clients/"))
    status, body = session_of(as_bob, "globex", f"{client_id}-plant")
    assert status == 200 and "Kick" not in body and "Add subscription" not in body
    assert as_bob.post(f"/tenants/globex/clients/{client_id}-plant/kick/", {}).status_code == 403


def test_tenant_users_do_not_see_the_platform_list(as_alice, device):
    device("d0")
    assert as_alice.get("/clients/").status_code == 403


# ---------------------------------------------------------------- the client's page


def test_detail_shows_subscriptions_and_protocol(as_alice, device, client_id):
    c = device("d0", version=V5, properties=props(mqtt.PacketTypes.CONNECT, SessionExpiryInterval=300))
    c.subscribe("sensors/+/temp", qos=1)
    c.subscribe("cmd/#", qos=2)
    status, body = session_of(as_alice, "acme", client_id)
    assert status == 200
    assert "sensors/+/temp" in body and "cmd/#" in body
    assert "MQTT 5.0" in body
    assert "acme/d0" in body and "persistent" in body
    old = device("d1", "-old")
    old.subscribe("x/y", qos=0)
    status, body = session_of(as_alice, "acme", f"{client_id}-old")
    assert status == 200 and "MQTT 3.1.1" in body and "x/y" in body


def test_kick_disconnects_the_client(as_alice, device, client_id):
    c = device("d0", version=V5, properties=props(mqtt.PacketTypes.CONNECT, SessionExpiryInterval=300))
    c.subscribe("keep/#", qos=1)
    r = as_alice.post(f"/tenants/acme/clients/{client_id}/kick/", {})
    assert r.status_code == 302 and r["Location"] == "/tenants/acme/clients/"
    reason, _ = c.expect_disconnect()
    assert reason.value == 0x98           # Administrative action
    follow = text(as_alice.get(r["Location"]))
    assert f"Client {client_id} disconnected." in follow
    # its persistent session stays, offline, with its subscription
    status, body = session_of(as_alice, "acme", client_id)
    assert status == 200 and "offline" in body and "keep/#" in body
    offline = text(as_alice.get("/tenants/acme/clients/", {"client_id": client_id, "connected": "false"}))
    assert f">{client_id}<" in offline
    online = text(as_alice.get("/tenants/acme/clients/", {"client_id": client_id, "connected": "true"}))
    assert f">{client_id}<" not in online


def test_kick_a_311_client(as_admin, device, client_id):
    c = device("d0")
    assert as_admin.post(f"/tenants/acme/clients/{client_id}/kick/", {}).status_code == 302
    c.expect_disconnect()
    assert session_of(as_admin, "acme", client_id)[0] == 404


def test_kick_and_clear_session_removes_the_session(as_alice, device, client_id):
    c = device("d0", version=V5, properties=props(mqtt.PacketTypes.CONNECT, SessionExpiryInterval=300))
    c.subscribe("keep/#", qos=1)
    r = as_alice.post(f"/tenants/acme/clients/{client_id}/kick/", {"clear_session": "on"})
    assert r.status_code == 302
    c.expect_disconnect()
    status, body = session_of(as_alice, "acme", client_id)
    assert status == 404 and "no stored session" in body
    assert client_id not in text(as_alice.get("/tenants/acme/clients/"))
    # reconnecting finds no session
    again = device("d0", version=V5, clean_start=False,
                   properties=props(mqtt.PacketTypes.CONNECT, SessionExpiryInterval=300))
    assert again.session_present is False


def test_kick_of_a_client_that_is_gone(as_alice, client_id):
    r = as_alice.post(f"/tenants/acme/clients/{client_id}/kick/", {})
    assert r.status_code == 200
    assert "No such client" in text(r)


def test_any_client_id_round_trips_through_the_urls(as_alice, device, client_id):
    odd = "/plant 7/~2F?#%ü"
    c = device("d0", odd)
    cid = client_id + odd
    listing = text(as_alice.get("/tenants/acme/clients/", {"client_id": "plant 7"}))
    url = reverse("client_detail", args=["acme", cid])
    assert f'href="{url}"'.replace("&", "&amp;") in listing
    r = as_alice.get(url)
    assert r.status_code == 200 and "MQTT 3.1.1" in text(r)
    assert as_alice.post(reverse("client_subscribe", args=["acme", cid]), {"filter": "odd/#", "qos": "0"}
                         ).status_code == 302
    assert as_alice.post(reverse("client_kick", args=["acme", cid]), {}).status_code == 302
    c.expect_disconnect()


# ---------------------------------------------------------------- subscriptions


def test_add_and_remove_a_subscription_from_the_page(as_alice, device, client_id):
    c = device("d0")
    pub = device("d1", "-pub")
    url = f"/tenants/acme/clients/{client_id}/subscriptions/"
    r = as_alice.post(url, {"filter": "alerts/#", "qos": "1"})
    assert r.status_code == 302 and r["Location"] == f"/tenants/acme/clients/{client_id}/"
    status, body = session_of(as_alice, "acme", client_id)
    assert "alerts/#" in body and f"Subscribed {client_id} to alerts/# (QoS 1)." in body
    pub.publish("alerts/fire", b"hot", qos=1)
    msg = c.expect()
    assert (msg.topic, msg.payload, msg.qos) == ("alerts/fire", b"hot", 1)

    r = as_alice.post(url + "remove/", {"filter": "alerts/#"})
    assert r.status_code == 302
    status, body = session_of(as_alice, "acme", client_id)
    assert "Removed the subscription to alerts/#." in body
    assert "alerts/#</td>" not in body
    pub.publish("alerts/fire", b"again", qos=1)
    c.expect_none(0.5)


def test_subscriptions_with_htmx(as_alice, device, client_id):
    c = device("d0")
    pub = device("d1", "-pub")
    url = f"/tenants/acme/clients/{client_id}/subscriptions/"
    frag = text(as_alice.post(url, {"filter": "news/+", "qos": "0"}, **HTMX))
    assert 'id="session"' in frag and "news/+" in frag and "<html" not in frag
    pub.publish("news/today", b"x")
    assert c.expect().topic == "news/today"
    frag = text(as_alice.post(url + "remove/", {"filter": "news/+"}, **HTMX))
    assert 'id="session"' in frag and "No subscriptions" in frag
    pub.publish("news/today", b"y")
    c.expect_none(0.5)


def test_remove_a_shared_subscription(as_alice, device, client_id):
    c = device("d0", version=V5)
    pub = device("d1", "-pub")
    c.subscribe(f"$share/workers/jobs/{client_id}/#", qos=1)
    status, body = session_of(as_alice, "acme", client_id)
    assert "shared: workers" in body
    pub.publish(f"jobs/{client_id}/1", b"a", qos=1)
    assert c.expect().payload == b"a"
    r = as_alice.post(f"/tenants/acme/clients/{client_id}/subscriptions/remove/",
                      {"filter": f"$share/workers/jobs/{client_id}/#"})
    assert r.status_code == 302
    assert "No subscriptions" in session_of(as_alice, "acme", client_id)[1]
    pub.publish(f"jobs/{client_id}/2", b"b", qos=1)
    c.expect_none(0.5)


def test_an_invalid_filter_is_an_inline_error(as_alice, device, client_id):
    device("d0")
    r = as_alice.post(f"/tenants/acme/clients/{client_id}/subscriptions/", {"filter": "a/#/b", "qos": "0"})
    assert r.status_code == 200
    body = text(r)
    assert 'class="error"' in body and "refused" in body.lower()
    # what was typed stays in the form
    assert 'value="a/#/b"' in body
    r = as_alice.post(f"/tenants/acme/clients/{client_id}/subscriptions/", {"filter": "", "qos": "2"})
    assert re.search(r'<option value="2" selected>', text(r))


# ---------------------------------------------------------------- retained messages


def test_retained_messages_list_view_and_delete(as_alice, device, client_id):
    topic = f"state/{client_id}/mode"
    pub = device("d0")
    pub.publish(topic, b"eco", qos=1, retain=True)
    listing = text(as_alice.get("/tenants/acme/retained/"))
    assert topic in listing
    assert topic in text(as_alice.get("/tenants/acme/retained/", {"prefix": f"state/{client_id}/"}))
    assert topic not in text(as_alice.get("/tenants/acme/retained/", {"prefix": "nothing/"}))
    view = as_alice.get("/tenants/acme/retained/message/", {"topic": topic})
    assert view.status_code == 200 and "eco" in text(view)
    # the confirmation page, then the delete
    assert topic in text(as_alice.get("/tenants/acme/retained/delete/", {"topic": topic}))
    r = as_alice.post("/tenants/acme/retained/delete/", {"topic": topic})
    assert r.status_code == 302 and r["Location"] == "/tenants/acme/retained/"
    after = text(as_alice.get("/tenants/acme/retained/", {"prefix": f"state/{client_id}/"}))
    assert f"Retained message on {topic} deleted." in after and "No retained messages" in after
    assert as_alice.get("/tenants/acme/retained/message/", {"topic": topic}).status_code == 404
    late = device("d1", "-late")
    late.subscribe(f"state/{client_id}/#", qos=1)
    late.expect_none(0.5)


def test_retained_messages_are_per_tenant(as_bob, device, client_id):
    topic = f"state/{client_id}/secret"
    device("d0").publish(topic, b"acme only", qos=1, retain=True)
    assert topic not in text(as_bob.get("/tenants/globex/retained/"))
    assert as_bob.get("/tenants/globex/retained/message/", {"topic": topic}).status_code == 404
    assert as_bob.get("/tenants/acme/retained/message/", {"topic": topic}).status_code == 404


def test_the_brokers_sys_messages_are_listed_only_on_request_and_never_deletable(as_alice, plane, settings,
                                                                                    secrets, client_id):
    """The broker's own retained ``$SYS/...`` tree is in every tenant; it is not the
    tenant's (no quota, rewritten every interval): hidden unless asked for, no Delete."""
    sysnode = plane.broker("--admin", "127.0.0.1:0", "--node-id", "live-sys", "--sys-interval", "1")
    dev = Client(client_id, username="acme/d0", password=secrets["acme/d0"])
    try:
        settings.BROKERD_ADMIN_URL = sysnode.admin_url
        dev.connect(sysnode.port())            # the tenant is on the node: its $SYS tree too

        def listed(**q):
            return text(as_alice.get("/tenants/acme/retained/", q))

        wait_until(lambda: "$SYS/broker/uptime" in listed(sys="on"), timeout=10)
        page = listed(sys="on")
        assert "Delete…" not in page and 'id="id_sys" value="on" checked' in page
        default = listed()
        assert "$SYS/broker" not in default and "No retained messages" in default
        assert "are not listed (they do not count against the tenant" in default
    finally:
        dev.disconnect()
        sysnode.stop()


# ---------------------------------------------------------------- publish


def test_publish_a_test_message_reaches_a_subscriber(as_alice, device, client_id):
    c = device("d0")
    c.subscribe(f"test/{client_id}/#", qos=1)
    r = as_alice.post("/tenants/acme/publish/", {"topic": f"test/{client_id}/ping", "payload": "hello",
                                                "qos": "1"})
    assert r.status_code == 302
    msg = c.expect()
    assert (msg.topic, msg.payload, msg.qos, msg.retain) == (f"test/{client_id}/ping", b"hello", 1, False)
    page = text(as_alice.get(r["Location"]))
    assert f"Published to test/{client_id}/ping: delivered to 1 subscriber." in page
    # a retained test message is listed under retained messages
    as_alice.post("/tenants/acme/publish/", {"topic": f"test/{client_id}/kept", "payload": "k", "qos": "0",
                                             "retain": "on"})
    wait_until(lambda: f"test/{client_id}/kept" in text(as_alice.get("/tenants/acme/retained/")))


def test_publish_with_htmx_answers_the_form(as_alice, device, client_id):
    c = device("d0")
    c.subscribe(f"test/{client_id}", qos=0)
    frag = text(as_alice.post("/tenants/acme/publish/", {"topic": f"test/{client_id}", "payload": "x", "qos": "0"},
                              **HTMX))
    assert 'id="publish-form"' in frag and "<html" not in frag
    assert "delivered to 1 subscriber" in frag
    assert c.expect().payload == b"x"


def test_publish_does_not_cross_tenants(as_alice, device, client_id):
    other = device("plant-1", "-plant", tenant="globex")
    other.subscribe("#", qos=0)
    as_alice.post("/tenants/acme/publish/", {"topic": f"test/{client_id}", "payload": "x", "qos": "0"})
    other.expect_none(0.5)


# ---------------------------------------------------------------- overload


def test_a_publisher_paced_by_the_queue_budget_says_so(as_alice, plane, secrets, settings, client_id):
    """On a node with a small --queue-budget, a device blasting QoS 1 at a subscriber that never
    reads is paced (its socket is left unread while the queues are over the budget): its client
    page says so; the stuck subscriber's page and a publisher whose messages are taken do not."""
    b = plane.broker("--admin", "127.0.0.1:0", "--node-id", "live-budget", "--queue-budget", "30000")
    settings.BROKERD_ADMIN_URL = b.admin_url
    clients = []
    try:
        def raw_device(dev: str, suffix: str) -> raw.RawClient:
            c = raw.RawClient(b.port(), timeout=5)
            clients.append(c)
            ack = c.connect(client_id + suffix, version=4, keepalive=0, username=f"acme/{dev}",
                            password=secrets[f"acme/{dev}"])
            assert ack.code == 0, ack
            return c

        stuck = raw_device("d1", "-stuck")
        stuck.subscribe(f"pace/{client_id}/#", qos=1)      # and never reads again
        polite = raw_device("d2", "-polite")
        taker = raw_device("d3", "-taker")
        taker.subscribe(f"calm/{client_id}", qos=0)
        blaster = raw_device("d4", "-blaster")
        blaster.sock.settimeout(10)
        for i in range(200):                               # 200 kB: the budget holds about 25 of them
            blaster.send(raw.publish_packet(f"pace/{client_id}/x", b"%06d" % i + b"b" * 994, qos=1, pid=i + 1))
            if i % 20 == 0:
                polite.send(raw.publish_packet(f"calm/{client_id}", b"calm", qos=0))

        def page(suffix):
            return session_of(as_alice, "acme", client_id + suffix)[1]

        wait_until(lambda: "by the queue budget" in page("-blaster"), timeout=10)
        assert re.search(r"Paced</dt><dd[^>]*>[0-9,]+ times? by the queue budget</dd>", page("-blaster"))
        for suffix in ("-stuck", "-polite", "-taker"):
            body = page(suffix)
            assert "Bytes" in body and "by the queue budget" not in body, suffix
    finally:
        for c in clients:
            c.close()
        b.stop()


# ---------------------------------------------------------------- the "Connect this device" panel


def test_the_connect_panel_shows_what_the_live_node_advertises(as_alice, node, settings):
    """No MQTT_PUBLIC_URLS: the URLs the nodes advertise (GET /api/v1/nodes, each node's "mqtt");
    with it, the setting's."""
    settings.MQTT_PUBLIC_URLS = []
    mqtt_url, ws_url = f"mqtt://127.0.0.1:{node.port('mqtt')}", f"ws://127.0.0.1:{node.port('ws')}/mqtt"
    (listed,) = BrokerdClient(node.admin_url, TOKEN).nodes()
    assert listed["mqtt"] == [mqtt_url, ws_url]
    page = as_alice.get("/tenants/acme/devices/sensor-1/").content.decode()
    assert f'<code class="broker-url" data-scheme="mqtt">{mqtt_url}</code>' in page
    assert f'<code class="broker-url" data-scheme="ws">{ws_url}</code>' in page
    assert f"mosquitto_pub -h 127.0.0.1 -p {node.port('mqtt')} -u acme/sensor-1" in page
    assert "advertise" in page and "did not answer" not in page
    settings.MQTT_PUBLIC_URLS = "mqtts://mqtt.acme.example:8883"
    page = as_alice.get("/tenants/acme/devices/sensor-1/").content.decode()
    assert "mqtts://mqtt.acme.example:8883" in page and mqtt_url not in page


# ---------------------------------------------------------------- brokerd down


def test_pages_show_the_banner_when_brokerd_is_down(as_alice, settings):
    settings.BROKERD_ADMIN_URL = f"http://127.0.0.1:{free_port()}"
    for url in ("/tenants/acme/clients/", "/tenants/acme/retained/", "/tenants/acme/clients/x/"):
        r = as_alice.get(url)
        assert r.status_code == 200
        assert "brokerd's admin API is unreachable." in text(r)
