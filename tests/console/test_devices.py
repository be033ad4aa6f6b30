"""Devices and their credentials, as a tenant administrator sees them:
create (inline errors, nothing written), edit, disable/enable, delete after a
confirmation; secrets shown once, stored only as a hash, refused by the
broker's own check once disabled, expired, rotated or deleted."""

import datetime as dt
import json
import re

import pytest
from django.utils import timezone

from core.models import AuditEvent
from tenants import hashing, services
from tenants.models import AclRule, Credential, Device

from .conftest import HTMX, policy

SECRET = re.compile(r'<code id="secret">([^<]+)</code>')


def secret_on(response) -> str:
    """The secret a "copy it now" page shows (exactly one)."""
    assert response.status_code == 200
    assert response["Cache-Control"] == "no-store"
    found = SECRET.findall(response.content.decode())
    assert len(found) == 1
    return found[0]


def audit_text() -> str:
    return " ".join(f"{e.before} {e.after}" for e in AuditEvent.objects.all())


def actions() -> list[str]:
    return list(AuditEvent.objects.order_by("id").values_list("action", flat=True))


# ---------------------------------------------------------------- create


def test_create_with_a_credential_shows_the_secret_once(as_alice, acme):
    response = as_alice.post("/tenants/acme/devices/new/", {
        "name": "pump-7", "description": "basement pump", "with_credential": "on", "label": "factory"})
    secret = secret_on(response)
    page = response.content.decode()
    assert "Device pump-7 created" in page and "acme/pump-7" in page and "factory" in page
    assert len(secret) >= 43

    device = Device.objects.get(tenant=acme, name="pump-7")
    (credential,) = device.credentials.all()
    assert secret not in credential.secret_hash
    assert credential.secret_hash == hashing.hash_secret(secret)
    assert services.authenticate_device("acme", "pump-7", secret)
    assert not services.authenticate_device("acme", "pump-7", secret + "x")
    assert "pump-7" in policy("acme")["devices"]

    # never again: not on the device page, the list, the audit log or in the snapshot
    for url in ("/tenants/acme/devices/pump-7/", "/tenants/acme/devices/", "/tenants/acme/audit/"):
        assert secret not in as_alice.get(url).content.decode()
    assert secret not in json.dumps(policy("acme"))
    assert secret not in audit_text() and credential.secret_hash not in audit_text()
    assert actions() == ["device.create", "credential.create"]
    event = AuditEvent.objects.get(action="device.create")
    assert (event.actor, event.tenant, event.object_id) == ("alice", "acme", "pump-7")
    assert event.before is None and json.loads(event.after)["description"] == "basement pump"


def test_create_without_a_credential_goes_to_the_device(as_alice, acme):
    response = as_alice.post("/tenants/acme/devices/new/", {"name": "gw-2", "description": ""})
    assert response.status_code == 302 and response["Location"] == "/tenants/acme/devices/gw-2/"
    page = as_alice.get(response["Location"]).content.decode()
    assert "Device gw-2 created." in page and "No credentials yet" in page
    assert not Credential.objects.filter(device__name="gw-2").exists()
    assert actions() == ["device.create"]


@pytest.mark.parametrize(("name", "error"), [
    ("Pump 7", "A device name is 1-128 characters"),
    ("", "This field is required."),
    ("new", "&#x27;new&#x27; is reserved"),
    (".", "cannot be"),
    ("..", "cannot be"),
])
def test_create_invalid_name_is_an_inline_error(as_alice, acme, name, error):
    before = (Device.objects.count(), Credential.objects.count())
    response = as_alice.post("/tenants/acme/devices/new/", {"name": name, "with_credential": "on"})
    assert response.status_code == 200
    page = response.content.decode()
    assert error in page
    assert 'class="field has-error"' in page
    if name:
        assert f'value="{name}"' in page                    # what was typed stays in the form
    assert (Device.objects.count(), Credential.objects.count()) == before
    assert not AuditEvent.objects.exists()


