"""Rules in the console (issue 19): validated by brokerd's own compiler, carried
in the policy snapshot, audited; ``manage.py rules`` and its contract."""

import json

import pytest
from django.core.management import CommandError

from core.models import AuditEvent
from tenants import policy_snapshot
from tenants import rules as rule_services
from tenants.errors import NotFound, ServiceError

from .test_cli import env, manage, one_line_error  # noqa: F401  (env: the module's migrated database)
from .test_commands import run

pytestmark = pytest.mark.django_db

SQL = 'SELECT payload.temp AS t, clientid FROM "sensors/+/temp" WHERE payload.temp > 30'


def test_a_rule_is_stored_published_in_the_snapshot_and_audited(tenant):
    rule = rule_services.add_rule(tenant, sql=SQL, action="republish",
                                  config={"topic": "alerts/${clientid}", "qos": 1})
    doc = policy_snapshot.load("acme")
    assert doc["rules"] == [{"id": rule.pk, "sql": SQL, "action": "republish",
                             "config": {"topic": "alerts/${clientid}", "qos": 1, "retain": False},
                             "enabled": True}]
    rule_services.set_rule_enabled(rule, False)
    assert policy_snapshot.load("acme")["rules"][0]["enabled"] is False
    rule_services.delete_rule(rule)
    assert policy_snapshot.load("acme")["rules"] == []
    actions = list(AuditEvent.objects.filter(object_type="rule").order_by("id").values_list("action", "actor",
                                                                                           "tenant"))
    assert actions == [("rule.create", "manage.py", "acme"), ("rule.disable", "manage.py", "acme"),
                       ("rule.delete", "manage.py", "acme")]


def test_a_malformed_statement_is_refused_with_its_position(tenant):
    with pytest.raises(ServiceError, match=r"^rule statement: line 2, column 7: unknown field 'tmep'"):
        rule_services.add_rule(tenant, sql='SELECT clientid FROM "t"\nWHERE tmep > 1', action="republish",
                               config={"topic": "x"})
    with pytest.raises(ServiceError, match=r"line 1, column 36: incomplete expression"):
        rule_services.add_rule(tenant, sql='SELECT * FROM "t" WHERE (payload.a > ', action="republish",
                               config={"topic": "x"})
    assert not tenant.rules.exists()
    assert "rules" not in (policy_snapshot.load("acme") or {}) or policy_snapshot.load("acme")["rules"] == []


@pytest.mark.parametrize("action, config, says", [
    ("webhook", {"url": "ftp://example.com/"}, "must start with http:// or https://"),
    ("webhook", {"url": "file:///etc/passwd"}, "must start with http:// or https://"),
    ("webhook", {"url": "http://${host}/x"}, "host and port are literal"),
    ("webhook", {"url": "http://user:pw@example.com/"}, "user:password@"),
    ("webhook", {"url": "http://example.com/", "method": "TRACE"}, "method is one of"),
    ("webhook", {"url": "http://example.com/", "headers": {"Host": "x"}}, "set by the sender"),
    ("webhook", {"url": "http://example.com/", "headers": {"X-A": "a\r\nX-B: b"}}, "control characters"),
    ("webhook", {"url": "http://example.com/", "timeout": 0}, "timeout is more than 0"),
    ("webhook", {"url": "http://example.com/", "retries": 11}, "retries is 0..10"),
    ("store", {"dataset": "Temps"}, "the dataset is a short name"),
    ("store", {"dataset": "a" * 33}, "the dataset is a short name"),
    ("store", {"dataset": "../x"}, "the dataset is a short name"),
    ("store", {"dataset": "1x"}, "the dataset is a short name"),
    ("store", {}, "the dataset is a short name"),
    ("store", {"dataset": "t", "tenant": "globex"}, "unknown settings tenant"),
    ("republish", {"topic": "$SYS/x"}, "may not start with $"),
    ("republish", {"topic": "a/#"}, "wildcards"),
    ("republish", {"topic": "a/${"}, "closing"),
    ("republish", {"topic": "a", "qos": 3}, "qos is 0, 1, 2 or ${qos}"),
    ("teleport", {}, "unknown action"),
])
def test_actions_that_would_not_run_are_refused(tenant, action, config, says):
    with pytest.raises(ServiceError, match=says.replace("$", r"\$")):
        rule_services.add_rule(tenant, sql=SQL, action=action, config=config)
    assert not tenant.rules.exists()


