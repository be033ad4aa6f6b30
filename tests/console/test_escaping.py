"""Output escaping: an XSS attempt in every stored field a user (or a device,
through brokerd) can set, rendered on every page that shows it.

Each field gets its own payload (``xss(n)``) so a page shows which field
leaked. Where the console's validation allows the payload it is stored through
the console's own form and the pages that show the field must carry its
escaped form, never the raw one; where validation refuses it the refusal must
be an inline form error (200, the message on the form, nothing stored).
Values that come from brokerd -- client ids, user names, topics, payloads,
node ids -- are what a fake admin API answers, and the audit rows brokerd
writes (before/after JSON) are stored as brokerd stores them.

``test_no_page_carries_a_raw_payload`` then opens every GET page of
``test_authorization.TABLE`` in both tenants and on the platform, as root,
alice and bob, with every payload stored at once: not one raw payload
anywhere.
"""

import datetime as dt
import json

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape

from console.models import ApiToken
from core.brokerd_client import BrokerdClient, BrokerdError
from core.models import AuditEvent
from metrics.models import Alarm
from spark_reports import delivery
from spark_reports.models import ReportRun, ReportSchedule
from tenants import services
from tenants.models import AclRule, Credential, Device, Membership, Tenant

from ..reports.conftest import sample_result
from .test_authorization import TABLE, TENANT_KINDS, TENANT_SCOPED, build_world


def xss(n) -> str:
    return f"<script>alert({n})</script>\"'><img src=x onerror=alert({n})>"


def raw_parts(n) -> list[str]:
    """What must never reach a page unescaped (the payload or its dangerous halves)."""
    return [xss(n), f"<script>alert({n})", f"<img src=x onerror=alert({n})>"]


def escaped(n, in_json=False) -> str:
    value = xss(n)
    if in_json:                             # inside a JSON document shown on the page (audit rows)
        value = json.dumps(value)[1:-1]
    return escape(value)


def check(html: str, n, shown=True, in_json=False, where=""):
    for part in raw_parts(n):
        assert part not in html, f"{where}: raw payload {n} on the page"
    if shown:
        assert escaped(n, in_json) in html, f"{where}: payload {n} not shown (escaped) where it should be"


def page(client, url, status=200) -> str:
    response = client.get(url)
    assert response.status_code == status, (url, response.status_code)
    return response.content.decode()


# ------------------------------------------------------------ brokerd's answers (a fake admin API)

LIVE_CLIENT = xss("client")          # a client id (MQTT allows nearly anything)
LIVE_USER = xss("username")
LIVE_TOPIC = xss("topic")
LIVE_PAYLOAD = xss("payload")
LIVE_FILTER = xss("filter")
LIVE_NODE = xss("node")


def fake_brokerd(monkeypatch):
    """brokerd's admin API answering with hostile ids, topics and payloads."""
    client = {"node": LIVE_NODE, "tenant": "acme", "client_id": LIVE_CLIENT, "username": LIVE_USER,
              "device": None, "ip": "10.0.0.1", "protocol": "5", "connected": True, "connected_at": 1.7e9,
              "keepalive": 60, "session_expiry": 0, "subscriptions": 1, "queued": 0, "inflight": 0,
              "messages_in": 1, "messages_out": 1, "bytes_in": 1, "bytes_out": 1}
    detail = {**client, "subscriptions": [{"filter": LIVE_FILTER, "qos": 1, "no_local": False,
                                           "retain_as_published": False, "retain_handling": 0,
                                           "shared_group": xss("group")}],
              "subscription_count": 1, "listener": xss("listener")}
    retained = {"tenant": "acme", "topic": LIVE_TOPIC, "qos": 1, "size": 60, "expires_at": None}
    node = {"id": LIVE_NODE, "health": "ok", "uptime": 10, "listeners": [], "connected": 1, "sessions": 1,
            "subscriptions": 1, "retained": 1, "messages_received": 1, "messages_sent": 1, "bytes_received": 1,
            "bytes_sent": 1}

    def call(self, method, path, query=None, body=None):
        query = query or {}
        page_of = lambda items: {"items": items, "total": len(items), "page": 1, "per_page": 50,  # noqa: E731
                                 "pages": 1}
        if method == "GET" and path == "nodes":
            return {"items": [node]}
        if method == "GET" and path == "clients":
            return page_of([client])
        if method == "GET" and path.startswith("clients/"):
            return detail
        if method == "GET" and path == "retained":
            if query.get("topic"):
                return {**retained, "topic": query["topic"], "payload": LIVE_PAYLOAD, "payload_encoding": "utf8",
                        "content_type": xss("content-type")}
            return page_of([retained])
        if method == "POST" and path == "publish":
            return {"deliveries": 1}
        raise BrokerdError(404, xss("api-error"))

    monkeypatch.setattr(BrokerdClient, "_call", call)