def test_create_duplicate_name_is_an_inline_error(as_alice, acme):
    before = (Device.objects.count(), Credential.objects.count(), policy("acme"))
    response = as_alice.post("/tenants/acme/devices/new/", {"name": "sensor-1", "with_credential": "on"})
    assert response.status_code == 200
    page = response.content.decode()
    assert "already exists" in page
    assert 'class="field has-error"' in page          # under the name field, where the user looks
    assert SECRET.search(page) is None
    assert (Device.objects.count(), Credential.objects.count(), policy("acme")) == before
    assert not AuditEvent.objects.exists()


def test_create_with_an_expiry_in_the_past_is_an_inline_error(as_alice, acme):
    response = as_alice.post("/tenants/acme/devices/new/", {
        "name": "pump-8", "with_credential": "on", "expires_at": "2001-01-01T00:00"})
    assert response.status_code == 200
    assert "Pick a moment in the future." in response.content.decode()
    assert not Device.objects.filter(name="pump-8").exists()


def test_create_with_a_certificate_fingerprint_in_use(as_alice, acme, globex):
    fp = "ab" * 32
    services.create_device(globex, "cam", cert_fingerprint=fp)
    response = as_alice.post("/tenants/acme/devices/new/", {"name": "cam-2", "cert_fingerprint": fp.upper()})
    assert response.status_code == 200
    assert "already in use" in response.content.decode()
    assert not Device.objects.filter(name="cam-2").exists()


@pytest.mark.parametrize("how", ["create", "edit"])
def test_a_fingerprint_in_use_in_another_tenant_names_neither_tenant_nor_device(as_alice, acme, globex, how):
    """A tenant administrator who types another tenant's certificate fingerprint
    (certificates are shown in every TLS handshake) must not learn which
    tenant and device hold it: the refusal says "in use", nothing more."""
    fp = "cd" * 32
    services.create_device(globex, "secret-cam", cert_fingerprint=fp)
    if how == "create":
        response = as_alice.post("/tenants/acme/devices/new/", {"name": "cam-2", "cert_fingerprint": fp})
    else:
        response = as_alice.post("/tenants/acme/devices/sensor-1/edit/", {"description": "", "cert_fingerprint": fp})
    page = response.content.decode()
    assert response.status_code == 200 and "already in use" in page
    assert "globex" not in page and "secret-cam" not in page
    assert Device.objects.get(tenant=acme, name="sensor-1").cert_fingerprint is None


def test_a_fingerprint_in_use_in_the_same_tenant_names_the_device(as_alice, acme):
    fp = "ef" * 32
    services.create_device(acme, "cam", cert_fingerprint=fp)
    response = as_alice.post("/tenants/acme/devices/new/", {"name": "cam-2", "cert_fingerprint": fp})
    assert response.status_code == 200 and "already belongs to device acme/cam" in response.content.decode()


def test_new_device_form_is_offered_with_a_first_credential(as_alice, acme):
    page = as_alice.get("/tenants/acme/devices/new/").content.decode()
    assert 'name="with_credential"' in page and "checked" in page


# ---------------------------------------------------------------- edit, disable, delete


def test_edit(as_alice, acme):
    page = as_alice.get("/tenants/acme/devices/sensor-1/edit/").content.decode()
    assert "roof sensor" in page and 'name="name"' not in page          # the name cannot change
    fp = "AB:" * 31 + "AB"
    response = as_alice.post("/tenants/acme/devices/sensor-1/edit/", {
        "description": "moved to the cellar", "cert_fingerprint": fp, "cert_cn": "sensor-1.acme"})
    assert response.status_code == 302 and response["Location"] == "/tenants/acme/devices/sensor-1/"
    device = Device.objects.get(tenant=acme, name="sensor-1")
    assert (device.description, device.cert_fingerprint, device.cert_cn) == (
        "moved to the cellar", "ab" * 32, "sensor-1.acme")
    assert policy("acme")["devices"]["sensor-1"]["cert_fingerprint"] == "ab" * 32
    page = as_alice.get(response["Location"]).content.decode()
    assert "Device sensor-1 saved." in page and "moved to the cellar" in page
    event = AuditEvent.objects.get(action="device.update")
    assert json.loads(event.before)["description"] == "roof sensor"
    assert json.loads(event.after)["description"] == "moved to the cellar"


