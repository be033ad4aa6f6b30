"""The store action end to end (issue 19): a store rule added with ``manage.py
rules``, run by a real brokerd on what real paho devices publish, its rows
landed beside the usage log, compacted into the lake exactly once, and read
back by the Spark telemetry report -- one tenant's rows only."""

import json
import shutil
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command

from spark_reports import lake
from spark_reports.jobs import Period
from spark_reports.telemetry import TelemetryReport

from ..controlplane import ControlPlane
from ..mqtt import V311
from ..rules.nodes import client, loaded, rule_view, wait_for

pytestmark = pytest.mark.slow

SQL = ('SELECT payload.temp AS temp, payload.unit AS unit, nth(2, split(topic, \'/\')) AS room '
       'FROM "sensors/+/temp" WHERE payload.temp IS NOT NULL')
ACME = [(21.5, "kitchen"), (30.0, "kitchen"), (18.25, "cellar"), (25.0, "cellar")]
GLOBEX = [(900.0, "furnace"), (1000.0, "furnace")]


@pytest.fixture(scope="module")
def landed(tmp_path_factory):
    """acme and globex both store into a dataset named ``temps``; acme's devices
    publish 4 readings and one without a temperature, globex's 2; the node stops."""
    d = tmp_path_factory.mktemp("telemetry")
    plane = ControlPlane(d)
    secrets = plane.provision([{"slug": s, "default_acl": "allow", "devices": ["d1"]} for s in ("acme", "globex")])
    token = plane.issue_token("telemetry-reader", "read")
    rules = {s: int(plane.manage("rules", "add", s, "--sql", SQL, "--store", "temps").stdout) for s in ("acme", "globex")}
    usage = d / "usage"
    node = plane.broker("--admin", "127.0.0.1:0", "--usage-dir", str(usage), "--node-id", "t1",
                        "--rules-store-interval", "0.2")
    try:
        for slug in rules:
            loaded(node, token, slug, rules[slug])
        for slug, readings in (("acme", ACME), ("globex", GLOBEX)):
            dev = client(node, secrets, f"{slug}/d1", f"{slug}-dev", version=V311)
            for temp, room in readings:
                dev.publish(f"sensors/{room}/temp", json.dumps({"temp": temp, "unit": "C"}).encode(), qos=1)
            dev.publish("sensors/attic/temp", b'{"humidity": 40}', qos=1)        # WHERE not true: no row
            dev.publish("other/topic", b'{"temp": 99}', qos=1)                   # not the rule's FROM
            dev.disconnect()
        for slug, readings in (("acme", ACME), ("globex", GLOBEX)):
            n = len(readings)
            view = wait_for(lambda s=slug, n=n: (v := rule_view(node, token, s, rules[s])) and v["stored"] == n and v,
                            what=f"{slug}'s rows written")
            assert (view["matched"], view["passed"], view["no_result"], view["failed"], view["dropped"]) == (
                len(readings) + 1, len(readings), 1, 0, 0)
    finally:
        node.stop()
    return usage, rules


def _period():
    today = datetime.now(tz=UTC).date()
    return Period.days(today - timedelta(days=1), today)


def test_brokerd_lands_each_stored_row_once_in_the_tenants_name(landed):
    usage, rules = landed
    rows = [json.loads(line) for f in sorted(usage.glob("telemetry/date=*/t1-*.jsonl"))
            for line in f.read_text().splitlines()]
    assert sorted((r["tenant"], json.loads(r["data"])["temp"]) for r in rows) == sorted(
        [("acme", t) for t, _ in ACME] + [("globex", t) for t, _ in GLOBEX])
    r = next(r for r in rows if r["tenant"] == "acme")
    assert (r["dataset"], r["rule"], r["client_id"], r["node"]) == ("temps", rules["acme"], "acme-dev", "t1")
    assert r["topic"].startswith("sensors/") and abs(r["ts"] - time.time()) < 600
    assert json.loads(r["data"]).keys() == {"temp", "unit", "room"}


def _check_acme(result):
    assert result["tenant"] == "acme" and result["bucket"] == "hour"
    [ds] = result["datasets"]
    assert (ds["dataset"], ds["rows"], ds["devices"], ds["rules"]) == ("temps", 4, 1, 1)
    fields = {f["field"]: f for f in result["fields"]}
    temps = [t for t, _ in ACME]
    assert (fields["temp"]["rows"], fields["temp"]["numeric"], fields["temp"]["min"], fields["temp"]["max"]) == (
        4, 4, min(temps), max(temps))
    assert fields["temp"]["avg"] == pytest.approx(sum(temps) / 4)
    assert (fields["unit"]["rows"], fields["unit"]["numeric"], fields["unit"]["min"]) == (4, 0, None)
    assert sum(s["rows"] for s in result["series"] if s["field"] == "temp") == 4
    assert {s["field"] for s in result["series"]} == {"temp"}      # text fields have no series


