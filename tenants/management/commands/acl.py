"""``manage.py acl add|list|delete|move|check``: a tenant's ACL rules."""

from tenants import queries, services
from tenants.management.cli import SubcommandCommand, positive_int


class Command(SubcommandCommand):
    help = "Manage a tenant's ACL rules (evaluated by position; the first match decides)."

    def add_subcommands(self, sub):
        p = sub.add_parser("add", help="add a rule (default: last)")
        p.add_argument("tenant")
        verdict = p.add_mutually_exclusive_group(required=True)
        verdict.add_argument("--allow", dest="allow", action="store_true")
        verdict.add_argument("--deny", dest="allow", action="store_false")
        p.add_argument("--action", required=True, choices=["publish", "subscribe", "both"])
        p.add_argument(
            "--topic",
            required=True,
            metavar="FILTER",
            help="topic filter; {device} and {client_id} fill whole levels",
        )
        who = p.add_mutually_exclusive_group()
        who.add_argument("--device", metavar="NAME", help="only this device")
        who.add_argument("--pattern", metavar="GLOB", help="devices whose name matches, e.g. 'sensor-*'")
        p.add_argument(
            "--position", type=positive_int, metavar="N", help="insert at this position (1 = first)"
        )
        sub.add_parser("list", help="list rules in evaluation order").add_argument("tenant")
        p = sub.add_parser("delete", help="delete a rule")
        p.add_argument("tenant")
        p.add_argument("rule_id", type=positive_int, metavar="RULE_ID")
        p = sub.add_parser("move", help="move a rule to another position")
        p.add_argument("tenant")
        p.add_argument("rule_id", type=positive_int, metavar="RULE_ID")
        p.add_argument("position", type=positive_int, metavar="POSITION")
        p = sub.add_parser("check", help="would this client be allowed?")
        p.add_argument("tenant")
        p.add_argument("device")
        p.add_argument("client_id")
        p.add_argument("action", choices=["publish", "subscribe"])
        p.add_argument("topic")

    def do_add(self, tenant, allow, action, topic, device, pattern, position, **_):
        rule = services.add_acl_rule(
            queries.get_tenant(tenant),
            allow=allow,
            action=action,
            topic=topic,
            device=device,
            pattern=pattern,
            position=position,
        )
        self.stdout.write(f"added rule {rule.pk} at position {rule.position}")

    def do_list(self, tenant, **_):
        rows = []
        for r in queries.acl_rules(queries.get_tenant(tenant)):
            who = r.who if r.who == "all" else f"{r.who} {r.device.name if r.device_id else r.device_pattern}"
            rows.append((r.pk, r.position, "allow" if r.allow else "deny", r.action, who, r.topic))
        self.table(("ID", "POS", "VERDICT", "ACTION", "WHO", "TOPIC"), rows)

    def do_delete(self, tenant, rule_id, **_):
        services.delete_acl_rule(queries.get_acl_rule(queries.get_tenant(tenant), rule_id))
        self.stdout.write(f"deleted rule {rule_id}")

    def do_move(self, tenant, rule_id, position, **_):
        rule = services.move_acl_rule(queries.get_acl_rule(queries.get_tenant(tenant), rule_id), position)
        self.stdout.write(f"moved rule {rule.pk} to position {rule.position}")

    def do_check(self, tenant, device, client_id, action, topic, **_):
        t = queries.get_tenant(tenant)
        allowed, rule = services.acl_decision(t, device, client_id, action, topic)
        verdict = "allowed" if allowed else "denied"
        self.stdout.write(
            f"{verdict} by rule {rule.pk} (position {rule.position})"
            if rule
            else f"{verdict} by the tenant's default ({t.default_acl})"
        )
