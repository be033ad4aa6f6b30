"""The dashboard pages and the alarms: who may open what (administrator,
tenant member, outsider, anonymous), what the frames hold, the sidebar
badges, and clearing a node-down alarm by hand."""

import datetime as dt
import re

import pytest
from django.utils import timezone

from core.models import AuditEvent
from metrics import alarms as alarm_db
from metrics.core import Condition
from metrics.models import Alarm

pytestmark = pytest.mark.django_db


def text(r) -> str:
    """The page, its CSRF tokens blanked: 64 random letters and digits hold "n2" or "tiny" now and then."""
    page = re.sub(r'(name="csrfmiddlewaretoken" value=")[^"]*"', r'\1"', r.content.decode())
    return re.sub(r'("X-CSRFToken": ")[^"]*"', r'\1"', page)


def test_cluster_dashboard_for_administrators_only(browsers):
    r = browsers["root"].get("/metrics/")
    assert r.status_code == 200
    html = text(r)
    assert 'data-ws="/ws/metrics/"' in html and 'data-scope="cluster"' in html
    for chart in ("connections", "messages", "bytes", "drops"):
        assert f'data-chart="{chart}"' in html
    assert "vendor/uplot.iife.min.js" in html and "metrics/dashboard.js" in html
    assert 'id="history"' in html
    assert browsers["alice"].get("/metrics/").status_code == 403
    assert browsers["bob"].get("/metrics/").status_code == 403
    r = browsers["anonymous"].get("/metrics/")
    assert r.status_code == 302 and r["Location"].startswith("/login/")


def test_node_page_for_administrators_only(browsers):
    r = browsers["root"].get("/metrics/nodes/node7/")
    assert r.status_code == 200
    assert 'data-scope="node" data-node="node7"' in text(r) and "Node node7" in text(r)
    assert browsers["alice"].get("/metrics/nodes/node7/").status_code == 403
    assert browsers["anonymous"].get("/metrics/nodes/node7/").status_code == 302


def test_tenant_dashboard_for_members_and_administrators(browsers):
    r = browsers["alice"].get("/tenants/acme/metrics/")
    assert r.status_code == 200
    html = text(r)
    assert 'data-ws="/ws/metrics/tenants/acme/"' in html and 'data-scope="tenant"' in html
    assert browsers["alice"].get("/tenants/globex/metrics/").status_code == 404
    assert browsers["bob"].get("/tenants/acme/metrics/").status_code == 404
    assert browsers["bob"].get("/tenants/globex/metrics/").status_code == 200       # a viewer may watch
    assert browsers["root"].get("/tenants/acme/metrics/").status_code == 200
    # administrators may also watch a tenant brokerd knows without a console row (anonymous clients)
    assert browsers["root"].get("/tenants/default/metrics/").status_code == 200
    assert browsers["alice"].get("/tenants/default/metrics/").status_code == 404
    r = browsers["anonymous"].get("/tenants/acme/metrics/")
    assert r.status_code == 302 and r["Location"].startswith("/login/")


def test_tenant_dashboard_shows_the_connection_quota(browsers):
    html = text(browsers["tina"].get("/tenants/tiny/metrics/"))
    assert 'data-progress="totals.connections/quota.max_connections"' in html
    assert '<span class="unit">/ 2</span>' in html


def test_nav_entries_and_alarm_badges(browsers, tenants):
    alarm_db.apply([Condition("quota", "tiny:max_connections", "tiny", "tenant tiny: 2 connections ..."),
                    Condition("node_down", "n2", None, "node n2 is no longer in the cluster")], [])
    admin = text(browsers["root"].get("/tenants/"))
    assert 'href="/metrics/"' in admin and 'href="/metrics/alarms/"' in admin
    assert 'title="2 open alarms">2</span>' in admin
    tina = text(browsers["tina"].get("/tenants/tiny/"))
    assert 'href="/tenants/tiny/metrics/"' in tina and 'title="1 open alarm">1</span>' in tina
    assert 'href="/metrics/"' not in tina
    alice = text(browsers["alice"].get("/tenants/acme/"))
    assert "open alarm" not in alice