def test_the_command_line_contract(tenant):
    [rid] = run("rules", "add", "acme", "--sql", SQL, "--republish", "alerts/${clientid}", "--qos", "1",
                "--retain")
    [rid2] = run("rules", "add", "acme", "--sql", 'SELECT * FROM "$events/client_connected"', "--republish",
                 "events/${clientid}", "--disabled")
    listing = run("rules", "list", "acme")
    assert listing[0].split() == ["ID", "ENABLED", "ACTION", "TARGET", "SQL"]
    assert listing[1].split()[:4] == [rid, "yes", "republish", "alerts/${clientid}"]
    assert listing[2].split()[:4] == [rid2, "no", "republish", "events/${clientid}"]
    assert run("rules", "enable", "acme", rid2) == [f"enabled rule {rid2}"]
    assert run("rules", "disable", "acme", rid) == [f"disabled rule {rid}"]
    assert [r["enabled"] for r in policy_snapshot.load("acme")["rules"]] == [False, True]
    assert run("rules", "delete", "acme", rid) == [f"deleted rule {rid}"]
    with pytest.raises(CommandError, match=f"tenant 'acme' has no rule {rid}"):
        run("rules", "delete", "acme", rid)


def test_a_webhook_rule_is_stored_with_its_request(tenant):
    [rid] = run("rules", "add", "acme", "--sql", SQL, "--webhook", "https://hooks.example.com/t/${clientid}?v=1",
                "--method", "put", "--header", "X-Device: ${clientid}", "--header", "Authorization: Bearer s3",
                "--body", '{"temp": ${t}}', "--timeout", "2.5", "--retries", "2")
    [doc] = policy_snapshot.load("acme")["rules"]
    assert (doc["id"], doc["action"]) == (int(rid), "webhook")
    assert doc["config"] == {"url": "https://hooks.example.com/t/${clientid}?v=1", "method": "PUT",
                             "headers": {"X-Device": "${clientid}", "Authorization": "Bearer s3"},
                             "body": '{"temp": ${t}}', "timeout": 2.5, "retries": 2}
    assert run("rules", "list", "acme")[1].split()[:4] == [rid, "yes", "webhook",
                                                           "https://hooks.example.com/t/${clientid}?v=1"]
    with pytest.raises(CommandError, match="expected 'NAME: VALUE'"):
        run("rules", "add", "acme", "--sql", SQL, "--webhook", "http://example.com/", "--header", "nocolon")


def test_a_store_rule_names_its_dataset(tenant):
    """``--store DATASET`` (the issue's contract): the rule's rows go to the tenant's telemetry dataset."""
    [rid] = run("rules", "add", "acme", "--sql", SQL, "--store", "temps_2")
    [doc] = policy_snapshot.load("acme")["rules"]
    assert (doc["id"], doc["action"], doc["config"]) == (int(rid), "store", {"dataset": "temps_2"})
    assert run("rules", "list", "acme")[1].split()[:4] == [rid, "yes", "store", "temps_2"]
    with pytest.raises(CommandError, match="store: the dataset is a short name"):
        run("rules", "add", "acme", "--sql", SQL, "--store", "../../etc")


def test_rules_test_prints_the_output_row_without_side_effects(tenant):
    before = policy_snapshot.load("acme")
    [line] = run("rules", "test", "acme", "--sql", SQL + " AND clientid = 'd7'", "--topic", "sensors/d1/temp",
                 "--payload", '{"temp": 31.5}', "--client-id", "d7")
    assert json.loads(line) == {"t": 31.5, "clientid": "d7"}
    assert run("rules", "test", "acme", "--sql", SQL, "--topic", "sensors/d1/temp", "--payload",
               '{"temp": 3}') == ["null"]
    with pytest.raises(CommandError, match="does not match the rule's FROM"):
        run("rules", "test", "acme", "--sql", SQL, "--topic", "other", "--payload", "{}")
    assert policy_snapshot.load("acme") == before and not tenant.rules.exists()


