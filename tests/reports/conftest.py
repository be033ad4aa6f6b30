"""The reports suite: one SparkSession for the whole test session, people
and tenants for the pages, and usage logs written in brokerd's layout."""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from tenants import services as tenant_services
from tenants.models import Membership

from ..procs import free_port

PASSWORD = "correct-horse-battery-9"


@pytest.fixture(scope="session")
def spark():
    """This process's long-lived session (spark_reports.spark), started once."""
    from spark_reports.spark import get_spark, stop_spark

    yield get_spark()
    stop_spark()


def _user(username, **extra):
    return get_user_model().objects.create_user(username, f"{username}@example.test", PASSWORD, **extra)


def _client(user):
    c = Client()
    c.force_login(user)
    return c


@pytest.fixture
def fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def brokerd_down(settings):
    """Pages that also show live numbers get no brokerd (refused at once)."""
    settings.BROKERD_ADMIN_URL = f"http://127.0.0.1:{free_port()}"
    settings.BROKERD_ADMIN_TOKEN = "unused"


@pytest.fixture
def acme(db):
    return tenant_services.create_tenant("acme", name="Acme Corp", contact_emails=["ops@acme.test", "cto@acme.test"])


@pytest.fixture
def globex(db):
    return tenant_services.create_tenant("globex", name="Globex", contact_emails=["noc@globex.test"])


@pytest.fixture
def people(db, fast_passwords, acme, globex):
    """root: platform administrator; alice: admin of acme; victor: viewer of
    acme; bob: admin of globex (an outsider to acme)."""
    out = {"root": _user("root", is_staff=True), "alice": _user("alice"), "victor": _user("victor"),
           "bob": _user("bob")}
    Membership.objects.create(user=out["alice"], tenant=acme, role=Membership.Role.ADMIN)
    Membership.objects.create(user=out["victor"], tenant=acme, role=Membership.Role.VIEWER)
    Membership.objects.create(user=out["bob"], tenant=globex, role=Membership.Role.ADMIN)
    return out


@pytest.fixture
def clients(people):
    out = {name: _client(user) for name, user in people.items()}
    out["anonymous"] = Client()
    return out


def sample_result(kind="tenant", tenant="acme") -> dict:
    """A finished report's result as the jobs shape it (spark_reports.reports)."""
    daily = [{"date": f"2026-03-0{d}", "msgs_in": 100 * d, "msgs_out": 50 * d, "bytes_in": 4000 * d,
              "bytes_out": 2000 * d, "rejected": d, "dropped": 2 * d, "connects": 10 + d, "disconnects": 9 + d}
             for d in range(2, 9)]
    totals = {"msgs_in": 3500, "msgs_in_q0": 3000, "msgs_in_q1": 400, "msgs_in_q2": 100, "msgs_out": 1750,
              "messages": 5250, "bytes_in": 140000, "bytes_out": 70000, "connects": 105, "disconnects": 98,
              "devices": 17, "peak_connections": 12, "peak_at": "2026-03-04T10:00:00+00:00",
              "median_session": 1234.5, "rejected": 35, "dropped": 70, "acl_denied": 20, "quota_rejected": 10,
              "auth_failures": 5, "dropped_queue_full": 30, "dropped_expired": 20, "dropped_no_subscribers": 20}
    result = {"kind": kind, "tenant": tenant if kind == "tenant" else None,
              "start": "2026-03-02T00:00:00+00:00", "end": "2026-03-09T00:00:00+00:00",
              "generated_at": "2026-03-09T06:00:00+00:00", "top_n": 10,
              "rows": {"connections": 120, "traffic": 900}, "totals": totals, "daily": daily,
              "rejections": [{"kind": "acl_denied", "label": "ACL denied", "count": 20},
                             {"kind": "quota_rejected", "label": "quota exceeded", "count": 10},
                             {"kind": "auth_failures", "label": "authentication failed", "count": 5}]}
    if kind == "tenant":
        result["top_topics"] = [{"topic": "plant/<b>boiler</b>", "messages": 900, "msgs_in": 600, "msgs_out": 300,
                                 "bytes": 36000, "bytes_in": 24000, "bytes_out": 12000},
                                {"topic": "plant/pump", "messages": 700, "msgs_in": 500, "msgs_out": 200,
                                 "bytes": 28000, "bytes_in": 20000, "bytes_out": 8000}]
        result["top_devices"] = [{"device": "sensor-1", "messages": 800, "msgs_in": 500, "msgs_out": 300,
                                  "bytes": 30000, "bytes_in": 20000, "bytes_out": 10000, "connections": 4,
                                  "connected_seconds": 7200.0}]
        result["reasons"] = [{"reason": "keepalive timeout", "count": 60}, {"reason": "client disconnect", "count": 38}]
    else:
        totals["tenants"] = 2
        result["tenants"] = [
            {"tenant": "acme", "rank": 1, "messages": 4000, "msgs_in": 3000, "msgs_out": 1000, "bytes_in": 1,
             "bytes_out": 1, "connects": 80, "devices": 10, "peak_connections": 9, "rejected": 30, "dropped": 60},
            {"tenant": "globex", "rank": 2, "messages": 1250, "msgs_in": 500, "msgs_out": 750, "bytes_in": 1,
             "bytes_out": 1, "connects": 25, "devices": 7, "peak_connections": 3, "rejected": 5, "dropped": 10}]
        result["nodes"] = [{"node": "node1", "messages": 5250, "msgs_in": 3500, "msgs_out": 1750, "bytes_in": 1,
                            "bytes_out": 1, "connects": 105, "disconnects": 98, "peak_connections": 12}]
    return result


@pytest.fixture
def make_run(db):
    """make_run(tenant_or_None, status="succeeded", **fields) -> a ReportRun as a worker leaves it."""
    from datetime import UTC, datetime

    from spark_reports.models import ReportRun

    def make(tenant, status="succeeded", **fields):
        kind = "tenant" if tenant is not None else "platform"
        defaults = {"period_start": datetime(2026, 3, 2, tzinfo=UTC), "period_end": datetime(2026, 3, 9, tzinfo=UTC),
                    "progress_total": 5, "attempts": 1}
        if status == "succeeded":
            defaults["result"] = sample_result(kind, tenant.slug if tenant else None)
        defaults.update(fields)
        return ReportRun.objects.create(kind=kind, tenant=tenant, status=status, **defaults)

    return make
