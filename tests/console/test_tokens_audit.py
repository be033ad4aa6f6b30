"""API tokens, the audit log, CSRF and output escaping.

Tokens: the secret (``bkd_...``) is shown once and stored as a hash that
brokerd's own check accepts until the token is revoked; tenant users get 403.
Audit: every console change is a row (who, what, before/after); the pages
filter; a tenant administrator sees only her tenant's rows; nothing in the
console edits or deletes a row.
"""

import datetime as dt
import json
import re

import pytest
from django.test import Client
from django.urls import get_resolver
from django.utils import timezone

from brokerd.admin.endpoints import AdminTokens
from console.models import ApiToken, hash_token
from core.models import AuditEvent
from tenants import services
from tenants.models import AclRule, Device, Membership, Tenant

from .conftest import HTMX


def broker_check(secret):
    """What a brokerd node decides for this bearer token, from the table it reads."""
    tokens = AdminTokens()
    tokens.replace(ApiToken.objects.values_list("id", "name", "token_hash", "scope", "revoked"))
    return tokens.check(secret)


def shown_secret(response) -> str:
    assert response.status_code == 200 and response["Cache-Control"] == "no-store"
    (secret,) = re.findall(r'<code id="secret">([^<]+)</code>', response.content.decode())
    return secret


# ---------------------------------------------------------------- API tokens


def test_create_shows_the_token_once(as_admin):
    response = as_admin.post("/tokens/new/", {"name": "grafana", "scope": "read"})
    secret = shown_secret(response)
    assert secret.startswith("bkd_") and len(secret) > 40
    token = ApiToken.objects.get(name="grafana")
    assert token.token_hash == hash_token(secret) and secret not in token.token_hash
    assert (token.scope, token.revoked, token.created_by.username) == ("read", False, "root")
    assert broker_check(secret).name == "grafana"
    page = as_admin.get("/tokens/").content.decode()
    assert "grafana" in page and "read only" in page
    assert secret not in page and secret[4:] not in page and token.token_hash not in page
    event = AuditEvent.objects.get(action="token.create")
    assert json.loads(event.after) == {"name": "grafana", "scope": "read", "revoked": False}
    assert secret not in event.after and event.tenant is None


def test_token_name_errors_are_inline(as_admin):
    ApiToken.issue("deploy", "write")
    for name, error in (("deploy", "already exists"), ("", "This field is required."),
                        ("   ", "This field is required.")):
        response = as_admin.post("/tokens/new/", {"name": name, "scope": "write"})
        assert response.status_code == 200 and error in response.content.decode()
    response = as_admin.post("/tokens/new/", {"name": "x", "scope": "admin"})
    assert "Select a valid choice" in response.content.decode()
    assert ApiToken.objects.count() == 1 and not AuditEvent.objects.exists()


def test_revoke(as_admin):
    token, secret = ApiToken.issue("deploy", "write")
    page = as_admin.get(f"/tokens/{token.pk}/revoke/").content.decode()
    assert "Revoke token deploy?" in page
    token.refresh_from_db()
    assert not token.revoked and broker_check(secret) is not None            # a GET revokes nothing

    response = as_admin.post(f"/tokens/{token.pk}/revoke/")
    assert response.status_code == 302 and response["Location"] == "/tokens/"
    token.refresh_from_db()
    assert token.revoked and token.revoked_at is not None
    assert broker_check(secret) is None
    page = as_admin.get("/tokens/").content.decode()
    assert "Token deploy revoked" in page and ">revoked<" in page
    assert f"/tokens/{token.pk}/revoke/" not in page                        # nothing left to revoke
    event = AuditEvent.objects.get(action="token.revoke")
    assert json.loads(event.before)["revoked"] is False and json.loads(event.after)["revoked"] is True

    as_admin.post(f"/tokens/{token.pk}/revoke/")                              # again: an error, no row
    assert "already revoked" in as_admin.get("/tokens/").content.decode()
    assert AuditEvent.objects.filter(action="token.revoke").count() == 1


def test_unknown_token_is_not_found(as_admin):
    assert as_admin.post("/tokens/999/revoke/").status_code == 404


