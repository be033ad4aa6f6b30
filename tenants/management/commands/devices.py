"""``manage.py devices create|list|delete|rotate|disable|enable``.

``create`` and ``rotate`` print the new secret alone on their last line (for
``tail -1``); it is shown once and only its hash is stored.
"""

from tenants import queries, services
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
