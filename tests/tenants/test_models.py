"""Validation of tenants, devices, credentials, rules, quotas and $SYS settings."""

import datetime as dt

import pytest
from django.utils import timezone

from tenants import queries, services
from tenants.models import PolicyCounter, Quota, SystemTopicSetting, Tenant
from tenants.services import Conflict, NotFound, ServiceError

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("slug", ["acme", "default", "a", "a-1", "0", "x" * 63, "-odd-"])
def test_valid_slugs(slug):
    assert services.create_tenant(slug).slug == slug


@pytest.mark.parametrize("slug", ["", "Acme", "a_b", "a.b", "a/b", "a b", "x" * 64, "é", "a\n"])
def test_invalid_slugs(slug):
    with pytest.raises(ServiceError, match="slug"):
        services.create_tenant(slug)
    assert not Tenant.objects.exists()


def test_tenant_defaults_and_companions():
    t = services.create_tenant("acme")
    assert (t.name, t.status, t.default_acl, t.contact_emails) == ("acme", "active", "deny", [])
    assert Quota.objects.get(tenant=t).as_dict() == dict.fromkeys(Quota().as_dict())
    sys_ = SystemTopicSetting.objects.get(tenant=t)
    assert (sys_.enabled, sys_.interval, sys_.parts) == (
        True, 10, ["clients", "messages", "bytes", "subscriptions", "retained", "load"])
    assert PolicyCounter.objects.get(pk=1).value >= 1


def test_duplicate_tenant():
    services.create_tenant("acme")
    with pytest.raises(Conflict, match="already exists"):
        services.create_tenant("acme")


def test_contact_emails_round_trip():
    t = services.create_tenant("acme", contact_emails=[" a@x.test", "b@y.test", "a@x.test"])
    assert Tenant.objects.get(pk=t.pk).contact_emails == ["a@x.test", "b@y.test"]
    services.update_tenant(t, contact_emails=[])
    assert Tenant.objects.get(pk=t.pk).contact_emails == []


@pytest.mark.parametrize("email", ["nope", "a@", "a b@x.test", "a@x.test\nb@y.test"])
def test_invalid_contact_email(email):
    with pytest.raises(ServiceError, match="not a valid email"):
        services.create_tenant("acme", contact_emails=[email])


def test_default_acl_choices():
    assert services.create_tenant("a", default_acl="allow").default_acl == "allow"
    with pytest.raises(ServiceError, match="default_acl"):
        services.create_tenant("b", default_acl="maybe")


@pytest.mark.parametrize("name", ["sensor-1", "a", "gw_2.floor-3", "x" * 128])
def test_valid_device_names(tenant, name):
    assert services.create_device(tenant, name).name == name


@pytest.mark.parametrize("name", ["", "Sensor", "a/b", "a+b", "a#", "a b", "x" * 129, "{device}"])
def test_invalid_device_names(tenant, name):
    with pytest.raises(ServiceError, match="name"):
        services.create_device(tenant, name)


def test_device_names_unique_per_tenant(tenant):
    other = services.create_tenant("other")
    services.create_device(tenant, "d")
    services.create_device(other, "d")
    with pytest.raises(Conflict, match="acme/d already exists"):
        services.create_device(tenant, "d")


def test_cert_fingerprint_normalised_and_unique(tenant):
    fp = "AB:" + ":".join(["cd"] * 31)
    d = services.create_device(tenant, "d1", cert_fingerprint=fp, cert_cn=" d1.acme ")
    assert (d.cert_fingerprint, d.cert_cn) == ("ab" + "cd" * 31, "d1.acme")
    other = services.create_tenant("other")
    with pytest.raises(Conflict, match="fingerprint"):
        services.create_device(other, "d1", cert_fingerprint="ab" + "cd" * 31)
    # unset fingerprints do not collide
    services.create_device(tenant, "d2", cert_fingerprint="")
    services.create_device(tenant, "d3")
    assert queries.get_device(tenant, "d2").cert_fingerprint is None


