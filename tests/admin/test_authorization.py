"""Every endpoint of brokerd's admin API, tried with every kind of bearer
token, against a real node (``--admin``) and its console database.

``ENDPOINTS`` has one entry per path and method of the OpenAPI document the
node serves (``test_every_endpoint_has_an_entry`` fails when the document has
one without an entry, or an entry is no longer in the document). An entry's
kind is ``PUBLIC`` (anyone), ``READ`` (a read or write token) or ``WRITE`` (a
write token). Each is tried with no token and with a revoked one (401), a
read token (a read: its answer; a write: 403) and a write token (its answer).
Around every refused write the node's state is compared -- the client still
connected with the same subscriptions, the retained message still there, no
message delivered, no audit row written -- and the allowed write then shows
it does change that state (so "nothing changed" means something).
"""

import json
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from urllib.parse import quote

import pytest

from ..mqtt import PahoClient

PUBLIC, READ, WRITE = "public", "read", "write"
CLIENT = "/api/v1/clients/{tenant}/{client_id}"


@dataclass
class Api:
    kind: str
    query: str = ""
    body: dict | None = None
    ok: int = 200
    # what the allowed write changes in ``state()`` (a key of it), or "delivered" for a publish
    changes: str = ""
    extra: dict = field(default_factory=dict)


ENDPOINTS: dict[tuple[str, str], Api] = {
    ("GET", "/healthz"): Api(PUBLIC),
    ("GET", "/openapi.json"): Api(PUBLIC),
    ("GET", "/api/v1/nodes"): Api(READ),
    ("GET", "/api/v1/metrics"): Api(READ),
    ("GET", "/metrics"): Api(READ),                      # Prometheus text
    ("GET", "/api/v1/clients"): Api(READ, query="tenant={tenant}&client_id={client_id}"),
    ("GET", CLIENT): Api(READ),
    ("DELETE", CLIENT): Api(WRITE, changes="connected"),
    ("POST", CLIENT + "/subscriptions"): Api(WRITE, body={"filter": "added/#", "qos": 1}, ok=201,
                                             changes="subscriptions"),
    ("DELETE", CLIENT + "/subscriptions"): Api(WRITE, query="filter=x%2F%23", changes="subscriptions"),
    ("POST", "/api/v1/publish"): Api(WRITE, body={"tenant": "{tenant}", "topic": "x/{client_id}", "payload": "hi"},
                                     changes="delivered"),
    ("GET", "/api/v1/tenants/{tenant}/rules"): Api(READ),
    ("GET", "/api/v1/tenants/{tenant}/delayed"): Api(READ),
    ("GET", "/api/v1/retained"): Api(READ, query="tenant={tenant}&topic=r/{client_id}"),
    ("DELETE", "/api/v1/retained"): Api(WRITE, query="tenant={tenant}&topic=r/{client_id}", changes="retained"),
}


def test_every_endpoint_has_an_entry(http):
    status, _, spec = http("GET", "/openapi.json")
    assert status == 200
    documented = {(method.upper(), path) for path, item in spec["paths"].items() for method in item
                  if method in ("get", "put", "post", "delete", "patch", "head", "options")}
    missing = sorted(documented - set(ENDPOINTS))
    assert not missing, f"endpoints of the OpenAPI document without an entry in ENDPOINTS: {missing}"
    stale = sorted(set(ENDPOINTS) - documented)
    assert not stale, f"entries of ENDPOINTS no longer in the OpenAPI document: {stale}"
    # the document says what the table says: public ones need no token, the others a bearer token
    for (method, path), entry in ENDPOINTS.items():
        security = spec["paths"][path][method.lower()].get("security", spec["security"])
        assert (security == []) == (entry.kind == PUBLIC), (method, path)


@pytest.fixture
def cid(client_id):
    """The test's client id in letters, digits and dashes (it goes into topics and query strings)."""
    return "authz-" + re.sub(r"[^A-Za-z0-9]+", "-", client_id)[-40:]


