"""Auto-subscriptions in the console (issue 19): validated like ACL filters
(brokerd's topic validation), carried in the policy snapshot, audited;
``manage.py autosub`` and its contract. The broker side: tests/rules/test_autosub_e2e.py,
tests/tenancy/test_autosub.py."""


import pytest
from django.core.management import CommandError

from core.models import AuditEvent
from tenants import autosub, policy_snapshot
from tenants.errors import NotFound, ServiceError

from .test_cli import env, manage, one_line_error  # noqa: F401  (env: the module's migrated database)
from .test_commands import run

pytestmark = pytest.mark.django_db


def test_an_auto_subscription_is_stored_published_in_the_snapshot_and_audited(tenant):
    a = autosub.add(tenant, filter="cmd/{device}/#", qos=1, device_pattern="pump-*")
    b = autosub.add(tenant, filter="fleet/all", retain_handling=1, no_local=True, retain_as_published=True)
    assert policy_snapshot.load("acme")["autosub"] == [
        {"id": a.pk, "pattern": "pump-*", "filter": "cmd/{device}/#", "qos": 1, "no_local": False, "rap": False,
         "rh": 0},
        {"id": b.pk, "pattern": None, "filter": "fleet/all", "qos": 0, "no_local": True, "rap": True, "rh": 1}]
    a_id = a.pk
    autosub.delete(a)
    assert [d["id"] for d in policy_snapshot.load("acme")["autosub"]] == [b.pk]
    events = list(AuditEvent.objects.filter(object_type="autosub").order_by("id")
                  .values_list("action", "object_id", "actor"))
    assert events == [("autosub.create", str(a_id), "manage.py"), ("autosub.create", str(b.pk), "manage.py"),
                      ("autosub.delete", str(a_id), "manage.py")]
    with pytest.raises(NotFound):
        autosub.get(tenant, a_id)


@pytest.mark.parametrize("filt, qos, rh, fragment", [
    ("", 0, 0, "empty"),
    ("a/#/b", 0, 0, "invalid topic filter"),
    ("a/b+", 0, 0, "invalid topic filter"),
    ("a/{device}x", 0, 0, "placeholder"),
    ("a/{tenant}", 0, 0, "placeholder"),
    ("$share/g/a", 0, 0, "$share/"),
    ("$SYS/#", 0, 0, "$ topics"),
    ("a/b", 3, 0, "QoS is 0, 1 or 2"),
    ("a/b", -1, 0, "QoS is 0, 1 or 2"),
    ("a/b", 0, 3, "retain handling"),
    ("a" * 1025, 0, 0, "longer than 1024"),
])
def test_invalid_auto_subscriptions_are_refused_and_nothing_is_published(tenant, filt, qos, rh, fragment):
    before = policy_snapshot.load("acme")
    with pytest.raises(ServiceError, match=None) as exc:
        autosub.add(tenant, filter=filt, qos=qos, retain_handling=rh)
    assert fragment in str(exc.value)
    assert policy_snapshot.load("acme") == before
    assert not AuditEvent.objects.filter(object_type="autosub").exists()


def test_the_command_line_contract(tenant):
    [aid] = run("autosub", "add", "acme", "--filter", "cmd/{device}/#", "--qos", "2", "--device", "pump-*")
    [aid2] = run("autosub", "add", "acme", "--filter", "fleet/news", "--retain-handling", "1", "--no-local")
    listing = run("autosub", "list", "acme")
    assert listing[0].split() == ["ID", "DEVICES", "FILTER", "QOS", "OPTIONS"]
    assert listing[1].split() == [aid, "pump-*", "cmd/{device}/#", "2"]
    assert listing[2].split() == [aid2, "*", "fleet/news", "0", "no-local,rh=1"]
    assert run("autosub", "delete", "acme", aid) == [f"deleted auto-subscription {aid}"]
    with pytest.raises(CommandError, match=f"tenant 'acme' has no auto-subscription {aid}"):
        run("autosub", "delete", "acme", aid)


def test_errors_are_one_line_with_a_non_zero_exit(env):  # noqa: F811
    one_line_error(manage(env, "autosub", "add", "acme", "--filter", "a/#/b"), 1, "invalid topic filter 'a/#/b'")
    one_line_error(manage(env, "autosub", "add", "acme", "--filter", "a", "--qos", "3"), 2, "expected 0, 1 or 2")
    one_line_error(manage(env, "autosub", "add", "nosuch", "--filter", "a"), 1, "nosuch")
    one_line_error(manage(env, "autosub", "delete", "acme", "999"), 1, "has no auto-subscription 999")
    one_line_error(manage(env, "autosub", "add", "acme"), 2, "--filter")
    done = manage(env, "autosub", "add", "acme", "--filter", "cmd/{client_id}")
    assert done.returncode == 0 and done.stdout.strip().isdigit(), done
    done = manage(env, "autosub", "list", "acme")
    assert done.returncode == 0 and "cmd/{client_id}" in done.stdout
