"""A tenant may lower its limits, never raise them; brokerd gets the smaller."""

import pytest

from tenants import policy_snapshot, queries, services
from tenants.errors import ServiceError

pytestmark = pytest.mark.django_db


def test_tenant_lowers_a_limit_and_the_snapshot_carries_it():
    t = services.create_tenant("acme")
    services.update_quota(t, max_connections=100, client_msgs_in=50)
    services.update_own_quota(t, max_connections=10)
    q = policy_snapshot.load("acme")["quota"]
    assert q["max_connections"] == 10
    assert q["client_msgs_in"] == 50
    assert queries.effective_quota(t)["max_connections"] == 10


def test_tenant_may_not_raise_above_the_ceiling():
    t = services.create_tenant("acme")
    services.update_quota(t, max_connections=100)
    with pytest.raises(ServiceError, match="may not exceed the limit of 100"):
        services.update_own_quota(t, max_connections=101)
    assert queries.own_quota(t).max_connections is None
    assert policy_snapshot.load("acme")["quota"]["max_connections"] == 100


def test_own_limit_under_an_unlimited_ceiling_applies():
    t = services.create_tenant("acme")
    services.update_own_quota(t, max_payload=1024)
    assert policy_snapshot.load("acme")["quota"]["max_payload"] == 1024


def test_ceiling_lowered_below_own_limit_wins():
    t = services.create_tenant("acme")
    services.update_quota(t, max_queued=1000)
    services.update_own_quota(t, max_queued=500)
    services.update_quota(t, max_queued=100)
    assert policy_snapshot.load("acme")["quota"]["max_queued"] == 100


def test_bad_values_refused_with_a_message():
    t = services.create_tenant("acme")
    with pytest.raises(ServiceError, match="positive integer"):
        services.update_own_quota(t, max_queued=0)
    with pytest.raises(ServiceError, match="unknown quota field"):
        services.update_own_quota(t, bogus=1)
