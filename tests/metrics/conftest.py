"""The live metrics suite's people, brokerd and websockets.

People (in the test database, as in tests/console): ``root`` a platform
administrator, ``alice`` a member of tenant "acme", ``bob`` a member of
"globex".

A real brokerd node (``--admin 127.0.0.1:0``) runs per module with a
console database of its own as its control plane (``tests.controlplane``:
the same tenants and devices, made through the Django layer in a
subprocess; a SQLite file, since brokerd cannot read the test database held
in memory by this process). The console under test -- the hub, the
consumers, the views -- points at it through ``BROKERD_ADMIN_URL`` /
``BROKERD_ADMIN_TOKEN``. Websockets go through the real ASGI application
(``console.asgi``: origin check, session authentication, routing) with
channels' ``WebsocketCommunicator``, inside ``async_to_sync`` so that the
hub's and the consumers' database calls run on the test's thread.
"""

import time

import paho.mqtt.client as mqtt
import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.test import Client

from metrics import hub as hub_module
from tenants import services
from tenants.models import Membership

from ..browser.conftest import browser, chromium_path, context, page  # noqa: F401  (test_browser's fixtures)
from ..controlplane import ControlPlane
from ..integration.helpers import Client as Paho
from ..procs import free_port

PASSWORD = "correct-horse-battery-9"
TOKEN = "metrics-console-token"
DEVICES = {"acme": [f"d{i}" for i in range(4)], "globex": ["g0", "g1"], "tiny": ["t0", "t1", "t2"],
           "strict": ["s0"]}
TINY_MAX_CONNECTIONS = 2


# ------------------------------------------------------------------ brokerd

@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    plane = ControlPlane(tmp_path_factory.mktemp("metrics"))
    plane.env["BROKERD_ADMIN_TOKEN"] = TOKEN
    return plane


@pytest.fixture(scope="module")
def secrets(plane):
    """{"acme/d0": secret, ...}: acme, globex and tiny allow everything (tiny may hold 2
    connections); strict allows only ok/#."""
    return plane.provision([
        {"slug": "acme", "default_acl": "allow", "devices": DEVICES["acme"]},
        {"slug": "globex", "default_acl": "allow", "devices": DEVICES["globex"]},
        {"slug": "tiny", "default_acl": "allow", "devices": DEVICES["tiny"],
         "quota": {"max_connections": TINY_MAX_CONNECTIONS}},
        {"slug": "strict", "default_acl": "deny", "devices": DEVICES["strict"],
         "acl": [{"topic": "ok/#", "action": "both", "allow": True}]},
    ])


@pytest.fixture(scope="module")
def node(plane, secrets):
    b = plane.broker("--admin", "127.0.0.1:0", "--node-id", "mx1")
    yield b
    b.stop()


@pytest.fixture
def live(settings, node):
    """The console pointed at the module's brokerd, polling fast."""
    settings.BROKERD_ADMIN_URL = node.admin_url
    settings.BROKERD_ADMIN_TOKEN = TOKEN
    settings.METRICS_POLL_INTERVAL = 0.25
    settings.METRICS_ALARM_NODE_DOWN_AFTER = 1
    hub_module.get_hub().reset()
    return node


@pytest.fixture(autouse=True)
def fresh_hub(settings):
    """Each test: a hub with no memory and an empty channel layer; brokerd
    nowhere unless the test asks for ``live`` (connection refused at once)."""
    from channels.layers import channel_layers

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.BROKERD_ADMIN_URL = f"http://127.0.0.1:{free_port()}"
    settings.BROKERD_ADMIN_TOKEN = "unused"
    channel_layers.backends.clear()
    hub = hub_module.get_hub()
    hub.reset()
    yield hub
    hub._task = None
    hub.reset()
    channel_layers.backends.clear()


@pytest.fixture
def device(node, secrets):
    """device("acme/d0") -> a connected paho client (3.1.1); all disconnected afterwards."""
    made = []

    def connect(who: str, version=mqtt.MQTTv311, **kwargs):
        c = Paho(f"{who.replace('/', '-')}-{time.monotonic_ns()}", version=version, username=who,
                 password=secrets[who])
        made.append(c)
        return c.connect(node.port(), **kwargs)

    yield connect
    for c in made:
        try:
            c.disconnect()
        except Exception:
            pass


# ------------------------------------------------------------------ people

def _user(username, **extra):
    return get_user_model().objects.create_user(username, f"{username}@example.test", PASSWORD, **extra)


@pytest.fixture
def tenants(db):
    """acme, globex and tiny in the test database (the console's side)."""
    out = {slug: services.create_tenant(slug, name=slug.title(), default_acl="allow") for slug in DEVICES}
    services.update_quota(out["tiny"], max_connections=TINY_MAX_CONNECTIONS)
    return out


@pytest.fixture
def people(tenants):
    root = _user("root", is_staff=True)
    alice = _user("alice")
    Membership.objects.create(user=alice, tenant=tenants["acme"], role=Membership.Role.ADMIN)
    bob = _user("bob")
    Membership.objects.create(user=bob, tenant=tenants["globex"], role=Membership.Role.VIEWER)
    tina = _user("tina")
    Membership.objects.create(user=tina, tenant=tenants["tiny"], role=Membership.Role.VIEWER)
    return {"root": root, "alice": alice, "bob": bob, "tina": tina}


@pytest.fixture
def browsers(people):
    """{"root": Client, ..., "anonymous": Client} signed in (Django's test client)."""
    out = {}
    for name, user in people.items():
        c = Client()
        c.force_login(user)
        out[name] = c
    out["anonymous"] = Client()
    return out


def session_cookie(client: Client) -> str:
    return client.cookies["sessionid"].value


# ------------------------------------------------------------------ websockets

def socket(path: str, client: Client | None = None, origin: str = "http://localhost") -> WebsocketCommunicator:
    """A websocket to the real ASGI application, signed in as ``client``'s user."""
    from console.asgi import application

    headers = [(b"origin", origin.encode()), (b"host", b"localhost")]
    if client is not None and "sessionid" in client.cookies:
        headers.append((b"cookie", f"sessionid={session_cookie(client)}".encode()))
    return WebsocketCommunicator(application, path, headers=headers)


async def receive_until(comm: WebsocketCommunicator, predicate, timeout: float = 5.0) -> dict:
    """The first message the predicate accepts (the others are skipped)."""
    deadline = time.monotonic() + timeout
    seen = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no matching message within {timeout} s; got {seen[-3:]}")
        try:
            msg = await comm.receive_json_from(timeout=left)
        except TimeoutError:
            raise AssertionError(f"no matching message within {timeout} s; got {seen[-3:]}") from None
        seen.append(msg)
        if predicate(msg):
            return msg


def run(coro_fn):
    """Run an async scenario on a fresh event loop, database calls on this thread."""
    return async_to_sync(coro_fn)()
