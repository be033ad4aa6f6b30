"""Every page of the console at a phone's (390x844), a tablet's (820x1180) and a
laptop's (1366x900) width, in a real browser against the real system: no page
wider than the screen (tables scroll inside their card), the navigation
reachable on a phone or tablet (behind the Menu button), no JavaScript errors.

The pages are the GET entries of the authorization table
(tests/console/test_authorization.py), opened by a platform administrator
on a world of one tenant with one of everything those URLs name. Fragments
(CSV, htmx partials, the report's polling answer) are not pages and are
left out. ``SCREENSHOTS=1`` saves each page at each width under
var/screenshots/layout-*.png.
"""

import json
import re

import pytest
from django.urls import reverse

from ..console.test_authorization import TABLE
from .conftest import ADMIN_PASSWORD, ADMIN_USER, shot
from .test_console import connect_device, log_in

pytestmark = pytest.mark.slow

SIZES = {"phone": (390, 844), "tablet": (820, 1180), "laptop": (1366, 900)}
# answers that are not pages a person reads
NOT_PAGES = {"healthz", "favicon", "logout", "login", "home", "rules_table", "acl_check", "tenant_metrics_history",
             "metrics_history", "report_status", "report_csv", "platform_report_status", "platform_report_csv",
             # the console's REST API (console.api): JSON for bearer tokens, no page
             "api_openapi", "api_rules", "api_rule_test", "api_rule", "api_rule_enable", "api_rule_disable"}
PRINTABLE = {"report_print", "platform_report_print"}      # a report for paper: no navigation

WORLD = r"""
import datetime as dt, json
from django.contrib.auth import get_user_model
from django.utils import timezone
from console.models import ApiToken
from metrics.models import Alarm
from spark_reports.models import ReportRun, ReportSchedule
from tenants import rules as rule_services
from tenants import services
from tenants.models import Membership, Tenant
from tests.reports.conftest import sample_result

t = Tenant.objects.get(slug="layoutco")
services.update_tenant(t, name="Layout Co", contact_emails=["ops@layout.test"], default_acl=t.default_acl)
services.add_acl_rule(t, topic="extra/#", action="both", allow=True)
prule = rule_services.add_rule(t, sql='SELECT * FROM "x/#"', action="republish", config={"topic": "y/${clientid}"},
                               actor="test")
prule_off = rule_services.add_rule(t, sql='SELECT * FROM "x/#"', action="republish",
                                   config={"topic": "z/${clientid}"}, enabled=False, actor="test")
user = get_user_model().objects.create_user("member-of-layoutco", password="a-Long-passw0rd-9")
member = Membership.objects.create(user=user, tenant=t, role=Membership.Role.VIEWER)
device = t.devices.order_by("name").first()
week = dict(period_start=dt.datetime(2026, 3, 2, tzinfo=dt.UTC), period_end=dt.datetime(2026, 3, 9, tzinfo=dt.UTC))
run = ReportRun.objects.create(kind="tenant", tenant=t, status="succeeded", result=sample_result("tenant", t.slug),
                               **week)
failed = ReportRun.objects.create(kind="tenant", tenant=t, status="failed", error="boom", **week)
schedule = ReportSchedule.objects.create(tenant=t, frequency="weekly", hour=6, recipients=["ops@layout.test"])
prun = ReportRun.objects.create(kind="platform", status="succeeded", result=sample_result("platform", None), **week)
alarm = Alarm.objects.create(kind="node_down", subject="n9", message="node n9 is down", raised_at=timezone.now())
token, _ = ApiToken.issue("grafana", "read")
tenant = {"slug": t.slug, "device": device.name, "credential": device.credentials.first().pk,
          "rule": t.acl_rules.order_by("position").first().pk, "member": member.pk, "prule": prule.pk,
          "prule_off": prule_off.pk, "client": "layout-client", "run": run.pk, "failed_run": failed.pk,
          "schedule": schedule.pk}
platform = {"run": prun.pk, "failed_run": prun.pk, "alarm": alarm.pk, "token": token.pk, "node": "web1"}
print("WORLD " + json.dumps({"tenant": tenant, "platform": platform}))
"""


