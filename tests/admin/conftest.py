"""The admin API suite: brokerd nodes started with ``--admin 127.0.0.1:0``,
tokens made in a real console database (``tests.controlplane``), requests
over real HTTP."""

import json
import urllib.error
import urllib.request

import pytest

from ..controlplane import ControlPlane
from ..procs import BrokerProcess

# the console's own token, given to the nodes as BROKERD_ADMIN_TOKEN (the only kind that may send X-On-Behalf-Of)
CONSOLE_TOKEN = "admin-suite-console-token"


class Http:
    """One request to an admin API: -> (status, headers, decoded JSON body)."""

    def __init__(self, base: str):
        self.base = base.rstrip("/")

    def __call__(self, method: str, path: str, token: str | None = None, body=None, headers=None,
                 raw_auth: str | None = None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if raw_auth is not None:
            req.add_header("Authorization", raw_auth)
        elif token is not None:
            req.add_header("Authorization", f"Bearer {token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, {k.lower(): v for k, v in resp.headers.items()}, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            body = exc.read()
            return exc.code, {k.lower(): v for k, v in exc.headers.items()}, json.loads(body) if body else None


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    """A console database shared by the module (migrated once)."""
    return ControlPlane(tmp_path_factory.mktemp("console"))


@pytest.fixture(scope="module")
def _made(plane):
    """What ``tokens`` and ``secrets`` hand out, made in one manage.py (each is a Django start-up)."""
    return plane.provision_with_tokens([{"slug": "acme", "default_acl": "allow", "devices": ["d0", "d1", "d2", "d3"]}],
                                       {"grafana": "read", "ops": "write", "old": "write"}, revoked=("old",))


@pytest.fixture(scope="module")
def tokens(_made):
    """A read and a write token made in the console, and one revoked at once."""
    made = _made[1]
    return {"read": made["grafana"], "write": made["ops"], "revoked": made["old"]}


@pytest.fixture(scope="module")
def secrets(_made):
    """Tenant "acme" (everything allowed) with devices d0..d3: {"acme/d0": secret, ...}."""
    return _made[0]


@pytest.fixture(scope="module")
def node(plane, tokens, secrets):
    """One brokerd node (anonymous clients in tenant "default") with the admin
    API, reading tokens and policies from the console database; the console's
    own token is ``CONSOLE_TOKEN``."""
    b = BrokerProcess("--sys-interval", "0", "--admin", "127.0.0.1:0", "--node-id", "n1", anonymous=True,
                      env={**plane.env, "BROKERD_ADMIN_TOKEN": CONSOLE_TOKEN}).start()
    yield b
    b.stop()


@pytest.fixture(scope="module")
def http(node):
    return Http(node.admin_url)
