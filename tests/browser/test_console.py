"""The console in a real browser against the real system (daphne + brokerd on
one control-plane database): an administrator provisions a tenant and a
device, a real MQTT client connects with the secret read off the page and is
kicked from the browser; a tenant user sees only their tenant.

``SCREENSHOTS=1`` also saves full-page screenshots of the pages under
var/screenshots/ (see conftest.py).
"""

import re
import time

import pytest
from playwright.sync_api import expect

from ..integration.helpers import Client
from .conftest import ADMIN_PASSWORD, ADMIN_USER, shot

pytestmark = pytest.mark.slow


def log_in(page, stack, username, password):
    page.goto(stack.url("/login/"))
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("button", name="Sign out")).to_be_visible()


def nav(page, name):
    """Follow a sidebar link."""
    page.locator("aside.sidebar").get_by_role("link", name=name, exact=True).click()


def connect_device(stack, client_id, username, password, timeout=10.0) -> Client:
    """A paho client of the device; retried while brokerd has not yet read the
    new policy from the database (it polls it every 0.5 s)."""
    deadline = time.monotonic() + timeout
    while True:
        c = Client(client_id, username=username, password=password)
        try:
            return c.connect(stack.mqtt_port)
        except ConnectionError:
            c.client.loop_stop()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def subscribe_granted(client, topic, qos=1, timeout=10.0):
    """Subscribe until the broker grants it: a rule just added in the console
    reaches brokerd with its next poll of the database."""
    deadline = time.monotonic() + timeout
    while True:
        codes = client.subscribe(topic, qos=qos)
        if not any(c.is_failure for c in codes):
            return codes
        assert time.monotonic() < deadline, f"subscription to {topic} still refused: {codes}"
        time.sleep(0.3)


def test_provision_a_device_connect_it_and_kick_it(page, stack):
    page.goto(stack.url("/"))
    expect(page).to_have_url(re.compile(r"/login/"))
    shot(page, "01-login")
    # a wrong password is an inline error on the login form
    page.get_by_label("Username").fill(ADMIN_USER)
    page.get_by_label("Password").fill("not-the-password")
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator(".form-errors")).to_be_visible()
    log_in(page, stack, ADMIN_USER, ADMIN_PASSWORD)
    expect(page.get_by_role("heading", level=1)).to_be_visible()
    shot(page, "02-overview")

    # a tenant: first a slug that is not one (the error is shown under the field), then a good one
    nav(page, "Tenants")
    shot(page, "03-tenants-empty")
    page.get_by_role("link", name="New tenant").first.click()
    page.get_by_label("Slug").fill("Not a slug!")
    page.get_by_role("button", name="Create tenant").click()
    expect(page.locator(".field.has-error .error").first).to_be_visible()
    shot(page, "04-form-inline-error")
    page.get_by_label("Slug").fill("acme")
    page.locator("#id_name").fill("Acme Corp")
    page.get_by_role("button", name="Create tenant").click()
    expect(page).to_have_url(re.compile(r"/tenants/acme/$"))
    shot(page, "05-tenant-overview")

    # a device with its first credential: the secret is shown once
    nav(page, "Devices")
    expect(page.locator(".empty")).to_be_visible()
    shot(page, "06-devices-empty")
    page.get_by_role("link", name="New device").first.click()
    page.locator("#id_name").fill("pump-7")
    page.get_by_label("Description").fill("Pump in the boiler room")
    page.get_by_role("button", name="Create device").click()
    expect(page.get_by_role("heading", name="Device pump-7 created")).to_be_visible()
    username = page.locator("#username").inner_text().strip()
    secret = page.locator("#secret").inner_text().strip()
    assert username == "acme/pump-7" and len(secret) >= 40
    shot(page, "07-device-secret")
    page.get_by_role("link", name="I have copied it").click()
    expect(page).to_have_url(re.compile(r"/tenants/acme/devices/pump-7/$"))

    # an ACL rule, so the device may use its own topics
    nav(page, "ACL rules")
    page.get_by_label("Topic filter").fill("{device}/#")
    page.get_by_role("button", name="Add rule").click()
    expect(page.locator("#acl-editor td.mono", has_text="{device}/#")).to_be_visible()
    shot(page, "09-acl")
    nav(page, "Quotas")
    shot(page, "10-quotas")

    # the device connects with what the page showed
    device = connect_device(stack, "pump-7-main", username, secret)
    try:
        subscribe_granted(device, "pump-7/cmd", qos=1)
        nav(page, "Devices")
        expect(page.get_by_role("link", name="pump-7")).to_be_visible()
        shot(page, "11-devices")
        page.get_by_role("link", name="pump-7").click()
        expect(page.locator("body")).to_contain_text("pump-7-main")
        shot(page, "08-device-detail")

        nav(page, "Live clients")
        row = page.locator("#client-table tr", has_text="pump-7-main")
        expect(row).to_be_visible()
        expect(row).to_contain_text("connected")
        shot(page, "12-clients")
        row.get_by_role("link", name="pump-7-main").click()
        expect(page.locator("#session")).to_contain_text("pump-7/cmd")
        expect(page.locator("#session")).to_contain_text("MQTT 3.1.1")
        shot(page, "13-client-detail")

        # a test message from the browser reaches it; kept as the topic's retained message
        nav(page, "Publish")
        page.locator("#id_topic").fill("pump-7/cmd")
        page.locator("#id_payload").fill("start")
        page.locator("#id_retain").check()
        page.get_by_role("button", name="Publish", exact=True).click()
        expect(page.locator("#messages")).to_contain_text("delivered to 1 subscriber")
        shot(page, "14-publish")
        msg = device.expect()
        assert (msg.topic, msg.payload) == ("pump-7/cmd", b"start")
        nav(page, "Retained")
        expect(page.locator("#retained-table")).to_contain_text("pump-7/cmd")
        shot(page, "14-retained")
        nav(page, "Live clients")
        page.locator("#client-table").get_by_role("link", name="pump-7-main").click()

        # kick it from the browser
        page.get_by_role("link", name="Kick…").click()
        shot(page, "15-kick-confirm")
        page.get_by_role("button", name="Kick client").click()
        expect(page.locator("#messages")).to_contain_text("pump-7-main disconnected")
        device.expect_disconnect()
        expect(page.locator("#client-table")).not_to_contain_text("pump-7-main")
        shot(page, "15-clients-after-kick")
    finally:
        device.client.loop_stop()

    # the platform pages
    nav(page, "Clients")
    shot(page, "16-platform-clients")
    nav(page, "Tenants")
    expect(page.locator("table")).to_contain_text("acme")
    shot(page, "17-tenants")
    nav(page, "Audit log")
    expect(page.locator("table")).to_contain_text("client.kick")
    shot(page, "18-audit")
    nav(page, "API tokens")
    shot(page, "19-tokens-empty")
    page.get_by_role("link", name="New token").first.click()
    page.locator("#id_name").fill("grafana")
    page.get_by_role("button", name=re.compile("Create")).click()
    shot(page, "20-token-secret")
    nav(page, "API tokens")
    expect(page.locator("table")).to_contain_text("grafana")
    shot(page, "21-tokens")
    nav(page, "Overview")
    shot(page, "22-overview-with-data")

    # a page that does not exist
    response = page.goto(stack.url("/tenants/acme/devices/nope/"))
    assert response.status == 404
    expect(page.get_by_role("heading", name="Not found")).to_be_visible()
    shot(page, "23-not-found")


