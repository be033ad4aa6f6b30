"""The first platform administrator of a fresh installation, and the tenant
of anonymous clients (run by `make run`).

Creates a staff superuser when there is no platform administrator yet: name
from ``CONSOLE_ADMIN_USER`` (default ``admin``), password from
``CONSOLE_ADMIN_PASSWORD`` or generated and kept in ``VAR_DIR/admin_password``
(mode 0600) so it can be shown again. Prints how to log in: the password
while it is still the initial one, otherwise how to reset it.

With ``ANONYMOUS_TENANT`` set (development's default: ``default``, the
tenant brokerd's ``--allow-anonymous`` clients land in), that tenant is made a
real one if it is not (``tenants.services.ensure_anonymous_tenant``): listed,
counted and managed like the others, marked "anonymous clients".
"""

import os
import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from core import audit
from tenants.audit_docs import tenant_doc
from tenants.services import ensure_anonymous_tenant


class Command(BaseCommand):
    help = ("Create the first platform administrator if there is none and the anonymous clients' tenant "
            "(ANONYMOUS_TENANT); print how to log in.")

    def handle(self, *args, **options):
        User = get_user_model()
        path = settings.VAR_DIR / "admin_password"
        username = os.environ.get("CONSOLE_ADMIN_USER") or "admin"
        with transaction.atomic():
            admin = User.objects.filter(is_staff=True, is_active=True).order_by("id").first()
            if admin is None:
                password = os.environ.get("CONSOLE_ADMIN_PASSWORD")
                if not password:
                    password = secrets.token_urlsafe(12)
                    path.parent.mkdir(parents=True, exist_ok=True)
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                    with os.fdopen(fd, "w") as fh:
                        fh.write(password)
                admin = User.objects.create_superuser(username, email="", password=password)
                self.stdout.write(f"created the platform administrator {username!r}")
        anonymous, created = ensure_anonymous_tenant(settings.ANONYMOUS_TENANT)
        if created:
            audit.record(None, "tenant.create", "tenant", anonymous.slug, tenant=anonymous,
                         after=tenant_doc(anonymous), actor="manage.py console_bootstrap")
            self.stdout.write(f"created the tenant {anonymous.slug!r} of anonymous clients (default ACL allow)")
        initial = path.read_text().strip() if path.exists() else None
        if initial and admin.check_password(initial):
            self.stdout.write(f"LOGIN {admin.get_username()} {initial}")
        else:
            self.stdout.write(f"LOGIN {admin.get_username()} (password set by you; reset: "
                              f"manage.py changepassword {admin.get_username()})")
