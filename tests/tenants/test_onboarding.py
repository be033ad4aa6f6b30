"""What the "Connect this device" panel is made of (tenants.onboarding, plain
Python) and the one-click rule's service: URLs checked and ordered, examples
that a shell and Python read back as exactly the values given, whatever they
hold, and ``allow_own_topics`` adding its rule once."""

import ast
import json
import shlex

import pytest

from tenants import onboarding, policy_snapshot, queries, services
from tenants.models import AclRule, PolicySnapshot

URLS = ["ws://mqtt.example.com:8083/mqtt", "mqtt://mqtt.example.com:1883", "wss://mqtt.example.com/mqtt",
        "mqtts://mqtt.example.com:8883"]


# ---------------------------------------------------------------- URLs


def test_public_urls_are_checked_and_kept_in_order():
    assert onboarding.public_urls(" mqtt://a:1883, ,mqtts://a:8883,mqtt://a:1883 ") == ["mqtt://a:1883",
                                                                                      "mqtts://a:8883"]
    assert onboarding.public_urls("") == [] and onboarding.public_urls(None) == []


@pytest.mark.parametrize(("url", "says"), [
    ("http://a:80", "scheme must be one of"),
    ("mqtt://0.0.0.0:1883", "no host a device can reach"),
    ("mqtt://:1883", "no host a device can reach"),
    ("mqtt://a:99999", "out of range"),
    ("mqtt://a:1883/path", "only ws:// and wss:// URLs take a path"),
    ("mqtt://user:pw@a:1883", "only scheme://host:port"),
])
def test_a_bad_public_url_is_named(url, says):
    with pytest.raises(ValueError, match="MQTT_PUBLIC_URLS") as err:
        onboarding.public_urls(f"mqtt://ok:1883,{url}")
    assert says in str(err.value) and repr(url) in str(err.value)


def test_advertised_urls_come_from_live_nodes_once_each():
    nodes = [{"id": "n1", "health": "ok", "mqtt": ["mqtt://h1:1883", "ws://h1:8083/mqtt"]},
             {"id": "n2", "health": "unreachable", "mqtt": ["mqtt://h2:1883"]},
             {"id": "n3", "health": "fenced", "mqtt": ["mqtt://h3:1883"]},
             {"id": "n4", "health": "ok"},                           # an older node: no "mqtt"
             {"id": "n5", "health": "ok", "mqtt": ["mqtt://h1:1883", "mqtt://0.0.0.0:1883", "mqtt://h5:1883"]}]
    assert onboarding.advertised_urls(nodes) == ["mqtt://h1:1883", "ws://h1:8083/mqtt", "mqtt://h5:1883"]


def test_endpoints_by_scheme_and_the_examples_prefer_tls_then_tcp():
    rows = onboarding.endpoints(URLS + ["mqtt://other:1883"])
    assert [(e.scheme, e.urls) for e in rows] == [
        ("mqtt", ("mqtt://mqtt.example.com:1883", "mqtt://other:1883")), ("mqtts", ("mqtts://mqtt.example.com:8883",)),
        ("ws", ("ws://mqtt.example.com:8083/mqtt",)), ("wss", ("wss://mqtt.example.com/mqtt",))]
    assert onboarding.example_url(URLS) == "mqtts://mqtt.example.com:8883"
    assert onboarding.example_url(URLS[:2]) == "mqtt://mqtt.example.com:1883"
    assert onboarding.example_url(["ws://h:8083/mqtt", "wss://h/mqtt"]) == "wss://h/mqtt"
    assert onboarding.example_url([]) is None


# ---------------------------------------------------------------- examples

# a secret is URL-safe base64, but nothing in the examples may rely on it
NASTY = "it's $(rm -rf ~); `x` \"q\" \\ #"


@pytest.mark.parametrize("secret", ["Zm9v-YmFy_0123456789", NASTY])
def test_mosquitto_commands_read_back_as_the_values(secret):
    panel = onboarding.connect_panel(["mqtt://broker.example:1884"], "acme/pump-7", "pump-7", secret)
    sub, pub = shlex.split(panel["mosquitto"]["sub"]), shlex.split(panel["mosquitto"]["pub"])
    assert sub == ["mosquitto_sub", "-h", "broker.example", "-p", "1884", "-u", "acme/pump-7", "-P", secret,
                   "-t", "pump-7/#", "-v"]
    assert pub == ["mosquitto_pub", "-h", "broker.example", "-p", "1884", "-u", "acme/pump-7", "-P", secret,
                   "-t", "pump-7/hello", "-m", "hello from pump-7", "-q", "1"]


