"""The console suite's people and data (after healthchecks' hc/test.py).

- ``platform_admin``: a staff user, sees and changes everything;
- ``alice``: administrator of tenant "acme";
- ``bob``: viewer of tenant "globex".

Both tenants hold devices, credentials and ACL rules. brokerd's admin API
points at a closed port unless a test asks for the live broker
(``tests/console/test_live.py``), so pages that read the cluster show the
"unreachable" banner and never wait.
"""


import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from tenants import policy_snapshot, services
from tenants.models import Membership

from ..procs import free_port

PASSWORD = "correct-horse-battery-9"


@pytest.fixture(autouse=True)
def brokerd_down(settings):
    """No admin API answers (connection refused at once); passwords hash fast."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.BROKERD_ADMIN_URL = f"http://127.0.0.1:{free_port()}"
    settings.BROKERD_ADMIN_TOKEN = "unused"


def _user(username, **extra):
    return get_user_model().objects.create_user(username, f"{username}@example.test", PASSWORD, **extra)


def make_acme():
    tenant = services.create_tenant("acme", name="Acme Corp", contact_emails=["ops@acme.test"])
    device, credential, secret = services.provision_device(tenant, "sensor-1", description="roof sensor")
    services.create_device(tenant, "gateway")
    services.add_acl_rule(tenant, topic="sensors/{device}/#", action="publish", allow=True, pattern="sensor-*")
    services.add_acl_rule(tenant, topic="secret/#", action="both", allow=False)
    tenant.test_credential = credential
    tenant.test_secret = secret
    return tenant


def make_globex():
    tenant = services.create_tenant("globex", name="Globex")
    device, credential, secret = services.provision_device(tenant, "plant-1")
    services.add_acl_rule(tenant, topic="plant/#", action="both", allow=True)
    tenant.test_credential = credential
    return tenant


def make_alice(acme):
    user = _user("alice")
    Membership.objects.create(user=user, tenant=acme, role=Membership.Role.ADMIN)
    return user


def make_bob(globex):
    user = _user("bob")
    Membership.objects.create(user=user, tenant=globex, role=Membership.Role.VIEWER)
    return user


def make_people(acme, globex) -> dict:
    """The fixtures' tenants and people made at once (``people``), for a module-scoped fixture."""
    return {"admin": _user("root", is_staff=True), "alice": make_alice(acme), "bob": make_bob(globex)}


@pytest.fixture
def acme(db):
    return make_acme()


@pytest.fixture
def globex(db):
    return make_globex()


@pytest.fixture
def platform_admin(db):
    return _user("root", is_staff=True)


@pytest.fixture
def alice(acme):
    return make_alice(acme)


@pytest.fixture
def bob(globex):
    return make_bob(globex)


@pytest.fixture
def people(platform_admin, alice, bob):
    return {"admin": platform_admin, "alice": alice, "bob": bob}


def _client(user):
    c = Client()
    c.force_login(user)
    return c


@pytest.fixture
def as_admin(platform_admin):
    return _client(platform_admin)


@pytest.fixture
def as_alice(alice):
    return _client(alice)


@pytest.fixture
def as_bob(bob):
    return _client(bob)


@pytest.fixture
def clients(people):
    """{"admin": Client, "alice": Client, "bob": Client, "anonymous": Client}."""
    out = {name: _client(user) for name, user in people.items()}
    out["anonymous"] = Client()
    return out


def policy(slug: str) -> dict:
    """The tenant's policy as brokerd puts it together: its row of tenants_policysnapshot, and
    ``devices`` from its rows of tenants_devicepolicy."""
    return policy_snapshot.load(slug)


HTMX = {"HTTP_HX_REQUEST": "true"}