def test_alarms_shown_where_they_belong(browsers, tenants):
    alarm_db.apply([Condition("quota", "tiny:max_connections", "tiny", "tenant tiny: 2 of 2 connections"),
                    Condition("node_down", "n2", None, "node n2 is no longer in the cluster")], [])
    alarm_db.apply([], [("node_down", "n2")])
    overview = text(browsers["root"].get("/overview/"))
    assert "tenant tiny: 2 of 2 connections" in overview
    assert "Cleared recently (1)" in overview and "node n2 is no longer in the cluster" in overview
    assert "tenant tiny: 2 of 2 connections" in text(browsers["tina"].get("/tenants/tiny/metrics/"))
    acme = text(browsers["alice"].get("/tenants/acme/metrics/"))
    assert "tiny" not in acme and "n2" not in acme and "No open alarm." in acme
    page = text(browsers["root"].get("/metrics/alarms/?state=open"))
    assert "tenant tiny: 2 of 2 connections" in page and "node n2" not in page
    page = text(browsers["root"].get("/metrics/alarms/?state=cleared"))
    assert "node n2 is no longer in the cluster" in page
    assert browsers["alice"].get("/metrics/alarms/").status_code == 403


def test_one_open_alarm_per_kind_and_subject_history_kept():
    c = Condition("drops", "acme", None, "tenant acme: 50 messages dropped per second")
    assert alarm_db.apply([c], []) == {"raised": 1, "cleared": 0}
    assert alarm_db.apply([c], []) == {"raised": 0, "cleared": 0}          # another process raised it too
    assert alarm_db.apply([], [c.key]) == {"raised": 0, "cleared": 1}
    assert alarm_db.apply([], [c.key]) == {"raised": 0, "cleared": 0}
    assert alarm_db.apply([c], [])["raised"] == 1                           # again later: a new row
    assert Alarm.objects.filter(kind="drops", subject="acme").count() == 2
    assert alarm_db.open_keys() == {("drops", "acme")}


def test_node_left_for_good_cleared_by_an_administrator(browsers):
    alarm_db.apply([Condition("node_down", "n9", None, "node n9 is no longer in the cluster"),
                    Condition("drops", "acme", "acme", "drops")], [])
    node_alarm = Alarm.objects.get(subject="n9")
    drops = Alarm.objects.get(subject="acme")
    assert browsers["alice"].post(f"/metrics/alarms/{node_alarm.id}/dismiss/").status_code == 403
    assert browsers["root"].post(f"/metrics/alarms/{drops.id}/dismiss/").status_code == 404   # the hub clears those
    r = browsers["root"].post(f"/metrics/alarms/{node_alarm.id}/dismiss/", {"next": "https://evil.example/"})
    assert r.status_code == 302 and r["Location"] == "/metrics/alarms/"
    node_alarm.refresh_from_db()
    assert node_alarm.cleared_at is not None and node_alarm.dismissed_by == "root"
    assert AuditEvent.objects.filter(action="alarm.dismiss", actor="root").exists()
    assert alarm_db.dismissed_nodes(timezone.now() - dt.timedelta(minutes=1)).keys() == {"n9"}


def test_hub_stops_watching_a_dismissed_node(tenants):
    """After "left for good" the hub does not raise the alarm again while the node stays away."""
    from metrics.hub import get_hub

    hub = get_hub()
    now = timezone.now().timestamp()
    hub.rules.last_ok["n9"] = now - 60
    hub._quotas_at = now
    alarm_db.apply([Condition("node_down", "n9", None, "gone")], [])
    alarm_db.dismiss(Alarm.objects.get(subject="n9"), "root")
    summary = {"nodes": [], "tenants": {}, "cluster": {}}
    assert hub._alarm_round(now + 1, summary, None) == []
    assert "n9" not in hub.rules.last_ok
    assert not Alarm.objects.filter(cleared_at__isnull=True).exists()


def test_alarm_filters_answer_htmx_with_the_table_only(browsers, tenants):
    alarm_db.apply([Condition("quota", "tiny:max_connections", "tiny", "tenant tiny: 2 of 2 connections")], [])
    r = browsers["root"].get("/metrics/alarms/?state=open&kind=quota", HTTP_HX_REQUEST="true")
    html = text(r)
    assert html.lstrip().startswith('<div id="alarm-table">') and "<html" not in html
    assert "tenant tiny: 2 of 2 connections" in html and 'href="/tenants/tiny/metrics/"' in html
    assert "No alarms" in text(browsers["root"].get("/metrics/alarms/?kind=drops", HTTP_HX_REQUEST="true"))


def test_history_range_without_javascript_reloads_the_page(browsers):
    html = text(browsers["root"].get("/metrics/?range=7d"))
    assert 'href="/metrics/?range=24h"' in html and 'class="active">7d<' in html
    assert "one point per hour" in html
    assert browsers["root"].get("/metrics/?range=1y").status_code == 404
    html = text(browsers["root"].get("/metrics/nodes/web1/?range=24h"))
    assert 'hx-get="/metrics/history/?node=web1&amp;range=1h"' in html