def test_edit_bad_fingerprint_is_inline_and_changes_nothing(as_alice, acme):
    response = as_alice.post("/tenants/acme/devices/sensor-1/edit/", {"description": "x", "cert_fingerprint": "xyz"})
    assert response.status_code == 200
    assert "64 lowercase hex digits" in response.content.decode()
    assert Device.objects.get(tenant=acme, name="sensor-1").description == "roof sensor"
    assert not AuditEvent.objects.exists()


def test_disable_and_enable(as_alice, acme):
    secret = acme.test_secret
    response = as_alice.post("/tenants/acme/devices/sensor-1/disable/")
    assert response.status_code == 302 and response["Location"] == "/tenants/acme/devices/sensor-1/"
    page = as_alice.get(response["Location"]).content.decode()
    assert "Device sensor-1 disabled." in page and ">disabled<" in page
    assert policy("acme")["devices"]["sensor-1"]["enabled"] is False
    assert not services.authenticate_device("acme", "sensor-1", secret)

    as_alice.post("/tenants/acme/devices/sensor-1/enable/")
    assert policy("acme")["devices"]["sensor-1"]["enabled"] is True
    assert services.authenticate_device("acme", "sensor-1", secret)
    events = AuditEvent.objects.filter(action__in=["device.disable", "device.enable"]).order_by("id")
    assert [(json.loads(e.before)["enabled"], json.loads(e.after)["enabled"]) for e in events] == [
        (True, False), (False, True)]


def test_disable_and_enable_only_by_post(as_alice, acme):
    assert as_alice.get("/tenants/acme/devices/sensor-1/disable/").status_code == 405
    assert Device.objects.get(tenant=acme, name="sensor-1").enabled


def test_disable_from_the_list_returns_to_the_list(as_alice, acme):
    page = as_alice.get("/tenants/acme/devices/?q=sensor").content.decode()
    assert 'name="next" value="/tenants/acme/devices/?q=sensor"' in page      # the search is kept
    response = as_alice.post("/tenants/acme/devices/sensor-1/disable/", {"next": "/tenants/acme/devices/?q=sensor"})
    assert response["Location"] == "/tenants/acme/devices/?q=sensor"


@pytest.mark.parametrize("next_url", ["https://evil.example/", "//evil.example/x", "javascript:alert(1)"])
def test_disable_never_redirects_off_site(as_alice, acme, next_url):
    response = as_alice.post("/tenants/acme/devices/sensor-1/disable/", {"next": next_url})
    assert response.status_code == 302
    assert response["Location"] == "/tenants/acme/devices/sensor-1/"


def test_delete_asks_first(as_alice, acme):
    services.add_acl_rule(acme, topic="cmd/#", action="subscribe", allow=True, device="sensor-1")
    page = as_alice.get("/tenants/acme/devices/sensor-1/delete/").content.decode()
    assert "Delete device sensor-1?" in page
    assert "<strong>1</strong> credential" in page and "<strong>1</strong> ACL rule" in page
    assert Device.objects.filter(tenant=acme, name="sensor-1").exists()     # a GET deletes nothing

    response = as_alice.post("/tenants/acme/devices/sensor-1/delete/")
    assert response.status_code == 302 and response["Location"] == "/tenants/acme/devices/"
    assert not Device.objects.filter(tenant=acme, name="sensor-1").exists()
    assert not Credential.objects.filter(device__name="sensor-1").exists()
    assert list(AclRule.objects.filter(tenant=acme).values_list("position", "topic")) == [
        (1, "sensors/{device}/#"), (2, "secret/#")]
    assert "sensor-1" not in policy("acme")["devices"]
    assert not services.authenticate_device("acme", "sensor-1", acme.test_secret)
    page = as_alice.get("/tenants/acme/devices/").content.decode()
    assert "Device sensor-1 deleted." in page
    event = AuditEvent.objects.get(action="device.delete")
    assert json.loads(event.before)["removed"] == {"credentials": 1, "acl_rules": 1} and event.after is None


