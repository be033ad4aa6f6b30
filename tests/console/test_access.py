"""Who may open what: every page with the platform admin, alice (admin of
acme), bob (viewer of globex) and an anonymous visitor.

A tenant the user has no membership of does not exist for them (404, never
403 or data); a viewer's writes and tenant users on platform pages get 403;
anonymous visitors are sent to the login page.
"""

import re

import pytest

from tenants.models import Membership

from .conftest import HTMX

# (url, admin, alice, bob); {cred} {rule} are acme's, {gcred} {grule} {gmember} globex's
PAGES = [
    ("/", 200, 302, 302),
    ("/overview/", 200, 403, 403),
    ("/tenants/", 200, 200, 200),
    ("/tenants/new/", 200, 403, 403),
    ("/clients/", 200, 403, 403),
    ("/audit/", 200, 403, 403),
    ("/tokens/", 200, 403, 403),
    ("/tokens/new/", 200, 403, 403),
    ("/account/password/", 200, 200, 200),
    # acme: alice administers it, bob does not exist there
    ("/tenants/acme/", 200, 200, 404),
    ("/tenants/acme/edit/", 200, 403, 403),
    ("/tenants/acme/delete/", 200, 403, 403),
    ("/tenants/acme/devices/", 200, 200, 404),
    ("/tenants/acme/devices/new/", 200, 200, 404),
    ("/tenants/acme/devices/sensor-1/", 200, 200, 404),
    ("/tenants/acme/devices/sensor-1/edit/", 200, 200, 404),
    ("/tenants/acme/devices/sensor-1/delete/", 200, 200, 404),
    ("/tenants/acme/devices/sensor-1/credentials/new/", 200, 200, 404),
    ("/tenants/acme/devices/sensor-1/credentials/{cred}/rotate/", 200, 200, 404),
    ("/tenants/acme/devices/sensor-1/credentials/{cred}/expire/", 200, 200, 404),
    ("/tenants/acme/devices/sensor-1/credentials/{cred}/delete/", 200, 200, 404),
    ("/tenants/acme/acl/", 200, 200, 404),
    ("/tenants/acme/acl/{rule}/edit/", 200, 200, 404),
    ("/tenants/acme/acl/{rule}/delete/", 200, 200, 404),
    ("/tenants/acme/acl/check/?device=sensor-1&action=publish&topic=a", 200, 200, 404),
    ("/tenants/acme/quotas/", 200, 200, 404),
    ("/tenants/acme/system-topics/", 200, 200, 404),
    ("/tenants/acme/members/", 200, 200, 404),
    ("/tenants/acme/audit/", 200, 200, 404),
    ("/tenants/acme/clients/", 200, 200, 404),
    ("/tenants/acme/clients/dev-1/", 200, 200, 404),
    ("/tenants/acme/clients/dev-1/kick/", 200, 200, 404),
    ("/tenants/acme/retained/", 200, 200, 404),
    ("/tenants/acme/retained/message/?topic=a/b", 200, 200, 404),
    ("/tenants/acme/retained/delete/?topic=a/b", 200, 200, 404),
    ("/tenants/acme/publish/", 200, 200, 404),
    # globex: bob only reads it, alice does not exist there
    ("/tenants/globex/", 200, 404, 200),
    ("/tenants/globex/devices/", 200, 404, 200),
    ("/tenants/globex/devices/plant-1/", 200, 404, 200),
    ("/tenants/globex/devices/new/", 200, 404, 403),
    ("/tenants/globex/devices/plant-1/edit/", 200, 404, 403),
    ("/tenants/globex/devices/plant-1/delete/", 200, 404, 403),
    ("/tenants/globex/devices/plant-1/credentials/new/", 200, 404, 403),
    ("/tenants/globex/devices/plant-1/credentials/{gcred}/rotate/", 200, 404, 403),
    ("/tenants/globex/devices/plant-1/credentials/{gcred}/expire/", 200, 404, 403),
    ("/tenants/globex/acl/", 200, 404, 200),
    ("/tenants/globex/acl/{grule}/edit/", 200, 404, 403),
    ("/tenants/globex/acl/{grule}/delete/", 200, 404, 403),
    ("/tenants/globex/quotas/", 200, 404, 200),
    ("/tenants/globex/system-topics/", 200, 404, 200),
    ("/tenants/globex/members/", 200, 404, 200),
    ("/tenants/globex/members/{gmember}/remove/", 200, 404, 403),
    ("/tenants/globex/audit/", 200, 404, 403),
    ("/tenants/globex/clients/", 200, 404, 200),
    ("/tenants/globex/clients/dev-1/kick/", 200, 404, 403),
    ("/tenants/globex/retained/", 200, 404, 200),
    ("/tenants/globex/retained/delete/?topic=a", 200, 404, 403),
    ("/tenants/globex/publish/", 200, 404, 200),
    # guessing: another tenant's objects through one's own tenant
    ("/tenants/acme/devices/plant-1/", 404, 404, 404),
    ("/tenants/acme/devices/sensor-1/credentials/{gcred}/rotate/", 404, 404, 404),
    ("/tenants/acme/acl/{grule}/edit/", 404, 404, 404),
    ("/tenants/acme/members/{gmember}/remove/", 404, 404, 404),
    ("/tenants/no-such-tenant/", 404, 404, 404),
    ("/tenants/no-such-tenant/devices/", 404, 404, 404),
]