# ------------------------------------------------------------ the console's own fields


def test_tenant_name(as_admin, as_alice, alice, acme, globex):
    response = as_admin.post(reverse("tenant_edit", args=["acme"]),
                             {"name": xss(1), "contact_emails": "ops@acme.test", "default_acl": "deny"})
    assert response.status_code == 302
    assert Tenant.objects.get(slug="acme").name == xss(1)
    Membership.objects.create(user=alice, tenant=globex, role=Membership.Role.VIEWER)   # the picker
    for client, url in [(as_admin, "/tenants/acme/"), (as_admin, "/tenants/"), (as_admin, "/tenants/?q=acme"),
                        (as_admin, "/tenants/acme/edit/"), (as_admin, "/tenants/acme/devices/"),
                        (as_alice, "/"), (as_alice, "/tenants/"), (as_alice, "/tenants/globex/"),
                        (as_alice, "/tenants/acme/members/")]:
        check(page(client, url), 1, where=url)


def test_tenant_contact_emails_refuse_markup_inline(as_admin, acme):
    for value in (xss(2), f'"{xss(2)}"@acme.test'):
        response = as_admin.post(reverse("tenant_edit", args=["acme"]),
                                 {"name": "Acme", "contact_emails": value, "default_acl": "deny"})
        html = response.content.decode()
        assert response.status_code == 200 and "is not a valid email address" in html
        check(html, 2, where="tenant edit form, refused")        # echoed in the error and the textarea
    acme.refresh_from_db()
    assert acme.contact_emails == ["ops@acme.test"]


def test_device_name_refused_inline(as_alice, acme):
    response = as_alice.post(reverse("device_create", args=["acme"]), {"name": xss(3)})
    html = response.content.decode()
    assert response.status_code == 200 and 'class="error"' in html
    check(html, 3, where="device form, refused")
    assert not Device.objects.filter(name=xss(3)).exists()


def test_device_description_and_certificate_name(as_alice, acme):
    response = as_alice.post(reverse("device_edit", args=["acme", "sensor-1"]),
                             {"description": xss(4), "cert_cn": xss(5)})
    assert response.status_code == 302
    device = Device.objects.get(name="sensor-1")
    assert (device.description, device.cert_cn) == (xss(4), xss(5))
    for url in ("/tenants/acme/devices/", "/tenants/acme/devices/?q=alert", "/tenants/acme/devices/sensor-1/",
                "/tenants/acme/devices/sensor-1/edit/"):
        html = page(as_alice, url)
        check(html, 4, where=url)
        check(html, 5, shown="devices/sensor-1/" in url, where=url)
    # the audit row's before/after documents
    check(page(as_alice, "/tenants/acme/audit/"), 4, in_json=True, where="tenant audit")


def test_credential_label(as_alice, acme):
    response = as_alice.post(reverse("credential_create", args=["acme", "sensor-1"]), {"label": xss(6)})
    assert response.status_code == 200
    check(response.content.decode(), 6, where="the new secret's page")
    credential = Credential.objects.get(label=xss(6))
    for url in ("/tenants/acme/devices/sensor-1/",
                f"/tenants/acme/devices/sensor-1/credentials/{credential.pk}/rotate/",
                f"/tenants/acme/devices/sensor-1/credentials/{credential.pk}/expire/",
                f"/tenants/acme/devices/sensor-1/credentials/{credential.pk}/delete/"):
        check(page(as_alice, url), 6, shown=url.endswith("sensor-1/"), where=url)
    check(page(as_alice, "/tenants/acme/audit/"), 6, in_json=True, where="tenant audit")


def test_acl_topic(as_alice, acme):
    response = as_alice.post(reverse("acl_add", args=["acme"]),
                             {"who": "device", "device": "sensor-1", "action": "both", "topic": xss(7),
                              "allow": "allow"})
    assert response.status_code == 302, response.content.decode()[:2000]
    rule = AclRule.objects.get(topic=xss(7))
    for url in ("/tenants/acme/acl/", "/tenants/acme/devices/sensor-1/", f"/tenants/acme/acl/{rule.pk}/edit/",
                f"/tenants/acme/acl/{rule.pk}/delete/"):
        check(page(as_alice, url), 7, where=url)
    check(page(as_alice, "/tenants/acme/audit/"), 7, in_json=True, where="tenant audit")


