"""Services: rule ordering and moves, credentials, authentication, ACL decisions."""

import datetime as dt

import pytest
from django.db import connection
from django.utils import timezone

from tenants import hashing, queries, services
from tenants.models import Credential
from tenants.services import NotFound, ServiceError

pytestmark = pytest.mark.django_db


def topics(tenant):
    return [(r.position, r.topic) for r in queries.acl_rules(tenant)]


def add(tenant, topic, **kwargs):
    return services.add_acl_rule(tenant, topic=topic, action=kwargs.pop("action", "both"),
                                 allow=kwargs.pop("allow", True), **kwargs)


# ---------------------------------------------------------------- ACL order

def test_rules_append_and_insert(tenant):
    add(tenant, "a")
    add(tenant, "b")
    add(tenant, "first", position=1)
    add(tenant, "middle", position=3)
    add(tenant, "last", position=99)  # clamped to the end
    assert topics(tenant) == [(1, "first"), (2, "a"), (3, "middle"), (4, "b"), (5, "last")]


@pytest.mark.parametrize("move_from, to, expected", [
    (1, 3, ["b", "c", "a", "d"]),
    (4, 1, ["d", "a", "b", "c"]),
    (2, 2, ["a", "b", "c", "d"]),
    (3, 2, ["a", "c", "b", "d"]),
    (1, 50, ["b", "c", "d", "a"]),
])
def test_move(tenant, move_from, to, expected):
    rules = [add(tenant, t) for t in "abcd"]
    services.move_acl_rule(rules[move_from - 1], to)
    assert topics(tenant) == list(enumerate(expected, 1))


def test_move_refuses_bad_position(tenant):
    r = add(tenant, "a")
    with pytest.raises(ServiceError, match="position"):
        services.move_acl_rule(r, 0)


@pytest.mark.parametrize("at, direction, position, target", [
    (1, "up", None, None),          # the first rule stays
    (2, "up", None, 1),
    (2, "down", None, 3),
    (3, "down", None, None),        # the last rule stays: no change, no audit row
    (1, None, 3, 3),
    (1, None, 99, 3),               # clamped to the last place
    (3, None, 99, None),            # ... where the last rule already is
    (2, None, 2, None),
    (2, None, 0, None),
    (2, None, None, None),
    (2, "up", 3, 1),                # a direction wins over a position
])
def test_move_target(tenant, at, direction, position, target):
    for topic in "abc":
        add(tenant, topic)
    rule = queries.acl_rules(tenant)[at - 1]
    assert services.move_target(rule, direction, position) == target


def test_delete_renumbers(tenant):
    rules = [add(tenant, t) for t in "abc"]
    services.delete_acl_rule(rules[0])
    assert topics(tenant) == [(1, "b"), (2, "c")]


def test_deleting_a_device_deletes_its_rules(tenant, device):
    add(tenant, "a")
    add(tenant, "mine", device="sensor-1")
    add(tenant, "c")
    services.delete_device(device)
    assert topics(tenant) == [(1, "a"), (2, "c")]


def test_update_rule_switches_who(tenant, device):
    r = add(tenant, "a")
    services.update_acl_rule(r, device=device)
    assert (r.who, r.device_id, r.device_pattern) == ("device", device.pk, "")
    services.update_acl_rule(r, pattern="sensor-*")
    assert (r.who, r.device_id, r.device_pattern) == ("pattern", None, "sensor-*")
    services.update_acl_rule(r, who="all", topic="t/{device}", allow=False, action="publish")
    r = queries.get_acl_rule(tenant, r.pk)
    assert (r.who, r.device_id, r.device_pattern, r.topic, r.allow, r.action) == (
        "all", None, "", "t/{device}", False, "publish")
    with pytest.raises(ServiceError, match="invalid topic filter"):
        services.update_acl_rule(r, topic="t/#/x")
    assert queries.get_acl_rule(tenant, r.pk).topic == "t/{device}"


def test_get_rule_of_another_tenant(tenant):
    other = services.create_tenant("other")
    r = add(other, "a")
    with pytest.raises(NotFound, match="no ACL rule"):
        queries.get_acl_rule(tenant, r.pk)


# ---------------------------------------------------------------- decisions

def test_acl_decision(tenant, device):
    services.create_device(tenant, "pump-1")
    deny = add(tenant, "sensors/{device}/secret", allow=False)
    own = add(tenant, "sensors/{device}/#", pattern="sensor-*")
    cmd = add(tenant, "cmd/{client_id}/#", action="subscribe")
    assert services.acl_decision(tenant, "sensor-1", "c1", "publish", "sensors/sensor-1/t") == (True, own)
    assert services.acl_decision(tenant, "sensor-1", "c1", "publish", "sensors/sensor-1/secret") == (False, deny)
    assert services.acl_decision(tenant, "pump-1", "c1", "publish", "sensors/pump-1/t") == (False, None)
    assert services.acl_decision("acme", "pump-1", "c1", "subscribe", "cmd/c1/+") == (True, cmd)
    assert services.acl_decision(tenant, "pump-1", "c1", "publish", "cmd/c1/x") == (False, None)
    assert services.acl_decision(tenant, "pump-1", "c/1", "subscribe", "cmd/c/1/#") == (False, None)
    services.update_tenant(tenant, default_acl="allow")
    assert services.acl_decision(tenant, "pump-1", "c1", "publish", "anything") == (True, None)
    with pytest.raises(ServiceError, match="invalid topic name"):
        services.acl_decision(tenant, "pump-1", "c1", "publish", "a/#")
    with pytest.raises(NotFound):
        services.acl_decision("nope", "d", "c", "publish", "a")


