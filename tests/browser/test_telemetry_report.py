"""The telemetry report in a real browser (daphne + the console database of the
``stack`` fixture): the Reports page offers Usage or Telemetry, and a finished
telemetry run -- its result as the Spark job shapes it, stored as a worker
leaves it (the Spark run itself is in tests/reports/test_telemetry.py) --
reads at a phone's and a laptop's width. ``SCREENSHOTS=1``:
var/screenshots/telemetry-report-*.png."""

import json

import pytest
from playwright.sync_api import expect

from .conftest import ADMIN_PASSWORD, ADMIN_USER, shot
from .test_console import log_in

pytestmark = pytest.mark.slow

RESULT = {
    "kind": "telemetry", "tenant": "meteo", "dataset": None, "start": "2026-11-25T00:00:00+00:00",
    "end": "2026-11-27T00:00:00+00:00", "generated_at": "2026-11-26T06:00:00+00:00", "top_n": 10, "bucket": "hour",
    "datasets": [{"dataset": "temperatures", "rows": 4, "devices": 2, "rules": 1,
                  "first": "2026-11-26T04:10:00+00:00", "last": "2026-11-26T05:40:00+00:00"}],
    "fields": [{"dataset": "temperatures", "field": "room", "rows": 4, "numeric": 0, "min": None, "avg": None,
                "max": None},
               {"dataset": "temperatures", "field": "temp", "rows": 4, "numeric": 4, "min": 18.25, "avg": 23.6875,
                "max": 30.0}],
    "series": [{"dataset": "temperatures", "field": "temp", "at": "2026-11-26T04:00:00+00:00", "rows": 2,
                "min": 21.5, "avg": 25.75, "max": 30.0},
               {"dataset": "temperatures", "field": "temp", "at": "2026-11-26T05:00:00+00:00", "rows": 2,
                "min": 18.25, "avg": 21.625, "max": 25.0}],
    "series_truncated": False,
}

MAKE = r"""
import json, sys
from datetime import datetime, UTC
from spark_reports.models import ReportRun
from tenants.models import Tenant
run = ReportRun.objects.create(kind="telemetry", tenant=Tenant.objects.get(slug="meteo"), status="succeeded",
                               period_start=datetime(2026, 11, 25, tzinfo=UTC),
                               period_end=datetime(2026, 11, 27, tzinfo=UTC), result=json.loads(sys.stdin.read()))
print("RUN", run.pk)
"""


def test_a_telemetry_report_is_offered_and_reads_on_a_phone_and_a_laptop(page, stack):
    stack.provision([{"slug": "meteo", "default_acl": "allow", "devices": ["t1"]}])
    out = stack.manage("shell", "-c", MAKE, stdin=json.dumps(RESULT))
    run_id = int([ln for ln in out.splitlines() if ln.startswith("RUN ")][-1].split()[1])
    log_in(page, stack, ADMIN_USER, ADMIN_PASSWORD)
    for size, (w, h) in (("phone", (390, 844)), ("laptop", (1366, 900))):
        page.set_viewport_size({"width": w, "height": h})
        page.goto(stack.url("/tenants/meteo/reports/"))
        expect(page.get_by_label("Telemetry (what its store rules kept)")).to_be_visible()
        expect(page.locator("table").first).to_contain_text("telemetry report #")
        shot(page, f"telemetry-report-list-{size}")
        page.goto(stack.url(f"/tenants/meteo/reports/{run_id}/"))
        expect(page.get_by_role("heading", name="Telemetry of")).to_be_visible()
        expect(page.locator("#table-fields")).to_contain_text("23.688")
        expect(page.locator("#table-series")).to_contain_text("2026-11-26 05:00")
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
        shot(page, f"telemetry-report-{size}")
