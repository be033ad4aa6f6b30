"""The management commands, through call_command."""

import io

import pytest
from django.core.management import CommandError, call_command

from tenants import queries, services

pytestmark = pytest.mark.django_db


def run(*args) -> list[str]:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue().splitlines()


def fails(*args, match: str):
    with pytest.raises(CommandError, match=match):
        run(*args)


def test_tenants_lifecycle():
    assert run("tenants", "create", "acme", "--name", "Acme", "--contact", "a@acme.test",
               "--contact", "b@acme.test", "--default-acl", "allow") == ["created tenant acme"]
    t = queries.get_tenant("acme")
    assert (t.name, t.contact_emails, t.default_acl) == ("Acme", ["a@acme.test", "b@acme.test"], "allow")
    run("tenants", "create", "default")
    listing = run("tenants", "list")
    assert listing[0].split() == ["SLUG", "STATUS", "DEFAULT", "ACL", "DEVICES", "NAME"]
    assert [line.split()[:2] for line in listing[1:]] == [["acme", "active"], ["default", "active"]]
    run("tenants", "suspend", "acme")
    assert queries.get_tenant("acme").status == "suspended"
    run("tenants", "resume", "acme")
    assert queries.get_tenant("acme").status == "active"
    assert run("tenants", "delete", "acme") == ["deleted tenant acme"]
    assert queries.policy("acme")["status"] == "deleted"


def test_tenants_errors():
    run("tenants", "create", "acme")
    fails("tenants", "create", "acme", match="already exists")
    fails("tenants", "create", "Bad_Slug", match="slug")
    fails("tenants", "create", "x", "--contact", "nope", match="not a valid email")
    fails("tenants", "create", "x", "--default-acl", "maybe", match="invalid choice")
    for sub in ("delete", "suspend", "resume", "quota"):
        fails("tenants", sub, "ghost", match="unknown tenant 'ghost'")
    fails("tenants", match="required")
    fails("tenants", "explode", match="invalid choice")


def test_tenants_quota():
    run("tenants", "create", "acme")
    out = run("tenants", "quota", "acme", "--max-connections", "100", "--max-payload", "65536",
              "--client-msgs-in", "10")
    assert ["max_connections", "100"] in [line.split() for line in out]
    q = queries.quota(queries.get_tenant("acme"))
    assert (q.max_connections, q.max_payload, q.client_msgs_in, q.max_queued) == (100, 65536, 10, None)
    run("tenants", "quota", "acme", "--max-payload", "none")
    assert queries.quota(queries.get_tenant("acme")).max_payload is None
    assert ["max_connections", "100"] in [line.split() for line in run("tenants", "quota", "acme")]
    for bad in ("0", "-1", "ten", "1.5"):
        fails("tenants", "quota", "acme", "--max-connections", bad, match="positive integer or 'none'")
    fails("tenants", "quota", "acme", "--max-everything", "1", match="unrecognized")


def test_devices():
    run("tenants", "create", "acme")
    out = run("devices", "create", "acme", "sensor-1", "--description", "roof", "--label", "factory")
    secret = out[-1]
    assert len(secret) >= 43 and " " not in secret
    assert services.authenticate_device("acme", "sensor-1", secret)
    assert secret not in "\n".join(out[:-1])
    fails("devices", "create", "acme", "sensor-1", match="acme/sensor-1 already exists")
    fails("devices", "create", "ghost", "d", match="unknown tenant")
    fails("devices", "create", "acme", "Bad/Name", match="device name")
    listing = run("devices", "list", "acme")
    assert listing[1].split()[:3] == ["sensor-1", "yes", "1/1"]

    new = run("devices", "rotate", "acme", "sensor-1")[-1]
    assert new != secret
    assert services.authenticate_device("acme", "sensor-1", new)
    assert not services.authenticate_device("acme", "sensor-1", secret)

    run("devices", "disable", "acme", "sensor-1")
    assert not services.authenticate_device("acme", "sensor-1", new)
    run("devices", "enable", "acme", "sensor-1")
    assert services.authenticate_device("acme", "sensor-1", new)
    run("devices", "delete", "acme", "sensor-1")
    for sub in ("delete", "rotate", "disable", "enable"):
        fails("devices", sub, "acme", "sensor-1", match="unknown device acme/sensor-1")


