"""The live dashboards in a real browser: daphne + brokerd on one database
(tests/browser's ``Stack``, brokerd writing history rows every 2 s), paho
devices publishing, Debian's chromium (Playwright) watching the numbers and
the charts move. ``SCREENSHOTS=1`` saves var/screenshots/dashboard.png (and
the tenant's and the node's pages)."""

import math
import re
import signal
import threading
import time

import pytest
from playwright.sync_api import expect

from ..browser.conftest import ADMIN_PASSWORD, ADMIN_USER, Stack, shot
from ..integration.helpers import Client

pytestmark = pytest.mark.slow


class MetricsStack(Stack):
    """tests/browser's stack with brokerd writing its history every 2 s."""

    broker_flags = ("--history-interval", "2")

    def __init__(self, var):
        super().__init__(var)
        # a node that stops answering is alarmed after 1 s of it, not the default 3: the alarm arrives about
        # 5 s after the stop instead of 9 (the full suite once took more than its 15 s wait to show it)
        self.env["METRICS_ALARM_NODE_DOWN_AFTER"] = "1"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = MetricsStack(tmp_path_factory.mktemp("metrics-browser")).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def devices(stack):
    """Tenants acme (4 devices) and globex (1), everything on plant/# allowed; -> {"acme/pump-0": secret}."""
    return stack.provision([
        {"slug": slug, "name": name, "devices": [f"pump-{i}" for i in range(n)],
         "acl": [{"topic": "plant/#", "action": "both", "allow": True}]}
        for slug, name, n in (("acme", "Acme Corp", 4), ("globex", "Globex", 1))])


class Traffic:
    """Devices publishing QoS 0/1 at a rate that swings between ~40 and ~260 msg/s."""

    def __init__(self, stack, secrets):
        self.clients = []
        deadline = time.monotonic() + 10
        for who, secret in secrets.items():
            while True:
                c = Client(f"{who.replace('/', '-')}-{time.monotonic_ns()}", username=who, password=secret)
                try:
                    self.clients.append(c.connect(stack.mqtt_port))
                    break
                except ConnectionError:           # brokerd reads new devices with its next poll
                    c.client.loop_stop()
                    assert time.monotonic() < deadline
                    time.sleep(0.3)
        self.clients[0].subscribe("plant/#", qos=1)
        self.stop = threading.Event()
        self.sent = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        t0 = time.monotonic()
        while not self.stop.is_set():
            t = time.monotonic() - t0
            n = int(15 + 11 * math.sin(t / 2.5) + 3 * math.sin(t * 1.7))
            for i in range(n):
                c = self.clients[1 + (self.sent + i) % (len(self.clients) - 1)]
                c.publish(f"plant/line-{i % 3}/pressure", b"%.2f" % (3 + math.sin(t)), qos=i % 2)
            self.sent += n
            time.sleep(0.1)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(5)
        for c in self.clients:
            try:
                c.disconnect()
            except Exception:
                pass


def number(page, selector) -> int:
    text = page.locator(selector).first.inner_text()
    digits = re.sub(r"[^\d]", "", text)
    return int(digits) if digits else -1


def log_in(page, stack):
    page.goto(stack.url("/login/"))
    page.get_by_label("Username").fill(ADMIN_USER)
    page.get_by_label("Password").fill(ADMIN_PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("button", name="Sign out")).to_be_visible()