# ---------------------------------------------------------------- list, htmx


def test_list_and_search(as_bob, as_alice, acme):
    page = as_alice.get("/tenants/acme/devices/").content.decode()
    assert "<html" in page and "sensor-1" in page and "gateway" in page and "roof sensor" in page
    page = as_alice.get("/tenants/acme/devices/?q=roof").content.decode()
    assert "/tenants/acme/devices/sensor-1/" in page and "/tenants/acme/devices/gateway/" not in page
    page = as_alice.get("/tenants/acme/devices/?q=zzz").content.decode()
    assert "No device matches" in page


def test_htmx_search_gets_the_table_only(as_alice, acme):
    response = as_alice.get("/tenants/acme/devices/?q=gate", **HTMX)
    fragment = response.content.decode()
    assert response.status_code == 200
    assert "<html" not in fragment and "<body" not in fragment
    assert fragment.startswith('<div id="device-table">')
    assert "/tenants/acme/devices/gateway/" in fragment and "/tenants/acme/devices/sensor-1/" not in fragment


def test_viewer_sees_no_write_buttons(as_bob, globex):
    page = as_bob.get("/tenants/globex/devices/plant-1/").content.decode()
    assert "plant-1" in page
    for url in ("/edit/", "/delete/", "/disable/", "/credentials/new/", "/rotate/"):
        assert url not in page
    page = as_bob.get("/tenants/globex/devices/").content.decode()
    assert "New device" not in page and "/disable/" not in page


# ---------------------------------------------------------------- credentials


def test_new_credential_shows_its_secret_once(as_alice, acme):
    response = as_alice.post("/tenants/acme/devices/sensor-1/credentials/new/", {"label": "field-2"})
    secret = secret_on(response)
    assert "Credential #" in response.content.decode() and "created" in response.content.decode()
    credential = Credential.objects.get(device__name="sensor-1", label="field-2")
    assert secret not in credential.secret_hash and hashing.verify_secret(secret, credential.secret_hash)
    # both credentials work
    assert services.authenticate_device("acme", "sensor-1", secret)
    assert services.authenticate_device("acme", "sensor-1", acme.test_secret)
    page = as_alice.get("/tenants/acme/devices/sensor-1/").content.decode()
    assert secret not in page and "field-2" in page
    assert secret not in audit_text()
    event = AuditEvent.objects.get(action="credential.create")
    assert json.loads(event.after) == {**json.loads(event.after), "device": "sensor-1", "label": "field-2"}


def test_new_credential_with_every_field_left_out(as_alice, acme):
    # label and expiry are optional: a POST without them (htmx sends the CSRF token as a header) still creates one
    secret = secret_on(as_alice.post("/tenants/acme/devices/sensor-1/credentials/new/"))
    assert services.authenticate_device("acme", "sensor-1", secret)
    assert Credential.objects.filter(device__name="sensor-1").count() == 2


def test_the_device_page_shows_no_hashes(as_alice, acme):
    page = as_alice.get("/tenants/acme/devices/sensor-1/").content.decode()
    assert acme.test_credential.secret_hash not in page and "sha256$" not in page


def test_new_credential_with_a_past_expiry_is_an_inline_error(as_alice, acme):
    response = as_alice.post("/tenants/acme/devices/sensor-1/credentials/new/", {"expires_at": "2001-01-01T00:00"})
    assert response.status_code == 200 and "Pick a moment in the future." in response.content.decode()
    assert Credential.objects.filter(device__name="sensor-1").count() == 1


