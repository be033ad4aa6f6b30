"""The console's REST API for rules (console.api): bearer tokens from the
console's token table (read: GET and the tester; write: changes), never a
browser session; the same validation as manage.py rules and the Rules page
(a malformed statement: 400 with its line and column); each change audited
as the token (source "api") and in the tenant's policy snapshot; tenants
apart (another tenant's rule id under a slug is a 404)."""

import json

import pytest

from console.models import ApiToken
from core.models import AuditEvent
from tenants import rules as rule_service
from tenants.models import Rule

from .conftest import policy

SQL = 'SELECT payload.temp AS t, clientid FROM "sensors/+/temp" WHERE t > 30'
BASE = "/api/v1/tenants"


@pytest.fixture
def tokens(db):
    _, write = ApiToken.issue("deploy", "write")
    _, read = ApiToken.issue("grafana", "read")
    _, revoked = ApiToken.issue("old", "write")
    ApiToken.objects.filter(name="old").update(revoked=True)
    return {"write": write, "read": read, "revoked": revoked}


def call(client, method, path, token=None, body=None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    data = json.dumps(body) if body is not None else None
    r = getattr(client, method.lower())(path, data=data, content_type="application/json", **headers)
    return r.status_code, (r.json() if r.content else None)


def test_a_rule_is_added_listed_disabled_enabled_and_deleted_with_a_write_token(client, acme, tokens):
    status, doc = call(client, "POST", f"{BASE}/acme/rules", tokens["write"],
                       {"sql": SQL, "action": "store", "config": {"dataset": "temps"}})
    assert status == 201
    rid = doc["id"]
    assert doc == {"id": rid, "sql": SQL, "action": "store", "config": {"dataset": "temps"}, "enabled": True}
    assert policy("acme")["rules"] == [doc]                       # on its way to the nodes
    assert call(client, "GET", f"{BASE}/acme/rules", tokens["read"]) == (200, {"tenant": "acme", "items": [doc]})
    assert call(client, "GET", f"{BASE}/acme/rules/{rid}", tokens["read"]) == (200, doc)
    status, off = call(client, "POST", f"{BASE}/acme/rules/{rid}/disable", tokens["write"])
    assert (status, off["enabled"], policy("acme")["rules"][0]["enabled"]) == (200, False, False)
    assert call(client, "POST", f"{BASE}/acme/rules/{rid}/enable", tokens["write"])[1]["enabled"] is True
    assert call(client, "DELETE", f"{BASE}/acme/rules/{rid}", tokens["write"]) == (200, {"deleted": rid})
    assert policy("acme")["rules"] == [] and not Rule.objects.exists()
    rows = list(AuditEvent.objects.filter(object_type="rule").order_by("id").values_list(
        "action", "actor", "source", "tenant", "object_id"))
    assert rows == [(a, "api-token:deploy", "api", "acme", str(rid)) for a in (
        "rule.create", "rule.disable", "rule.enable", "rule.delete")]


def test_each_action_is_validated_as_manage_py_does(client, acme, tokens):
    status, doc = call(client, "POST", f"{BASE}/acme/rules", tokens["write"],
                       {"sql": 'SELECT clientid\nFROM "t"\nWHERE tmep > 1', "action": "republish",
                        "config": {"topic": "x"}})
    assert status == 400 and (doc["line"], doc["column"]) == (3, 7)
    assert doc["error"].startswith("rule statement: line 3, column 7: unknown field 'tmep'")
    for action, config, says in [("webhook", {"url": "ftp://x/"}, "webhook: the URL must start with http://"),
                                 ("store", {"dataset": "../x"}, "store: the dataset is a short name"),
                                 ("republish", {"topic": "$SYS/x"}, "may not start with $"),
                                 ("teleport", {}, "unknown action")]:
        status, doc = call(client, "POST", f"{BASE}/acme/rules", tokens["write"],
                           {"sql": SQL, "action": action, "config": config})
        assert status == 400 and says in doc["error"], (action, doc)
    for body, says in [({"sql": SQL, "action": "store", "config": {"dataset": "a"}, "tenant": "globex"},
                        "unknown fields: tenant"),
                       ({"sql": SQL, "action": "store", "config": "x"}, "'config' is a JSON object"),
                       ({"action": "store", "config": {"dataset": "a"}}, "'sql' is a string"),
                       ({"sql": SQL, "action": "store", "config": {"dataset": "a"}, "enabled": "yes"},
                        "'enabled' is true or false")]:
        status, doc = call(client, "POST", f"{BASE}/acme/rules", tokens["write"], body)
        assert (status, doc["error"]) == (400, says) or (status == 400 and says in doc["error"]), body
    r = client.post(f"{BASE}/acme/rules", data=b"{not json", content_type="application/json",
                    HTTP_AUTHORIZATION=f"Bearer {tokens['write']}")
    assert r.status_code == 400 and "not JSON" in r.json()["error"]
    assert not Rule.objects.exists() and not AuditEvent.objects.filter(object_type="rule").exists()


def test_the_tester_shows_the_row_without_side_effects_to_a_read_token(client, acme, tokens):
    before = policy("acme")
    body = {"sql": SQL, "topic": "sensors/k/temp", "payload": '{"temp": 31.5}', "client_id": "d7"}
    assert call(client, "POST", f"{BASE}/acme/rules/test", tokens["read"], body) == (
        200, {"row": {"t": 31.5, "clientid": "d7"}})
    assert call(client, "POST", f"{BASE}/acme/rules/test", tokens["read"], dict(body, payload='{"temp": 3}')) == (
        200, {"row": None})
    status, doc = call(client, "POST", f"{BASE}/acme/rules/test", tokens["read"], dict(body, topic="other"))
    assert status == 400 and "does not match the rule's FROM" in doc["error"]
    event = {"sql": 'SELECT clientid, topic, reason FROM "$events/message_dropped"', "topic": "$events/message_dropped",
             "event_topic": "sensors/k/temp", "payload": "", "client_id": "d7"}
    assert call(client, "POST", f"{BASE}/acme/rules/test", tokens["read"], event) == (
        200, {"row": {"clientid": "d7", "topic": "sensors/k/temp", "reason": "no_subscribers"}})
    assert policy("acme") == before and not Rule.objects.exists() and not AuditEvent.objects.exists()


def test_tokens_decide_and_a_browser_session_is_not_one(client, as_admin, acme, tokens):
    rule = rule_service.add_rule(acme, sql=SQL, action="store", config={"dataset": "temps"}, actor="test")
    audited = AuditEvent.objects.count()
    for token, status in ((None, 401), ("bkd_wrong", 401), (tokens["revoked"], 401)):
        assert call(client, "GET", f"{BASE}/acme/rules", token)[0] == status
    # a read token may read and test, not change
    assert call(client, "DELETE", f"{BASE}/acme/rules/{rule.pk}", tokens["read"]) == (
        403, {"error": "token 'grafana' may only read"})
    assert call(client, "POST", f"{BASE}/acme/rules/{rule.pk}/disable", tokens["read"])[0] == 403
    assert call(client, "POST", f"{BASE}/acme/rules", tokens["read"],
                {"sql": SQL, "action": "store", "config": {"dataset": "x"}})[0] == 403
    # the platform administrator's signed-in session is no token (and the API takes no CSRF token)
    assert call(as_admin, "GET", f"{BASE}/acme/rules")[0] == 401
    assert call(as_admin, "DELETE", f"{BASE}/acme/rules/{rule.pk}")[0] == 401
    r = client.get(f"{BASE}/acme/rules")
    assert r["WWW-Authenticate"].startswith("Bearer")
    assert call(client, "PUT", f"{BASE}/acme/rules/{rule.pk}", tokens["write"], {})[0] == 405
    assert Rule.objects.get().enabled and AuditEvent.objects.count() == audited


def test_tenants_apart(client, acme, globex, tokens):
    mine = rule_service.add_rule(acme, sql=SQL, action="store", config={"dataset": "temps"}, actor="test")
    theirs = rule_service.add_rule(globex, sql=SQL, action="store", config={"dataset": "temps"}, actor="test")
    assert [r["id"] for r in call(client, "GET", f"{BASE}/acme/rules", tokens["read"])[1]["items"]] == [mine.pk]
    for method, path in (("GET", f"{BASE}/acme/rules/{theirs.pk}"), ("DELETE", f"{BASE}/acme/rules/{theirs.pk}"),
                         ("POST", f"{BASE}/acme/rules/{theirs.pk}/disable")):
        status, doc = call(client, method, path, tokens["write"])
        assert (status, doc["error"]) == (404, f"tenant 'acme' has no rule {theirs.pk}")
    assert call(client, "GET", f"{BASE}/initech/rules", tokens["read"]) == (404, {"error": "no tenant 'initech'"})
    assert Rule.objects.filter(pk=theirs.pk, enabled=True).exists()


def test_the_openapi_document_lists_every_endpoint(client, db):
    r = client.get("/api/v1/openapi.json")
    doc = r.json()
    assert r.status_code == 200 and doc["openapi"].startswith("3.")
    assert {(p, m) for p, ops in doc["paths"].items() for m in ops} == {
        ("/api/v1/tenants/{tenant}/rules", "get"), ("/api/v1/tenants/{tenant}/rules", "post"),
        ("/api/v1/tenants/{tenant}/rules/{id}", "get"), ("/api/v1/tenants/{tenant}/rules/{id}", "delete"),
        ("/api/v1/tenants/{tenant}/rules/{id}/enable", "post"), ("/api/v1/tenants/{tenant}/rules/{id}/disable", "post"),
        ("/api/v1/tenants/{tenant}/rules/test", "post")}
