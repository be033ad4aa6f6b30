"""Who may use the admin API: bearer tokens made in the console, scoped
read / write, revocable; the node's own bootstrap token."""

import time

from ..mqtt import PahoClient


def test_health_and_openapi_need_no_token(http):
    status, _, body = http("GET", "/healthz")
    assert (status, body["status"], body["node"]) == (200, "ok", "n1")
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


def test_write_token_writes_and_the_audit_log_names_it(plane, node, http, tokens, client_id):
    c = PahoClient(client_id).connect(node.port())
    status, _, body = http("DELETE", f"/api/v1/clients/default/{client_id}", token=tokens["write"],
                           headers={"X-On-Behalf-Of": "console:carol"})
    assert (status, body["kicked"]) == (200, True)
    c.expect_disconnect()
    deadline = time.monotonic() + 5
    rows = []
    while not rows and time.monotonic() < deadline:
        rows = plane.query("SELECT actor, source, action, object_type, object_id, tenant, before, remote_addr "
                           "FROM console_auditevent WHERE object_id = ?", (client_id,))
        time.sleep(0.05)
    assert len(rows) == 1
    actor, source, action, otype, oid, tenant, before, addr = rows[0]
    assert actor == "console:carol (via api-token:ops)"
    assert (source, action, otype, tenant) == ("api", "client.kick", "client", "default")
    assert client_id in before and addr.startswith("127.0.0.1")


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
    api = BrokerdClient(base_url=node.admin_url, token=tokens["write"], actor="console:débora-東京")
    assert api.kick("default", client_id)["kicked"] is True
    c.expect_disconnect()
    assert _audit_actor(plane, client_id) == "console:débora-東京 (via api-token:ops)"


def test_a_header_that_is_not_utf8_still_gets_an_answer(plane, node, http, tokens, client_id):
    import http.client
    from urllib.parse import urlsplit

    c = PahoClient(client_id).connect(node.port())
    url = urlsplit(node.admin_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=5)
    conn.putrequest("DELETE", f"/api/v1/clients/default/{client_id}")
    conn.putheader("Authorization", f"Bearer {tokens['write']}")
    conn.putheader("X-On-Behalf-Of", "caf\xe9".encode("latin-1"))
    conn.endheaders()
    assert conn.getresponse().status == 200
    conn.close()
    c.expect_disconnect()
    assert _audit_actor(plane, client_id) == "café (via api-token:ops)"     # read as Latin-1, as HTTP does
