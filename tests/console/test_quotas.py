"""Quotas, system-topic settings and members.

Quotas: platform administrators set the ceilings; a tenant administrator may
lower her tenant's own limits, never raise them above a ceiling (an inline
error, nothing changes); a viewer changes nothing (403). brokerd's snapshot
holds the smaller of the two, field by field.

Members: tenant administrators add members, change roles and remove them; a
tenant always keeps at least one administrator.
"""

import json
import re

import pytest
from django.test import Client

from core.models import AuditEvent
from tenants import services
from tenants.models import Membership, OwnQuota, Quota, SystemTopicSetting

from .conftest import HTMX, PASSWORD, policy

QUOTAS = "/tenants/acme/quotas/"


def own(**values):
    return {"which": "own", **{f"own-{k}": str(v) for k, v in values.items()}}


def ceiling(**values):
    return {"which": "ceiling", **{f"ceiling-{k}": str(v) for k, v in values.items()}}


def own_quota(tenant) -> dict:
    row = OwnQuota.objects.filter(tenant=tenant).first()
    return {} if row is None else {k: v for k, v in row.as_dict().items() if v is not None}


# ---------------------------------------------------------------- quotas


def test_platform_admin_sets_the_ceilings(as_admin, acme):
    response = as_admin.post(QUOTAS, ceiling(max_connections=100, client_msgs_in=50))
    assert response.status_code == 302 and response["Location"] == QUOTAS
    quota = Quota.objects.get(tenant=acme)
    assert (quota.max_connections, quota.client_msgs_in, quota.max_payload) == (100, 50, None)
    assert policy("acme")["quota"]["max_connections"] == 100
    assert policy("acme")["quota"]["max_payload"] is None
    page = as_admin.get(QUOTAS).content.decode()
    assert "Ceilings saved." in page and 'value="100"' in page
    event = AuditEvent.objects.get(action="quota.update")
    assert (event.actor, event.tenant) == ("root", "acme")
    assert json.loads(event.before)["max_connections"] is None and json.loads(event.after)["max_connections"] == 100


def test_tenant_admin_lowers_her_own_limit(as_alice, acme):
    services.update_quota(acme, max_connections=100)
    response = as_alice.post(QUOTAS, own(max_connections=10))
    assert response.status_code == 302
    assert own_quota(acme) == {"max_connections": 10}
    assert Quota.objects.get(tenant=acme).max_connections == 100           # the ceiling stays
    assert policy("acme")["quota"]["max_connections"] == 10
    page = as_alice.get(QUOTAS).content.decode()
    assert "Your limits saved." in page
    event = AuditEvent.objects.get(action="own_quota.update")
    assert json.loads(event.after)["max_connections"] == 10 and event.actor == "alice"


def test_tenant_admin_cannot_raise_above_the_ceiling(as_alice, acme):
    services.update_quota(acme, max_connections=100)
    services.update_own_quota(acme, max_connections=10)
    snapshot = policy("acme")
    for headers in ({}, HTMX):
        response = as_alice.post(QUOTAS, own(max_connections=500, client_msgs_in=5), **headers)
        assert response.status_code == 200
        page = response.content.decode()
        assert "May not exceed the ceiling of 100" in page and "has-error" in page
        assert 'value="500"' in page                       # what she typed stays in the form
    assert own_quota(acme) == {"max_connections": 10}       # nothing changed, not even client_msgs_in
    assert policy("acme") == snapshot
    assert not AuditEvent.objects.exists()


def test_up_to_the_ceiling_is_fine(as_alice, acme):
    services.update_quota(acme, max_connections=100)
    as_alice.post(QUOTAS, own(max_connections=100))
    assert own_quota(acme) == {"max_connections": 100}


def test_unlimited_ceiling_lets_the_tenant_choose(as_alice, acme):
    as_alice.post(QUOTAS, own(max_payload=1_000_000))
    assert policy("acme")["quota"]["max_payload"] == 1_000_000


@pytest.mark.parametrize("value", ["0", "-5", "many", "1.5"])
def test_bad_values_are_inline(as_alice, acme, value):
    response = as_alice.post(QUOTAS, {"which": "own", "own-max_connections": value})
    assert response.status_code == 200 and "has-error" in response.content.decode()
    assert own_quota(acme) == {}


def both(**values):
    """What the platform administrator's one Save posts: every field of both columns."""
    return {"which": "both", **{k.replace("__", "-"): str(v) for k, v in values.items()}}