def test_rotate_asks_then_shows_the_new_secret_once(as_alice, acme):
    cred = acme.test_credential
    url = f"/tenants/acme/devices/sensor-1/credentials/{cred.pk}/rotate/"
    page = as_alice.get(url).content.decode()
    assert "Rotate credential" in page and "Rotate secret" in page
    assert services.authenticate_device("acme", "sensor-1", acme.test_secret)     # a GET rotates nothing

    response = as_alice.post(url)
    secret = secret_on(response)
    assert "rotated" in response.content.decode()
    assert secret != acme.test_secret
    assert not services.authenticate_device("acme", "sensor-1", acme.test_secret)
    assert services.authenticate_device("acme", "sensor-1", secret)
    cred.refresh_from_db()
    assert secret not in cred.secret_hash
    assert secret not in as_alice.get("/tenants/acme/devices/sensor-1/").content.decode()
    assert secret not in audit_text() and cred.secret_hash not in audit_text()
    assert actions() == ["credential.rotate"]


@pytest.mark.parametrize(("setup", "warning"), [
    (lambda c: services.disable_credential(c), "is disabled"),
    (lambda c: services.expire_credential(c), "expired"),
    (lambda c: services.disable_device(c.device), "the device is disabled"),
])
def test_rotating_an_unusable_credential_says_so(as_alice, acme, setup, warning):
    cred = acme.test_credential
    setup(cred)
    response = as_alice.post(f"/tenants/acme/devices/sensor-1/credentials/{cred.pk}/rotate/")
    secret = secret_on(response)
    page = response.content.decode()
    assert "does not let the device in yet" in page and warning in page
    assert not services.authenticate_device("acme", "sensor-1", secret)


def test_rotating_a_usable_credential_has_no_warning(as_alice, acme):
    response = as_alice.post(f"/tenants/acme/devices/sensor-1/credentials/{acme.test_credential.pk}/rotate/")
    assert "does not let the device in" not in response.content.decode()


def test_credential_disable_enable(as_alice, acme):
    cred = acme.test_credential
    base = f"/tenants/acme/devices/sensor-1/credentials/{cred.pk}"
    response = as_alice.post(f"{base}/disable/")
    assert response.status_code == 302 and response["Location"] == "/tenants/acme/devices/sensor-1/"
    assert not services.authenticate_device("acme", "sensor-1", acme.test_secret)
    assert policy("acme")["devices"]["sensor-1"]["credentials"][0]["enabled"] is False
    page = as_alice.get(response["Location"]).content.decode()
    assert f"Credential #{cred.pk} disabled" in page and ">disabled<" in page
    as_alice.post(f"{base}/enable/")
    assert services.authenticate_device("acme", "sensor-1", acme.test_secret)
    assert actions() == ["credential.disable", "credential.enable"]


def test_credential_expire_now(as_alice, acme):
    cred = acme.test_credential
    url = f"/tenants/acme/devices/sensor-1/credentials/{cred.pk}/expire/"
    assert "Set expiry" in as_alice.get(url).content.decode()
    response = as_alice.post(url, {"when": "now"})
    assert response.status_code == 302
    assert not services.authenticate_device("acme", "sensor-1", acme.test_secret)
    page = as_alice.get("/tenants/acme/devices/sensor-1/").content.decode()
    assert f"Credential #{cred.pk} expired." in page and ">expired<" in page
    event = AuditEvent.objects.get(action="credential.expire")
    assert json.loads(event.before)["expires_at"] is None and json.loads(event.after)["expires_at"]


def test_credential_expire_later(as_alice, acme):
    cred = acme.test_credential
    url = f"/tenants/acme/devices/sensor-1/credentials/{cred.pk}/expire/"
    when = (timezone.now() + dt.timedelta(days=30)).replace(second=0, microsecond=0)
    as_alice.post(url, {"when": "at", "at": when.strftime("%Y-%m-%dT%H:%M")})
    cred.refresh_from_db()
    assert cred.expires_at == when
    assert services.authenticate_device("acme", "sensor-1", acme.test_secret)
    assert policy("acme")["devices"]["sensor-1"]["credentials"][0]["expires_at"] == when.timestamp()