@pytest.mark.parametrize("who", ["alice", "bob"])
def test_tenant_users_get_403_and_change_nothing(clients, who):
    token, secret = ApiToken.issue("deploy", "write")
    c = clients[who]
    assert c.get("/tokens/").status_code == 403
    assert c.get("/tokens/new/").status_code == 403
    assert c.post("/tokens/new/", {"name": "mine", "scope": "write"}).status_code == 403
    assert c.get(f"/tokens/{token.pk}/revoke/").status_code == 403
    assert c.post(f"/tokens/{token.pk}/revoke/").status_code == 403
    assert list(ApiToken.objects.values_list("name", "revoked")) == [("deploy", False)]
    assert broker_check(secret) is not None and not AuditEvent.objects.exists()


# ---------------------------------------------------------------- the audit log


def event(action, *, actor="root", tenant="acme", at=None, object_id="x"):
    return AuditEvent.objects.create(at=at or timezone.now(), actor=actor, source="console", action=action,
                                     object_type=action.split(".")[0], object_id=object_id, tenant=tenant)


def listed(page) -> list[str]:
    """The object ids of the rows shown, top to bottom."""
    return re.findall(r'<span class="mono">([^<]*)</span></td>', page)


@pytest.fixture
def log(db):
    day = dt.timedelta(days=1)
    now = timezone.now()
    # the tenants existed before their events (a tenant's log starts when it was created)
    Tenant.objects.update(created_at=now - 30 * day)
    event("device.create", actor="alice", object_id="e1", at=now - 10 * day)
    event("device.delete", actor="alice", object_id="e2", at=now - 5 * day)
    event("acl.add", actor="root", object_id="e3", at=now - 2 * day)
    event("device.create", actor="bob", tenant="globex", object_id="e4", at=now - day)
    event("token.create", actor="root", tenant=None, object_id="e5", at=now)
    return now


@pytest.mark.parametrize(("query", "expected"), [
    ({}, ["e5", "e4", "e3", "e2", "e1"]),
    ({"actor": "alice"}, ["e2", "e1"]),
    ({"actor": "ROO"}, ["e5", "e3"]),
    ({"action": "device."}, ["e4", "e2", "e1"]),
    ({"action": "device.create"}, ["e4", "e1"]),
    ({"tenant": "globex"}, ["e4"]),
    ({"object_type": "token"}, ["e5"]),
    ({"action": "device.", "tenant": "acme"}, ["e2", "e1"]),
    ({"action": "nothing"}, []),
])
def test_platform_audit_filters(as_admin, log, query, expected):
    page = as_admin.get("/audit/", query).content.decode()
    assert listed(page) == expected
    fragment = as_admin.get("/audit/", query, **HTMX).content.decode()
    assert fragment.startswith('<div id="audit-table">') and "<html" not in fragment
    assert listed(fragment) == expected
    if not expected:
        assert "No events match these filters" in fragment


def test_platform_audit_date_filters(as_admin, log):
    def ids(**q):
        return listed(as_admin.get("/audit/", {k: v.isoformat() for k, v in q.items()}).content.decode())

    today = log.date()
    assert ids(since=today - dt.timedelta(days=2)) == ["e5", "e4", "e3"]
    assert ids(until=today - dt.timedelta(days=5)) == ["e2", "e1"]
    assert ids(since=today - dt.timedelta(days=5), until=today - dt.timedelta(days=2)) == ["e3", "e2"]
    assert ids(since=today, until=today) == ["e5"]


def test_paging_keeps_the_filters(as_admin, db):
    for i in range(60):
        event("device.create", object_id=f"d{i:02}", at=timezone.now() - dt.timedelta(minutes=i))
    event("acl.add", object_id="other")
    page = as_admin.get("/audit/", {"action": "device."}).content.decode()
    assert len(listed(page)) == 50 and "1–50 of 60" in page
    assert "?action=device.&amp;page=2" in page
    page = as_admin.get("/audit/", {"action": "device.", "page": "2"}).content.decode()
    assert listed(page) == [f"d{i:02}" for i in range(50, 60)]


def test_a_bad_date_is_an_inline_error(as_admin, log):
    page = as_admin.get("/audit/", {"since": "yesterday"}).content.decode()
    assert "Enter a valid date." in page


def test_tenant_audit_shows_only_its_tenant(as_alice, log):
    page = as_alice.get("/tenants/acme/audit/").content.decode()
    assert listed(page) == ["e3", "e2", "e1"]
    # no tenant filter to widen it, and a forged one is ignored
    assert 'name="tenant"' not in page
    assert listed(as_alice.get("/tenants/acme/audit/", {"tenant": "globex"}).content.decode()) == ["e3", "e2", "e1"]
    assert listed(as_alice.get("/tenants/acme/audit/", {"actor": "root"}).content.decode()) == ["e3"]
    fragment = as_alice.get("/tenants/acme/audit/", {"action": "device."}, **HTMX).content.decode()
    assert fragment.startswith('<div id="audit-table">') and listed(fragment) == ["e2", "e1"]


