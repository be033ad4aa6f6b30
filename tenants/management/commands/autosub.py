"""``manage.py autosub list|add|delete``: a tenant's auto-subscribe rules (subscriptions added on CONNECT)."""

import argparse

from tenants import autosub as services
from tenants import queries
from tenants.management.cli import SubcommandCommand, positive_int


def level(text: str) -> int:
    if text not in ("0", "1", "2"):
        raise argparse.ArgumentTypeError(f"expected 0, 1 or 2, not {text!r}")
    return int(text)


class Command(SubcommandCommand):
    help = "Manage a tenant's auto-subscriptions: filters its devices are subscribed to when they connect."

    def add_subcommands(self, sub):
        sub.add_parser("list", help="list the tenant's auto-subscriptions").add_argument("tenant")
        p = sub.add_parser("add", help="add an auto-subscription; prints its id")
        p.add_argument("tenant")
        p.add_argument("--filter", required=True, help="topic filter; {device} and {client_id} fill whole levels")
        p.add_argument("--qos", type=level, default=0, help="QoS (default 0)")
        p.add_argument("--device", default="", metavar="GLOB", help="device-name glob (default: every client)")
        p.add_argument("--no-local", action="store_true", help="MQTT 5: not the client's own messages")
        p.add_argument("--retain-as-published", action="store_true", help="MQTT 5: keep the retain flag")
        p.add_argument("--retain-handling", type=level, default=0,
                       help="0: retained messages on every connect, 1: only when new, 2: never (default 0)")
        p = sub.add_parser("delete", help="delete an auto-subscription")
        p.add_argument("tenant")
        p.add_argument("autosub_id", type=positive_int, metavar="ID")

    def do_list(self, tenant, **_):
        rows = [(a.pk, a.device_pattern or "*", a.filter, a.qos,
                 ",".join(n for n, on in (("no-local", a.no_local), ("rap", a.retain_as_published)) if on)
                 + (f"{',' if a.no_local or a.retain_as_published else ''}rh={a.retain_handling}"
                    if a.retain_handling else ""))
                for a in services.auto_subscriptions(queries.get_tenant(tenant))]
        self.table(("ID", "DEVICES", "FILTER", "QOS", "OPTIONS"), rows)

    def do_add(self, tenant, filter, qos, device, no_local, retain_as_published, retain_handling, **_):
        a = services.add(queries.get_tenant(tenant), filter=filter, qos=qos, device_pattern=device,
                         no_local=no_local, retain_as_published=retain_as_published, retain_handling=retain_handling)
        self.stdout.write(str(a.pk))

    def do_delete(self, tenant, autosub_id, **_):
        services.delete(services.get(queries.get_tenant(tenant), autosub_id))
        self.stdout.write(f"deleted auto-subscription {autosub_id}")
