"""``manage.py tenants create|list|delete|suspend|resume|quota``."""

import argparse

from tenants import queries, services
from tenants.limits import QUOTA_FIELDS
from tenants.management.cli import SubcommandCommand, positive_int


def limit(text: str) -> int | None:
    """A quota value on the command line: a positive integer, or none (unlimited)."""
    if text.lower() in ("none", "unlimited"):
        return None
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'none', not {text!r}")


class Command(SubcommandCommand):
    help = "Manage tenants: create, list, delete, suspend, resume, quota."

    def add_subcommands(self, sub):
        p = sub.add_parser("create", help="create a tenant (quota unlimited)")
        p.add_argument("slug")
        p.add_argument("--name", default="", help="display name (default: the slug)")
        p.add_argument(
            "--contact", action="append", default=[], metavar="EMAIL", help="contact email (repeatable)"
        )
        p.add_argument(
            "--default-acl",
            choices=["allow", "deny"],
            default="deny",
            help="decision when no ACL rule matches (default: deny)",
        )
        sub.add_parser("list", help="list tenants")
        for name, text in (
            ("delete", "delete a tenant and everything it owns"),
            ("suspend", "refuse the tenant's devices"),
            ("resume", "undo suspend"),
        ):
            sub.add_parser(name, help=text).add_argument("slug")
        p = sub.add_parser("quota", help="show the tenant's quota, or set fields ('none' = unlimited)")
        p.add_argument("slug")
        for field in QUOTA_FIELDS:
            p.add_argument(
                "--" + field.replace("_", "-"),
                dest=field,
                type=limit,
                default=argparse.SUPPRESS,
                metavar="N|none",
            )

    def do_create(self, slug, name, contact, default_acl, **_):
        tenant = services.create_tenant(slug, name=name, contact_emails=contact, default_acl=default_acl)
        self.stdout.write(f"created tenant {tenant.slug}")

    def do_list(self, **_):
        self.table(
            ("SLUG", "STATUS", "DEFAULT ACL", "DEVICES", "NAME"),
            [(t.slug, t.status, t.default_acl, t.device_count, t.name) for t in queries.tenants()],
        )

    def do_delete(self, slug, **_):
        services.delete_tenant(queries.get_tenant(slug))
        self.stdout.write(f"deleted tenant {slug}")

    def do_suspend(self, slug, **_):
        services.suspend_tenant(queries.get_tenant(slug))
        self.stdout.write(f"suspended tenant {slug}")

    def do_resume(self, slug, **_):
        services.resume_tenant(queries.get_tenant(slug))
        self.stdout.write(f"resumed tenant {slug}")

    def do_quota(self, slug, **options):
        tenant = queries.get_tenant(slug)
        changes = {f: options[f] for f in QUOTA_FIELDS if f in options}
        quota = services.update_quota(tenant, **changes) if changes else queries.quota(tenant)
        self.table(
            ("LIMIT", "VALUE"), [(f, "unlimited" if v is None else v) for f, v in quota.as_dict().items()]
        )