def test_tenant_audit_is_for_administrators(as_bob, as_alice, log):
    assert as_bob.get("/tenants/globex/audit/").status_code == 403
    assert as_alice.get("/tenants/globex/audit/").status_code == 404
    assert as_alice.get("/audit/").status_code == 403


def test_console_changes_are_all_in_the_log(as_alice, acme, alice):
    """One walk through the tenant pages; each change is one row naming alice."""
    cred = acme.test_credential
    rule = acme.acl_rules.get(position=2)
    dave = Membership.objects.create(user=type(alice).objects.create_user("dave"), tenant=acme, role="viewer")
    steps = [
        ("/tenants/acme/devices/new/", {"name": "d1", "with_credential": "on"}, ["device.create", "credential.create"]),
        ("/tenants/acme/devices/d1/edit/", {"description": "new"}, ["device.update"]),
        ("/tenants/acme/devices/d1/disable/", {}, ["device.disable"]),
        ("/tenants/acme/devices/d1/enable/", {}, ["device.enable"]),
        ("/tenants/acme/devices/sensor-1/credentials/new/", {}, ["credential.create"]),
        (f"/tenants/acme/devices/sensor-1/credentials/{cred.pk}/rotate/", {}, ["credential.rotate"]),
        (f"/tenants/acme/devices/sensor-1/credentials/{cred.pk}/disable/", {}, ["credential.disable"]),
        (f"/tenants/acme/devices/sensor-1/credentials/{cred.pk}/enable/", {}, ["credential.enable"]),
        (f"/tenants/acme/devices/sensor-1/credentials/{cred.pk}/expire/", {"when": "now"}, ["credential.expire"]),
        (f"/tenants/acme/devices/sensor-1/credentials/{cred.pk}/delete/", {}, ["credential.delete"]),
        ("/tenants/acme/acl/new/", {"who": "all", "action": "both", "topic": "a/#", "allow": "allow"}, ["acl.add"]),
        (f"/tenants/acme/acl/{rule.pk}/edit/", {"who": "all", "action": "both", "topic": "b/#", "allow": "deny"},
         ["acl.update"]),
        (f"/tenants/acme/acl/{rule.pk}/move/", {"direction": "up"}, ["acl.move"]),
        (f"/tenants/acme/acl/{rule.pk}/delete/", {}, ["acl.delete"]),
        ("/tenants/acme/quotas/", {"which": "own", "own-max_queued": "9"}, ["own_quota.update"]),
        ("/tenants/acme/members/", {"username": "erin", "password": "a-Long-passw0rd", "role": "viewer"},
         ["member.add"]),
        (f"/tenants/acme/members/{dave.pk}/role/", {"role": "admin"}, ["member.role"]),
        (f"/tenants/acme/members/{dave.pk}/remove/", {}, ["member.remove"]),
        ("/tenants/acme/devices/d1/delete/", {}, ["device.delete"]),
    ]
    for url, data, expected in steps:
        first = AuditEvent.objects.count()
        response = as_alice.post(url, data)
        assert response.status_code in (200, 302), url
        new = AuditEvent.objects.order_by("id")[first:]
        assert [e.action for e in new] == expected, url
        for e in new:
            assert (e.actor, e.source, e.tenant, e.remote_addr) == ("alice", "console", "acme", "127.0.0.1")
            assert e.before or e.after
    page = as_alice.get("/tenants/acme/audit/").content.decode()
    assert "device.create" in page and "member.remove" in page and "before / after" in page


def test_the_log_cannot_be_changed_from_the_console(as_admin, as_alice, log):
    rows = list(AuditEvent.objects.values())
    routes = [str(p.pattern) for p in get_resolver().url_patterns] + [
        str(p.pattern) for p in get_resolver().resolve("/tenants/acme/").tried[-1][0].url_patterns]
    assert [r for r in routes if "audit" in r] == ["audit/", "audit/"]         # list pages only, no row URLs
    e1 = AuditEvent.objects.get(object_id="e1")
    for url in (f"/audit/{e1.pk}/", f"/audit/{e1.pk}/delete/", f"/audit/{e1.pk}/edit/"):
        assert as_admin.post(url).status_code == 404
    for client, url in ((as_admin, "/audit/"), (as_admin, "/tenants/acme/audit/"), (as_alice, "/tenants/acme/audit/")):
        for method in (client.post, client.put, client.delete, client.patch):
            assert method(url, {"id": e1.pk, "action": "forged"}).status_code == 405, (url, method)
    assert list(AuditEvent.objects.values()) == rows


