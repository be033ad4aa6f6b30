"""``manage.py rules add|list|delete|enable|disable|test``: a tenant's rules (brokerd/rules/)."""

import argparse
import time

from django.core.management.base import CommandError

from tenants import queries
from tenants import rules as services
from tenants.management.cli import SubcommandCommand, positive_int


def qos(text: str) -> int:
    if text not in ("0", "1", "2"):
        raise argparse.ArgumentTypeError(f"QoS is 0, 1 or 2, not {text!r}")
    return int(text)


def republish_qos(text: str):
    return text if text == "${qos}" else qos(text)


class Command(SubcommandCommand):
    help = "Manage a tenant's rules: SQL-like statements over its messages and events, and their actions."

    def add_subcommands(self, sub):
        p = sub.add_parser("add", help="add a rule; prints its id")
        p.add_argument("tenant")
        p.add_argument("--sql", required=True, help='e.g. SELECT payload.temp AS t FROM "sensors/+" WHERE t > 30')
        action = p.add_mutually_exclusive_group(required=True)
        action.add_argument("--republish", metavar="TOPIC_TEMPLATE", help="publish the output row to this topic")
        action.add_argument("--webhook", metavar="URL",
                            help="send the output row to this URL (http/https; ${field} templates in path and query)")
        action.add_argument("--store", metavar="DATASET",
                            help="append the output row to the tenant's telemetry dataset DATASET (a short name: "
                                 "a-z, 0-9, _), read by the Spark telemetry report")
        p.add_argument("--qos", type=republish_qos, default=0,
                       help="republish: QoS (default 0), or '${qos}': the message's")
        p.add_argument("--retain", action="store_true", help="republish: retained")
        p.add_argument("--retain-as-message", action="store_true",
                       help="republish: retained when the message was (EMQX's ${flags.retain})")
        p.add_argument("--payload", metavar="TEMPLATE", help="republish: payload template (default: the row as JSON)")
        p.add_argument("--method", default="POST", help="webhook: HTTP method (default POST)")
        p.add_argument("--header", action="append", default=[], metavar="'NAME: TEMPLATE'",
                       help="webhook: a request header (repeatable)")
        p.add_argument("--body", metavar="TEMPLATE", help="webhook: body template (default: the row as JSON)")
        p.add_argument("--timeout", type=float, default=5.0, help="webhook: seconds per attempt (default 5)")
        p.add_argument("--retries", type=int, default=3, help="webhook: attempts after the first (default 3)")
        p.add_argument("--disabled", action="store_true", help="store the rule disabled")
        sub.add_parser("list", help="list the tenant's rules").add_argument("tenant")
        for name, text in (("delete", "delete a rule"), ("enable", "enable a rule"), ("disable", "disable a rule")):
            p = sub.add_parser(name, help=text)
            p.add_argument("tenant")
            p.add_argument("rule_id", type=positive_int, metavar="ID")
        p = sub.add_parser("test", help="run a statement on one message and print the output row as JSON "
                                        "(null: WHERE is not true); nothing is published")
        p.add_argument("tenant")
        p.add_argument("--sql", required=True)
        p.add_argument("--topic", required=True)
        p.add_argument("--payload", required=True)
        p.add_argument("--client-id", default="test-client")
        p.add_argument("--username", default=None, help="default: TENANT/CLIENT_ID")
        p.add_argument("--qos", type=qos, default=0)
        p.add_argument("--event-topic", default="", help="--topic $events/...: the event's message topic or filter")
        p.add_argument("--reason", default="", help="--topic $events/...: the event's reason")

    def do_add(self, tenant, sql, republish, webhook, store, qos, retain, payload, method, disabled, header=(),
               body=None, timeout=5.0, retries=3, retain_as_message=False, **_):
        t = queries.get_tenant(tenant)
        if republish is not None:
            kind, config = "republish", {"topic": republish, "qos": qos,
                                         "retain": "${flags.retain}" if retain_as_message else retain}
            if payload is not None:
                config["payload"] = payload
        elif webhook is not None:
            kind, config = "webhook", {"url": webhook, "method": method, "timeout": timeout, "retries": retries}
            headers = {}
            for h in header:
                name, sep, value = h.partition(":")
                if not sep or not name.strip():
                    raise CommandError(f"--header {h!r}: expected 'NAME: VALUE'")
                headers[name.strip()] = value.strip()
            if headers:
                config["headers"] = headers
            if body is not None:
                config["body"] = body
        else:
            kind, config = "store", {"dataset": store}
        rule = services.add_rule(t, sql=sql, action=kind, config=config, enabled=not disabled)
        self.stdout.write(str(rule.pk))

    def do_list(self, tenant, **_):
        rows = []
        for r in services.rules(queries.get_tenant(tenant)):
            target = {"republish": r.config.get("topic"), "webhook": r.config.get("url"),
                      "store": r.config.get("dataset")}.get(r.action, "")
            rows.append((r.pk, "yes" if r.enabled else "no", r.action, target, " ".join(r.sql.split())))
        self.table(("ID", "ENABLED", "ACTION", "TARGET", "SQL"), rows)

    def do_delete(self, tenant, rule_id, **_):
        services.delete_rule(services.get_rule(queries.get_tenant(tenant), rule_id))
        self.stdout.write(f"deleted rule {rule_id}")

    def do_enable(self, tenant, rule_id, **_):
        services.set_rule_enabled(services.get_rule(queries.get_tenant(tenant), rule_id), True)
        self.stdout.write(f"enabled rule {rule_id}")

    def do_disable(self, tenant, rule_id, **_):
        services.set_rule_enabled(services.get_rule(queries.get_tenant(tenant), rule_id), False)
        self.stdout.write(f"disabled rule {rule_id}")

    def do_test(self, tenant, sql, topic, payload, client_id, username, qos, event_topic="", reason="", **_):
        t = queries.get_tenant(tenant)
        row = services.test_rule(sql, topic=topic, payload=payload.encode("utf-8"), client_id=client_id,
                                 username=username if username is not None else f"{t.slug}/{client_id}", qos=qos,
                                 timestamp_ms=int(time.time() * 1000), event_topic=event_topic, reason=reason)
        self.stdout.write(services.row_json(row))
