"""Who may use the admin API: bearer tokens made in the console, scoped
read / write, revocable; the node's own bootstrap token, which is the
console's and the only kind that may name the console user it acts for."""

import time

from ..mqtt import PahoClient
from .conftest import CONSOLE_TOKEN


def test_health_and_openapi_need_no_token(http):
    status, headers, body = http("GET", "/healthz")
    assert (status, body["status"], body["node"]) == (200, "ok", "n1")
    assert headers["connection"] == "close"        # nothing without a token keeps an admin connection
    status, headers, spec = http("GET", "/openapi.json")
    assert status == 200 and headers["content-type"].startswith("application/json")
    assert spec["openapi"].startswith("3.")
    paths = spec["paths"]
    for p in ("/api/v1/nodes", "/api/v1/clients", "/api/v1/clients/{tenant}/{client_id}",
              "/api/v1/clients/{tenant}/{client_id}/subscriptions", "/api/v1/publish", "/api/v1/retained"):
        assert p in paths, p
    assert spec["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"


def test_missing_token_is_401_with_a_challenge(http):
    status, headers, body = http("GET", "/api/v1/nodes")
    assert status == 401
    assert headers["www-authenticate"].startswith("Bearer")
    assert "token" in body["error"]


def test_wrong_token_and_wrong_scheme_are_401(http, tokens):
    assert http("GET", "/api/v1/nodes", token="bkd_not-a-real-token")[0] == 401
    assert http("GET", "/api/v1/nodes", raw_auth=f"Basic {tokens['read']}")[0] == 401
    assert http("GET", "/api/v1/nodes", raw_auth="Bearer ")[0] == 401
    # a token's hash is not a token
    assert http("GET", "/api/v1/nodes", token="sha256$" + "0" * 64)[0] == 401


def test_revoked_token_is_401(http, tokens):
    status, _, body = http("GET", "/api/v1/nodes", token=tokens["revoked"])
    assert status == 401


def test_read_token_reads(http, tokens):
    status, _, body = http("GET", "/api/v1/nodes", token=tokens["read"])
    assert status == 200
    assert [n["id"] for n in body["items"]] == ["n1"]
    assert body["items"][0]["health"] == "ok"


def test_read_token_cannot_write_and_nothing_happens(node, http, tokens, client_id):
    c = PahoClient(client_id).connect(node.port())
    try:
        for method, path, body in [
            ("DELETE", f"/api/v1/clients/default/{client_id}", None),
            ("POST", f"/api/v1/clients/default/{client_id}/subscriptions", {"filter": "x/#", "qos": 0}),
            ("DELETE", f"/api/v1/clients/default/{client_id}/subscriptions?filter=x", None),
            ("POST", "/api/v1/publish", {"tenant": "default", "topic": "x", "payload": "hi"}),
            ("DELETE", "/api/v1/retained?tenant=default&topic=x", None),
        ]:
            status, _, answer = http(method, path, token=tokens["read"], body=body)
            assert status == 403, (method, path)
            assert "read-only" in answer["error"]
        assert c.client.is_connected()
        status, _, detail = http("GET", f"/api/v1/clients/default/{client_id}", token=tokens["read"])
        assert detail["subscriptions"] == []
    finally:
        c.disconnect()


def _audit_rows(plane, client_id: str, timeout: float = 5.0) -> list:
    deadline = time.monotonic() + timeout
    rows = []
    while not rows and time.monotonic() < deadline:
        rows = plane.query("SELECT actor, source, action, object_type, object_id, tenant, before, remote_addr "
                           "FROM console_auditevent WHERE object_id = ?", (client_id,))
        time.sleep(0.05)
    return rows


def test_write_token_writes_and_the_audit_log_names_it(plane, node, http, tokens, client_id):
    c = PahoClient(client_id).connect(node.port())
    status, _, body = http("DELETE", f"/api/v1/clients/default/{client_id}", token=tokens["write"])
    assert (status, body["kicked"]) == (200, True)
    c.expect_disconnect()
    rows = _audit_rows(plane, client_id)
    assert len(rows) == 1
    actor, source, action, otype, oid, tenant, before, addr = rows[0]
    assert actor == "api-token:ops"
    assert (source, action, otype, tenant) == ("api", "client.kick", "client", "default")
    assert client_id in before and addr.startswith("127.0.0.1")


def test_a_console_made_token_cannot_name_the_user_it_acts_for(plane, node, http, tokens, client_id):
    """X-On-Behalf-Of writes a console user's name into the audit log: any holder of a
    token from the console's token table could make any user the author of what it did.
    It is refused (403, saying why, from the headers: nothing is done) for every token but the
    console's own (BROKERD_ADMIN_TOKEN); the same request without the header is audited under
    the token alone."""
    c = PahoClient(client_id).connect(node.port())
    try:
        for token, method, path in [
                (tokens["write"], "DELETE", f"/api/v1/clients/default/{client_id}"),
                (tokens["write"], "POST", "/api/v1/publish"),
                (tokens["read"], "GET", "/api/v1/nodes")]:
            body = {"tenant": "default", "topic": f"x/{client_id}", "payload": "p"} if method == "POST" else None
            status, _, answer = http(method, path, token=token, body=body,
                                     headers={"X-On-Behalf-Of": "console:root"})
            assert status == 403, (method, path)
            assert "X-On-Behalf-Of" in answer["error"] and "BROKERD_ADMIN_TOKEN" in answer["error"]
        assert c.client.is_connected()
        assert plane.query("SELECT count(*) FROM console_auditevent WHERE actor LIKE '%console:root%'") == [(0,)]
        assert _audit_rows(plane, client_id, timeout=0.3) == []
    finally:
        c.disconnect()


def test_the_consoles_own_token_names_the_console_user_and_itself(plane, node, tokens, client_id):
    """The console's client (core/brokerd_client.py) with the console's token: the audit row
    names the console user, source console, as the console's own rows do."""
    from core.brokerd_client import BrokerdClient

    c = PahoClient(client_id).connect(node.port())
    api = BrokerdClient(base_url=node.admin_url, token=CONSOLE_TOKEN, actor="console:carol")
    assert api.kick("default", client_id)["kicked"] is True
    c.expect_disconnect()
    rows = _audit_rows(plane, client_id)
    assert [r[:2] for r in rows] == [("carol", "console")]


def test_token_made_after_start_works_and_revoking_it_takes_effect(plane, http):
    secret = plane.issue_token("late", "write")
    deadline = time.monotonic() + 10
    while http("GET", "/api/v1/nodes", token=secret)[0] != 200:
        assert time.monotonic() < deadline, "a new console token never became valid"
        time.sleep(0.1)
    plane.revoke_token("late")
    deadline = time.monotonic() + 10
    while http("GET", "/api/v1/nodes", token=secret)[0] != 401:
        assert time.monotonic() < deadline, "a revoked token still works"
        time.sleep(0.1)


def test_bootstrap_token_from_the_environment(tmp_path):
    from ..procs import BrokerProcess
    from .conftest import Http

    with BrokerProcess("--admin", "127.0.0.1:0", env={"BROKERD_ADMIN_TOKEN": "s3cret-bootstrap"}) as b:
        http = Http(b.admin_url)
        assert http("GET", "/api/v1/nodes", token="s3cret-bootstrap")[0] == 200
        assert http("POST", "/api/v1/publish", token="s3cret-bootstrap",
                    body={"tenant": "default", "topic": "t", "payload": "x"})[0] == 200
        assert http("GET", "/api/v1/nodes", token="s3cret-bootstrap-not")[0] == 401


def _audit_actor(plane, client_id: str) -> str:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        rows = plane.query("SELECT actor FROM console_auditevent WHERE object_id = ?", (client_id,))
        if rows:
            return rows[0][0]
        time.sleep(0.05)
    raise AssertionError(f"no audit row for {client_id}")


def test_a_console_user_with_a_non_ascii_name_acts_and_is_audited(plane, node, tokens, client_id):
    """Django user names may be any letters: the console's client sends them percent-encoded,
    the node records them as they are (was: the request dropped without an answer)."""
    from core.brokerd_client import BrokerdClient

    c = PahoClient(client_id).connect(node.port())
    api = BrokerdClient(base_url=node.admin_url, token=CONSOLE_TOKEN, actor="console:débora-東京")
    assert api.kick("default", client_id)["kicked"] is True
    c.expect_disconnect()
    assert _audit_actor(plane, client_id) == "débora-東京"


def test_a_header_that_is_not_utf8_still_gets_an_answer(plane, node, http, tokens, client_id):
    import http.client
    from urllib.parse import urlsplit

    c = PahoClient(client_id).connect(node.port())
    url = urlsplit(node.admin_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=5)
    conn.putrequest("DELETE", f"/api/v1/clients/default/{client_id}")
    conn.putheader("Authorization", f"Bearer {CONSOLE_TOKEN}")
    conn.putheader("X-On-Behalf-Of", "caf\xe9".encode("latin-1"))
    conn.endheaders()
    assert conn.getresponse().status == 200
    conn.close()
    c.expect_disconnect()
    assert _audit_actor(plane, client_id) == "café"   # read as Latin-1, as HTTP does


def test_while_the_consoles_token_is_rotated_the_previous_one_still_acts_for_its_users(plane, client_id):
    """Rotating BROKERD_ADMIN_TOKEN (docs/operations.md): the nodes take the new one with the
    old one as BROKERD_ADMIN_TOKEN_PREVIOUS, so the console, until it has switched, still acts
    for its users (a console-made token would now get 403 for X-On-Behalf-Of). The audit row
    names the user either way; any other secret is refused."""
    from core.brokerd_client import BrokerdClient

    from ..procs import BrokerProcess

    env = {**plane.env, "BROKERD_ADMIN_TOKEN": "rotated-new", "BROKERD_ADMIN_TOKEN_PREVIOUS": "rotated-old"}
    with BrokerProcess("--sys-interval", "0", "--admin", "127.0.0.1:0", env=env) as b:
        for i, secret in enumerate(("rotated-old", "rotated-new")):
            cid = f"{client_id}-{i}"
            c = PahoClient(cid).connect(b.port())
            assert BrokerdClient(base_url=b.admin_url, token=secret, actor="console:rita").kick("default", cid)
            c.expect_disconnect()
            assert _audit_actor(plane, cid) == "rita"
        from .conftest import Http

        assert Http(b.admin_url)("GET", "/api/v1/nodes", token="rotated-older")[0] == 401


def test_a_node_bound_to_every_address_reports_the_admin_address_others_reach():
    """GET /api/v1/nodes names each node's admin API as the other nodes and the
    console reach it (--advertise-host), not the wildcard it is bound to: the
    console learns nodes from there (in containers nodes bind 0.0.0.0)."""
    from ..procs import BrokerProcess
    from .conftest import CONSOLE_TOKEN, Http

    with BrokerProcess("--admin", "0.0.0.0:0", "--advertise-host", "127.0.0.1",
                       env={"BROKERD_ADMIN_TOKEN": CONSOLE_TOKEN}) as node:
        port = node.admin.rsplit(":", 1)[1]
        status, _, body = Http(f"http://127.0.0.1:{port}")("GET", "/api/v1/nodes", CONSOLE_TOKEN)
        assert status == 200
        assert body["items"][0]["admin"] == f"127.0.0.1:{port}"