@pytest.fixture(scope="module")
def acme_landed(spark, landed):
    """acme's telemetry report over the landed rows (and its period), made once for the module:
    checked by the first test, compared with the report over the lake by the second."""
    usage, _ = landed
    period = _period()
    return TelemetryReport().run(spark, str(usage), period, "acme"), period


def test_the_spark_report_reads_one_tenants_telemetry(spark, landed, acme_landed):
    """globex stores into a dataset of the same name, with hotter readings: none of them is in acme's figures."""
    usage, _ = landed
    result, period = acme_landed
    _check_acme(result)
    globex = TelemetryReport().run(spark, str(usage), period, "globex")
    assert [(d["dataset"], d["rows"]) for d in globex["datasets"]] == [("temps", 2)]
    assert {f["field"]: f["min"] for f in globex["fields"]}["temp"] == 900.0
    # a period that ends before the rows were stored: nothing (bounded on both ends)
    old = datetime.now(tz=UTC).date() - timedelta(days=3)
    assert TelemetryReport().run(spark, str(usage), Period.days(old, old), "acme")["datasets"] == []
    assert TelemetryReport().run(spark, str(usage), period, "acme", dataset="other")["datasets"] == []


def test_compacted_into_the_lake_exactly_once(spark, landed, acme_landed, tmp_path):
    """The compaction moves the telemetry into the Parquet lake with the usage datasets; a second run
    adds nothing, and the report over the lake is the report over the landed files."""
    usage, _ = landed
    copy = tmp_path / "usage"
    shutil.copytree(usage, copy)
    first = lake.compact(spark, str(copy), now=time.time() + 60, settle=0, keep_landed=0)
    assert any(u.startswith("telemetry/") for u in first.dates)
    assert not list(copy.glob("telemetry/date=*/*.jsonl"))
    assert list((copy / "lake" / "telemetry").glob("date=*/run=*/*.parquet"))
    again = lake.compact(spark, str(copy), now=time.time() + 60, settle=0, keep_landed=0)
    assert (again.files, again.rows) == (0, 0)
    a, period = dict(acme_landed[0]), acme_landed[1]
    b = TelemetryReport().run(spark, str(copy), period, "acme")
    a.pop("generated_at"), b.pop("generated_at")
    assert a == b
    _check_acme(b)


def test_manage_py_prints_the_report(spark, landed, acme, settings, capsys):
    usage, _ = landed
    settings.USAGE_DIR = str(usage)
    settings.USAGE_LAKE = str(usage / "lake")
    day = datetime.now(tz=UTC).date().isoformat()
    call_command("telemetry_report", "acme", "--dataset", "temps", "--from", day)
    _check_acme(json.loads(capsys.readouterr().out))


def test_the_console_runs_the_telemetry_report_and_shows_it(spark, landed, clients, acme, settings,
                                                           django_capture_on_commit_callbacks, monkeypatch):
    """"Run report" with Telemetry queues a telemetry run; the worker's run (services.execute_run, here
    in-process) reads brokerd's rows; the page, its CSV and the printable version show acme's figures.
    A viewer reads it; another tenant's member gets a 404."""
    from django.urls import reverse

    from spark_reports import services
    from spark_reports.models import ReportRun

    usage, _ = landed
    settings.USAGE_DIR = str(usage)
    settings.USAGE_LAKE = str(usage / "lake")
    sent = []
    monkeypatch.setattr("spark_reports.tasks.run_report.delay", lambda run_id: sent.append(run_id))
    with django_capture_on_commit_callbacks(execute=True):
        r = clients["alice"].post(reverse("reports", args=["acme"]), {"kind": "telemetry", "preset": "today"})
    run = ReportRun.objects.get()
    assert r.status_code == 302 and sent == [run.pk] and (run.kind, run.tenant_id) == ("telemetry", acme.pk)
    services.execute_run(run, attempt=1)
    run.refresh_from_db()
    assert run.status == "succeeded", run.error
    _check_acme(run.result)
    page = clients["victor"].get(reverse("report", args=["acme", run.pk])).content.decode()
    assert "Telemetry of Acme Corp" in page and 'id="table-fields"' in page
    fields = page[page.index('id="table-fields"'):]
    assert ">temp<" in fields and ">18.25<" in fields and ">30.0<" in fields and "23.688" in fields   # avg 23.6875
    assert "900" not in page                                                    # never globex's readings
    csv = clients["victor"].get(reverse("report_csv", args=["acme", run.pk]) + "?table=fields").content.decode()
    assert csv.splitlines()[0] == "dataset,field,rows,numeric,min,avg,max"
    assert "temps,temp,4,4,18.25,23.688,30" in csv
    tidy = clients["victor"].get(reverse("report_csv", args=["acme", run.pk])).content.decode()
    assert "fields,temps/temp,max,30" in tidy
    assert "Telemetry report" in clients["victor"].get(reverse("report_print", args=["acme", run.pk])).content.decode()
    listing = clients["alice"].get(reverse("reports", args=["acme"])).content.decode()
    assert "telemetry report #" in listing and "1 dataset" in listing
    assert clients["bob"].get(reverse("report", args=["acme", run.pk])).status_code == 404
