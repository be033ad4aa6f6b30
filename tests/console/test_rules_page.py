"""The tenant's Rules page: list with the nodes' counters (or "nodes
unreachable"), add/edit with the statement's error under the editor (line,
column, the typed text kept), enable/disable/delete (CSRF, confirmation,
audit, policy snapshot), the "test with this message" runner (no side
effects), tenant isolation and roles (the ACL page's model).

People (conftest): root (platform admin), alice (admin of acme), bob (viewer
of globex). brokerd's admin API points at a closed port unless a test starts
``AdminApiDouble``, a loopback HTTP server answering the one endpoint this
page reads, ``GET /api/v1/tenants/{t}/rules`` (the real node is in
``tests/browser/test_rules_browser.py``).
"""

import html
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.test import Client

from core.models import AuditEvent
from tenants import rules as rule_service
from tenants.models import Rule

from .conftest import HTMX, policy

RULES = "/tenants/acme/rules/"
SQL = 'SELECT payload.temp AS t, clientid FROM "sensors/+/temp" WHERE t > 30'
BAD_SQL = 'SELECT clientid\nFROM "sensors/#"\nWHERE tmep > 1'


def form(sql=SQL, topic="alerts/${clientid}", qos="1", retain=False, payload="", **extra):
    data = {"sql": sql, "topic": topic, "qos": qos, "payload": payload, **extra}
    if retain:
        data["retain"] = "on"
    return data


@pytest.fixture
def rule(acme):
    return rule_service.add_rule(acme, sql=SQL, action="republish", config={"topic": "alerts/${clientid}", "qos": 1})


@pytest.fixture
def globex_rule(globex):
    return rule_service.add_rule(globex, sql='SELECT * FROM "plant/#"', action="republish",
                                 config={"topic": "copy/${topic}"})