@pytest.fixture
def ids(acme, globex, bob):
    return {
        "cred": acme.test_credential.pk,
        "rule": acme.acl_rules.first().pk,
        "gcred": globex.test_credential.pk,
        "grule": globex.acl_rules.first().pk,
        "gmember": Membership.objects.get(user=bob).pk,
    }


@pytest.mark.parametrize(("url", "as_admin", "as_alice", "as_bob"), PAGES, ids=[p[0] for p in PAGES])
def test_page_access(clients, ids, url, as_admin, as_alice, as_bob):
    url = url.format(**ids)
    got = {who: clients[who].get(url).status_code for who in ("admin", "alice", "bob")}
    assert got == {"admin": as_admin, "alice": as_alice, "bob": as_bob}


@pytest.mark.parametrize("url", [p[0] for p in PAGES if p[0] != "/"])
def test_anonymous_goes_to_login(clients, ids, url):
    response = clients["anonymous"].get(url.format(**ids))
    assert response.status_code == 302
    assert response["Location"].startswith("/login/?next=")


def test_home_of_tenant_users_is_their_tenant(clients):
    assert clients["alice"].get("/")["Location"] == "/tenants/acme/"
    assert clients["bob"].get("/")["Location"] == "/tenants/globex/"


def test_user_of_several_tenants_gets_a_picker(clients, alice, globex):
    Membership.objects.create(user=alice, tenant=globex, role=Membership.Role.VIEWER)
    page = clients["alice"].get("/")
    assert page.status_code == 200
    assert b"Your tenants" in page.content
    assert b'href="/tenants/acme/"' in page.content and b'href="/tenants/globex/"' in page.content


def test_user_without_tenants_is_told_so(db, django_user_model):
    from django.test import Client

    c = Client()
    c.force_login(django_user_model.objects.create_user("carol", password="x-long-password-1"))
    page = c.get("/")
    assert page.status_code == 200
    assert b"not a member of any tenant" in page.content


def test_tenant_list_shows_only_own_tenants(clients):
    alice = clients["alice"].get("/tenants/").content.decode()
    assert "acme" in alice and "globex" not in alice
    admin = clients["admin"].get("/tenants/").content.decode()
    assert "acme" in admin and "globex" in admin


# writes a viewer may not make (403), and nothing changes
VIEWER_WRITES = [
    ("/tenants/globex/devices/new/", {"name": "x1", "with_credential": "on"}),
    ("/tenants/globex/devices/plant-1/disable/", {}),
    ("/tenants/globex/devices/plant-1/delete/", {}),
    ("/tenants/globex/devices/plant-1/credentials/{gcred}/rotate/", {}),
    ("/tenants/globex/devices/plant-1/credentials/{gcred}/disable/", {}),
    ("/tenants/globex/acl/new/", {"who": "all", "action": "both", "topic": "x/#", "allow": "allow"}),
    ("/tenants/globex/acl/{grule}/move/", {"direction": "down"}),
    ("/tenants/globex/acl/{grule}/delete/", {}),
    ("/tenants/globex/quotas/", {"which": "own", "own-max_connections": "3"}),
    ("/tenants/globex/system-topics/", {"enabled": "on", "interval": "5"}),
    ("/tenants/globex/members/", {"username": "mallory", "password": "a-Long-passw0rd", "role": "admin"}),
    ("/tenants/globex/members/{gmember}/role/", {"role": "admin"}),
    ("/tenants/globex/clients/dev-1/kick/", {}),
    ("/tenants/globex/clients/dev-1/subscriptions/", {"filter": "a/#", "qos": "0"}),
    ("/tenants/globex/retained/delete/", {"topic": "a"}),
    ("/tenants/globex/publish/", {"topic": "a", "payload": "x", "qos": "0"}),
]


@pytest.mark.parametrize(("url", "data"), VIEWER_WRITES, ids=[w[0] for w in VIEWER_WRITES])
def test_viewer_writes_are_forbidden(clients, ids, globex, url, data):
    before = (globex.devices.count(), globex.acl_rules.count(), list(globex.devices.values("enabled")),
              Membership.objects.count())
    response = clients["bob"].post(url.format(**ids), {k: v.format(**ids) for k, v in data.items()})
    assert response.status_code == 403
    assert (globex.devices.count(), globex.acl_rules.count(), list(globex.devices.values("enabled")),
            Membership.objects.count()) == before