def test_a_platform_administrators_page_saves_ceilings_and_own_limits_with_one_button(as_admin, acme):
    """Two forms mixed in one table: an own limit typed before "Save ceilings" was dropped
    while the page said "Ceilings saved"."""
    page = as_admin.get(QUOTAS).content.decode()
    assert page.count("<form id=\"quota-form\"") == 1 and 'name="which" value="both"' in page
    assert page.count('type="submit" form="quota-form"') == 1
    assert 'name="ceiling-max_connections"' in page and 'name="own-max_connections"' in page
    assert 'form="ceiling-form"' not in page and 'form="own-form"' not in page
    response = as_admin.post(QUOTAS, both(ceiling__max_connections=100, own__max_connections=10))
    assert response.status_code == 302
    assert Quota.objects.get(tenant=acme).max_connections == 100 and own_quota(acme) == {"max_connections": 10}
    assert policy("acme")["quota"]["max_connections"] == 10
    assert "Limits saved." in as_admin.get(QUOTAS).content.decode()
    assert sorted(AuditEvent.objects.values_list("action", flat=True)) == ["own_quota.update", "quota.update"]


def test_a_combined_save_with_an_error_saves_nothing_and_keeps_what_was_typed(as_admin, acme):
    for headers in ({}, HTMX):
        response = as_admin.post(QUOTAS, both(ceiling__max_connections=100, ceiling__max_queued=50,
                                              own__max_connections=500), **headers)
        page = response.content.decode()
        assert response.status_code == 200 and "May not exceed the ceiling of 100" in page
        assert 'value="500"' in page and 'value="100"' in page and 'value="50"' in page
    assert Quota.objects.get(tenant=acme).max_connections is None      # the ceilings were not saved either
    assert own_quota(acme) == {} and not AuditEvent.objects.exists()


def test_tenant_admin_cannot_set_the_ceilings(as_alice, acme):
    page = as_alice.get(QUOTAS).content.decode()
    assert 'name="ceiling-' not in page and 'name="own-max_connections"' in page
    response = as_alice.post(QUOTAS, ceiling(max_connections=1_000_000))
    assert response.status_code == 403
    assert Quota.objects.get(tenant=acme).max_connections is None
    assert not AuditEvent.objects.exists()


def test_viewer_reads_the_limits_and_cannot_change_them(as_bob, globex):
    services.update_quota(globex, max_connections=20)
    page = as_bob.get("/tenants/globex/quotas/").content.decode()
    assert "Read only" in page and "<form" not in page.split('id="quota-table"')[1]
    assert "20" in page
    for data in (own(max_connections=5), ceiling(max_connections=500)):
        assert as_bob.post("/tenants/globex/quotas/", data).status_code == 403
    assert own_quota(globex) == {} and Quota.objects.get(tenant=globex).max_connections == 20
    assert policy("globex")["quota"]["max_connections"] == 20


def test_lowering_a_ceiling_below_the_tenants_own_limit_takes_effect(as_admin, acme):
    services.update_own_quota(acme, max_queued=500)
    as_admin.post(QUOTAS, ceiling(max_queued=100))
    assert policy("acme")["quota"]["max_queued"] == 100
    page = as_admin.get(QUOTAS).content.decode()
    row = page.split("max queued", 1)[1].split("</tr>")[0]
    assert '<td class="num strong">100</td>' in row


def test_htmx_save_swaps_the_table(as_alice, acme):
    response = as_alice.post(QUOTAS, own(max_subscriptions=7), **HTMX)
    page = response.content.decode()
    assert response.status_code == 200 and page.lstrip().startswith('<div id="quota-table">') and "<html" not in page
    assert 'value="7"' in page and "Your limits saved." in page
    assert policy("acme")["quota"]["max_subscriptions"] == 7


def test_overview_shows_the_limits_in_force(as_alice, acme):
    services.update_quota(acme, max_connections=100)
    services.update_own_quota(acme, max_connections=40)
    page = as_alice.get("/tenants/acme/").content.decode()
    row = page.split("max connections", 1)[1].split("</tr>")[0]
    assert ">40<" in row


# ---------------------------------------------------------------- system topics


def test_platform_admin_changes_the_system_topics(as_admin, acme):
    response = as_admin.post("/tenants/acme/system-topics/", {"interval": "30", "parts": ["load", "clients"]})
    assert response.status_code == 302
    setting = SystemTopicSetting.objects.get(tenant=acme)
    assert (setting.enabled, setting.interval, list(setting.parts)) == (False, 30, ["clients", "load"])
    assert policy("acme")["sys"] == {"enabled": False, "interval": 30, "parts": ["clients", "load"]}
    assert "System topic settings saved." in as_admin.get("/tenants/acme/system-topics/").content.decode()
    event = AuditEvent.objects.get(action="system_topics.update")
    assert json.loads(event.before)["enabled"] is True and json.loads(event.after)["interval"] == 30


@pytest.mark.parametrize("data", [{"enabled": "on", "interval": "0"}, {"enabled": "on", "interval": ""},
                                  {"enabled": "on", "interval": "10", "parts": ["cpu"]}])