def test_acl_device_pattern_refused_inline(as_alice, acme):
    response = as_alice.post(reverse("acl_add", args=["acme"]),
                             {"who": "pattern", "pattern": xss(8), "action": "both", "topic": "a/#",
                              "allow": "allow"})
    html = response.content.decode()
    assert response.status_code == 200 and 'class="error"' in html
    check(html, 8, shown=False, where="ACL form, refused")
    assert not AclRule.objects.filter(device_pattern=xss(8)).exists()


def test_acl_checker_echoes_its_question_escaped(as_alice, acme):
    from urllib.parse import urlencode

    url = "/tenants/acme/acl/check/?" + urlencode({"device": "sensor-1", "client_id": xss(9), "action": "publish",
                                                  "topic": xss(10)})
    html = page(as_alice, url)
    check(html, 9, where="acl check")
    check(html, 10, where="acl check")
    html = page(as_alice, "/tenants/acme/acl/check/?" + urlencode({"device": xss(11), "action": "publish",
                                                                  "topic": "a"}))
    check(html, 11, where="acl check, refused device")


def test_member_names_refused_inline_and_shown_escaped(as_alice, as_admin, acme):
    response = as_alice.post(reverse("members", args=["acme"]),
                             {"username": xss(12), "email": xss(13), "password": "a-Long-passw0rd-9",
                              "role": "viewer"})
    html = response.content.decode()
    assert response.status_code == 200 and 'class="error"' in html
    check(html, 12, where="member form, refused")
    assert not get_user_model().objects.filter(username=xss(12)).exists()
    # a user made outside the console's forms (a script, an identity provider) with such a name
    user = get_user_model().objects.create_user(xss(14), email="x@acme.test")
    membership = Membership.objects.create(user=user, tenant=acme, role=Membership.Role.VIEWER)
    for url in ("/tenants/acme/members/", f"/tenants/acme/members/{membership.pk}/remove/"):
        check(page(as_alice, url), 14, where=url)
    response = as_alice.post(reverse("member_role", args=["acme", membership.pk]), {"role": "admin"}, follow=True)
    check(response.content.decode(), 14, where="members after a role change (its message)")
    html = page(as_alice, "/tenants/acme/audit/")
    check(html, 14, where="tenant audit (the object id)")


def test_report_schedule_fields(as_alice, acme):
    # recipients are the tenant's contact emails (markup refused there); the other fields are choices
    response = as_alice.post(reverse("report_schedules", args=["acme"]),
                             {"frequency": xss(15), "hour": xss(16), "recipients": xss(17), "enabled": "on"})
    html = response.content.decode()
    assert response.status_code == 200 and 'class="error"' in html
    for n in (15, 16, 17):
        check(html, n, shown=False, where="schedule form, refused")
    assert not ReportSchedule.objects.exists()


def test_token_name(as_admin):
    response = as_admin.post(reverse("token_create"), {"name": xss(18), "scope": "read"})
    check(response.content.decode(), 18, where="the new token's page")
    token = ApiToken.objects.get(name=xss(18))
    for url in ("/tokens/", f"/tokens/{token.pk}/revoke/", "/audit/"):
        check(page(as_admin, url), 18, where=url)
    response = as_admin.post(f"/tokens/{token.pk}/revoke/", follow=True)
    check(response.content.decode(), 18, where="tokens after revoking (its message)")


def test_alarm_subject_and_message(as_admin, as_alice, acme):
    Alarm.objects.create(kind="node_down", subject=xss(19), message=f"node {xss(20)} is down",
                         raised_at=timezone.now())
    Alarm.objects.create(kind="drops", subject=xss(21), tenant=acme, tenant_slug="acme",
                         message=f"drops rising in {xss(22)}", raised_at=timezone.now())
    for client, url, shown in [(as_admin, "/metrics/alarms/", (19, 20, 22)), (as_admin, "/overview/", (20, 22)),
                               (as_admin, "/metrics/", (20, 22)), (as_admin, "/tenants/acme/metrics/", (22,)),
                               (as_alice, "/tenants/acme/metrics/", (22,))]:
        html = page(client, url)
        for n in (19, 20, 21, 22):
            check(html, n, shown=n in shown, where=url)


