"""History charts from metrics_sample rows made here (as brokerd writes them),
with the expected points computed in the test: the series arithmetic, and
the endpoints (JSON and the htmx fragment) with their access rules."""

import datetime as dt
import json
import re

import pytest
from django.utils import timezone

from metrics import history_queries
from metrics.models import Sample
from tenants.models import Tenant

pytestmark = pytest.mark.django_db

NOW = dt.datetime(2026, 11, 22, 10, 30, 20, tzinfo=dt.UTC)


def minute(ago: int) -> dt.datetime:
    """The start of the minute ``ago`` minutes before NOW's minute."""
    return NOW.replace(second=0) - dt.timedelta(minutes=ago)


def row(at, node="n1", tenant="", resolution="m", **values):
    return Sample.objects.create(resolution=resolution, at=at, node=node, tenant=tenant, **values)


def test_last_hour_sums_nodes_per_minute_as_rates():
    row(minute(0), "n1", connections=5, messages_in=600, bytes_in=6000, dropped=60)
    row(minute(0), "n2", connections=7, messages_in=120, bytes_in=1200)
    row(minute(10), "n1", connections=3, messages_out=30)
    row(minute(60), "n1", messages_in=99999)                       # before the window
    s = history_queries.series("1h", now=NOW)
    assert len(s["t"]) == 60 and s["step"] == 60
    assert s["t"][-1] == int(minute(0).timestamp()) and s["t"][0] == int(minute(59).timestamp())
    assert s["connections"][-1] == 12                               # 5 + 7: the nodes' peaks added
    assert s["msgs_in"][-1] == (600 + 120) / 60
    assert s["bytes_in"][-1] == 7200 / 60 and s["drops"][-1] == 1.0
    assert s["msgs_out"][-11] == 0.5 and s["connections"][-11] == 3
    assert s["connections"][-2] is None                            # no row at all: a gap, not 0
    assert s["totals"]["messages_in"] == 720 and s["totals"]["connections_peak"] == 12
    assert s["known_points"] == 2


def test_tenant_series_zero_where_nodes_reported_but_not_the_tenant():
    row(minute(0), "n1", connections=4, messages_in=100)
    row(minute(0), "n1", tenant="acme", connections=2, messages_in=60)
    row(minute(1), "n1", connections=4, messages_in=100)           # acme silent this minute
    row(minute(0), "n1", tenant="globex", messages_in=40)
    s = history_queries.series("1h", tenant="acme", now=NOW)
    assert s["msgs_in"][-1] == 1.0 and s["connections"][-1] == 2
    assert s["msgs_in"][-2] == 0 and s["connections"][-2] == 0     # known minute, no acme row
    assert s["msgs_in"][-3] is None
    assert s["totals"]["messages_in"] == 60


def test_24_hours_in_5_minute_points():
    # NOW is 10:30:20 -> the last point starts 10:30; minutes 10:25..10:29 are the point before
    for m, (conns, msgs) in enumerate([(1, 300), (4, 300), (2, 300), (3, 0), (1, 0)], start=1):
        row(minute(m), "n1", connections=conns, messages_in=msgs)
    row(minute(2), "n2", connections=5, messages_in=300)
    s = history_queries.series("24h", now=NOW)
    assert len(s["t"]) == 288 and s["step"] == 300
    assert s["t"][-2] == int(dt.datetime(2026, 11, 22, 10, 25, tzinfo=dt.UTC).timestamp())
    assert s["msgs_in"][-2] == (300 * 3 + 300) / 300                # 1200 messages over 5 minutes
    assert s["connections"][-2] == 4 + 5                           # the highest per-minute sum (10:28)
    assert s["msgs_in"][-1] is None


def test_7_days_from_hour_rows_and_one_node():
    hour = NOW.replace(minute=0, second=0)
    row(hour - dt.timedelta(hours=2), "n1", resolution="h", connections=9, messages_in=36000, messages_out=7200)
    row(hour - dt.timedelta(hours=2), "n2", resolution="h", connections=1, messages_in=3600)
    row(hour - dt.timedelta(hours=2), "n1", resolution="m", messages_in=5)   # minute rows are not read
    s = history_queries.series("7d", now=NOW)
    assert len(s["t"]) == 168 and s["step"] == 3600
    assert s["msgs_in"][-3] == 11.0 and s["msgs_out"][-3] == 2.0 and s["connections"][-3] == 10
    one = history_queries.series("7d", node="n2", now=NOW)
    assert one["msgs_in"][-3] == 1.0 and one["connections"][-3] == 1 and one["msgs_out"][-3] == 0


# ------------------------------------------------------------------ endpoints

def recent_rows():
    now = timezone.now().replace(second=0, microsecond=0)
    # the tenants existed before their rows (a tenant's history starts when it was created)
    Tenant.objects.update(created_at=now - dt.timedelta(days=1))
    row(now - dt.timedelta(minutes=1), "n1", connections=3, messages_in=180)
    row(now - dt.timedelta(minutes=1), "n1", tenant="acme", connections=2, messages_in=120)
    row(now - dt.timedelta(minutes=1), "n1", tenant="globex", connections=1, messages_in=60)


def test_history_json_for_admin_cluster_node_and_tenant(browsers):
    recent_rows()
    root = browsers["root"]
    cluster = root.get("/metrics/history/?range=1h&format=json").json()
    assert cluster["range"] == "1h" and cluster["totals"]["messages_in"] == 180
    assert 3.0 in cluster["msgs_in"]
    assert root.get("/metrics/history/?range=1h&format=json&node=n2").json()["known_points"] == 0
    acme = root.get("/tenants/acme/metrics/history/?range=1h&format=json").json()
    assert acme["totals"]["messages_in"] == 120
    assert root.get("/metrics/history/?range=2y").status_code == 404


def test_tenant_history_only_for_its_members(browsers):
    recent_rows()
    assert browsers["alice"].get("/tenants/acme/metrics/history/?format=json").json()["totals"]["messages_in"] == 120
    assert browsers["alice"].get("/tenants/globex/metrics/history/?format=json").status_code == 404
    assert browsers["bob"].get("/tenants/acme/metrics/history/").status_code == 404
    assert browsers["alice"].get("/metrics/history/").status_code == 403
    assert browsers["anonymous"].get("/tenants/acme/metrics/history/").status_code == 302


def test_history_fragment_for_htmx_carries_the_data_and_range_tabs(browsers):
    recent_rows()
    r = browsers["alice"].get("/tenants/acme/metrics/history/?range=24h", HTTP_HX_REQUEST="true")
    html = r.content.decode()
    assert r.status_code == 200 and '<div class="card mt" id="history"' in html and "<html" not in html
    data = json.loads(re.search(r'<script id="history-data" type="application/json">(.*?)</script>', html, re.S)[1])
    assert data["range"] == "24h" and data["totals"]["messages_in"] == 120
    for r_ in ("1h", "24h", "7d"):
        assert f'hx-get="/tenants/acme/metrics/history/?range={r_}"' in html
    assert 'class="active">24h<' in html