class AdminApiDouble:
    """A test double of brokerd's admin API: answers ``GET /api/v1/tenants/{t}/rules``
    with ``items`` (and records the paths asked), 404 for anything else."""

    def __init__(self, items):
        double = self
        self.items, self.paths = items, []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                double.paths.append(self.path)
                if self.path.startswith("/api/v1/tenants/") and self.path.endswith("/rules"):
                    body = json.dumps({"tenant": self.path.split("/")[4], "items": double.items}).encode()
                    self.send_response(200)
                else:
                    body = b'{"error": "not here"}'
                    self.send_response(404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def nodes(settings):
    doubles = []

    def start(items):
        d = AdminApiDouble(items)
        doubles.append(d)
        settings.BROKERD_ADMIN_URL = d.url
        return d
    yield start
    for d in doubles:
        d.close()


def text(response) -> str:
    return html.unescape(response.content.decode())


# ------------------------------------------------------------------ list


def test_the_list_shows_statement_action_state_and_nodes_unreachable(as_alice, rule):
    r = as_alice.get(RULES)
    assert r.status_code == 200
    page = text(r)
    assert SQL in page and "alerts/${clientid}" in page and "QoS 1" in page and "enabled" in page
    assert "Nodes unreachable" in page and "nodes unreachable" in page
    # no number is made up when the nodes do not answer
    row = page[page.index(f'id="rule-{rule.pk}"'):]
    row = row[:row.index("</tr>")]
    assert not any(f'<td class="num">{n}</td>' in row for n in range(10))


def test_the_list_shows_the_nodes_counters_and_last_error(as_alice, rule, nodes):
    double = nodes([{"id": rule.pk, "enabled": True, "loaded": True, "matched": 12, "passed": 7, "no_result": 4,
                     "failed": 1, "last_error": "the ACL denies 'd1' publishing to 'alerts/d1'",
                     "last_error_at": 1_790_000_000.5, "nodes": {"n1": {}}}])
    page = text(as_alice.get(RULES))
    assert "Nodes unreachable" not in page
    for figure in ("12", "7", "4"):
        assert f'<td class="num">{figure}</td>' in page
    assert '<td class="num strong">1</td>' in page            # failed, in bold
    assert "the ACL denies 'd1' publishing to 'alerts/d1'" in page and "2026-09-21 14:13:20 UTC" in page
    assert double.paths == ["/api/v1/tenants/acme/rules"]
    # the table alone, as the page polls it
    fragment = text(as_alice.get(f"{RULES}table/", **HTMX))
    assert fragment.startswith('<div class="card" id="rules-table"') and "<td class=\"num\">12</td>" in fragment


def test_a_rule_the_nodes_do_not_have_yet_shows_no_figures(as_alice, rule, nodes):
    nodes([])
    page = text(as_alice.get(RULES))
    assert "not on the nodes yet" in page and "Nodes unreachable" not in page


# -------------------------------------------------------- create / edit


def test_create_stores_publishes_and_audits(as_alice, acme):
    r = as_alice.post(f"{RULES}new/", form(retain=True, payload='{"t": ${t}}'))
    assert r.status_code == 302 and r["Location"] == RULES
    rule = Rule.objects.get(tenant=acme)
    assert (rule.sql, rule.action, rule.enabled) == (SQL, "republish", True)
    assert rule.config == {"topic": "alerts/${clientid}", "qos": 1, "retain": True, "payload": '{"t": ${t}}'}
    assert [x["id"] for x in policy("acme")["rules"]] == [rule.pk]
    event = AuditEvent.objects.get(action="rule.create")
    assert (event.actor, event.tenant, event.object_id) == ("alice", "acme", str(rule.pk))


def test_a_malformed_statement_shows_its_line_and_column_and_keeps_the_input(as_alice, acme):
    for extra in ({}, HTMX):
        r = as_alice.post(f"{RULES}new/", form(sql=BAD_SQL, topic="alerts/x"), **extra)
        assert r.status_code == 200
        page = text(r)
        assert "Line 3, column 7: unknown field 'tmep'" in page
        assert "3 | WHERE tmep > 1\n" + " " * (len("3 | ") + 6) + "^" in page
        assert ">\n" + BAD_SQL + "</textarea>" in page              # what was typed, as typed
        assert 'value="alerts/x"' in page
    assert not Rule.objects.exists() and not AuditEvent.objects.filter(action__startswith="rule.").exists()


def test_a_statement_nested_too_deeply_is_refused_on_the_form_not_with_a_server_error(as_alice, acme):
    """Parentheses 60 deep (about 130 characters, far within the length
    allowed) made the form answer 500: the parser's recursion error was not
    the syntax error the form shows."""
    sql = "SELECT " + "(" * 60 + "qos" + ")" * 60 + ' AS x FROM "t/#"'
    r = as_alice.post(f"{RULES}new/", form(sql=sql, topic="alerts/x"), **HTMX)
    assert r.status_code == 200
    assert "Expressions nested too deeply" in text(r)
    assert not Rule.objects.exists()


def test_an_action_the_nodes_would_refuse_is_shown_on_its_field(as_alice, acme):
    page = text(as_alice.post(f"{RULES}new/", form(topic="alerts/#")))
    assert "The topic may not hold wildcards" in page and not Rule.objects.exists()


def test_each_action_is_offered_and_the_chosen_one_is_stored_and_audited(as_alice, acme):
    page = text(as_alice.get(RULES))
    for kind in ("republish", "webhook", "store"):
        assert f'name="action" value="{kind}"' in page and f'data-action="{kind}"' in page
    r = as_alice.post(f"{RULES}new/", form(action="webhook", topic="", url="https://hooks.example.com/in/${clientid}",
                                           method="PUT", headers="X-Device: ${clientid}\n\nAuthorization: Bearer s3",
                                           body='{"t": ${t}}', timeout="2.5", retries="2"))
    assert r.status_code == 302
    r = as_alice.post(f"{RULES}new/", form(action="store", topic="", dataset="temps_1"))
    assert r.status_code == 302
    hook, keep = Rule.objects.filter(tenant=acme).order_by("id")
    assert (hook.action, hook.config) == ("webhook", {
        "url": "https://hooks.example.com/in/${clientid}", "method": "PUT", "timeout": 2.5, "retries": 2,
        "headers": {"X-Device": "${clientid}", "Authorization": "Bearer s3"}, "body": '{"t": ${t}}'})
    assert (keep.action, keep.config) == ("store", {"dataset": "temps_1"})
    assert [(x["id"], x["action"]) for x in policy("acme")["rules"]] == [(hook.pk, "webhook"), (keep.pk, "store")]
    assert list(AuditEvent.objects.filter(action="rule.create").order_by("id").values_list("actor", "object_id")) == [
        ("alice", str(hook.pk)), ("alice", str(keep.pk))]


@pytest.mark.parametrize("fields, field, says", [
    ({"action": "webhook", "url": ""}, "url", "A URL is required."),
    ({"action": "webhook", "url": "ftp://hooks.example.com/"}, "url", "The URL must start with http:// or https://"),
    ({"action": "webhook", "url": "http://${host}/"}, "url", "The URL's host and port are literal"),
    ({"action": "webhook", "url": "https://h.example.com/", "headers": "no colon here"}, "headers",
     "Expected 'Name: value', not 'no colon here'."),
    ({"action": "webhook", "url": "https://h.example.com/", "headers": "Host: evil"}, "headers",
     "The Host header is set by the sender"),
    ({"action": "webhook", "url": "https://h.example.com/", "timeout": "99"}, "timeout", "less than or equal to 60"),
    ({"action": "store", "dataset": ""}, "dataset", "A dataset name is required."),
    ({"action": "store", "dataset": "My Data"}, "dataset", "The dataset is a short name"),
    ({"action": "republish", "topic": ""}, "topic", "A topic template is required."),
])
def test_an_action_error_is_shown_on_its_field_and_keeps_the_input(as_alice, acme, fields, field, says):
    data = form(topic="", **fields) if "topic" not in fields else form(**fields)
    for extra in ({}, HTMX):
        r = as_alice.post(f"{RULES}new/", data, **extra)
        assert r.status_code == 200
        page = text(r)
        assert says in page
        # the error sits in its field's block (after its input, before the next field)
        at = page.index(f'name="{field}"')
        assert page.index(says, at) < page.find('<div class="field', at + 1) or page.find('<div class="field', at + 1) < 0
        assert SQL in page
        for value in fields.values():
            assert html.escape(value, quote=True) in r.content.decode() or value in page
    assert not Rule.objects.exists() and not AuditEvent.objects.filter(action__startswith="rule.").exists()


def test_a_webhook_rule_is_edited_with_its_own_fields_and_never_turned_into_another_kind_unasked(as_alice, acme):
    hook = rule_service.add_rule(acme, sql=SQL, action="webhook", config={
        "url": "https://hooks.example.com/t/${clientid}", "method": "PUT", "headers": {"X-A": "1", "X-B": "${t}"}})
    page = text(as_alice.get(RULES))
    assert "PUT https://hooks.example.com/t/${clientid}" in page and f"{RULES}{hook.pk}/edit/" in page
    edit = text(as_alice.get(f"{RULES}{hook.pk}/edit/"))
    assert re.search(r'<input type="radio" name="action" value="webhook"[^>]*\bchecked>', edit)
    assert not re.search(r'<input type="radio" name="action" value="republish"[^>]*\bchecked>', edit)
    assert 'value="https://hooks.example.com/t/${clientid}"' in edit and ">\nX-A: 1\nX-B: ${t}</textarea>" in edit
    # an old-style post without an action: read as the rule's own kind (a webhook without a URL), refused
    r = as_alice.post(f"{RULES}{hook.pk}/edit/", form(topic="alerts/x"))
    assert r.status_code == 200 and "A URL is required." in text(r)
    hook.refresh_from_db()
    assert hook.action == "webhook" and not AuditEvent.objects.filter(action="rule.update").exists()
    r = as_alice.post(f"{RULES}{hook.pk}/edit/", form(action="webhook", topic="", method="POST",
                                                       url="https://hooks.example.com/v2/${clientid}", headers="X-A: 2"))
    assert r.status_code == 302
    hook.refresh_from_db()
    assert hook.config == {"url": "https://hooks.example.com/v2/${clientid}", "method": "POST", "timeout": 5.0,
                           "retries": 3, "headers": {"X-A": "2"}}
    r = as_alice.post(f"{RULES}{hook.pk}/edit/", form(action="store", topic="", dataset="hooks_log"))
    hook.refresh_from_db()
    assert (hook.action, hook.config) == ("store", {"dataset": "hooks_log"})
    assert AuditEvent.objects.filter(action="rule.update").count() == 2


def test_the_list_shows_each_actions_target_and_its_delivery_counters(as_alice, acme, nodes):
    hook = rule_service.add_rule(acme, sql=SQL, action="webhook", config={"url": "https://h.example.com/x",
                                                                           "retries": 1})
    keep = rule_service.add_rule(acme, sql=SQL, action="store", config={"dataset": "temps"})
    base = {"enabled": True, "loaded": True, "matched": 9, "passed": 8, "no_result": 0, "failed": 1,
            "last_error": None, "last_error_at": None, "nodes": {}}
    nodes([dict(base, id=hook.pk, sent=6, retried=3, dropped=1), dict(base, id=keep.pk, stored=7, dropped=1)])
    page = text(as_alice.get(RULES))
    assert "→ webhook <code>POST https://h.example.com/x</code>" in page and "1 retry" in page
    assert "sent 6 · retried 3 · dropped 1" in page
    assert "→ store to dataset <code>temps</code>" in page and "stored 7 · dropped 1" in page


def test_edit_changes_the_statement_and_audits(as_alice, rule):
    page = text(as_alice.get(f"{RULES}{rule.pk}/edit/"))
    assert f"Edit rule {rule.pk}" in page and SQL in page
    bad = text(as_alice.post(f"{RULES}{rule.pk}/edit/", form(sql='SELECT * FROM "a" WHERE (', topic="b")))
    assert "column" in bad and 'SELECT * FROM "a" WHERE (' in bad
    rule.refresh_from_db()
    assert rule.sql == SQL
    new_sql = 'SELECT clientid FROM "sensors/#"'
    r = as_alice.post(f"{RULES}{rule.pk}/edit/", form(sql=new_sql, topic="copy/${clientid}", qos="0"))
    assert r.status_code == 302
    rule.refresh_from_db()
    assert (rule.sql, rule.config["topic"], rule.config["qos"]) == (new_sql, "copy/${clientid}", 0)
    assert policy("acme")["rules"][0]["sql"] == new_sql
    event = AuditEvent.objects.get(action="rule.update")
    assert json.loads(event.before)["sql"] == SQL and json.loads(event.after)["sql"] == new_sql


def test_edit_keeps_the_user_properties_the_form_does_not_show(as_alice, acme):
    rule = rule_service.add_rule(acme, sql=SQL, action="republish",
                                 config={"topic": "a/${clientid}", "user_properties": {"site": "${clientid}"}})
    assert "1 user property" in text(as_alice.get(RULES))
    assert as_alice.post(f"{RULES}{rule.pk}/edit/", form(topic="b/${clientid}")).status_code == 302
    rule.refresh_from_db()
    assert rule.config["topic"] == "b/${clientid}" and rule.config["user_properties"] == {"site": "${clientid}"}


# ------------------------------------------------ enable / disable / delete


def test_disable_enable_and_delete(as_alice, rule):
    r = as_alice.post(f"{RULES}{rule.pk}/disable/", **HTMX)
    assert r.status_code == 200 and ">disabled<" in r.content.decode() and ">Enable<" in r.content.decode()
    rule.refresh_from_db()
    assert not rule.enabled and policy("acme")["rules"][0]["enabled"] is False
    assert as_alice.post(f"{RULES}{rule.pk}/enable/").status_code == 302
    rule.refresh_from_db()
    assert rule.enabled
    # delete: a confirmation page on GET, the deletion on POST
    confirm = as_alice.get(f"{RULES}{rule.pk}/delete/")
    assert confirm.status_code == 200 and "Delete rule" in confirm.content.decode()
    assert Rule.objects.filter(pk=rule.pk).exists()
    assert as_alice.post(f"{RULES}{rule.pk}/delete/").status_code == 302
    assert not Rule.objects.filter(pk=rule.pk).exists() and policy("acme")["rules"] == []
    assert [e.action for e in AuditEvent.objects.order_by("id") if e.action.startswith("rule.")] == [
        "rule.create", "rule.disable", "rule.enable", "rule.delete"]


def test_changes_need_post_and_csrf(alice, rule):
    c = Client(enforce_csrf_checks=True)
    c.force_login(alice)
    assert c.get(f"{RULES}{rule.pk}/disable/").status_code == 405
    assert c.post(f"{RULES}{rule.pk}/disable/").status_code == 403
    assert c.post(f"{RULES}{rule.pk}/delete/").status_code == 403
    assert c.post(f"{RULES}new/", form()).status_code == 403
    rule.refresh_from_db()
    assert rule.enabled and Rule.objects.count() == 1
    page = c.get(RULES).content.decode()
    assert page.count('name="csrfmiddlewaretoken"') >= 3 and "hx-confirm=\"Delete rule" in page


# ------------------------------------------------------------- the runner


def run(client, sql=SQL, topic="sensors/kitchen/temp", payload='{"temp": 31.5}', client_id="pump-7", fields=None,
        **extra):
    r = client.post(f"{RULES}test/", {"sql": sql, "test_topic": topic, "test_payload": payload,
                                      "test_client_id": client_id, **(fields or {})}, **extra)
    assert r.status_code == 200
    return text(r)


def test_the_runner_shows_the_row_no_row_or_the_error_without_side_effects(as_alice, rule, nodes):
    double = nodes([])
    out = run(as_alice, **HTMX)
    assert out.startswith('<div id="rule-test"') and "Output row" in out and '{"t":31.5,"clientid":"pump-7"}' in out
    assert "No row (WHERE not true)" in run(as_alice, payload='{"temp": 20}', **HTMX)
    assert "does not match the rule's FROM" in run(as_alice, topic="other/x", **HTMX)
    failing = run(as_alice, sql='SELECT payload.a + 1 AS x FROM "sensors/#"', payload='{"a": "text"}', **HTMX)
    assert "the rule fails on this message" in failing and "Error" in failing
    bad = run(as_alice, sql=BAD_SQL, **HTMX)
    assert "line 3, column 7: unknown field 'tmep'" in bad
    # nothing stored, published, audited or sent to a node
    assert Rule.objects.count() == 1 and double.paths == []
    assert not AuditEvent.objects.exclude(action="rule.create").exists()
    # without htmx: the whole page, the form keeping what was typed
    page = run(as_alice)
    assert "Output row" in page and 'value="sensors/kitchen/temp"' in page and SQL in page


def test_the_runner_runs_an_event_statement_on_the_event_named_as_its_topic(as_alice, rule):
    """An event statement could not be tried at all: its FROM names no topic, and the runner refused
    every message as "does not match the rule's FROM"."""
    sql = 'SELECT clientid, topic, reason FROM "$events/delivery_dropped"'
    page = run(as_alice, sql=sql, topic="$events/delivery_dropped", fields={"test_event_topic": "cmd/pump-7"}, **HTMX)
    assert "Output row" in page and '{"clientid":"pump-7","topic":"cmd/pump-7","reason":"queue_full"}' in page
    page = run(as_alice, sql=sql, topic="$events/delivery_dropped",
               fields={"test_event_topic": "cmd/pump-7", "test_reason": "expired"}, **HTMX)
    assert '"reason":"expired"' in page
    assert "carries a topic: give the event's topic" in run(as_alice, sql=sql, topic="$events/delivery_dropped",
                                                                  **HTMX)
    # without htmx: the whole page, keeping the event's fields as typed
    page = run(as_alice, sql=sql, topic="$events/delivery_dropped", fields={"test_event_topic": "cmd/pump-7"})
    assert 'name="test_event_topic" class="mono" value="cmd/pump-7"' in page and "Output row" in page


# ---------------------------------------------------- isolation and roles


def test_another_tenants_rules_are_404(as_alice, globex_rule):
    base = f"/tenants/globex/rules/{globex_rule.pk}"
    assert as_alice.get("/tenants/globex/rules/").status_code == 404
    assert as_alice.get("/tenants/globex/rules/table/").status_code == 404
    assert as_alice.post("/tenants/globex/rules/new/", form()).status_code == 404
    assert as_alice.post("/tenants/globex/rules/test/", {"sql": SQL, "test_topic": "a"}).status_code == 404
    for action in ("edit", "enable", "disable", "delete"):
        assert as_alice.post(f"{base}/{action}/", form()).status_code == 404
    # globex's rule through acme's URL is not found either
    for action in ("edit", "disable", "delete"):
        assert as_alice.post(f"{RULES}{globex_rule.pk}/{action}/", form()).status_code == 404
    globex_rule.refresh_from_db()
    assert globex_rule.enabled and globex_rule.sql == 'SELECT * FROM "plant/#"'
    assert not as_alice.get(RULES).content.decode().count("plant/#")


def test_a_viewer_reads_and_tests_but_cannot_change(as_bob, globex_rule):
    base = "/tenants/globex/rules/"
    page = text(as_bob.get(base))
    assert 'SELECT * FROM "plant/#"' in page and "Add a rule" not in page and ">Disable<" not in page
    assert as_bob.post(f"{base}new/", form()).status_code == 403
    for action in ("edit", "enable", "disable", "delete"):
        assert as_bob.post(f"{base}{globex_rule.pk}/{action}/", form()).status_code == 403
    assert as_bob.get(f"{base}{globex_rule.pk}/delete/").status_code == 403
    r = as_bob.post(f"{base}test/", {"sql": 'SELECT * FROM "plant/#"', "test_topic": "plant/a",
                                     "test_payload": "x"}, **HTMX)
    assert r.status_code == 200 and "Output row" in r.content.decode()
    globex_rule.refresh_from_db()
    assert globex_rule.enabled and Rule.objects.count() == 1


def test_the_platform_administrator_manages_any_tenant(as_admin, globex):
    assert as_admin.post("/tenants/globex/rules/new/", form(sql='SELECT * FROM "plant/#"')).status_code == 302
    event = AuditEvent.objects.get(action="rule.create")
    assert (event.actor, event.tenant) == ("root", "globex")


def test_anonymous_users_are_sent_to_log_in(rule):
    r = Client().get(RULES)
    assert r.status_code == 302 and "/login/" in r["Location"]


def test_a_tenant_has_at_most_so_many_rules(as_alice, acme, settings):
    """Each of a tenant's rules runs on every node for every message its FROM matches: past
    RULES_MAX_PER_TENANT (2 here) the form says so, nothing is added or published."""
    settings.RULES_MAX_PER_TENANT = 2
    for _ in range(2):
        assert as_alice.post(f"{RULES}new/", form()).status_code == 302
    page = as_alice.post(f"{RULES}new/", form()).content.decode()
    assert "has 2 rules, the most a tenant may have" in page
    assert Rule.objects.filter(tenant=acme).count() == 2 and len(policy("acme")["rules"]) == 2


def test_a_republish_as_the_message_is_chosen_on_the_form(as_alice, acme):
    """QoS "As the message" and "Retain as the message was": EMQX's ${qos} and ${flags.retain}."""
    from tenants.models import Rule

    response = as_alice.post(f"{RULES}new/", {"sql": 'SELECT * FROM "a/#"', "action": "republish",
                                              "topic": "b/${topic}", "qos": "${qos}", "retain_as_message": "on"})
    assert response.status_code in (200, 302), response.content.decode()[-2000:]
    rule = Rule.objects.get(tenant=acme, sql='SELECT * FROM "a/#"')
    assert rule.config == {"topic": "b/${topic}", "qos": "${qos}", "retain": "${flags.retain}"}
    page = as_alice.get(f"{RULES}{rule.pk}/edit/").content.decode()
    assert '<option value="${qos}" selected>' in page
    assert re.search(r'<input type="checkbox" name="retain_as_message"[^>]* checked>', page)