@pytest.fixture
def scene(node, http, tokens, cid):
    """A connected client of tenant "default" subscribed to x/#, and a retained
    message on r/<client id>."""
    c = PahoClient(cid).connect(node.port())
    c.subscribe("x/#", qos=1)
    c.publish(f"r/{cid}", b"kept", qos=1, retain=True)
    yield c
    c.disconnect()
    http("DELETE", f"/api/v1/retained?tenant=default&topic=r/{cid}", token=tokens["write"])


def _audit_rows(plane) -> int:
    return plane.query("SELECT count(*) FROM console_auditevent")[0][0]


def state(http, tokens, cid) -> dict:
    """What a write could change, read with the write token."""
    status, _, detail = http("GET", f"/api/v1/clients/default/{quote(cid, safe='')}", token=tokens["write"])
    if status == 404:                       # kicked: a clean session ends with its connection
        detail = {"connected": False, "subscriptions": []}
    else:
        assert status == 200
    status, _, _ = http("GET", f"/api/v1/retained?tenant=default&topic=r/{cid}", token=tokens["write"])
    subs = sorted(s["filter"] if isinstance(s, dict) else s for s in detail["subscriptions"])
    return {"connected": detail["connected"], "subscriptions": subs, "retained": status == 200}


def _fill(value, names):
    if isinstance(value, str):
        return value.format(**names)
    if isinstance(value, dict):
        return {k: _fill(v, names) for k, v in value.items()}
    return value


@pytest.mark.parametrize(("method", "path"), list(ENDPOINTS), ids=[f"{m} {p}" for m, p in ENDPOINTS])
def test_endpoint(plane, node, http, tokens, scene, cid, method, path):
    entry = ENDPOINTS[(method, path)]
    names = {"tenant": "default", "client_id": quote(cid, safe="")}
    url = path.format(**names) + ("?" + entry.query.format(**names) if entry.query else "")
    body = _fill(entry.body, {"tenant": "default", "client_id": cid})
    before = state(http, tokens, cid)
    audit = _audit_rows(plane)

    def ask(token):
        """-> (status, headers, JSON answer or text)."""
        req = urllib.request.Request(node.admin_url.rstrip("/") + url, method=method,
                                     data=None if body is None else json.dumps(body).encode())
        if token is not None:
            req.add_header("Authorization", f"Bearer {token}")
        if body is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                status, headers, raw = resp.status, resp.headers, resp.read()
        except urllib.error.HTTPError as exc:
            status, headers, raw = exc.code, exc.headers, exc.read()
        headers = {k.lower(): v for k, v in headers.items()}
        is_json = headers.get("content-type", "").startswith("application/json")
        return status, headers, json.loads(raw) if is_json else raw.decode()

    refused = {"no token": None, "revoked token": tokens["revoked"], "unknown token": "bkd_" + "x" * 43}
    if entry.kind == WRITE:
        refused["read token"] = tokens["read"]
    for what, token in refused.items():
        status, headers, answer = ask(token)
        if entry.kind == PUBLIC:
            assert status == 200, (what, status, answer)
            continue
        want = 403 if what == "read token" else 401
        assert status == want, (what, status, answer)
        assert "error" in answer
        if want == 401:
            assert headers["www-authenticate"].startswith("Bearer")
        if entry.kind == WRITE:
            assert state(http, tokens, cid) == before, f"{what}: {method} {path} changed something"
            scene.expect_none(0.05)
    if entry.kind == WRITE:
        scene.expect_none(0.3)
        assert _audit_rows(plane) == audit, "a refused write was audited"

    allowed = [tokens["read"], tokens["write"]] if entry.kind != WRITE else [tokens["write"]]
    for token in allowed:
        status, headers, answer = ask(token)
        assert status == entry.ok, (status, answer)
    if entry.kind != WRITE:
        assert state(http, tokens, cid) == before
        return
    # the allowed write did change what the refused ones did not, and wrote exactly one audit row
    if entry.changes == "delivered":
        assert scene.expect().payload == b"hi"
    else:
        assert state(http, tokens, cid)[entry.changes] != before[entry.changes]
    deadline = time.monotonic() + 5
    while _audit_rows(plane) == audit and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _audit_rows(plane) == audit + 1