def test_rules_test_runs_an_event_statement_with_what_a_node_gives_it(tenant):
    """``--topic '$events/NAME'`` runs a statement reading events on that event, with the fields a node
    raises it with (tests/rules/test_rules_e2e.py shows the nodes' rows): before, every event statement
    was refused by the tester ("does not match the rule's FROM (no topic filter)")."""
    dropped = 'SELECT clientid, topic, qos, reason, payload FROM "$events/delivery_dropped"'
    [line] = run("rules", "test", "acme", "--sql", dropped, "--topic", "$events/delivery_dropped", "--event-topic",
                 "sensors/q/0", "--payload", "m0", "--qos", "1", "--client-id", "slow")
    assert json.loads(line) == {"clientid": "slow", "topic": "sensors/q/0", "qos": 1, "reason": "queue_full",
                                "payload": "m0"}
    [line] = run("rules", "test", "acme", "--sql", dropped, "--topic", "$events/delivery_dropped", "--event-topic",
                 "s/1", "--payload", "x", "--reason", "expired")
    assert json.loads(line)["reason"] == "expired"
    both = ('SELECT clientid, username, topic, payload, reason FROM "$events/client_connected", '
            '"$events/client_disconnected", "sensors/#"')
    [line] = run("rules", "test", "acme", "--sql", both, "--topic", "$events/client_connected", "--payload", "x",
                 "--client-id", "d7")
    assert json.loads(line) == {"clientid": "d7", "username": "acme/d7", "topic": None, "payload": None,
                                "reason": None}
    [line] = run("rules", "test", "acme", "--sql", both, "--topic", "$events/client_disconnected", "--payload", "")
    assert json.loads(line)["reason"] == "normal"
    [line] = run("rules", "test", "acme", "--sql", 'SELECT topic, qos FROM "$events/session_subscribed"', "--topic",
                 "$events/session_subscribed", "--event-topic", "cmd/#", "--qos", "2", "--payload", "")
    assert json.loads(line) == {"topic": "cmd/#", "qos": 2}
    authz = 'SELECT topic, action, result, authz_source FROM "$events/client_check_authz_complete"'
    [line] = run("rules", "test", "acme", "--sql", authz, "--topic", "$events/client_check_authz_complete",
                 "--event-topic", "other/#", "--payload", "")
    assert json.loads(line) == {"topic": "other/#", "action": "subscribe", "result": "deny", "authz_source": "acl"}
    [line] = run("rules", "test", "acme", "--sql", authz, "--topic", "$events/client_check_authz_complete",
                 "--event-topic", "other/x", "--reason", "allow", "--payload", "")
    assert json.loads(line) == {"topic": "other/x", "action": "publish", "result": "allow", "authz_source": "acl"}
    with pytest.raises(CommandError, match="its result \\(the reason field\\) is allow or deny"):
        run("rules", "test", "acme", "--sql", authz, "--topic", "$events/client_check_authz_complete",
            "--event-topic", "other/x", "--reason", "maybe", "--payload", "")
    with pytest.raises(CommandError, match=r"unknown event '\$events/client_gone': one of \$events/client_connected"):
        run("rules", "test", "acme", "--sql", dropped, "--topic", "$events/client_gone", "--payload", "")
    with pytest.raises(CommandError, match=r"is not in the rule's FROM \(\"sensors/#\", \"\$events/client_connected\""):
        run("rules", "test", "acme", "--sql", both, "--topic", "$events/message_acked", "--payload", "")
    with pytest.raises(CommandError, match="carries a topic: give the event's topic"):
        run("rules", "test", "acme", "--sql", dropped, "--topic", "$events/delivery_dropped", "--payload", "")
    assert not tenant.rules.exists()


def test_rules_test_fails_a_row_that_is_not_json_as_a_node_does(tenant):
    """The tester printed {"x":Infinity} where the node fails the rule (no JSON has Infinity)."""
    with pytest.raises(CommandError, match="the rule fails on this message: ValueError: Out of range float"):
        run("rules", "test", "acme", "--sql", 'SELECT float(payload.v) AS x FROM "s"', "--topic", "s",
            "--payload", '{"v": "1e999"}')