def test_dashboard_numbers_move_while_devices_publish(page, stack, devices):
    log_in(page, stack)
    page.locator("aside.sidebar").get_by_role("link", name="Live metrics").click()
    expect(page).to_have_url(re.compile(r"/metrics/$"))
    expect(page.locator("[data-status]")).to_have_text(re.compile("live"), timeout=10_000)
    total = '[data-bind="totals.msgs_in"]'
    before = number(page, total)
    assert before >= 0
    with Traffic(stack, {k: v for k, v in devices.items() if k.startswith("acme/")}) as traffic:
        # the cumulative count rises on the page, update after update
        seen = [before]
        deadline = time.monotonic() + 10
        while len(seen) < 4 and time.monotonic() < deadline:
            page.wait_for_timeout(300)
            value = number(page, total)
            if value != seen[-1]:
                seen.append(value)
        assert len(seen) >= 4 and seen == sorted(seen), seen
        expect(page.locator('[data-bind="totals.connections"]').first).to_have_text("4")
        # the charts' legends show the latest values without a pointer over them (they read "—")
        page.mouse.move(0, 0)
        legend = page.locator('[data-chart="connections"] .u-legend .u-series .u-value')
        expect(legend.nth(1)).to_have_text("4")
        expect(legend.nth(0)).not_to_have_text(re.compile(r"^(—|)$"))
        rate = page.locator('.stat-value[data-bind="rates.msgs_in"]')
        expect(rate).to_have_text(re.compile(r"^\d[\d.,k]*/s$"))
        assert rate.inner_text() != "0/s"
        rows = page.locator("[data-nodes] tr")
        expect(rows).to_have_count(1)
        expect(rows.first).to_contain_text("web1")
        expect(rows.first.locator(".badge")).to_have_text("ok")
        expect(page.locator("[data-tenants] tr").first).to_contain_text("acme")
        # brokerd writes history rows every 2 s here: a reload shows them as charts
        deadline = time.monotonic() + 20
        while True:
            page.wait_for_timeout(1_000)
            page.reload()
            if page.locator("[data-history-chart] canvas").count() or time.monotonic() > deadline:
                break
        expect(page.locator("[data-history-chart] canvas").first).to_be_visible()
        assert number(page, ".history-totals strong") > 0          # messages in, from the rows
        expect(page.locator("[data-status]")).to_have_text(re.compile("live"), timeout=10_000)
        shot(page, "dashboard", settle_ms=14_000)

        # the tenant's dashboard (from the cluster's tenant table)
        page.locator("[data-tenants] a", has_text="acme").click()
        expect(page).to_have_url(re.compile(r"/tenants/acme/metrics/$"))
        expect(page.locator("[data-status]")).to_have_text(re.compile("live"), timeout=10_000)
        tenant_total = '[data-bind="totals.msgs_in"]'
        first = number(page, tenant_total)
        page.wait_for_timeout(2_500)
        assert number(page, tenant_total) > first
        # the history tabs swap the fragment (htmx) and redraw
        page.locator(".range-tabs a", has_text="24h").click()
        expect(page.locator(".range-tabs a.active")).to_have_text("24h")
        expect(page.locator("#history [data-history-chart] canvas").first).to_be_visible()
        page.evaluate("window.scrollTo(0, 0)")
        shot(page, "dashboard-tenant", settle_ms=3_000)

        # a node's page (from the cluster's node table)
        page.goto(stack.url("/metrics/"))
        page.locator("[data-nodes] a", has_text="web1").click()
        expect(page.locator("[data-health]")).to_have_text("ok", timeout=10_000)
        expect(page.locator('[data-bind="memory_rss"]')).to_have_text(re.compile(r"MiB$"))
        shot(page, "dashboard-node", settle_ms=4_000)
        assert traffic.sent > 0


def test_dashboard_says_when_brokerd_stops_answering(page, stack, devices):
    log_in(page, stack)
    page.goto(stack.url("/metrics/"))
    expect(page.locator("[data-status]")).to_have_text("live", timeout=10_000)
    stack.broker.proc.send_signal(signal.SIGSTOP)     # nothing answers
    try:
        expect(page.locator("[data-status]")).to_have_text("brokerd unreachable", timeout=15_000)
        expect(page.locator("[data-alarms] .alarm-msg").first).to_contain_text("node web1 does not answer",
                                                                                timeout=15_000)
        expect(page.locator("[data-alarm-empty]")).to_be_hidden()      # not "No open alarm." above it
    finally:
        stack.broker.proc.send_signal(signal.SIGCONT)
    expect(page.locator("[data-status]")).to_have_text("live", timeout=15_000)
    expect(page.locator("[data-alarm-empty]")).to_be_visible(timeout=15_000)


def _change_password(page, stack, old: str, new: str) -> None:
    page.goto(stack.url("/account/password/"))
    page.locator("#id_old_password").fill(old)
    page.locator("#id_new_password1").fill(new)
    page.locator("#id_new_password2").fill(new)
    page.get_by_role("button", name="Change password").click()
    expect(page.get_by_text("Your password was changed.")).to_be_visible()


def test_dashboard_stays_live_when_its_user_changes_the_password_in_another_tab(context, page, stack, devices):
    """Django keeps the session that changed its password signed in under a new key (the cookie
    changes); the dashboard's socket, opened with the old key, was closed as signed out: an open
    dashboard said "signed out — reload" and stopped while its user was still signed in. The page
    now opens its socket again after a 4401 (up to 3 times, 1, 2 and 3 s later: the new cookie
    comes with the answer to the change, perhaps after the socket was closed), with the browser's
    cookie of then: it is live again; signed out for real, its sockets are refused and it says so."""
    log_in(page, stack)
    page.goto(stack.url("/metrics/"))
    expect(page.locator("[data-status]")).to_have_text("live", timeout=10_000)
    other = context.new_page()
    temporary = "browser-test-Changed-9"
    _change_password(other, stack, ADMIN_PASSWORD, temporary)
    try:
        page.wait_for_timeout(3_000)            # the socket is told at once (metrics.signals)
        expect(page.locator("[data-status]")).to_have_text("live", timeout=10_000)
    finally:
        _change_password(other, stack, temporary, ADMIN_PASSWORD)
    page.wait_for_timeout(3_000)
    expect(page.locator("[data-status]")).to_have_text("live", timeout=10_000)
    other.get_by_role("button", name="Sign out").click()
    expect(page.locator("[data-status]")).to_have_text("signed out — reload", timeout=15_000)
