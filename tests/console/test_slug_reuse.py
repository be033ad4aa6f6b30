"""A deleted tenant's slug given to a new tenant (a feature: ``tenants.services``
reuses the slug's policy row). What the console keeps by slug rather than by
row -- the audit log, the metrics history brokerd writes -- belonged to the
customer who had the slug before: the new tenant's members must see only
what happened since their tenant was created."""

import datetime as dt

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from core.models import AuditEvent
from metrics.models import Sample
from tenants import services
from tenants.models import Membership

from .conftest import PASSWORD


@pytest.fixture
def reused(acme):
    """acme's history, then acme deleted and a new customer's "acme" made, administered by carol."""
    earlier = timezone.now() - dt.timedelta(minutes=30)
    AuditEvent.objects.create(at=earlier, actor="alice", source="console", action="device.create",
                              object_type="device", object_id="old-secret-pump", tenant="acme",
                              after='{"name": "old-secret-pump", "description": "vault door"}')
    minute = earlier.replace(second=0, microsecond=0)
    Sample.objects.create(resolution="m", at=minute, node="n1", tenant="", connections=9, messages_in=6000)
    Sample.objects.create(resolution="m", at=minute, node="n1", tenant="acme", connections=7, messages_in=4200)
    services.delete_tenant(acme)
    AuditEvent.objects.create(at=timezone.now(), actor="root", source="console", action="tenant.delete",
                              object_type="tenant", object_id="acme", tenant="acme")
    tenant = services.create_tenant("acme", name="Another customer")
    AuditEvent.objects.create(at=timezone.now(), actor="root", source="console", action="tenant.create",
                              object_type="tenant", object_id="acme-new", tenant="acme")
    carol = get_user_model().objects.create_user("carol", "carol@example.test", PASSWORD)
    Membership.objects.create(user=carol, tenant=tenant, role=Membership.Role.ADMIN)
    client = Client()
    client.force_login(carol)
    return client


def test_the_new_tenants_audit_log_starts_with_it(reused):
    page = reused.get("/tenants/acme/audit/").content.decode()
    assert "acme-new" in page
    assert "old-secret-pump" not in page and "vault door" not in page


def test_the_new_tenants_history_starts_with_it(reused):
    history = reused.get("/tenants/acme/metrics/history/?range=1h&format=json").json()
    assert history["totals"]["messages_in"] == 0 and history["totals"]["connections_peak"] == 0
    assert history["known_points"] == 0                 # before it existed: unknown, not zero


def test_platform_administrators_keep_the_whole_log(reused, as_admin):
    page = as_admin.get("/audit/?tenant=acme").content.decode()
    assert "old-secret-pump" in page and "acme-new" in page