@pytest.mark.parametrize(("url", "data"), VIEWER_WRITES[:9], ids=[w[0] for w in VIEWER_WRITES[:9]])
def test_outsider_writes_are_not_found(clients, ids, url, data):
    response = clients["alice"].post(url.format(**ids), data)
    assert response.status_code == 404


def test_tenant_admin_cannot_use_platform_writes(clients, acme):
    assert clients["alice"].post("/tenants/new/", {"slug": "evil", "default_acl": "allow"}).status_code == 403
    assert clients["alice"].post("/tenants/acme/suspend/").status_code == 403
    assert clients["alice"].post("/tenants/acme/delete/", {"confirm": "acme"}).status_code == 403
    assert clients["alice"].post("/tokens/new/", {"name": "t", "scope": "write"}).status_code == 403
    acme.refresh_from_db()
    assert acme.status == "active"


def test_error_pages_are_styled(clients):
    page = clients["alice"].get("/tenants/globex/")
    assert page.status_code == 404
    assert b"There is nothing here" in page.content and b"console.css" in page.content
    page = clients["bob"].get("/tokens/")
    assert page.status_code == 403
    assert b"Your role does not allow this" in page.content


def test_fragments_have_no_layout(clients):
    page = clients["admin"].get("/tenants/?q=acme", **HTMX)
    assert page.status_code == 200
    assert b"<html" not in page.content and b'id="tenant-table"' in page.content


def test_a_403_is_logged_as_one_line_without_a_traceback(clients, acme, caplog):
    """A refused request is an answer, not a fault: every 403 logged a full traceback."""
    with caplog.at_level("WARNING", logger="django.request"):
        assert clients["alice"].post("/tenants/acme/suspend/").status_code == 403
    (record,) = [r for r in caplog.records if r.name == "django.request"]
    assert record.getMessage() == "Forbidden (Permission denied): /tenants/acme/suspend/"
    assert record.exc_info is None and "Traceback" not in caplog.text


def test_the_console_names_its_icon(clients):
    page = clients["alice"].get("/tenants/acme/").content.decode()
    assert '<link rel="icon" href="/static/console/favicon.svg" type="image/svg+xml">' in page
    response = clients["alice"].get("/favicon.ico")
    assert response.status_code == 301 and response["Location"] == "/static/console/favicon.svg"


def test_a_platform_administrator_switches_tenant_from_the_top_bar(clients, acme):
    """"All tenants" in the top bar looked like a switch and was text: now it is one."""
    page = clients["admin"].get("/overview/").content.decode()
    bar = page.split('<header class="topbar">', 1)[1].split("</header>", 1)[0]
    assert '<select data-navigate aria-label="Switch tenant">' in bar
    assert '<option value="/overview/" selected>All tenants</option>' in bar
    assert '<option value="/tenants/acme/">acme</option>' in bar and '<option value="/tenants/globex/">globex</option>' in bar
    on_acme = clients["admin"].get("/tenants/acme/").content.decode()
    assert '<option value="/tenants/acme/" selected>acme</option>' in on_acme


def test_the_switch_offers_the_list_past_fifty_tenants(clients, acme):
    from tenants.models import Tenant

    Tenant.objects.bulk_create([Tenant(slug=f"t{i:03d}") for i in range(60)])
    page = clients["admin"].get("/overview/").content.decode()
    assert len(re.findall(r'<option value="/tenants/[^"]+/">', page)) == 50
    assert '<option value="/tenants/">More tenants…</option>' in page


def test_a_change_of_membership_holds_at_the_next_request_of_an_open_session(clients, alice, acme):
    """Roles are read at every request, never kept in the session: a member demoted to viewer may
    no longer write, one removed no longer sees the tenant (pages and htmx fragments), a user
    deactivated is signed out -- at their very next request, in the session they already had."""
    client = clients["alice"]
    device = acme.devices.get(name="sensor-1")
    assert client.get("/tenants/acme/").status_code == 200
    Membership.objects.filter(user=alice, tenant=acme).update(role=Membership.Role.VIEWER)
    assert client.post("/tenants/acme/devices/sensor-1/disable/").status_code == 403
    device.refresh_from_db()
    assert device.enabled
    assert client.get("/tenants/acme/devices/").status_code == 200
    Membership.objects.filter(user=alice, tenant=acme).delete()
    assert client.get("/tenants/acme/").status_code == 404
    assert client.get("/tenants/acme/", **HTMX).status_code == 404
    assert client.get("/tenants/acme/metrics/history/?format=json").status_code == 404
    Membership.objects.create(user=alice, tenant=acme, role=Membership.Role.ADMIN)
    assert client.get("/tenants/acme/").status_code == 200
    alice.is_active = False
    alice.save(update_fields=["is_active"])
    response = client.get("/tenants/acme/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")
