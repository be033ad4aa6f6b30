"""Which auto-subscriptions a connecting client gets (brokerd.tenancy.autosub, pure)."""

import pytest

from brokerd.tenancy.autosub import compile_autosub, for_client
from brokerd.tenancy.policy import TenantPolicy

DOCS = [
    {"id": 1, "pattern": "pump-*", "filter": "cmd/{device}/#", "qos": 1},
    {"id": 2, "pattern": None, "filter": "in/{client_id}", "qos": 0, "rh": 2},
    {"id": 3, "filter": "fleet/all", "qos": 2, "no_local": True, "rap": True},
]


def filters(device, client_id):
    return [(e.id, f) for e, f in for_client(compile_autosub(DOCS), device, client_id)]


def test_placeholders_and_device_globs():
    assert filters("pump-7", "c1") == [(1, "cmd/pump-7/#"), (2, "in/c1"), (3, "fleet/all")]
    assert filters("valve-1", "c1") == [(2, "in/c1"), (3, "fleet/all")]
    assert filters(None, "anon") == [(2, "in/anon"), (3, "fleet/all")]     # anonymous: pattern rules skip


@pytest.mark.parametrize("client_id", ["a/b", "a+", "a#", ""])
def test_a_placeholder_that_would_widen_the_filter_makes_the_rule_not_apply(client_id):
    assert filters("pump-7", client_id) == [(1, "cmd/pump-7/#"), (3, "fleet/all")]


def test_a_device_name_that_would_widen_the_filter_makes_the_rule_not_apply():
    assert filters("pump-#", "c1") == [(2, "in/c1"), (3, "fleet/all")]


def test_the_snapshot_carries_them_and_none_costs_nothing():
    p = TenantPolicy.from_snapshot("acme", 3, {"schema": 1, "autosub": DOCS})
    assert [(e.id, e.qos, e.no_local, e.rap, e.rh) for e in p.autosub] == [
        (1, 1, False, False, 0), (2, 0, False, False, 2), (3, 2, True, True, 0)]
    assert TenantPolicy.from_snapshot("acme", 3, {"schema": 1}).autosub is None
    with pytest.raises(ValueError):
        compile_autosub([{"id": 9, "filter": "a", "qos": 5}])