def test_check_acl(tenant, device):
    deny = add(tenant, "sensors/{device}/secret", allow=False)
    own = add(tenant, "sensors/{device}/#", pattern="sensor-*")
    assert services.check_acl(tenant, "sensor-1", "c1", "publish", "sensors/sensor-1/t") == (True, own, False, True)
    assert services.check_acl(tenant, "sensor-1", "c1", "publish", "sensors/sensor-1/secret") == (
        False, deny, False, True)
    assert services.check_acl(tenant, "sensor-9", "c1", "subscribe", "sensors/sensor-9/#") == (
        True, own, True, False)     # granted, each message checked (the deny rule); no such device yet
    assert services.check_acl(tenant, "pump-1", "c1", "publish", "x") == (False, None, False, False)
    with pytest.raises(ServiceError, match="invalid topic name"):
        services.check_acl(tenant, "sensor-1", "c1", "publish", "a/#")


# ---------------------------------------------------------------- credentials

def test_secret_generated_and_only_hashed(device):
    cred, secret = services.create_credential(device, label="main")
    assert len(secret) >= 43  # token_urlsafe(32): 256 bits
    assert cred.secret_hash == hashing.hash_secret(secret)
    assert cred.secret_hash.startswith("sha256$") and len(cred.secret_hash) == 7 + 64
    assert services.authenticate_device("acme", "sensor-1", secret)
    assert not services.authenticate_device("acme", "sensor-1", secret[:-1] + "x")
    assert not services.authenticate_device("acme", "sensor-1", cred.secret_hash)


def dump_database() -> str:
    """Every value of every table, as text."""
    out = []
    with connection.cursor() as cur:
        for table in connection.introspection.table_names(cur):
            cur.execute(f'SELECT * FROM "{table}"')
            out.extend(repr(row) for row in cur.fetchall())
    return "\n".join(out)


def test_secrets_never_stored(tenant):
    _, _, s1 = services.provision_device(tenant, "d1")
    cred, s2 = services.create_credential(queries.get_device(tenant, "d1"))
    _, s3 = services.rotate_credential(cred)
    everything = dump_database()
    assert hashing.hash_secret(s3) in everything
    for secret in (s1, s2, s3):
        assert secret not in everything


def test_rotation(device):
    cred, old = services.create_credential(device)
    issued = cred.last_rotated_at
    _, new = services.rotate_credential(cred)
    assert new != old
    cred.refresh_from_db()
    assert cred.last_rotated_at > issued
    assert services.authenticate_device("acme", "sensor-1", new)
    assert not services.authenticate_device("acme", "sensor-1", old)


def test_rotate_device_credential_picks_the_only_one(device):
    # no credential yet: the first one is created
    cred, s1 = services.rotate_device_credential(device)
    cred2, s2 = services.rotate_device_credential(device)
    assert cred2.pk == cred.pk and s1 != s2
    assert Credential.objects.filter(device=device).count() == 1
    services.create_credential(device)
    with pytest.raises(ServiceError, match="2 credentials"):
        services.rotate_device_credential(device)
    _, s3 = services.rotate_device_credential(device, cred)
    assert services.authenticate_device("acme", "sensor-1", s3)


def test_expiry(device):
    cred, secret = services.create_credential(device, expires_at=timezone.now() + dt.timedelta(hours=1))
    assert services.authenticate_device("acme", "sensor-1", secret)
    services.expire_credential(cred)
    assert not services.authenticate_device("acme", "sensor-1", secret)
    services.expire_credential(cred, timezone.now() + dt.timedelta(days=1))
    assert services.authenticate_device("acme", "sensor-1", secret)


def test_authentication_needs_everything_enabled(tenant, device):
    cred, secret = services.create_credential(device)
    _, other_secret = services.create_credential(device)
    assert services.authenticate_device("acme", "sensor-1", other_secret)
    services.disable_credential(cred)
    assert not services.authenticate_device("acme", "sensor-1", secret)
    services.enable_credential(cred)
    services.disable_device(device)
    assert not services.authenticate_device("acme", "sensor-1", secret)
    services.enable_device(device)
    services.suspend_tenant(tenant)
    assert not services.authenticate_device("acme", "sensor-1", secret)
    services.resume_tenant(tenant)
    assert services.authenticate_device("acme", "sensor-1", secret)
    assert not services.authenticate_device("other", "sensor-1", secret)
    assert not services.authenticate_device("acme", "sensor-2", secret)
    assert not services.authenticate_device("acme", "sensor-1", None)
    services.delete_credential(cred)
    assert not services.authenticate_device("acme", "sensor-1", secret)


def test_delete_tenant_cascades(tenant, device):
    services.create_credential(device)
    add(tenant, "a", device=device)
    services.delete_tenant(tenant)
    assert not Credential.objects.exists()
    with pytest.raises(NotFound):
        queries.get_tenant("acme")


def test_queries(tenant, device):
    services.create_credential(device)
    c, _ = services.create_credential(device)
    services.disable_credential(c)
    services.create_device(tenant, "a-first")
    services.create_tenant("zeta")
    assert [(t.slug, t.device_count) for t in queries.tenants()] == [("acme", 2), ("zeta", 0)]
    assert [(d.name, d.credential_count, d.enabled_credential_count) for d in queries.devices(tenant)] == [
        ("a-first", 0, 0), ("sensor-1", 2, 1)]