# ---------------------------------------------------------------- CSRF


@pytest.fixture
def csrf_alice(alice):
    c = Client(enforce_csrf_checks=True)
    c.force_login(alice)
    return c


def csrf_token(client, url) -> str:
    return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', client.get(url).content.decode()).group(1)


@pytest.mark.parametrize(("url", "data"), [
    ("/tenants/acme/devices/new/", {"name": "forged", "with_credential": "on"}),
    ("/tenants/acme/devices/sensor-1/disable/", {}),
    ("/tenants/acme/devices/sensor-1/delete/", {}),
    ("/tenants/acme/acl/new/", {"who": "all", "action": "both", "topic": "#", "allow": "allow"}),
    ("/tenants/acme/quotas/", {"which": "own", "own-max_connections": "1"}),
    ("/tenants/acme/members/", {"username": "mallory", "password": "a-Long-passw0rd", "role": "admin"}),
])
def test_post_without_csrf_token_is_refused(csrf_alice, acme, url, data):
    before = (Device.objects.count(), list(Device.objects.values_list("enabled", flat=True)),
              AclRule.objects.count(), Membership.objects.count())
    assert csrf_alice.post(url, data).status_code == 403
    assert csrf_alice.post(url, data, **HTMX).status_code == 403
    assert (Device.objects.count(), list(Device.objects.values_list("enabled", flat=True)),
            AclRule.objects.count(), Membership.objects.count()) == before
    assert not AuditEvent.objects.exists()


def test_post_with_the_pages_csrf_token_works(csrf_alice, acme):
    token = csrf_token(csrf_alice, "/tenants/acme/devices/new/")
    response = csrf_alice.post("/tenants/acme/devices/new/", {"name": "real", "csrfmiddlewaretoken": token})
    assert response.status_code == 302 and Device.objects.filter(name="real").exists()
    # htmx sends the token as a header (hx-headers on <body>)
    page = csrf_alice.get("/tenants/acme/acl/").content.decode()
    header = json.loads(re.search(r"hx-headers='([^']+)'", page).group(1))["X-CSRFToken"]
    response = csrf_alice.post("/tenants/acme/acl/new/", {"who": "all", "action": "both", "topic": "h/#",
                                                          "allow": "allow"}, HTTP_X_CSRFTOKEN=header, **HTMX)
    assert response.status_code == 200 and AclRule.objects.filter(topic="h/#").exists()


def test_token_post_without_csrf_is_refused(platform_admin):
    c = Client(enforce_csrf_checks=True)
    c.force_login(platform_admin)
    assert c.post("/tokens/new/", {"name": "forged", "scope": "write"}).status_code == 403
    assert not ApiToken.objects.exists()


# ---------------------------------------------------------------- escaping

XSS = "<script>alert(1)</script>"
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"


def test_device_description_is_escaped_everywhere(as_alice, acme):
    as_alice.post("/tenants/acme/devices/sensor-1/edit/", {"description": XSS})
    assert Device.objects.get(name="sensor-1").description == XSS
    for url in ("/tenants/acme/devices/sensor-1/", "/tenants/acme/devices/", "/tenants/acme/devices/?q=script",
                "/tenants/acme/devices/sensor-1/edit/", "/tenants/acme/audit/"):
        page = as_alice.get(url).content.decode()
        assert XSS not in page and "<script>alert" not in page, url
        assert "&lt;script&gt;" in page, url


def test_search_terms_and_names_are_escaped(as_admin, acme):
    services.update_tenant(acme, name=XSS)
    ApiToken.issue(XSS, "read")
    for url in ("/tenants/acme/", "/tenants/", "/tokens/", f"/tokens/{ApiToken.objects.get().pk}/revoke/",
                f"/tenants/acme/devices/?q={XSS}", f"/audit/?actor={XSS}"):
        page = as_admin.get(url).content.decode()
        assert "<script>alert" not in page, url
    assert ESCAPED in as_admin.get("/tokens/").content.decode()
