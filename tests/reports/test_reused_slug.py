"""A tenant deleted and a new one made with the same slug: the usage log keys its rows by slug, so
the new tenant's reports must leave out the rows the deleted tenant left under it."""

from datetime import date, timedelta

import pytest

from spark_reports import services
from spark_reports import usagegen as gen
from tenants import services as tenant_services

pytestmark = pytest.mark.slow


def test_a_new_tenant_with_a_deleted_tenants_slug_reports_only_its_own_usage(spark, tmp_path, settings, acme):
    tenant_services.delete_tenant(acme)
    again = tenant_services.create_tenant("acme", contact_emails=["new@acme.test"])
    assert again.usage_since is not None
    since = again.usage_since.timestamp()
    minute = int(since // 60 * 60)
    old_traffic = [gen.traffic_row(minute - 86400, "acme", "old/secret", msgs_in_q1=1000, bytes_in=64000),
                   gen.traffic_row(minute, "acme", "old/secret", msgs_in_q1=7, bytes_in=70)]   # the minute of it
    new_traffic = [gen.traffic_row(minute + 120, "acme", "new/t", msgs_in_q1=3, bytes_in=30)]
    old_conns = [gen.connection_row("acme", "c-old", since - 7200, since - 60, username="acme/old-device",
                                    msgs_in=1000)]
    new_conns = [gen.connection_row("acme", "c-new", since + 130, since + 400, username="acme/new-device",
                                    msgs_in=3)]
    gen.write_rows(tmp_path, "traffic", old_traffic + new_traffic)
    gen.write_rows(tmp_path, "connections", old_conns + new_conns)
    settings.USAGE_DIR, settings.USAGE_LAKE = str(tmp_path), ""

    today = again.usage_since.date()
    run = services.create_run("tenant", today - timedelta(days=6), today + timedelta(days=1), tenant=again)
    run = services.execute_run(run, attempt=1)
    assert run.status == "succeeded", run.error
    totals = run.result["totals"]
    assert (totals["msgs_in"], totals["bytes_in"], totals["connects"], totals["devices"]) == (3, 30, 1, 1)
    assert [t["topic"] for t in run.result["top_topics"]] == ["new/t"]
    assert [d["device"] for d in run.result["top_devices"]] == ["new-device"]
    assert sum(d["msgs_in"] for d in run.result["daily"]) == 3
    assert date.fromisoformat(run.result["daily"][0]["date"]) == today


def test_a_tenant_whose_slug_was_never_used_reports_from_the_period_start(db):
    fresh = tenant_services.create_tenant("initech")
    assert fresh.usage_since is None
