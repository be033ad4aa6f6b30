"""The tenant of anonymous clients (brokerd ``--allow-anonymous``, tenant
``default``) is a real tenant everywhere: made by ``console_bootstrap`` (make
run), listed on the Tenants page, counted on the Overview, in the tenant
switch, marked "anonymous clients" there, on its own pages and in the live
metrics' tenant table; its pages work. Against real processes: with its
console row brokerd still admits anonymous clients (the row mirrors the open
policy brokerd applied without one), their traffic is the tenant's, and
suspending the tenant refuses them.
"""

import asyncio
import io
import time

import paho.mqtt.client as mqtt
import pytest
from django.core.management import call_command
from django.urls import reverse

from core.brokerd_client import BrokerdClient
from core.models import AuditEvent
from metrics import core as metrics_core
from metrics.hub import Hub
from tenants import services
from tenants.models import Tenant

from ..controlplane import ControlPlane
from ..integration.helpers import Client, wait_until
from .conftest import policy

BADGE = "anonymous clients</span>"


def bootstrap() -> str:
    out = io.StringIO()
    call_command("console_bootstrap", stdout=out)
    return out.getvalue()


@pytest.fixture
def anonymous(db, settings, tmp_path):
    settings.ANONYMOUS_TENANT = "default"
    settings.VAR_DIR = tmp_path
    bootstrap()
    return Tenant.objects.get(slug="default")


def test_bootstrap_makes_it_a_tenant_that_changes_nothing_for_its_clients(anonymous):
    assert (anonymous.name, anonymous.status, anonymous.default_acl) == ("Anonymous clients", "active", "allow")
    snapshot = policy("default")                     # what brokerd reads: allow, no rule, no quota
    assert snapshot["default_acl"] == "allow" and snapshot["acl"] == []
    assert not any(snapshot["quota"].values())
    event = AuditEvent.objects.get(action="tenant.create")
    assert (event.actor, event.tenant) == ("manage.py console_bootstrap", "default")
    bootstrap()      # every make run: still one
    assert Tenant.objects.filter(slug="default").count() == 1
    assert AuditEvent.objects.filter(action="tenant.create").count() == 1


def test_a_default_tenant_made_by_hand_is_kept_as_it_is(db, settings, tmp_path):
    services.create_tenant("default", name="Ours", default_acl="deny")
    settings.ANONYMOUS_TENANT, settings.VAR_DIR = "default", tmp_path
    bootstrap()
    t = Tenant.objects.get(slug="default")
    assert (t.name, t.default_acl, t.is_anonymous) == ("Ours", "deny", True)


def test_no_anonymous_tenant_when_it_is_not_configured(db, settings, tmp_path):
    settings.ANONYMOUS_TENANT, settings.VAR_DIR = "", tmp_path
    bootstrap()
    assert not Tenant.objects.exists()


def test_listed_counted_marked_and_its_pages_work(anonymous, acme, as_admin):
    tenants = as_admin.get(reverse("tenant_list")).content.decode()
    assert reverse("tenant", args=["default"]) in tenants and tenants.count(BADGE) == 1
    overview = as_admin.get(reverse("overview")).content.decode()
    assert '<div class="stat-label">Tenants</div><div class="stat-value">2</div>' in overview
    assert "default</a> (anonymous clients)" in overview
    assert "default (anonymous clients)</option>" in overview                  # the tenant switch
    page = as_admin.get(reverse("tenant", args=["default"])).content.decode()
    assert BADGE in page and "The tenant of anonymous clients." in page
    assert "Delete…" not in page
    metrics = as_admin.get(reverse("tenant_metrics", args=["default"])).content.decode()
    assert BADGE in metrics
    for name in ("devices", "acl", "quotas", "system_topics", "members", "reports", "tenant_clients"):
        assert as_admin.get(reverse(name, args=["default"])).status_code == 200, name
    # acme is not the anonymous tenant
    assert BADGE not in as_admin.get(reverse("tenant", args=["acme"])).content.decode()


def test_it_cannot_be_deleted_only_suspended(anonymous, as_admin):
    response = as_admin.post(reverse("tenant_delete", args=["default"]), {"confirm": "default"}, follow=True)
    assert "is the tenant of anonymous clients" in response.content.decode()
    assert Tenant.objects.filter(slug="default").exists()


# ---------------------------------------------------------------- against brokerd


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    plane = ControlPlane(tmp_path_factory.mktemp("anonymous"))
    plane.env["ANONYMOUS_TENANT"] = "default"
    plane.env["BROKERD_ADMIN_TOKEN"] = "anonymous-tenant-token"
    plane.manage("console_bootstrap")
    return plane


def test_brokerd_admits_its_clients_counts_them_and_refuses_them_once_suspended(plane, db, settings):
    node = plane.broker("--admin", "127.0.0.1:0", anonymous=True)
    try:
        c = Client("anon-1", version=mqtt.MQTTv311).connect(node.port())
        c.publish("demo/hello", b"world", qos=1)
        api = BrokerdClient(node.admin_url, "anonymous-tenant-token")
        wait_until(lambda: (api.metrics().get("tenants") or {}).get("default", {}).get("connections") == 1, 10,
                   message="the anonymous client is not counted in the tenant default")
        # the live metrics' tenant table marks it
        settings.ANONYMOUS_TENANT = "default"
        hub = Hub()
        asyncio.run(hub.broadcast(None, time.time(), metrics_core.summarize(api.metrics(), None), None))
        rows = {t["slug"]: t for t in hub.latest["tenants"]}
        assert rows["default"]["anonymous"] is True and rows["default"]["connections"] == 1
        c.disconnect()
        # suspended in the console: brokerd refuses anonymous clients
        plane.shell("from tenants import services; from tenants.models import Tenant; "
                    "services.suspend_tenant(Tenant.objects.get(slug='default'))")
        def refused_now():
            c = Client("anon-2", version=mqtt.MQTTv311)
            try:
                c.connect(node.port())
            except ConnectionError:
                return True
            finally:
                c.client.disconnect()
                c.client.loop_stop()
            return False

        wait_until(refused_now, 10, message="a suspended anonymous tenant still admits anonymous clients")
    finally:
        node.stop()
