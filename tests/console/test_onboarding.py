"""Onboarding a device in the console (issue 21, defect 5): the page that shows
a new secret has a "Connect this device" panel -- the broker's URLs, the user
name, copyable mosquitto and paho examples holding the secret; the device page
has the same panel with a placeholder for the secret. A tenant whose ACL
refuses the examples (a new one: default deny, no rule) says so on its
overview, the secret page and the device page, and offers its administrators
the one-click rule ``allow both {device}/#``, idempotent and audited.

brokerd is down here (the suite's default): URLs come from MQTT_PUBLIC_URLS,
or the panel says brokerd did not answer. URLs from live nodes:
tests/console/test_live.py; a real client using the panel: tests/browser/test_onboarding.py.
"""

import html
import re
import shlex

import pytest

from core.models import AuditEvent
from tenants import services
from tenants.models import AclRule, Membership

from .conftest import HTMX, _user, policy

PUBLIC = "mqtt://mqtt.acme.example:1883,mqtts://mqtt.acme.example:8883,ws://mqtt.acme.example:8083/mqtt," \
         "wss://mqtt.acme.example:443/mqtt"
BLOCK = re.compile(r'<pre id="connect-(sub|pub|paho)"[^>]*>(.*?)</pre>', re.S)
SECRET = re.compile(r'<code id="secret">([^<]+)</code>')


def blocks(page: str) -> dict[str, str]:
    """The panel's code blocks as the browser shows (and copies) them."""
    return {k: html.unescape(v) for k, v in BLOCK.findall(page)}


def urls_on(page: str) -> dict[str, list[str]]:
    found = {}
    for scheme, url in re.findall(r'<code class="broker-url" data-scheme="(\w+)">([^<]+)</code>', page):
        found.setdefault(scheme, []).append(html.unescape(url))
    return found


@pytest.fixture
def public(settings):
    settings.MQTT_PUBLIC_URLS = PUBLIC


def create(client, name="pump-7"):
    response = client.post("/tenants/acme/devices/new/", {"name": name, "with_credential": "on"})
    assert response.status_code == 200 and response["Cache-Control"] == "no-store"
    page = response.content.decode()
    return page, SECRET.findall(page)[0]


# ---------------------------------------------------------------- the panel


def test_the_secret_page_shows_urls_user_and_examples_with_the_secret(as_alice, acme, public):
    page, secret = create(as_alice)
    assert "Connect this device" in page
    assert urls_on(page) == {"mqtt": ["mqtt://mqtt.acme.example:1883"], "mqtts": ["mqtts://mqtt.acme.example:8883"],
                             "ws": ["ws://mqtt.acme.example:8083/mqtt"], "wss": ["wss://mqtt.acme.example:443/mqtt"]}
    assert '<code id="connect-username">acme/pump-7</code>' in page
    code = blocks(page)
    # the examples use TLS, and a shell reads them back as exactly the values
    assert shlex.split(code["sub"]) == [
        "mosquitto_sub", "-h", "mqtt.acme.example", "-p", "8883", "--capath", "/etc/ssl/certs", "-u", "acme/pump-7",
        "-P", secret, "-t", "pump-7/#", "-v"]
    assert shlex.split(code["pub"])[-6:] == ["-t", "pump-7/hello", "-m", "hello from pump-7", "-q", "1"]
    assert f"client.username_pw_set('acme/pump-7', {secret!r})" in code["paho"]
    assert "client.connect('mqtt.acme.example', 8883)" in code["paho"] and "client.tls_set()" in code["paho"]
    assert 'data-copy="#connect-pub"' in page and "MQTT_PUBLIC_URLS" in page


def test_a_rotated_or_new_credential_shows_the_panel_too(as_alice, acme, public):
    credential = acme.test_credential
    response = as_alice.post(f"/tenants/acme/devices/sensor-1/credentials/{credential.pk}/rotate/")
    page = response.content.decode()
    secret = SECRET.findall(page)[0]
    assert f"-P {secret}" in blocks(page)["pub"]
    response = as_alice.post("/tenants/acme/devices/sensor-1/credentials/new/", {"label": "spare"})
    page = response.content.decode()
    assert f"-P {SECRET.findall(page)[0]}" in blocks(page)["pub"]


def test_the_device_page_has_the_panel_with_a_placeholder_never_the_secret(as_alice, acme, public):
    _, secret = create(as_alice)
    page = as_alice.get("/tenants/acme/devices/pump-7/").content.decode()
    code = blocks(page)
    assert secret not in page
    argv = shlex.split(code["pub"])
    assert argv[argv.index("-P") + 1] == "$MQTT_PASSWORD"          # as a shell reads it: the variable
    assert '-P "$MQTT_PASSWORD"' in code["sub"]
    assert "os.environ['MQTT_PASSWORD']" in code["paho"]
    assert urls_on(page)["mqtt"] == ["mqtt://mqtt.acme.example:1883"]


def test_brokerd_unreachable_and_no_setting_says_so(as_alice, acme, settings):
    settings.MQTT_PUBLIC_URLS = []
    page, secret = create(as_alice)
    assert "brokerd's admin API did not answer" in page and "brokerd admin API unreachable" in page
    assert "Ask your operator for the broker" in page
    assert '<code id="connect-username">acme/pump-7</code>' in page
    assert blocks(page) == {} and urls_on(page) == {}                    # no host: no example that cannot work


def test_everything_in_the_panel_is_escaped(as_alice, acme, settings):
    settings.MQTT_PUBLIC_URLS = "ws://h.example:8083/<script>alert(1)</script>,mqtt://h.example:1883"
    page, _ = create(as_alice)
    assert "<script>alert" not in page
    assert urls_on(page)["ws"] == ["ws://h.example:8083/<script>alert(1)</script>"]