def test_node_page_of_a_hostile_node_name(as_admin):
    """brokerd takes any --node-id: its alarm links to the node's page, which shows the name
    (was: a "/" in the name made the alarms page a 500, no URL for the node's page)."""
    Alarm.objects.create(kind="node_down", subject=xss(23), message="a node is down", raised_at=timezone.now())
    url = reverse("metrics_node", args=[xss(23)])
    check(page(as_admin, url), 23, where=url)
    html = page(as_admin, reverse("alarms"))
    check(html, 23, where="alarms")
    assert f'href="{escape(url)}"' in html


def test_report_result(as_alice, acme):
    result = sample_result("tenant", "acme")
    result["top_topics"][0]["topic"] = xss(24)
    result["top_devices"][0]["device"] = xss(25)
    result["reasons"][0]["reason"] = xss(26)
    run = ReportRun.objects.create(kind="tenant", tenant=acme, status="succeeded", result=result,
                                   period_start=dt.datetime(2026, 3, 2, tzinfo=dt.UTC),
                                   period_end=dt.datetime(2026, 3, 9, tzinfo=dt.UTC))
    for url in (reverse("report", args=["acme", run.pk]), reverse("report_print", args=["acme", run.pk])):
        html = page(as_alice, url)
        for n in (24, 25, 26):
            check(html, n, where=url)


def test_report_email_escapes_the_tenant_name(acme):
    services.update_tenant(acme, name=xss(27))
    schedule = ReportSchedule.objects.create(tenant=acme, frequency="weekly", recipients=["ops@acme.test"])
    run = ReportRun.objects.create(kind="tenant", tenant=acme, status="succeeded", schedule=schedule,
                                   result=sample_result("tenant", "acme"),
                                   period_start=dt.datetime(2026, 3, 2, tzinfo=dt.UTC),
                                   period_end=dt.datetime(2026, 3, 9, tzinfo=dt.UTC))
    message = delivery.build_message(run, ["ops@acme.test"])
    (html, _), = message.alternatives
    check(html, 27, where="report email")


# ------------------------------------------------------------ what brokerd says and stores


def test_live_pages(monkeypatch, as_admin, as_alice, acme):
    fake_brokerd(monkeypatch)
    detail = reverse("client_detail", args=["acme", LIVE_CLIENT])
    kick = reverse("client_kick", args=["acme", LIVE_CLIENT])
    pages = [
        (as_admin, "/clients/", ["client", "username", "node"]),
        (as_alice, "/tenants/acme/clients/", ["client", "username", "node"]),
        (as_alice, detail, ["client", "username", "node", "filter", "group", "listener"]),
        (as_alice, kick, ["client"]),
        (as_alice, "/tenants/acme/retained/", ["topic"]),
        (as_alice, "/tenants/acme/retained/message/?topic=" + escape_q(LIVE_TOPIC), ["topic", "payload",
                                                                                     "content-type"]),
        (as_alice, "/tenants/acme/retained/delete/?topic=" + escape_q(LIVE_TOPIC), ["topic"]),
        (as_alice, "/tenants/acme/publish/?topic=" + escape_q(LIVE_TOPIC), ["topic"]),
        (as_admin, "/overview/", ["node"]),
    ]
    for client, url, shown in pages:
        html = page(client, url)
        for n in ("client", "username", "node", "filter", "group", "listener", "topic", "payload", "content-type"):
            check(html, n, shown=n in shown, where=url)
    # an error brokerd answers is shown as a message, escaped
    response = as_alice.post(reverse("client_subscribe", args=["acme", LIVE_CLIENT]), {"filter": "a/#", "qos": "0"})
    check(response.content.decode(), "api-error", where="subscribe error")
    response = as_alice.post(reverse("publish", args=["acme"]), {"topic": "plain/topic", "payload": xss(28),
                                                                "qos": "0"}, follow=True)
    check(response.content.decode(), 28, shown=False, where="after publishing")


def test_publish_keeps_the_topic_it_sent_to(monkeypatch, as_alice, acme):
    """After a publish the form is filled in again with the same topic (was: the topic went
    into the redirect's query string as it was -- "a&topic=b %25/c" came back as "b %/c")."""
    fake_brokerd(monkeypatch)
    for topic in ("a&topic=b %25/c", xss(36)):
        response = as_alice.post(reverse("publish", args=["acme"]), {"topic": topic, "payload": "x", "qos": "0"})
        assert response.status_code == 302
        html = page(as_alice, response["Location"])
        assert f'name="topic" value="{escape(topic)}"' in html


def escape_q(value: str) -> str:
    from urllib.parse import quote

    return quote(value, safe="")


