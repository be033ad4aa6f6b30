"""A tenant's rules: stored by the console, run by the brokerd nodes.

The statement and the action are checked with the very compiler the nodes
run (``brokerd.rules``, pure: no asyncio, no Django -- the console imports it
as it imports ``brokerd.tenancy.acl``), so a rule the console stores is a rule
every node can load, and ``test_rule`` shows what a node would output.
Every change runs in one transaction that writes the tenant's policy
snapshot (the nodes have it within about a second) and one audit row.

A webhook's URL must be http:// or https:// with a literal host (checked
here); whether the node may reach that host is the node's own decision
(``--rules-webhook-allow``, checked on the resolved address when it sends).
A store rule names a dataset (a short identifier); its rows land in the
tenant's own telemetry (``brokerd.integrations.telemetry``), which the
Spark telemetry report reads for that tenant only.
"""

import json

from django.conf import settings
from django.db import transaction

from brokerd.rules import EVENTS, Context, RuleEvalError, RuleSyntaxError
from brokerd.rules.actions import ActionError, validate
from brokerd.rules.compiler import compile_rule
from brokerd.rules.errors import EVENT_PREFIX
from core import audit

from . import policy_snapshot
from .errors import NotFound, ServiceError
from .models import Rule, Tenant

MAX_SQL = 16_384