# ---------------------------------------------------------------- "default deny, no rule"


@pytest.fixture
def fresh(db, alice):
    """A new tenant as the console makes it: default deny, no rule; alice administers it, vic views it."""
    tenant = services.create_tenant("fresh")
    Membership.objects.create(user=alice, tenant=tenant, role=Membership.Role.ADMIN)
    Membership.objects.create(user=_user("vic"), tenant=tenant, role=Membership.Role.VIEWER)
    services.provision_device(tenant, "valve-3")
    return tenant


@pytest.fixture
def as_vic(client, fresh):
    from django.contrib.auth import get_user_model
    client.force_login(get_user_model().objects.get(username="vic"))
    return client


BUTTON = "Allow each device its own topics"


def test_a_new_tenant_says_it_allows_nothing_and_offers_the_rule(as_alice, fresh, public):
    page = as_alice.get("/tenants/fresh/").content.decode()
    assert "Devices of fresh can neither publish nor subscribe." in page and BUTTON in page
    device = as_alice.get("/tenants/fresh/devices/valve-3/").content.decode()
    assert "The tenant's ACL refuses this device's examples." in device and BUTTON in device
    assert "<strong>denied</strong> by the tenant's default (deny: no rule matches)" in device
    # the page that shows a new device's secret too
    page = as_alice.post("/tenants/fresh/devices/new/", {"name": "valve-4", "with_credential": "on"}).content.decode()
    assert "The tenant's ACL refuses this device's examples." in page and BUTTON in page


def test_viewers_are_told_but_see_no_button_and_may_not_post(as_vic, fresh):
    for url in ("/tenants/fresh/", "/tenants/fresh/devices/valve-3/"):
        page = as_vic.get(url).content.decode()
        assert "A tenant administrator can add a rule such as" in page and BUTTON not in page
    assert as_vic.post("/tenants/fresh/acl/own-topics/").status_code == 403
    assert as_vic.post("/tenants/fresh/acl/own-topics/", **HTMX).status_code == 403
    assert not fresh.acl_rules.exists() and not AuditEvent.objects.filter(action="acl.add").exists()


def test_one_click_adds_the_rule_once_with_its_audit_row(as_alice, fresh):
    response = as_alice.post("/tenants/fresh/acl/own-topics/", {"next": "/tenants/fresh/devices/valve-3/"})
    assert response.status_code == 302 and response["Location"] == "/tenants/fresh/devices/valve-3/"
    (rule,) = fresh.acl_rules.all()
    assert (rule.position, rule.who, rule.action, rule.topic, rule.allow) == (1, "all", "both", "{device}/#", True)
    assert [(r["topic"], r["allow"]) for r in policy("fresh")["acl"]] == [("{device}/#", True)]   # brokerd's copy
    (event,) = AuditEvent.objects.filter(action="acl.add")
    assert (event.actor, event.tenant, event.object_type, event.object_id) == ("alice", "fresh", "acl_rule",
                                                                                str(rule.pk))
    page = as_alice.get(response["Location"]).content.decode()
    assert f"ACL rule {rule.pk} added at position 1: every device may publish and subscribe under its own name " \
        "({device}/#)." in page
    assert BUTTON not in page and "refuses this device" not in page
    assert "Devices of fresh can neither" not in as_alice.get("/tenants/fresh/").content.decode()

    # a second click (a stale page, a double click) adds nothing and logs nothing
    response = as_alice.post("/tenants/fresh/acl/own-topics/", **HTMX)
    assert f"ACL rule {rule.pk} (position 1) is there already" in response.content.decode()
    assert fresh.acl_rules.count() == 1 and AuditEvent.objects.filter(action="acl.add").count() == 1


def test_one_click_by_htmx_answers_with_the_notice_in_place(as_admin, fresh):
    response = as_admin.post("/tenants/fresh/acl/own-topics/", {"kind": "device", "next": "/x"}, **HTMX)
    page = response.content.decode()
    assert response.status_code == 200 and page.lstrip().startswith("<div class=\"callout callout-success acl-notice\"")
    rule = fresh.acl_rules.get()
    assert f"ACL rule {rule.pk} added at position 1:" in page and "<code>allow both {device}/#</code>" in page
    assert AuditEvent.objects.get(action="acl.add").actor == "root"


def test_one_click_goes_back_only_to_this_site(as_alice, fresh):
    response = as_alice.post("/tenants/fresh/acl/own-topics/", {"next": "https://evil.example/"})
    assert response["Location"] == "/tenants/fresh/acl/"


def test_a_rule_that_decides_first_is_named_not_a_second_button(as_alice, fresh):
    own, _ = services.allow_own_topics(fresh)
    deny = services.add_acl_rule(fresh, topic="valve-3/#", action="both", allow=False, position=1)
    page = as_alice.get("/tenants/fresh/devices/valve-3/").content.decode()
    assert f"<strong>denied</strong> by ACL rule {deny.pk} (position 1, <code>valve-3/#</code>)" in page
    assert f"ACL rule {own.pk} (position 2, <code>allow both {{device}}/#</code>) comes after the rule that decides" \
        in page
    assert BUTTON not in page


def test_a_device_the_rules_let_in_gets_no_notice(as_alice, acme):
    services.add_acl_rule(acme, topic="gateway/#", action="both", allow=True, device="gateway")
    page = as_alice.get("/tenants/acme/devices/gateway/").content.decode()
    assert "refuses this device" not in page and BUTTON not in page
    assert AclRule.objects.filter(tenant=acme).count() == 3