def test_credential_expire_at_without_a_date_is_inline(as_alice, acme):
    cred = acme.test_credential
    response = as_alice.post(f"/tenants/acme/devices/sensor-1/credentials/{cred.pk}/expire/", {"when": "at"})
    assert response.status_code == 200
    assert "Pick the date and time it expires." in response.content.decode()
    cred.refresh_from_db()
    assert cred.expires_at is None and not AuditEvent.objects.exists()


def test_credential_delete(as_alice, acme):
    cred = acme.test_credential
    url = f"/tenants/acme/devices/sensor-1/credentials/{cred.pk}/delete/"
    assert "Delete credential" in as_alice.get(url).content.decode()
    assert Credential.objects.filter(pk=cred.pk).exists()
    response = as_alice.post(url)
    assert response.status_code == 302 and response["Location"] == "/tenants/acme/devices/sensor-1/"
    assert not Credential.objects.filter(pk=cred.pk).exists()
    assert not services.authenticate_device("acme", "sensor-1", acme.test_secret)
    assert policy("acme")["devices"]["sensor-1"]["credentials"] == []
    assert json.loads(AuditEvent.objects.get(action="credential.delete").before)["id"] == cred.pk


def test_a_credential_is_reached_only_through_its_own_device(as_alice, acme):
    cred = acme.test_credential
    for what in ("rotate", "expire", "delete"):
        assert as_alice.post(f"/tenants/acme/devices/gateway/credentials/{cred.pk}/{what}/").status_code == 404
    assert as_alice.post(f"/tenants/acme/devices/gateway/credentials/{cred.pk}/disable/").status_code == 404
    assert services.authenticate_device("acme", "sensor-1", acme.test_secret)
    assert not AuditEvent.objects.exists()


# ---------------------------------------------------------------- import


def _upload(client, text: str, label: str = ""):
    from django.core.files.uploadedfile import SimpleUploadedFile

    data = text.encode("latin-1") if "\xff" in text else text.encode()
    return client.post("/tenants/acme/devices/new/import/",
                       {"file": SimpleUploadedFile("fleet.csv", data, "text/csv"), "label": label})


def test_import_makes_every_device_and_downloads_their_secrets_once(as_alice, acme):
    page = as_alice.get("/tenants/acme/devices/")
    assert 'href="/tenants/acme/devices/new/import/"' in page.content.decode()
    response = _upload(as_alice, "name,cert_cn,description\npump-1,,by the gate\ngw-1,gw-1.acme.example,roof\n",
                       label="factory")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert response["Cache-Control"] == "no-store"
    assert re.fullmatch(r'attachment; filename="acme-devices-\d{8}-\d{6}\.csv"', response["Content-Disposition"])
    lines = response.content.decode().splitlines()
    assert lines[0] == "name,username,secret"
    rows = [line.split(",") for line in lines[1:]]
    assert [(r[0], r[1]) for r in rows] == [("pump-1", "acme/pump-1"), ("gw-1", "acme/gw-1")]
    for name, _, secret in rows:
        [cred] = Credential.objects.filter(device__tenant=acme, device__name=name)
        assert cred.secret_hash == hashing.hash_secret(secret) and cred.label == "factory"
        assert secret not in audit_text()
    assert Device.objects.get(tenant=acme, name="gw-1").cert_cn == "gw-1.acme.example"
    assert {"gw-1", "pump-1"} <= set(policy("acme")["devices"])           # what brokerd reads
    assert actions()[-1] == "device.import"
    assert json.loads(AuditEvent.objects.order_by("id").last().after)["names"] == ["pump-1", "gw-1"]


