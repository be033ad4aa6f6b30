"""``manage.py devices create|import|list|delete|rotate|disable|enable``.

``create`` and ``rotate`` print the new secret alone on their last line (for
``tail -1``); it is shown once and only its hash is stored. ``import`` reads
a CSV file of devices and writes a CSV of their user names and secrets.
"""

import os
import sys
from contextlib import ExitStack

from django.db import transaction

from tenants import device_import, queries, services
from tenants.errors import ServiceError
from tenants.management.cli import SubcommandCommand, positive_int


class Command(SubcommandCommand):
    help = "Manage a tenant's devices and their credentials."

    def add_subcommands(self, sub):
        p = sub.add_parser("create", help="create a device with a credential; prints its secret last")
        p.add_argument("tenant")
        p.add_argument("device")
        p.add_argument("--description", default="")
        p.add_argument("--label", default="", help="label of the credential")
        p.add_argument(
            "--cert-fingerprint",
            default=None,
            metavar="SHA256",
            help="SHA-256 of the DER client certificate (hex, ':' allowed)",
        )
        p.add_argument("--cert-cn", default=None, metavar="CN")
        p = sub.add_parser("import", help="create the devices of a CSV file (header: name[,cert_fingerprint]"
                           "[,cert_cn][,description]), each with a credential, in one change; "
                           "writes name,username,secret as CSV")
        p.add_argument("tenant")
        p.add_argument("file", nargs="?", default="-", help="the CSV file ('-', the default: standard input)")
        p.add_argument("--label", default="", help="label of the credentials")
        p.add_argument("--output", default="-", help="where the secrets go ('-', the default: standard output)")
        sub.add_parser("list", help="list a tenant's devices").add_argument("tenant")
        for name, text in (
            ("delete", "delete a device, its credentials and its own ACL rules"),
            ("disable", "refuse the device"),
            ("enable", "undo disable"),
        ):
            p = sub.add_parser(name, help=text)
            p.add_argument("tenant")
            p.add_argument("device")
        p = sub.add_parser("rotate", help="new secret for the device's credential; prints it last")
        p.add_argument("tenant")
        p.add_argument("device")
        p.add_argument(
            "--credential",
            type=positive_int,
            metavar="ID",
            help="the credential to rotate (needed when the device has several)",
        )

    def _device(self, tenant, device):
        return queries.get_device(queries.get_tenant(tenant), device)

    def _secret(self, device, credential, secret, verb):
        self.stdout.write(f"{verb} credential {credential.pk} of device {device}")
        self.stdout.write(f"username: {device.tenant.slug}/{device.name}")
        self.stdout.write("secret (shown once, only its hash is stored):")
        self.stdout.write(secret)

    def do_create(self, tenant, device, description, label, cert_fingerprint, cert_cn, **_):
        dev, credential, secret = services.provision_device(
            queries.get_tenant(tenant),
            device,
            description=description,
            label=label,
            cert_fingerprint=cert_fingerprint,
            cert_cn=cert_cn,
        )
        self.stdout.write(f"created device {dev}")
        self._secret(dev, credential, secret, "created")

    def do_import(self, tenant, file, label, output, **_):
        tenant = queries.get_tenant(tenant)
        checked = services.check_device_rows(tenant, self._import_rows(file), label=label)
        # the secrets' file is made before the devices (not after: a file that cannot be written then
        # would leave devices whose secrets nobody saw), and never over an existing one; the secrets are
        # written out before the devices are committed (a full disk, a closed pipe: nothing made)
        with ExitStack() as files:
            try:
                target = self.stdout if output == "-" else files.enter_context(
                    open(output, "x", newline="", encoding="utf-8"))
            except OSError as exc:
                raise ServiceError(f"cannot write {output}: {exc.strerror}") from None
            try:
                with transaction.atomic():
                    made = services.create_checked_devices(tenant, checked)
                    try:
                        device_import.write_secrets(target, tenant.slug, made)
                        target.flush()
                        if target is not self.stdout:
                            os.fsync(target.fileno())
                    except OSError as exc:
                        if target is self.stdout:
                            _drop_stdout()
                        raise ServiceError(f"cannot write the secrets to {'standard output' if output == '-' else output}"
                                           f": {exc.strerror}; no device was made") from None
            except BaseException:
                if target is not self.stdout:
                    files.close()
                    os.unlink(output)
                raise
        self.stderr.write(f"created {len(made)} devices in {tenant.slug} (the secrets are shown once, only their "
                          "hashes are stored)")

    @staticmethod
    def _import_rows(file) -> list[dict]:
        with ExitStack() as files:
            try:
                source = sys.stdin if file == "-" else files.enter_context(open(file, newline="", encoding="utf-8"))
            except OSError as exc:
                raise ServiceError(f"cannot read {file}: {exc.strerror}") from None
            return device_import.parse(source)

    def do_list(self, tenant, **_):
        rows = [
            (
                d.name,
                "yes" if d.enabled else "no",
                f"{d.enabled_credential_count}/{d.credential_count}",
                d.cert_fingerprint or "-",
                d.description,
            )
            for d in queries.devices(queries.get_tenant(tenant))
        ]
        self.table(("DEVICE", "ENABLED", "CREDENTIALS", "CERT SHA256", "DESCRIPTION"), rows)

    def do_delete(self, tenant, device, **_):
        dev = self._device(tenant, device)
        services.delete_device(dev)
        self.stdout.write(f"deleted device {tenant}/{device}")

    def do_disable(self, tenant, device, **_):
        services.disable_device(self._device(tenant, device))
        self.stdout.write(f"disabled device {tenant}/{device}")

    def do_enable(self, tenant, device, **_):
        services.enable_device(self._device(tenant, device))
        self.stdout.write(f"enabled device {tenant}/{device}")

    def do_rotate(self, tenant, device, credential, **_):
        dev = self._device(tenant, device)
        chosen = None if credential is None else queries.get_credential(dev, credential)
        cred, secret = services.rotate_device_credential(dev, chosen)
        self._secret(dev, cred, secret, "new secret for")


def _drop_stdout() -> None:
    """What could not be written to the standard output is not tried again at exit (another error,
    after the one line): it goes nowhere."""
    try:
        if sys.stdout.fileno() != 1:
            return
    except (AttributeError, ValueError, OSError):       # not the process's (call_command's own stream)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