def test_unknown_tenant_and_rule(tenant):
    with pytest.raises(NotFound):
        rule_services.get_rule(tenant, 999)


@pytest.mark.slow
def test_errors_are_one_line_with_a_non_zero_exit(env):  # noqa: F811
    done = manage(env, "rules", "add", "acme", "--sql", 'SELECT * FROM "t" WHERE', "--republish", "x")
    one_line_error(done, 1, "rule statement: line 1, column 19: ")
    done = manage(env, "rules", "add", "acme", "--sql", SQL, "--webhook", "gopher://127.0.0.1:9/")
    one_line_error(done, 1, "webhook: the URL must start with http:// or https://")
    done = manage(env, "rules", "add", "acme", "--sql", SQL, "--republish", "x", "--webhook", "http://h/")
    one_line_error(done, 2, "not allowed with argument")
    done = manage(env, "rules", "add", "acme", "--sql", SQL, "--republish", "alerts/x")
    assert done.returncode == 0 and done.stdout.strip().isdigit(), done
    done = manage(env, "rules", "test", "acme", "--sql", SQL, "--topic", "sensors/a/temp", "--payload", '{"temp":40}')
    assert (done.returncode, json.loads(done.stdout)) == (0, {"t": 40, "clientid": "test-client"})


def test_a_tenant_has_at_most_rules_max_per_tenant_rules(tenant, settings):
    """A tenant's administrator could add rules without end: every rule matching a topic runs (and
    republishes) for each message -- 2,000 of them made one device message cost ~40 ms of the node's
    event loop and 2,000 deliveries whatever the tenant's message-rate quota -- and every rule rides in
    the policy snapshot each node fetches and compiles. Disabled rules count (enabling one is free)."""
    from tenants import services

    settings.RULES_MAX_PER_TENANT = 3
    rules = [rule_services.add_rule(tenant, sql=SQL, action="republish", config={"topic": f"alerts/{i}"})
             for i in range(2)]
    rule_services.set_rule_enabled(rules[0], False)
    rule_services.add_rule(tenant, sql=SQL, action="republish", config={"topic": "alerts/2"})
    with pytest.raises(ServiceError, match=r"^tenant 'acme' has 3 rules, the most a tenant may have"):
        rule_services.add_rule(tenant, sql=SQL, action="republish", config={"topic": "alerts/3"})
    assert tenant.rules.count() == 3 and len(policy_snapshot.load("acme")["rules"]) == 3
    other = services.create_tenant("globex", name="Globex")
    rule_services.add_rule(other, sql=SQL, action="republish", config={"topic": "alerts/x"})   # per tenant
    rule_services.delete_rule(rules[1])
    rule_services.add_rule(tenant, sql=SQL, action="republish", config={"topic": "alerts/3"})
    with pytest.raises(CommandError, match="the most a tenant may have"):
        run("rules", "add", "acme", "--sql", SQL, "--republish", "alerts/4")


@pytest.mark.parametrize("action, config", [
    ("republish", {"topic": "alerts/x", "payload": "x" * 20_000}),
    ("republish", {"topic": "alerts/" + "x" * 20_000}),
    ("republish", {"topic": "alerts/x", "user_properties": {f"k{i}": "v" for i in range(100)}}),
    ("webhook", {"url": "https://hooks.example.com/", "body": "x" * 20_000}),
    ("webhook", {"url": "https://hooks.example.com/", "headers": {f"X-H{i}": "v" for i in range(100)}}),
])
def test_an_actions_templates_are_bounded_as_its_statement_is(tenant, action, config):
    """The statement was bounded (16 KiB), its action's templates not: a megabyte payload template rode
    in the policy snapshot every node fetches on each of the tenant's changes, and was copied into each
    message the rule republished."""
    with pytest.raises(ServiceError, match=r"at most"):
        rule_services.add_rule(tenant, sql=SQL, action=action, config=config)