def test_brokerd_audit_rows(as_admin, as_alice, acme):
    """Rows brokerd writes for its API's writes: actor, topic, before/after JSON with payloads."""
    AuditEvent.objects.create(at=timezone.now(), actor=f"console:alice (via api-token:{xss(29)})", source="api",
                              action="message.publish", object_type="topic", object_id=xss(30), tenant="acme",
                              before=None, after=json.dumps({"topic": xss(30), "payload": xss(31)}))
    AuditEvent.objects.create(at=timezone.now(), actor="api-token:ops", source="api", action="client.kick",
                              object_type="client", object_id=xss(32), tenant="acme",
                              before=json.dumps({"client_id": xss(32), "username": xss(33)}), after=None)
    # a row that is not JSON (another writer): shown as text
    AuditEvent.objects.create(at=timezone.now(), actor="cli", source="cli", action="x", object_type="x",
                              object_id="1", tenant="acme", before=xss(34), after=None)
    for client, url in ((as_admin, "/audit/"), (as_alice, "/tenants/acme/audit/"),
                        (as_admin, "/audit/?actor=" + escape_q(xss(35)))):
        html = page(client, url)
        check(html, 29, shown="actor=" not in url, where=url)
        check(html, 30, shown="actor=" not in url, where=url)
        for n in (31, 33):
            check(html, n, in_json=True, shown="actor=" not in url, where=url)
        check(html, 34, shown="actor=" not in url, where=url)
        check(html, 35, shown="actor=" in url, where=url)


# ------------------------------------------------------------ every page, every payload at once


@pytest.fixture
def hostile(monkeypatch, acme, globex, people):
    """acme and globex with a payload in every field that takes one; the world of test_authorization."""
    fake_brokerd(monkeypatch)
    for tenant in (acme, globex):
        services.update_tenant(tenant, name=xss(f"name-{tenant.slug}"))
        device = tenant.test_credential.device
        # (a CN names one device on the platform: each tenant's its own)
        services.update_device(device, description=xss("description"), cert_cn=xss(f"cn-{tenant.slug}"))
        services.create_credential(device, label=xss("label"))
        services.add_acl_rule(tenant, topic=xss("acl"), action="both", allow=True, device=device)
        user = get_user_model().objects.create_user(xss(f"user-{tenant.slug}"))
        Membership.objects.create(user=user, tenant=tenant, role=Membership.Role.VIEWER)
        Alarm.objects.create(kind="drops", subject=xss(f"subject-{tenant.slug}"), tenant=tenant, tenant_slug=tenant.slug,
                             message=xss("alarm"), raised_at=timezone.now())
        AuditEvent.objects.create(at=timezone.now(), actor=xss("actor"), source="api", action="message.publish",
                                  object_type="topic", object_id=xss("object"), tenant=tenant.slug,
                                  after=json.dumps({"payload": xss("after")}))
    ApiToken.issue(xss("token"), "read")
    Alarm.objects.create(kind="node_down", subject=xss("node-subject"), message=xss("node-alarm"),
                         raised_at=timezone.now())
    world = build_world(acme, globex)
    for slug in ("acme", "globex"):
        run = ReportRun.objects.get(pk=world[slug]["run"])
        run.result["top_topics"][0]["topic"] = xss("report-topic")
        run.save()
    return world


MARKERS = ("<script>alert(", "<img src=x onerror=alert(")


def test_no_page_carries_a_raw_payload(hostile, clients):
    checked, shown, wrong = 0, 0, []
    for name, tries in TABLE.items():
        for t in tries:
            if t.method != "GET":
                continue
            tenant_scoped = t.kind in TENANT_KINDS or name in TENANT_SCOPED
            for slug in ("acme", "globex") if tenant_scoped else (None,):
                objects = {**hostile[None], **(hostile[slug] if slug else {})}
                kwargs = {k: objects[v] for k, v in t.args.items()}
                if slug:
                    kwargs = {"slug": slug, **kwargs}
                url = reverse(name, kwargs=kwargs) + (f"?{t.query}" if t.query else "")
                for who in ("admin", "alice", "bob"):
                    response = clients[who].get(url)
                    if not response.get("Content-Type", "").startswith("text/html"):
                        continue                # CSV downloads, JSON history: not pages
                    html = response.content.decode()
                    checked += response.status_code == 200
                    shown += "&lt;script&gt;alert(" in html
                    if any(m in html for m in MARKERS):
                        wrong.append(f"{who} {url} ({response.status_code})")
    assert not wrong, "raw payloads on: " + ", ".join(wrong)
    assert checked > 100 and shown > 80, (checked, shown)     # the pages were there, and showed payloads
