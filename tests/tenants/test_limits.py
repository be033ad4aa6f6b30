"""Quota arithmetic (tenants.limits and Quota.effective)."""

import pytest

from tenants import limits, queries, services


@pytest.mark.parametrize("args, expected", [
    ((None, None), None),
    ((100, None), 100),
    ((None, 7), 7),
    ((100, 7), 7),
    ((5, 50), 5),
    ((3, None, 2), 2),
    ((), None),
])
def test_effective_limit(args, expected):
    assert limits.effective_limit(*args) == expected


@pytest.mark.parametrize("limit, value, ok", [(None, 10**12, True), (5, 5, True), (5, 6, False)])
def test_within(limit, value, ok):
    assert limits.within(limit, value) is ok


@pytest.mark.parametrize("requested, limit, expected", [
    (0xFFFFFFFF, 3600, 3600), (60, 3600, 60), (60, None, 60)])
def test_clamp(requested, limit, expected):
    assert limits.clamp(requested, limit) == expected


def test_effective_limits_field_by_field():
    node = {"max_connections": 100000, "max_payload": 1 << 20}
    tenant = {"max_connections": 50, "max_queued": 10}
    eff = limits.effective_limits(node, tenant)
    assert set(eff) == set(limits.QUOTA_FIELDS)
    assert (eff["max_connections"], eff["max_payload"], eff["max_queued"], eff["connect_rate"]) == (
        50, 1 << 20, 10, None)


@pytest.mark.django_db
def test_quota_effective(tenant):
    services.update_quota(tenant, max_connections=10)
    q = queries.quota(tenant)
    assert q.effective("max_connections", 100000) == 10
    assert q.effective("max_connections", 3) == 3
    assert q.effective("max_payload", None) is None
    with pytest.raises(ValueError):
        q.effective("nope", 1)