def test_mosquitto_over_tls_uses_the_system_cas_and_websocket_has_no_mosquitto_command():
    tls = onboarding.mosquitto("mqtts://[::1]:8883", "acme/d", "s", "d")["pub"]
    assert shlex.split(tls)[1:7] == ["-h", "::1", "-p", "8883", "--capath", "/etc/ssl/certs"]
    assert onboarding.mosquitto("wss://h/mqtt", "acme/d", "s", "d") is None


def test_without_the_secret_the_examples_read_it_from_the_environment():
    panel = onboarding.connect_panel(["mqtt://h:1883"], "acme/d", "d")
    assert '-P "$MQTT_PASSWORD"' in panel["mosquitto"]["pub"] and not panel["secret_shown"]
    assert "os.environ['MQTT_PASSWORD']" in panel["paho"] and panel["paho"].startswith("import os")


def _calls(program: str) -> dict:
    """{"mqtt.Client": (args, kwargs), "client.connect": ...} of a paho snippet, its literals evaluated."""
    calls = {}
    for node in ast.walk(ast.parse(program)):
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            args = [ast.literal_eval(a) if not isinstance(a, ast.Subscript | ast.Attribute) else ast.unparse(a)
                    for a in node.args]
            calls[name] = (args, {k.arg: ast.unparse(k.value) if isinstance(k.value, ast.Attribute)
                                  else ast.literal_eval(k.value) for k in node.keywords})
    return calls


@pytest.mark.parametrize("secret", ["Zm9v-YmFy_0123456789", NASTY])
def test_the_paho_snippet_is_python_with_the_values(secret):
    calls = _calls(onboarding.paho("mqtts://broker.example:8883", "acme/pump-7", secret, "pump-7"))
    assert calls["mqtt.Client"] == (["mqtt.CallbackAPIVersion.VERSION2"], {"client_id": "pump-7"})
    assert calls["client.username_pw_set"] == (["acme/pump-7", secret], {})
    assert "client.tls_set" in calls
    assert calls["client.connect"] == (["broker.example", 8883], {})
    assert calls["client.publish"] == (["pump-7/hello", "hello from pump-7"], {"qos": 1})


def test_the_paho_snippet_over_websocket():
    calls = _calls(onboarding.paho("ws://h:8083/ws", "acme/d", "s", "d"))
    assert calls["mqtt.Client"][1] == {"client_id": "d", "transport": "websockets"}
    assert calls["client.ws_set_options"] == ([], {"path": "/ws"})
    assert "client.tls_set" not in calls and calls["client.connect"] == (["h", 8083], {})


def test_no_url_no_examples():
    panel = onboarding.connect_panel([], "acme/d", "d", "secret")
    assert panel["url"] is None and panel["mosquitto"] is None and panel["paho"] is None
    assert panel["username"] == "acme/d" and panel["endpoints"] == []


# ---------------------------------------------------------------- the one-click rule


def test_a_new_tenant_allows_nothing_until_a_rule_allows(tenant, device):
    assert queries.allows_nothing(tenant)
    services.add_acl_rule(tenant, topic="secret/#", action="both", allow=False)
    assert queries.allows_nothing(tenant)
    services.add_acl_rule(tenant, topic="x/#", action="publish", allow=True)
    assert not queries.allows_nothing(tenant)
    services.update_tenant(tenant, default_acl="allow")
    services.delete_acl_rule(tenant.acl_rules.get(topic="x/#"))
    assert not queries.allows_nothing(tenant)


def test_allow_own_topics_adds_its_rule_last_and_only_once(tenant, device):
    services.add_acl_rule(tenant, topic="secret/#", action="both", allow=False)
    before = services.example_access(tenant, "sensor-1", "sensor-1/hello", "sensor-1/#")
    assert not before["publish"].allowed and before["publish"].rule is None       # the default decided

    rule, created = services.allow_own_topics(tenant)
    assert created and (rule.position, rule.who, rule.action, rule.topic, rule.allow) == (
        2, "all", "both", "{device}/#", True)
    stored = json.loads(PolicySnapshot.objects.get(tenant_slug="acme").data)     # what brokerd reads
    assert stored["acl"][-1] == policy_snapshot.rule_json(rule)
    after = services.example_access(tenant, "sensor-1", "sensor-1/hello", "sensor-1/#")
    assert after["publish"].allowed and after["subscribe"].allowed and after["publish"].rule == rule

    again, created = services.allow_own_topics(tenant)
    assert not created and again == rule and tenant.acl_rules.count() == 2
    # a rule of the same topic that differs (one device, deny, publish only) is not it
    AclRule.objects.filter(pk=rule.pk).update(action="publish")
    assert services.own_topics_rule(tenant) is None