def test_bad_system_topic_settings_are_inline(as_admin, acme, data):
    response = as_admin.post("/tenants/acme/system-topics/", data)
    assert response.status_code == 200 and "has-error" in response.content.decode()
    assert policy("acme")["sys"]["interval"] == 10 and not AuditEvent.objects.exists()


def test_tenant_users_only_read_the_system_topics(as_alice, acme):
    page = as_alice.get("/tenants/acme/system-topics/").content.decode()
    assert "Read only" in page and "every 10 seconds" in page
    assert as_alice.post("/tenants/acme/system-topics/", {"interval": "1"}).status_code == 403
    assert policy("acme")["sys"]["interval"] == 10


# ---------------------------------------------------------------- members


MEMBERS = "/tenants/acme/members/"


def membership(username) -> Membership:
    return Membership.objects.select_related("user").get(user__username=username)


def test_tenant_admin_adds_a_member_who_can_sign_in(as_alice, acme):
    response = as_alice.post(MEMBERS, {"username": "dave", "email": "dave@acme.test", "password": PASSWORD,
                                       "role": "viewer"})
    assert response.status_code == 302 and response["Location"] == MEMBERS
    assert membership("dave").role == "viewer" and membership("dave").tenant == acme
    page = as_alice.get(MEMBERS).content.decode()
    assert "dave added as tenant viewer." in page and "dave@acme.test" in page
    c = Client()
    assert c.post("/login/", {"username": "dave", "password": PASSWORD}).status_code == 302
    assert c.get("/tenants/acme/devices/").status_code == 200
    assert c.post("/tenants/acme/devices/new/", {"name": "x"}).status_code == 403
    event = AuditEvent.objects.get(action="member.add")
    assert json.loads(event.after) == {"user": "dave", "email": "dave@acme.test", "role": "viewer"}
    assert PASSWORD not in (event.after or "")


@pytest.mark.parametrize(("data", "error"), [
    ({"username": "bob", "password": PASSWORD}, "is taken"),                 # tenant admins cannot adopt users
    ({"username": "erin", "password": ""}, "a new user needs an initial password"),
    ({"username": "erin", "password": "123"}, "too short"),
    ({"username": "", "password": PASSWORD}, "This field is required."),
    ({"username": "eve smith", "password": PASSWORD}, "Enter a valid username."),
    ({"username": "<b>eve</b>", "password": PASSWORD}, "Enter a valid username."),
])
def test_bad_members_are_inline(as_alice, acme, bob, data, error):
    response = as_alice.post(MEMBERS, {"role": "viewer", "email": "", **data})
    assert response.status_code == 200
    assert error.lower() in response.content.decode().replace("&#x27;", "'").lower()
    assert not Membership.objects.filter(tenant=acme).exclude(user__username="alice").exists()


def test_platform_admin_adds_an_existing_user(as_admin, acme, bob):
    as_admin.post(MEMBERS, {"username": "bob", "role": "admin", "email": "", "password": ""})
    assert Membership.objects.get(user=bob, tenant=acme).role == "admin"


def test_role_change(as_alice, acme, alice):
    dave = Membership.objects.create(user=type(alice).objects.create_user("dave"), tenant=acme, role="viewer")
    response = as_alice.post(f"{MEMBERS}{dave.pk}/role/", {"role": "admin"})
    assert response.status_code == 302 and response["Location"] == MEMBERS
    assert membership("dave").role == "admin"
    assert "dave is now tenant administrator." in as_alice.get(MEMBERS).content.decode()
    event = AuditEvent.objects.get(action="member.role")
    assert (json.loads(event.before)["role"], json.loads(event.after)["role"]) == ("viewer", "admin")
    # the same role again changes nothing and writes nothing
    as_alice.post(f"{MEMBERS}{dave.pk}/role/", {"role": "admin"})
    assert AuditEvent.objects.filter(action="member.role").count() == 1
    # a role that does not exist
    as_alice.post(f"{MEMBERS}{dave.pk}/role/", {"role": "owner"})
    assert membership("dave").role == "admin"
    assert "Choose a role for dave." in as_alice.get(MEMBERS).content.decode()


def test_remove_asks_first(as_alice, acme, alice):
    dave = Membership.objects.create(user=type(alice).objects.create_user("dave"), tenant=acme, role="viewer")
    page = as_alice.get(f"{MEMBERS}{dave.pk}/remove/").content.decode()
    assert "Remove dave from acme?" in page and "Remove member" in page
    assert Membership.objects.filter(pk=dave.pk).exists()
    response = as_alice.post(f"{MEMBERS}{dave.pk}/remove/")
    assert response.status_code == 302 and response["Location"] == MEMBERS
    assert not Membership.objects.filter(pk=dave.pk).exists()
    assert type(alice).objects.filter(username="dave").exists()              # the account stays
    assert "dave no longer has access to acme." in as_alice.get(MEMBERS).content.decode()
    assert json.loads(AuditEvent.objects.get(action="member.remove").before)["user"] == "dave"