@pytest.mark.parametrize("fp", ["abc", "g" * 64, "a" * 63, "a" * 65])
def test_invalid_cert_fingerprint(tenant, fp):
    with pytest.raises(ServiceError, match="fingerprint"):
        services.create_device(tenant, "d", cert_fingerprint=fp)


def test_credential_expiry_must_be_future_and_aware(device):
    with pytest.raises(ServiceError, match="past"):
        services.create_credential(device, expires_at=timezone.now() - dt.timedelta(seconds=1))
    with pytest.raises(ServiceError, match="timezone"):
        services.create_credential(device, expires_at=dt.datetime(2100, 1, 1))


@pytest.mark.parametrize("kwargs, message", [
    ({"topic": "a/{x}"}, "placeholder"),
    ({"topic": "a/#/b"}, "invalid topic filter"),
    ({"topic": ""}, "topic"),
    ({"topic": "$share/g/a"}, r"\$share"),
    ({"topic": "a", "action": "read"}, "action"),
    ({"topic": "a", "who": "device"}, "needs that device"),
    ({"topic": "a", "who": "pattern"}, "needs a device pattern"),
    ({"topic": "a", "pattern": "Sensor/*"}, "device_pattern"),
    ({"topic": "a", "who": "all", "pattern": "s*"}, "takes no device pattern"),
    ({"topic": "a", "allow": "yes"}, "allow must be true or false"),
    ({"topic": "a", "position": 0}, "position"),
])
def test_invalid_rules(tenant, kwargs, message):
    kwargs = {"action": "both", "allow": True, **kwargs}
    with pytest.raises(ServiceError, match=message):
        services.add_acl_rule(tenant, **kwargs)
    assert not queries.acl_rules(tenant).exists()


def test_rule_device_must_exist_in_the_tenant(tenant):
    other = services.create_tenant("other")
    foreign = services.create_device(other, "d9")
    with pytest.raises(NotFound, match="acme/nope"):
        services.add_acl_rule(tenant, topic="a", action="both", allow=True, device="nope")
    with pytest.raises(ServiceError, match="another tenant"):
        services.add_acl_rule(tenant, topic="a", action="both", allow=True, device=foreign)


@pytest.mark.parametrize("changes, message", [
    ({"max_connections": 0}, "positive"),
    ({"max_connections": -5}, "positive"),
    ({"max_payload": "10"}, "positive"),
    ({"max_payload": 1.5}, "positive"),
    ({"max_queued": True}, "positive"),
    ({"max_queued": 2**63}, "positive"),
    ({"max_everything": 1}, "unknown quota field"),
])
def test_invalid_quota(tenant, changes, message):
    with pytest.raises(ServiceError, match=message):
        services.update_quota(tenant, **changes)
    assert queries.quota(tenant).as_dict() == dict.fromkeys(Quota().as_dict())


def test_quota_set_and_clear(tenant):
    services.update_quota(tenant, max_connections=100, max_payload=2**20, max_session_expiry=3600)
    assert queries.quota(tenant).max_payload == 2**20
    services.update_quota(tenant, max_payload=None)
    q = queries.quota(tenant)
    assert (q.max_connections, q.max_payload, q.max_session_expiry) == (100, None, 3600)


def test_system_topic_settings(tenant):
    s = services.update_system_topics(tenant, enabled=False, interval=60, parts=["load", "clients", "load"])
    assert (s.enabled, s.interval, s.parts) == (False, 60, ["clients", "load"])
    assert queries.system_topics(tenant).parts == ["clients", "load"]
    for bad, message in ((0, "interval"), (86401, "interval"), ("5", "whole number")):
        with pytest.raises(ServiceError, match=message):
            services.update_system_topics(tenant, interval=bad)
    with pytest.raises(ServiceError, match="unknown system-topic part"):
        services.update_system_topics(tenant, parts=["clients", "weather"])
    assert queries.system_topics(tenant).interval == 60