def test_devices_rotate_with_several_credentials():
    run("tenants", "create", "acme")
    run("devices", "create", "acme", "d")
    device = queries.get_device(queries.get_tenant("acme"), "d")
    cred, _ = services.create_credential(device)
    fails("devices", "rotate", "acme", "d", match="name the one to rotate")
    secret = run("devices", "rotate", "acme", "d", "--credential", str(cred.pk))[-1]
    assert services.authenticate_device("acme", "d", secret)
    fails("devices", "rotate", "acme", "d", "--credential", "999999", match="no credential 999999")


def test_acl():
    run("tenants", "create", "acme")
    run("devices", "create", "acme", "sensor-1")
    assert run("acl", "add", "acme", "--allow", "--action", "publish", "--topic", "sensors/{device}/#",
               "--pattern", "sensor-*")[0].endswith("at position 1")
    run("acl", "add", "acme", "--deny", "--action", "both", "--topic", "sensors/+/secret",
        "--position", "1")
    run("acl", "add", "acme", "--allow", "--action", "subscribe", "--topic", "cmd/{client_id}/#",
        "--device", "sensor-1")
    rules = list(queries.acl_rules(queries.get_tenant("acme")))
    assert [(r.position, r.allow, r.who) for r in rules] == [(1, False, "all"), (2, True, "pattern"),
                                                             (3, True, "device")]
    listing = run("acl", "list", "acme")
    assert [line.split()[0] for line in listing[1:]] == [str(r.pk) for r in rules]
    assert "device sensor-1" in listing[3]

    assert run("acl", "check", "acme", "sensor-1", "c1", "publish", "sensors/sensor-1/t") == [
        f"allowed by rule {rules[1].pk} (position 2)"]
    assert run("acl", "check", "acme", "sensor-1", "c1", "publish", "other") == [
        "denied by the tenant's default (deny)"]

    run("acl", "move", "acme", str(rules[0].pk), "3")
    assert [r.pk for r in queries.acl_rules(queries.get_tenant("acme"))] == [rules[1].pk, rules[2].pk,
                                                                             rules[0].pk]
    assert run("acl", "delete", "acme", str(rules[1].pk)) == [f"deleted rule {rules[1].pk}"]
    fails("acl", "delete", "acme", str(rules[1].pk), match="no ACL rule")
    fails("acl", "delete", "acme", "x", match="positive integer")


@pytest.mark.parametrize("args, match", [
    (["--allow", "--action", "both", "--topic", "a/#/b"], "invalid topic filter"),
    (["--allow", "--action", "both", "--topic", "a/{devices}"], "placeholder"),
    (["--allow", "--action", "both", "--topic", "a", "--device", "ghost"], "unknown device acme/ghost"),
    (["--allow", "--action", "both", "--topic", "a", "--pattern", "UPPER*"], "pattern"),
    (["--allow", "--action", "jump", "--topic", "a"], "invalid choice"),
    (["--action", "both", "--topic", "a"], "--allow --deny"),
    (["--allow", "--deny", "--action", "both", "--topic", "a"], "not allowed with"),
    (["--allow", "--action", "both", "--topic", "a", "--device", "d", "--pattern", "p"], "not allowed with"),
    (["--allow", "--action", "both", "--topic", "a", "--position", "0"], "positive integer"),
    (["--allow", "--action", "both"], "--topic"),
])
def test_acl_add_errors(args, match):
    run("tenants", "create", "acme")
    fails("acl", "add", "acme", *args, match=match)
    assert not queries.acl_rules(queries.get_tenant("acme")).exists()


def test_acl_unknown_tenant():
    fails("acl", "add", "ghost", "--allow", "--action", "both", "--topic", "a", match="unknown tenant")
    fails("acl", "list", "ghost", match="unknown tenant")