def test_the_last_admin_cannot_be_removed_or_demoted(as_alice, as_admin, acme, alice):
    me = membership("alice")
    page = as_alice.get(f"{MEMBERS}{me.pk}/remove/").content.decode()
    assert "is the last administrator of acme" in page and "Remove member" not in page
    for client in (as_alice, as_admin):
        response = client.post(f"{MEMBERS}{me.pk}/remove/")
        assert response.status_code == 302 and response["Location"] == MEMBERS
        response = client.post(f"{MEMBERS}{me.pk}/role/", {"role": "viewer"})
        assert response.status_code == 302 and response["Location"] == MEMBERS
    assert membership("alice").role == "admin"
    assert "alice is the last administrator of acme" in as_alice.get(MEMBERS).content.decode()
    assert not AuditEvent.objects.exists()


def test_an_admin_may_leave_once_there_is_another(as_alice, acme, alice):
    Membership.objects.create(user=type(alice).objects.create_user("dave"), tenant=acme, role="admin")
    me = membership("alice")
    response = as_alice.post(f"{MEMBERS}{me.pk}/role/", {"role": "viewer"})
    assert response["Location"] == "/tenants/acme/"              # no longer allowed on the members' writes
    assert membership("alice").role == "viewer"
    assert as_alice.post(f"{MEMBERS}{me.pk}/remove/").status_code == 403
    dave = membership("dave")
    # alice is a viewer now: dave, the only admin, is out of her reach
    response = as_alice.post(f"{MEMBERS}{dave.pk}/remove/")
    assert response.status_code == 403 and Membership.objects.filter(pk=dave.pk).exists()


def test_an_admin_removing_herself_leaves_the_tenant(as_alice, acme, alice):
    Membership.objects.create(user=type(alice).objects.create_user("dave"), tenant=acme, role="admin")
    response = as_alice.post(f"{MEMBERS}{membership('alice').pk}/remove/")
    assert response.status_code == 302 and response["Location"] == "/"
    assert as_alice.get("/tenants/acme/").status_code == 404


def test_a_tenant_without_admins_may_lose_viewers(as_admin, globex, bob):
    response = as_admin.post(f"/tenants/globex/members/{membership('bob').pk}/remove/")
    assert response.status_code == 302 and not Membership.objects.filter(user=bob).exists()


def test_viewer_sees_members_without_controls(as_bob, globex):
    page = as_bob.get("/tenants/globex/members/").content.decode()
    assert "bob" in page and "Add a member" not in page and "/remove/" not in page and "/role/" not in page


def test_a_device_quota_refuses_devices_past_it_on_every_path(as_admin, as_alice, acme):
    """max_devices: the platform's ceiling (a plan's size) or the tenant's own lower limit; a new
    device, a device without a credential and an import past it are refused inline, nothing made;
    the overview shows the devices against it."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    have = acme.devices.count()
    response = as_admin.post(QUOTAS, ceiling(max_devices=have + 2))
    assert response.status_code == 302
    assert policy("acme")["quota"]["max_devices"] == have + 2
    upload = SimpleUploadedFile("fleet.csv", b"name\nq-1\nq-2\nq-3\n", "text/csv")
    page = as_alice.post("/tenants/acme/devices/new/import/", {"file": upload})
    assert f"The tenant&#x27;s quota allows {have + 2} devices and it has {have}: 3 more do not fit" in \
        page.content.decode()
    assert as_alice.post("/tenants/acme/devices/new/", {"name": "q-1", "with_credential": "on"}).status_code == 200
    assert as_alice.post("/tenants/acme/devices/new/", {"name": "q-2"}).status_code == 302
    for fields in ({"name": "q-3", "with_credential": "on"}, {"name": "q-3"}):
        page = as_alice.post("/tenants/acme/devices/new/", fields)
        assert f"The tenant&#x27;s quota allows {have + 2} devices and it has {have + 2}" in page.content.decode()
    assert not acme.devices.filter(name="q-3").exists()
    # the tenant's own lower limit counts too, and the overview shows the use
    assert as_alice.post(QUOTAS, own(max_devices=have + 2)).status_code == 302
    overview = as_alice.get("/tenants/acme/").content.decode()
    row = re.search(r"<td>max devices</td>\s*<td class=\"num\">([^<]*)</td>\s*<td class=\"num\">([^<]*)</td>", overview)
    assert row is not None and row.groups() == (f"{have + 2:,}", f"{have + 2:,}"), overview[-3000:]