def pages(world) -> list[tuple[str, str]]:
    """[(URL name, path)] of every GET page of the authorization table."""
    out = []
    for name, tries in TABLE.items():
        if name in NOT_PAGES:
            continue
        for t in tries:
            if t.method != "GET":
                continue
            scoped = t.kind not in ("public", "authenticated", "platform") or "slug" in _params(name)
            objects = world["tenant"] if scoped else world["platform"]
            kwargs = {k: objects[v] for k, v in t.args.items()}
            if scoped:
                kwargs["slug"] = world["tenant"]["slug"]
            path = reverse(name, kwargs=kwargs)
            out.append((name, path + (f"?{t.query}" if t.query else "")))
            break
    return out


def _params(name: str) -> set[str]:
    from django.urls import get_resolver

    return {p for possibility in get_resolver().reverse_dict.getlist(name) for _, params in possibility[0]
            for p in params}


@pytest.fixture(scope="module")
def world(stack):
    """The objects, and a device connected (the client pages) that retained a message on a/b."""
    secrets = stack.provision([{"slug": "layoutco", "default_acl": "deny", "devices": ["sensor-1", "sensor-2"],
                                "acl": [{"topic": "{device}/#", "action": "both", "allow": True},
                                        {"topic": "a/#", "action": "both", "allow": True}]}])
    out = stack.manage("shell", "-c", WORLD)
    world = json.loads([ln for ln in out.splitlines() if ln.startswith("WORLD ")][-1][len("WORLD "):])
    device = connect_device(stack, world["tenant"]["client"], "layoutco/sensor-1", secrets["layoutco/sensor-1"])
    device.publish("a/b", b"retained for the pages", qos=1, retain=True)
    yield world
    device.disconnect()


def test_every_page_fits_a_phone_and_a_laptop(page, stack, world):
    errors = []
    page.on("pageerror", lambda exc: errors.append(f"{page.url}: {exc}"))
    page.on("console", lambda m: errors.append(f"{page.url}: {m.text}") if m.type == "error" else None)
    log_in(page, stack, ADMIN_USER, ADMIN_PASSWORD)
    wide, no_menu = [], []
    seen = pages(world)
    assert len(seen) >= 45, [n for n, _ in seen]
    for name, path in seen:
        for size, (w, h) in SIZES.items():
            page.set_viewport_size({"width": w, "height": h})
            response = page.goto(stack.url(path))
            assert response.status == 200, f"{name} {path}: {response.status}"
            width = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
            if width[0] > width[1]:
                wide.append(f"{name} at {size}: {width[0]} px wide in {width[1]}")
            if name in PRINTABLE:
                pass
            elif size in ("phone", "tablet"):          # both below the 900 px fold
                toggle = page.locator("[data-nav-toggle]")
                nav = page.locator("#site-nav")
                if not toggle.is_visible() or nav.is_visible():
                    no_menu.append(f"{name}: the navigation is not folded behind Menu")
                else:
                    toggle.click()
                    if not page.locator("#site-nav a", has_text="Tenants").first.is_visible():
                        no_menu.append(f"{name}: Menu does not open the navigation")
            else:
                if page.locator("[data-nav-toggle]").is_visible() or not page.locator("#site-nav").is_visible():
                    no_menu.append(f"{name}: the navigation is not shown on a laptop")
            shot(page, f"layout-{re.sub(r'[^a-z0-9_]+', '-', name)}-{size}")
    # a dashboard's socket closing as the page is left is not an error of the page
    errors = [e for e in errors if "WebSocket" not in e]
    assert not wide, wide
    assert not no_menu, no_menu
    assert not errors, errors