@pytest.mark.parametrize("text, error", [
    ("name\nok-1\nBad Name\n", "Row 2 (&#x27;Bad Name&#x27;): name: "),
    ("name\nok-1\nok-1\n", "Row 2 (&#x27;ok-1&#x27;): device acme/ok-1 already exists"),
    ("device\nok-1\n", "The first line names the columns"),
    ("name\n", "The file names no device"),
    ("name\n\xff\n", "not UTF-8"),
    ("name,description,name\nok-1,x,ok-2\n", "The first line names each column once: name twice"),
])
def test_a_refused_import_says_why_on_the_page_and_makes_nothing(as_alice, acme, text, error):
    before = set(Device.objects.filter(tenant=acme).values_list("name", flat=True))
    response = _upload(as_alice, text)
    assert response.status_code == 200 and response["Content-Type"].startswith("text/html")
    assert error in response.content.decode()
    assert set(Device.objects.filter(tenant=acme).values_list("name", flat=True)) == before
    assert "device.import" not in actions()


def test_an_import_refuses_a_certificate_another_device_names(as_alice, acme, globex):
    services.create_device(globex, "gw", cert_cn="gw.shared.example", cert_fingerprint="ab" * 32)
    services.create_device(acme, "gw-old", cert_cn="gw.acme.example")
    for text, error in (
            ("name,cert_cn\nn-1,gw.x.example\nn-2,gw.x.example\n", "Row 2 (&#x27;n-2&#x27;): certificate CN already "
                                                                    "belongs to row 1"),
            ("name,cert_cn\nn-1,\nn-2,gw.shared.example\n", "Row 2 (&#x27;n-2&#x27;): certificate CN already in use "
                                                           "by a device of another tenant"),
            ("name,cert_fingerprint\nn-1," + "AB" * 32 + "\n", "Row 1 (&#x27;n-1&#x27;): certificate fingerprint "
                                                               "already in use by a device of another tenant"),
            ("name,cert_cn\nn-1,gw.acme.example\n", "certificate CN already belongs to device acme/gw-old")):
        response = _upload(as_alice, text)
        assert error in response.content.decode(), text
        assert not Device.objects.filter(tenant=acme, name__startswith="n-").exists()


def test_an_import_reads_a_file_saved_with_a_byte_order_mark(as_alice, acme):
    """Excel's "CSV UTF-8" starts the file with a BOM: before, its first column was refused as
    unknown ("unknown: \ufeffname") -- the file a spreadsheet user has could not be imported."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    data = "\ufeffname,description\r\nbom-1,Pump by the gate\r\n".encode()
    response = as_alice.post("/tenants/acme/devices/new/import/",
                             {"file": SimpleUploadedFile("fleet.csv", data, "text/csv")})
    assert response["Content-Type"].startswith("text/csv"), response.content.decode()[-2000:]
    assert response.content.decode().splitlines()[1].startswith("bom-1,acme/bom-1,")
    assert Device.objects.get(tenant=acme, name="bom-1").description == "Pump by the gate"


def test_no_secret_of_an_import_opens_as_a_formula_in_a_spreadsheet(as_alice, acme):
    """The file of secrets is their only copy, and a spreadsheet is where it is opened: a cell starting
    with =, +, - or @ is read as a formula -- before, one secret in 64 began with '-' (URL-safe base64)
    and showed as #NAME?, lost if the file was saved again. Secrets now begin with a letter or digit."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    data = ("name\n" + "".join(f"f-{i}\n" for i in range(600))).encode()
    response = as_alice.post("/tenants/acme/devices/new/import/",
                             {"file": SimpleUploadedFile("fleet.csv", data, "text/csv")})
    secrets_ = [line.split(",")[2] for line in response.content.decode().splitlines()[1:]]
    assert len(secrets_) == 600
    assert [s for s in secrets_ if s[0] in "=+-@"] == []
    assert all(len(s) >= 43 for s in secrets_)
