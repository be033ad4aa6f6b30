"""The whole pipeline on a real brokerd: devices connect and publish, brokerd
writes its usage log (``--usage-dir``), the Spark report reads it and the
console shows it -- the figures are what the devices did."""

import time
from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse

from spark_reports import reports
from spark_reports.jobs import Period
from spark_reports.models import ReportRun

from ..controlplane import ControlPlane
from ..mqtt import V5, V311, PahoClient
from ..procs import BrokerProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """Three devices of acme online together; 9 messages on t/a (QoS 0, 1, 2),
    4 on t/b, one refused login; then the node stops and flushes its log."""
    d = tmp_path_factory.mktemp("pipeline")
    plane = ControlPlane(d)
    secrets = plane.provision([{"slug": "acme", "default_acl": "allow", "devices": ["d1", "d2", "d3"]}])
    usage = d / "usage"
    node = BrokerProcess("--sys-interval", "0", "--usage-dir", str(usage), "--node-id", "p1", env=plane.env).start()
    try:
        port = node.port()
        clients = [PahoClient(f"cid-{n}", version=V5 if n == "d1" else V311, username=f"acme/{n}",
                              password=secrets[f"acme/{n}"]).connect(port) for n in ("d1", "d2", "d3")]
        sub, pub, _idle = clients
        sub.subscribe("t/#", qos=1)
        for qos in (0, 1, 2):
            for _ in range(3):
                pub.publish("t/a", b"12345", qos=qos)
        for _ in range(4):
            pub.publish("t/b", b"x", qos=1)
        sub.expect_n(13)
        with pytest.raises(ConnectionError):
            PahoClient("cid-bad", username="acme/d1", password="wrong").connect(port)
        for c in clients:
            c.disconnect()
        time.sleep(0.5)
    finally:
        node.stop()
    return usage


def _period():
    today = datetime.now(tz=UTC).date()
    return Period.days(today - timedelta(days=1), today)


@pytest.fixture(scope="module")
def landed_reports(spark, logged):
    """The tenant (acme) and platform reports over brokerd's landed log, made once for the module:
    the first test checks their figures, the compaction test compares the lake's with them."""
    period = _period()
    out = {code: reports.get(code).run(spark, str(logged), period, tenant)
           for code, tenant in (("tenant", "acme"), ("platform", None))}
    return dict(out, period=period)


def test_tenant_report_from_brokerds_log(landed_reports):
    result = landed_reports["tenant"]
    t = result["totals"]
    assert (t["msgs_in_q0"], t["msgs_in_q1"], t["msgs_in_q2"], t["msgs_in"]) == (3, 7, 3, 13)
    assert t["msgs_out"] == 13 and t["bytes_in"] == 9 * 5 + 4
    assert (t["connects"], t["disconnects"], t["devices"]) == (3, 3, 3)
    assert t["peak_connections"] == 3
    assert t["auth_failures"] == 1
    assert [(r["topic"], r["messages"]) for r in result["top_topics"]] == [("t/a", 18), ("t/b", 8)]
    devices = {r["device"]: r for r in result["top_devices"]}
    assert devices["d2"]["msgs_in"] == 13 and devices["d1"]["msgs_out"] == 13
    assert result["daily"][-1]["connects"] == 3

    platform = landed_reports["platform"]
    assert [r["tenant"] for r in platform["tenants"]] == ["acme"]
    assert [(r["node"], r["peak_connections"]) for r in platform["nodes"]] == [("p1", 3)]


def test_brokerds_log_compacted_gives_the_same_report(spark, logged, landed_reports, tmp_path):
    """brokerd's files compacted into the lake (a copy: the other tests read the
    landed log): the report over the lake is the report over the landing."""
    import shutil

    from spark_reports import lake

    copy = tmp_path / "usage"
    shutil.copytree(logged, copy)
    r = lake.compact(spark, str(copy), now=time.time() + 60, settle=0, keep_landed=0)   # the last minute closed
    assert r.files >= 2 and not list(copy.glob("*/date=*/*.jsonl"))
    for code, tenant in (("tenant", "acme"), ("platform", None)):
        a = dict(landed_reports[code])
        b = reports.get(code).run(spark, str(copy), landed_reports["period"], tenant)
        a.pop("generated_at"), b.pop("generated_at")
        assert a == b, code


def test_console_shows_it(spark, logged, clients, acme, settings):
    """The run a worker would make (services.execute_run, here in-process) and its page."""
    from spark_reports import services

    settings.USAGE_DIR = str(logged)
    today = datetime.now(tz=UTC).date()
    run = ReportRun.objects.create(tenant=acme, period_start=datetime(today.year, today.month, today.day, tzinfo=UTC)
                                   - timedelta(days=1),
                                   period_end=datetime(today.year, today.month, today.day, tzinfo=UTC)
                                   + timedelta(days=1))
    services.execute_run(run, attempt=1)
    run.refresh_from_db()
    assert run.status == "succeeded" and run.attempts == 1 and run.progress_step == 5
    html = clients["alice"].get(reverse("report", args=["acme", run.pk])).content.decode()
    assert ">26<" in html and "t/a" in html and "d2" in html


def test_a_cold_worker_says_spark_is_starting(spark, logged, clients, acme, settings, monkeypatch):
    """A cold first report sat at "Step 0 of 5" for ~30 s with no word of Spark starting. The
    page, looked at while the session starts (this process's is already running: the start is
    replayed by a stand-in for ``get_spark``), says so."""
    from spark_reports import services

    settings.USAGE_DIR = str(logged)
    today = datetime.now(tz=UTC).date()
    midnight = datetime(today.year, today.month, today.day, tzinfo=UTC)
    run = ReportRun.objects.create(tenant=acme, period_start=midnight - timedelta(days=1),
                                   period_end=midnight + timedelta(days=1))
    seen = []

    def starting():
        seen.append(clients["alice"].get(reverse("report", args=["acme", run.pk])).content.decode())
        return spark

    monkeypatch.setattr(services, "spark_running", lambda: False)
    monkeypatch.setattr(services, "get_spark", starting)
    services.execute_run(run, attempt=1)
    assert "Starting Spark: the worker&#x27;s first report waits for it (up to half a minute)" in seen[0]
    assert ">running<" in seen[0]
    run.refresh_from_db()
    assert run.status == "succeeded"