def test_a_tenant_user_sees_only_their_tenant(page, stack, browser):
    stack.manage("tenants", "create", "north", "--name", "North Ltd")
    stack.manage("tenants", "create", "south", "--name", "South plc")
    log_in(page, stack, ADMIN_USER, ADMIN_PASSWORD)
    page.goto(stack.url("/tenants/north/members/"))
    page.get_by_label("Username").fill("nina")
    page.get_by_label("Initial password").fill("nina-Passw0rd-north")
    page.get_by_label("Role").select_option("admin")
    page.get_by_role("button", name="Add member").click()
    expect(page.locator("table")).to_contain_text("nina")
    shot(page, "24-members")
    page.get_by_role("button", name="Sign out").click()

    log_in(page, stack, "nina", "nina-Passw0rd-north")
    expect(page).to_have_url(re.compile(r"/tenants/north/$"))
    expect(page.locator("aside.sidebar")).not_to_contain_text("Platform")
    shot(page, "25-tenant-user-overview")
    page.goto(stack.url("/tenants/"))
    rows = page.locator("table tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("north")
    expect(page.locator("table")).not_to_contain_text("south")
    # the sidebar still leads to her tenant from a page outside it
    expect(page.locator("aside.sidebar")).to_contain_text("North Ltd")
    shot(page, "26-tenant-user-tenants")
    response = page.goto(stack.url("/tenants/south/"))
    assert response.status == 404
    expect(page.get_by_role("heading", name="Not found")).to_be_visible()
    expect(page.locator("body")).not_to_contain_text("South plc")
    # platform pages are refused
    assert page.goto(stack.url("/clients/")).status == 403


def test_quotas_one_save_keeps_both_columns(page, stack):
    """A platform administrator types a ceiling and an own limit and presses the one Save
    button: both are saved (a second button used to save one column and drop the other);
    an own limit above the ceiling is an inline error with everything typed kept."""
    stack.provision([{"slug": "quotaco", "default_acl": "allow", "devices": []}])
    log_in(page, stack, ADMIN_USER, ADMIN_PASSWORD)
    page.set_viewport_size({"width": 1366, "height": 900})
    page.goto(stack.url("/tenants/quotaco/quotas/"))
    page.get_by_label("Ceiling: max connections").fill("100")
    page.get_by_label("Own limit: max connections").fill("10")
    expect(page.locator("#quota-table button[type=submit]")).to_have_count(1)
    page.get_by_role("button", name="Save ceilings and own limits").click()
    expect(page.get_by_text("Limits saved.")).to_be_visible()
    expect(page.get_by_label("Ceiling: max connections")).to_have_value("100")
    expect(page.get_by_label("Own limit: max connections")).to_have_value("10")
    page.get_by_label("Own limit: max connections").fill("500")
    page.get_by_label("Ceiling: max queued").fill("50")
    page.get_by_role("button", name="Save ceilings and own limits").click()
    expect(page.get_by_text("May not exceed the ceiling of 100")).to_be_visible()
    expect(page.get_by_label("Own limit: max connections")).to_have_value("500")
    expect(page.get_by_label("Ceiling: max queued")).to_have_value("50")
    for w, h, size in ((390, 844, "phone"), (1366, 900, "laptop")):
        page.set_viewport_size({"width": w, "height": h})
        page.evaluate("window.scrollTo(0, 0)")
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
        shot(page, f"quotas-error-{size}")
    page.goto(stack.url("/tenants/quotaco/quotas/"))
    expect(page.get_by_label("Ceiling: max queued")).to_have_value("")       # the failed save changed nothing


def test_the_client_list_and_a_clients_page_follow_the_devices(page, stack):
    """The client list and a client's page showed the moment they were opened: a device that
    connected (or subscribed) later was not there until a reload."""
    secrets = stack.provision([{"slug": "refreshco", "default_acl": "allow", "devices": ["tracker"]}])
    log_in(page, stack, ADMIN_USER, ADMIN_PASSWORD)
    page.goto(stack.url("/tenants/refreshco/clients/"))
    expect(page.locator("#client-table")).not_to_contain_text("tracker-1")
    device = connect_device(stack, "tracker-1", "refreshco/tracker", secrets["refreshco/tracker"])
    try:
        expect(page.locator("#client-table")).to_contain_text("tracker-1", timeout=12_000)     # no reload
        page.locator("#client-table").get_by_role("link", name="tracker-1").click()
        expect(page.locator(".subtitle .badge")).to_have_text("connected")
        device.subscribe("fleet/+/position", qos=1)
        expect(page.locator("#session")).to_contain_text("fleet/+/position", timeout=12_000)
        # what is being typed in the subscribe form is not swapped away
        page.get_by_label("Topic filter").fill("alerts/#")
        page.wait_for_timeout(6_000)
        expect(page.get_by_label("Topic filter")).to_have_value("alerts/#")
    finally:
        device.disconnect()


SCHEDULED = r"""
from tenants import services
from tenants.models import Tenant
from spark_reports import services as reports
from spark_reports.models import ReportSchedule
t = services.create_tenant("mailco", name="Mail Co", contact_emails=["ops@mail.test"])
reports.schedule_saved(ReportSchedule.objects.create(tenant=t, frequency="daily", hour=6, recipients=["ops@mail.test"]))
"""


def test_send_now_from_the_schedules_page(page, stack):
    """The Schedules page says where development email goes (the files under
    var/mail); Send now queues the schedule's report at once and its page says
    it will be emailed, and where to."""
    stack.manage("shell", "-c", SCHEDULED)
    log_in(page, stack, ADMIN_USER, ADMIN_PASSWORD)
    page.goto(stack.url("/tenants/mailco/reports/schedules/"))
    mail_dir = str(stack.var / "mail")
    expect(page.locator("#mail-destination")).to_contain_text(f"Each email is written as a file to {mail_dir}")
    shot(page, "schedules-send-now")
    page.get_by_role("button", name="Send now").click()
    expect(page).to_have_url(re.compile(r"/tenants/mailco/reports/\d+/$"))
    expect(page.get_by_text("Report queued: it will be emailed to ops@mail.test when done.")).to_be_visible()
    expect(page.locator("#mail-destination")).to_contain_text("When it is done the report is emailed")
    expect(page.locator("#mail-destination")).to_contain_text(mail_dir)
    expect(page.locator(".subtitle")).to_contain_text("(Send now of a daily schedule)")
    shot(page, "schedules-send-now-run")
    page.goto(stack.url("/audit/"))
    expect(page.locator("#audit-table")).to_contain_text("report_schedule.send")