class RuleStatementError(ServiceError):
    """A statement the compiler refuses; ``line`` and ``column`` (from 1, or None)
    say where, so the console can point at it next to the editor."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None):
        super().__init__(message)
        self.line, self.column = line, column


def rule_doc(rule: Rule) -> dict:
    """What the snapshot carries, the audit log shows and ``rules list`` prints."""
    return policy_snapshot.processing_rule_json(rule)


def check_sql(sql: str):
    """The compiled statement, or ServiceError with the line and column of the fault."""
    if not isinstance(sql, str) or len(sql) > MAX_SQL:
        raise RuleStatementError(f"rule statement: at most {MAX_SQL} characters")
    try:
        return compile_rule(sql)
    except RuleSyntaxError as exc:
        raise RuleStatementError(f"rule statement: {exc}", exc.line, exc.column) from None


def check_action(action: str, config: dict) -> dict:
    try:
        return validate(action, config)
    except ActionError as exc:
        raise ServiceError(str(exc)) from None


def _audit(action: str, rule_id, tenant: Tenant, before, after, request=None, actor=None) -> None:
    """``actor`` "api-token:NAME" (``console.api``) is recorded with source "api"."""
    source = "api" if actor and actor.startswith("api-token:") else "console"
    audit.record(request, action, "rule", rule_id, tenant=tenant, before=before, after=after,
                 actor=actor if actor is not None or request is not None else "manage.py", source=source)


def rules(tenant: Tenant):
    return tenant.rules.order_by("id")


def get_rule(tenant: Tenant, rule_id: int) -> Rule:
    rule = tenant.rules.filter(pk=rule_id).first()
    if rule is None:
        raise NotFound(f"tenant {tenant.slug!r} has no rule {rule_id}")
    return rule


@transaction.atomic
def add_rule(tenant: Tenant, *, sql: str, action: str, config: dict, enabled: bool = True,
             request=None, actor=None) -> Rule:
    check_sql(sql)
    config = check_action(action, config)
    Tenant.objects.select_for_update().filter(pk=tenant.pk).first()     # one add at a time per tenant
    limit = settings.RULES_MAX_PER_TENANT
    count = tenant.rules.count()
    if count >= limit:
        raise ServiceError(f"tenant {tenant.slug!r} has {count} rules, the most a tenant may have "
                           f"(RULES_MAX_PER_TENANT: {limit}); delete one first")
    rule = Rule.objects.create(tenant=tenant, sql=sql, action=action, config=config, enabled=bool(enabled))
    policy_snapshot.publish(tenant)
    _audit("rule.create", rule.pk, tenant, None, rule_doc(rule), request, actor)
    return rule


@transaction.atomic
def update_rule(rule: Rule, *, sql: str, config: dict, action: str | None = None, request=None,
                actor=None) -> Rule:
    """A new statement and/or action for ``rule`` (``action`` None: its kind
    stays; the enabled flag stays; the nodes recompile it and start its counters afresh)."""
    check_sql(sql)
    action = action or rule.action
    config = check_action(action, config)
    before = rule_doc(rule)
    rule.sql, rule.action, rule.config = sql, action, config
    rule.save(update_fields=["sql", "action", "config", "updated_at"])
    policy_snapshot.publish(rule.tenant)
    _audit("rule.update", rule.pk, rule.tenant, before, rule_doc(rule), request, actor)
    return rule


@transaction.atomic
def set_rule_enabled(rule: Rule, enabled: bool, request=None, actor=None) -> Rule:
    before = rule_doc(rule)
    rule.enabled = bool(enabled)
    rule.save(update_fields=["enabled", "updated_at"])
    policy_snapshot.publish(rule.tenant)
    _audit("rule.enable" if enabled else "rule.disable", rule.pk, rule.tenant, before, rule_doc(rule), request,
           actor)
    return rule


@transaction.atomic
def delete_rule(rule: Rule, request=None, actor=None) -> None:
    before, tenant, pk = rule_doc(rule), rule.tenant, rule.pk
    rule.delete()
    policy_snapshot.publish(tenant)
    _audit("rule.delete", pk, tenant, before, None, request, actor)


# what a node's event carries besides the client (clientid, username, peerhost, timestamp, node):
# the event's topic (a message's, a subscription's filter), and whether a payload, QoS, retain flag
# and reason -- with the reason it gives most often, for a test that names none
EVENT_FIELDS = {
    "client_connected": (False, False, None),
    "client_disconnected": (False, False, "normal"),
    "session_subscribed": (True, False, None),
    "session_unsubscribed": (True, False, None),
    "message_dropped": (True, True, "no_subscribers"),
    "delivery_dropped": (True, True, "queue_full"),
    "message_acked": (True, True, None),
    # its reason is its result (allow | deny); its action subscribe for a filter with a wildcard, else publish
    "client_check_authz_complete": (True, False, "deny"),
}
assert set(EVENT_FIELDS) == set(EVENTS)


def test_rule(sql: str, *, topic: str, payload: bytes, client_id: str = "test-client", username: str = "",
              qos: int = 0, retain: bool = False, timestamp_ms: int = 0, event_topic: str = "",
              reason: str = "") -> dict | None:
    """The output row the statement gives for this message (None: WHERE is not true);
    nothing is published, stored or counted. ``topic`` ``$events/NAME``: for that event, as a
    node raises it -- ``event_topic`` its message's topic (or its subscription's filter), ``reason``
    its reason; ``payload``, ``qos`` and ``retain`` count only for the events carrying a message."""
    rule = check_sql(sql)
    if topic.startswith(EVENT_PREFIX):
        name = topic[len(EVENT_PREFIX):]
        if name not in EVENT_FIELDS:
            raise ServiceError(f"unknown event {topic!r}: one of " + ", ".join(EVENT_PREFIX + e for e in EVENTS))
        if name not in rule.events:
            raise ServiceError(f"{topic!r} is not in the rule's FROM ({_froms(rule)})")
        has_topic, has_message, default_reason = EVENT_FIELDS[name]
        if has_topic and not event_topic:
            raise ServiceError(f"{topic!r} carries a topic: give the event's topic")
        if name == "client_check_authz_complete":
            result = reason or default_reason
            if result not in ("allow", "deny"):
                raise ServiceError(f"{topic!r}: its result (the reason field) is allow or deny")
            ctx = Context(topic, event_topic, None, client_id, username, timestamp=timestamp_ms,
                          action="subscribe" if "+" in event_topic or "#" in event_topic else "publish",
                          result=result, authz_source="acl")
        else:
            ctx = Context(topic, event_topic if has_topic else None, payload if has_message else None, client_id,
                          username, qos if has_topic else None, retain if has_message else None, timestamp_ms,
                          reason=(reason or default_reason) if default_reason else None)
    elif not rule.matches(topic):
        raise ServiceError(f"topic {topic!r} does not match the rule's FROM ({_froms(rule)})")
    else:
        ctx = Context("message.publish", topic, payload, client_id, username, qos, retain, timestamp_ms)
    try:
        row = rule.run(ctx)
        if row is not None:
            row_json(row)             # as a node would fail it: a row that is not JSON (NaN, Infinity)
        return row
    except RuleEvalError as exc:
        raise ServiceError(f"the rule fails on this message: {exc}") from None
    except ValueError as exc:
        raise ServiceError(f"the rule fails on this message: ValueError: {exc}") from None


def _froms(rule) -> str:
    return ", ".join([f'"{t}"' for t in rule.topics] + [f'"{EVENT_PREFIX}{e}"' for e in sorted(rule.events)])


def row_json(row) -> str:
    return json.dumps(row, separators=(",", ":"), ensure_ascii=False, default=str, allow_nan=False)
