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


def test_the_new_tenants_history_leaves_out_the_minute_and_hour_it_shares_with_the_old_one(acme):
    """brokerd's history rows are a node's, a slug's and a minute's (or an hour's): the row of the minute
    and of the hour in which the slug was given again hold what the deleted tenant did in them before.
    The new tenant's charts (and their JSON) begin after them -- they showed that traffic as its own."""
    now = timezone.now()
    for resolution, at in (("m", now.replace(second=0, microsecond=0)),
                           ("h", now.replace(minute=0, second=0, microsecond=0))):
        Sample.objects.create(resolution=resolution, at=at, node="n1", tenant="", connections=9, messages_in=6000)
        Sample.objects.create(resolution=resolution, at=at, node="n1", tenant="acme", connections=7,
                              messages_in=4200)
    services.delete_tenant(acme)
    tenant = services.create_tenant("acme", name="Another customer")
    carol = get_user_model().objects.create_user("carol", "carol@example.test", PASSWORD)
    Membership.objects.create(user=carol, tenant=tenant, role=Membership.Role.ADMIN)
    client = Client()
    client.force_login(carol)
    for range_key in ("1h", "24h", "7d"):
        history = client.get(f"/tenants/acme/metrics/history/?range={range_key}&format=json").json()
        assert history["totals"]["messages_in"] == 0, range_key
        assert history["totals"]["connections_peak"] == 0, range_key
        assert 4200 / history["step"] not in history["msgs_in"], range_key


def test_a_tenant_whose_slug_was_never_used_keeps_the_minute_and_hour_it_was_made_in(acme, as_alice):
    """Only a reused slug's first minute and hour are left out: a new slug's are the tenant's own."""
    made = acme.created_at
    for resolution, at in (("m", made.replace(second=0, microsecond=0)),
                           ("h", made.replace(minute=0, second=0, microsecond=0))):
        Sample.objects.create(resolution=resolution, at=at, node="n1", tenant="", connections=2, messages_in=60)
        Sample.objects.create(resolution=resolution, at=at, node="n1", tenant="acme", connections=2,
                              messages_in=60)
    for range_key in ("1h", "24h", "7d"):
        history = as_alice.get(f"/tenants/acme/metrics/history/?range={range_key}&format=json").json()
        assert history["totals"]["messages_in"] == 60, range_key
