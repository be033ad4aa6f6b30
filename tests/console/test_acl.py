"""ACL rules in the console: add, edit, reorder, delete -- each published to
brokerd's snapshot and audited -- and the checker ("would device X be
allowed to publish/subscribe TOPIC?") that names the rule that decided.

acme's rules (conftest): #1 allow publish ``sensors/{device}/#`` for
``sensor-*``; #2 deny both ``secret/#`` for all devices; default deny.
"""

import json
import re

import pytest

from core.models import AuditEvent
from tenants import services
from tenants.models import AclRule

from .conftest import HTMX, policy

ACL = "/tenants/acme/acl/"


def rules(tenant) -> list[tuple]:
    return list(AclRule.objects.filter(tenant=tenant).order_by("position")
                .values_list("position", "allow", "action", "topic"))


def snapshot_topics(slug) -> list[str]:
    return [r["topic"] for r in policy(slug)["acl"]]


def check(client, device, action, topic, client_id="", **extra):
    response = client.get(f"{ACL}check/", {"device": device, "client_id": client_id, "action": action,
                                           "topic": topic}, **extra)
    assert response.status_code == 200
    return response.content.decode()


def verdict(page) -> tuple[str, str | None]:
    """("Allowed"|"Denied", "#N", the position of the deciding rule, or None for the default)."""
    allowed = re.search(r'<div class="verdict">[^A-Z]*(Allowed|Denied)</div>', page).group(1)
    rule = re.search(r"Decided by <strong>ACL rule (\d+)</strong> \(position (\d+)\)", page)
    if rule is None:
        assert "No rule matched: the tenant's default" in page
        return allowed, None
    assert AclRule.objects.get(pk=int(rule.group(1))).position == int(rule.group(2))
    return allowed, f"#{rule.group(2)}"


def add(client, headers=None, **data):
    form = {"who": "all", "action": "both", "allow": "allow", "device": "", "pattern": "", "position": ""}
    form.update(data)
    return client.post(f"{ACL}new/", form, **(headers or {}))


# ---------------------------------------------------------------- add


def test_add_goes_last_by_default(as_alice, acme):
    response = add(as_alice, topic="alerts/#", action="subscribe")
    assert response.status_code == 302 and response["Location"] == ACL
    assert rules(acme)[-1] == (3, True, "subscribe", "alerts/#")
    assert snapshot_topics("acme") == ["sensors/{device}/#", "secret/#", "alerts/#"]
    page = as_alice.get(ACL).content.decode()
    new = acme.acl_rules.get(position=3)
    assert f"ACL rule {new.pk} added at position 3." in page and "alerts/#" in page
    event = AuditEvent.objects.get(action="acl.add")
    assert (event.actor, event.tenant, event.before) == ("alice", "acme", None)
    assert json.loads(event.after)["topic"] == "alerts/#" and json.loads(event.after)["position"] == 3


def test_add_at_a_position_moves_the_others_down(as_alice, acme):
    add(as_alice, topic="public/#", position="1")
    assert [r[3] for r in rules(acme)] == ["public/#", "sensors/{device}/#", "secret/#"]
    assert [r[0] for r in rules(acme)] == [1, 2, 3]


def test_add_for_one_device_and_for_a_pattern(as_alice, acme):
    add(as_alice, who="device", device="gateway", topic="gw/{client_id}/#", allow="deny")
    add(as_alice, who="pattern", pattern="gate*", topic="cmd/#")
    snap = policy("acme")["acl"]
    assert (snap[2]["who"], snap[2]["device"], snap[2]["allow"]) == ("device", "gateway", False)
    assert (snap[3]["who"], snap[3]["pattern"]) == ("pattern", "gate*")
    page = as_alice.get("/tenants/acme/devices/gateway/").content.decode()
    assert "gw/{client_id}/#" in page                   # the device page lists its own rules


@pytest.mark.parametrize(("data", "field_error"), [
    ({"topic": "a/#/b"}, "invalid topic filter"),
    ({"topic": "a/b+/c"}, "invalid topic filter"),
    ({"topic": "a/{dev}/c"}, "a placeholder"),
    ({"topic": "a/x{device}"}, "a placeholder"),
    ({"topic": "$share/g/a"}, "$share/"),
    ({"topic": ""}, "This field is required."),
    ({"topic": "a", "who": "device"}, "Choose the device this rule is for."),
    ({"topic": "a", "who": "device", "device": "plant-1"}, "Select a valid choice"),   # globex's device
    ({"topic": "a", "who": "pattern"}, "A pattern rule needs a device pattern."),
    ({"topic": "a", "who": "pattern", "pattern": "Sensor *"}, "A device pattern is a glob"),
    ({"topic": "a", "action": "delete"}, "Select a valid choice"),
    ({"topic": "a", "position": "0"}, "greater than or equal to 1"),
])
def test_bad_rules_are_inline_errors_and_change_nothing(as_alice, acme, data, field_error):
    before = (rules(acme), policy("acme"))
    for extra in ({}, HTMX):
        response = as_alice.post(f"{ACL}new/", {"who": "all", "action": "both", "allow": "allow", **data},
                                 **extra)
        assert response.status_code == 200
        page = response.content.decode()
        assert field_error in page.replace("&#x27;", "'")
        assert 'class="field has-error"' in page
    assert (rules(acme), policy("acme")) == before
    assert not AuditEvent.objects.exists()


def test_add_with_htmx_swaps_the_editor(as_alice, acme):
    response = add(as_alice, HTMX, topic="alerts/#")
    assert response.status_code == 200
    page = response.content.decode()
    assert page.startswith('<div id="acl-editor">') and "<html" not in page
    assert "alerts/#" in page and "Add a rule" in page              # a fresh form for the next rule
    added = acme.acl_rules.get(topic="alerts/#")
    assert 'hx-swap-oob="true"' in page and f"ACL rule {added.pk} added at position 3." in page


def test_rules_page_and_its_htmx_fragment(as_alice, acme):
    page = as_alice.get(ACL).content.decode()
    assert "<html" in page and 'id="acl-checker"' in page and "sensors/{device}/#" in page
    fragment = as_alice.get(ACL, **HTMX).content.decode()
    assert fragment.startswith('<div id="acl-editor">') and "<html" not in fragment
    assert "sensors/{device}/#" in fragment


def test_get_of_the_add_url_goes_to_the_rules(as_alice, acme):
    response = as_alice.get(f"{ACL}new/")
    assert response.status_code == 302 and response["Location"] == ACL


# ---------------------------------------------------------------- edit


def test_edit(as_alice, acme):
    rule = acme.acl_rules.get(position=2)
    url = f"{ACL}{rule.pk}/edit/"
    page = as_alice.get(url).content.decode()
    assert f"Edit ACL rule {rule.pk} (position 2)" in page and 'value="secret/#"' in page
    response = as_alice.post(url, {"who": "pattern", "pattern": "gate*", "action": "subscribe",
                                   "topic": "secret/{device}/#", "allow": "allow"})
    assert response.status_code == 302 and response["Location"] == ACL
    rule.refresh_from_db()
    assert (rule.position, rule.who, rule.device_pattern, rule.action, rule.topic, rule.allow) == (
        2, "pattern", "gate*", "subscribe", "secret/{device}/#", True)
    assert policy("acme")["acl"][1]["topic"] == "secret/{device}/#"
    event = AuditEvent.objects.get(action="acl.update")
    assert (json.loads(event.before)["topic"], json.loads(event.after)["topic"]) == ("secret/#", "secret/{device}/#")
    assert f"ACL rule {rule.pk} saved." in as_alice.get(ACL).content.decode()


def test_edit_with_htmx(as_alice, acme):
    rule = acme.acl_rules.get(position=2)
    url = f"{ACL}{rule.pk}/edit/"
    fragment = as_alice.get(url, **HTMX).content.decode()
    assert fragment.startswith('<div id="acl-editor">') and "<html" not in fragment and f"Edit ACL rule {rule.pk}" in fragment
    response = as_alice.post(url, {"who": "all", "action": "both", "topic": "hidden/#", "allow": "deny"}, **HTMX)
    fragment = response.content.decode()
    assert response.status_code == 200 and "<html" not in fragment
    assert "hidden/#" in fragment and "Add a rule" in fragment
    assert rules(acme)[1] == (2, False, "both", "hidden/#")


def test_edit_with_a_bad_topic_is_inline(as_alice, acme):
    rule = acme.acl_rules.get(position=2)
    response = as_alice.post(f"{ACL}{rule.pk}/edit/", {"who": "all", "action": "both", "topic": "a/#/b",
                                                       "allow": "deny"})
    assert response.status_code == 200
    page = response.content.decode()
    assert "invalid topic filter" in page and f"Edit ACL rule {rule.pk} (position 2)" in page
    rule.refresh_from_db()
    assert rule.topic == "secret/#" and not AuditEvent.objects.exists()


# ---------------------------------------------------------------- order


def test_moving_a_rule_changes_what_the_checker_decides(as_alice, acme):
    everything = services.add_acl_rule(acme, topic="#", action="both", allow=True)          # #3
    assert verdict(check(as_alice, "sensor-1", "publish", "secret/x")) == ("Denied", "#2")

    move = f"{ACL}{everything.pk}/move/"
    response = as_alice.post(move, {"direction": "up"})
    assert response.status_code == 302 and response["Location"] == ACL
    assert [r[3] for r in rules(acme)] == ["sensors/{device}/#", "#", "secret/#"]
    assert verdict(check(as_alice, "sensor-1", "publish", "secret/x")) == ("Allowed", "#2")

    fragment = as_alice.post(move, {"direction": "up"}, **HTMX).content.decode()
    assert fragment.startswith('<div id="acl-editor">') and "<html" not in fragment
    assert snapshot_topics("acme") == ["#", "sensors/{device}/#", "secret/#"]
    assert verdict(check(as_alice, "sensor-1", "publish", "secret/x")) == ("Allowed", "#1")

    as_alice.post(move, {"direction": "down"})
    as_alice.post(move, {"direction": "down"})
    assert snapshot_topics("acme") == ["sensors/{device}/#", "secret/#", "#"]
    assert verdict(check(as_alice, "sensor-1", "publish", "secret/x")) == ("Denied", "#2")

    moves = AuditEvent.objects.filter(action="acl.move").order_by("id")
    assert [(json.loads(e.before)["position"], json.loads(e.after)["position"]) for e in moves] == [
        (3, 2), (2, 1), (1, 2), (2, 3)]


def test_moving_past_either_end_changes_nothing(as_alice, acme):
    first, last = acme.acl_rules.get(position=1), acme.acl_rules.get(position=2)
    version = policy("acme")
    as_alice.post(f"{ACL}{first.pk}/move/", {"direction": "up"})
    as_alice.post(f"{ACL}{last.pk}/move/", {"direction": "down"})
    as_alice.post(f"{ACL}{last.pk}/move/", {"position": "7"})
    as_alice.post(f"{ACL}{last.pk}/move/", {"position": "x"})
    assert [r[3] for r in rules(acme)] == ["sensors/{device}/#", "secret/#"]
    assert policy("acme") == version
    assert not AuditEvent.objects.exists()


def test_move_to_a_position(as_alice, acme):
    last = acme.acl_rules.get(position=2)
    as_alice.post(f"{ACL}{last.pk}/move/", {"position": "1"})
    assert [r[3] for r in rules(acme)] == ["secret/#", "sensors/{device}/#"]


def test_move_only_by_post(as_alice, acme):
    assert as_alice.get(f"{ACL}{acme.acl_rules.first().pk}/move/").status_code == 405


# ---------------------------------------------------------------- delete


def test_delete_asks_first(as_alice, acme):
    first = acme.acl_rules.get(position=1)
    page = as_alice.get(f"{ACL}{first.pk}/delete/").content.decode()
    assert f"Delete ACL rule {first.pk} (position 1)?" in page and "sensors/{device}/#" in page
    assert acme.acl_rules.count() == 2
    response = as_alice.post(f"{ACL}{first.pk}/delete/")
    assert response.status_code == 302 and response["Location"] == ACL
    assert rules(acme) == [(1, False, "both", "secret/#")]            # renumbered
    assert snapshot_topics("acme") == ["secret/#"]
    assert f"ACL rule {first.pk} deleted." in as_alice.get(ACL).content.decode()
    event = AuditEvent.objects.get(action="acl.delete")
    assert json.loads(event.before)["topic"] == "sensors/{device}/#" and event.after is None


def test_delete_with_htmx(as_alice, acme):
    first = acme.acl_rules.get(position=1)
    fragment = as_alice.post(f"{ACL}{first.pk}/delete/", **HTMX).content.decode()
    assert fragment.startswith('<div id="acl-editor">') and "<html" not in fragment
    assert "sensors/{device}/#" not in fragment and "secret/#" in fragment


# ---------------------------------------------------------------- the checker


@pytest.mark.parametrize(("device", "client_id", "action", "topic", "expected"), [
    ("sensor-1", "", "publish", "sensors/sensor-1/temp", ("Allowed", "#1")),
    ("sensor-1", "", "publish", "sensors/sensor-2/temp", ("Denied", None)),     # {device} is sensor-1
    ("gateway", "", "publish", "sensors/gateway/temp", ("Denied", None)),       # not sensor-*
    ("sensor-1", "", "subscribe", "sensors/sensor-1/#", ("Denied", None)),      # rule #1 is publish only
    ("sensor-1", "", "subscribe", "secret/a", ("Denied", "#2")),
    ("sensor-1", "", "subscribe", "$share/g/secret/#", ("Denied", "#2")),
    ("unknown", "", "publish", "secret/x", ("Denied", "#2")),
])
def test_checker_answers_and_names_the_rule(as_alice, acme, device, client_id, action, topic, expected):
    page = check(as_alice, device, action, topic, client_id)
    assert verdict(page) == expected
    if expected[1] is None:
        assert "(<strong>deny</strong>) decided" in page


def test_checker_with_a_client_id_placeholder(as_alice, acme):
    services.add_acl_rule(acme, topic="clients/{client_id}/#", action="both", allow=True, position=1)
    page = check(as_alice, "gateway", "publish", "clients/gw-1/up", client_id="gw-1")
    assert verdict(page) == ("Allowed", "#1") and "(client id <code>gw-1</code>)" in page
    assert verdict(check(as_alice, "gateway", "publish", "clients/gw-2/up", client_id="gw-1")) == ("Denied", None)
    # without a client id the device name is the client id
    assert verdict(check(as_alice, "gateway", "publish", "clients/gateway/up")) == ("Allowed", "#1")


def test_checker_reports_a_partial_grant(as_alice, acme):
    services.add_acl_rule(acme, topic="#", action="subscribe", allow=True)
    page = check(as_alice, "sensor-1", "subscribe", "#")
    assert verdict(page) == ("Allowed", "#3") and "Granted in part" in page


def test_checker_follows_the_default(as_alice, acme):
    services.update_tenant(acme, default_acl="allow")
    page = check(as_alice, "gateway", "publish", "anything/else")
    assert verdict(page) == ("Allowed", None) and "(<strong>allow</strong>) decided" in page


def test_checker_notes_an_unknown_device(as_alice, acme):
    assert "has no device named ghost" in check(as_alice, "ghost", "publish", "a")
    assert "has no device named" not in check(as_alice, "gateway", "publish", "a")


@pytest.mark.parametrize(("action", "topic", "error"), [
    ("publish", "a/+/b", "Invalid topic name"),
    ("publish", "a/#", "Invalid topic name"),
    ("subscribe", "a/#/b", "Invalid topic filter"),
    ("subscribe", "$share/g", "Topic: "),
    ("publish", "", "This field is required."),
])
def test_checker_bad_topics_are_inline(as_alice, acme, action, topic, error):
    page = check(as_alice, "sensor-1", action, topic)
    assert error in page and 'class="verdict"' not in page


def test_checker_with_htmx_answers_with_a_fragment(as_alice, acme):
    fragment = check(as_alice, "sensor-1", "publish", "secret/x", **HTMX)
    assert fragment.startswith('<div id="acl-check">') and "<html" not in fragment
    assert verdict(fragment) == ("Denied", "#2")
    page = check(as_alice, "sensor-1", "publish", "secret/x")
    assert "<html" in page and 'class="highlight"' in page          # the full page marks the rule


def test_viewer_reads_and_checks_but_cannot_edit(as_bob, globex):
    page = as_bob.get("/tenants/globex/acl/").content.decode()
    assert "plant/#" in page and "Add a rule" not in page and "/move/" not in page and "/edit/" not in page
    page = as_bob.get("/tenants/globex/acl/check/", {"device": "plant-1", "action": "publish",
                                                      "topic": "plant/7"}).content.decode()
    assert verdict(page) == ("Allowed", "#1")


# ---------------------------------------------------------------- escaping


def test_rule_topics_are_escaped(as_alice, acme):
    topic = "x/<script>alert(1)</script>"
    add(as_alice, topic=topic)
    assert AclRule.objects.filter(topic=topic).exists()
    for page in (as_alice.get(ACL).content.decode(),
                 as_alice.get(ACL, **HTMX).content.decode(),
                 check(as_alice, "sensor-1", "publish", topic),
                 as_alice.get("/tenants/acme/audit/").content.decode()):
        assert "<script>alert(1)" not in page
    assert "x/&lt;script&gt;alert(1)&lt;/script&gt;" in as_alice.get(ACL).content.decode()


def test_the_acl_page_and_the_audit_log_give_a_rule_one_name(as_alice, as_admin, acme):
    """A rule is "ACL rule <id>" on the ACL page, in its messages, in the checker
    and in both audit logs, whatever its position (shown beside it) becomes."""
    add(as_alice, topic="alerts/#", action="subscribe")
    rule = acme.acl_rules.get(topic="alerts/#")
    as_alice.post(f"{ACL}{rule.pk}/move/", {"direction": "up"})
    rule.refresh_from_db()
    assert rule.position == 2
    page = as_alice.get(ACL).content.decode()
    row = re.search(rf'<td class="num strong">2</td>\s*<td class="nowrap">ACL rule {rule.pk}</td>', page)
    assert row, "the rule's row names it by its id beside its position"
    assert "Rule #" not in page
    for client, url in ((as_alice, "/tenants/acme/audit/"), (as_admin, "/audit/")):
        log = client.get(url).content.decode()
        assert log.count(f'ACL rule <span class="mono">{rule.pk}</span>') == 2, url      # added, moved
        assert "acl_rule" not in log.replace('value="acl_rule"', "")
    page = check(as_alice, "sensor-1", "subscribe", "alerts/x")
    assert f"Decided by <strong>ACL rule {rule.pk}</strong> (position 2)" in page


def test_a_tenant_has_at_most_so_many_acl_rules(as_alice, acme, settings):
    """Every node holds a tenant's ACL rules and checks each client's new topics against them one by
    one (100,000 rules: 0.2 s a CONNECT, 0.3 s a PUBLISH to a new topic, the node's loop stopped for
    every tenant meanwhile). Past TENANT_MAX_ACL_RULES (3 here; acme has 2) the form says so and
    nothing is added, nor published to the nodes; the command line is held to it too."""
    settings.TENANT_MAX_ACL_RULES = 3
    assert add(as_alice, topic="alerts/#").status_code == 302
    page = add(as_alice, headers=HTMX, topic="more/#").content.decode()
    assert "A tenant has at most 3 ACL rules" in page
    assert len(rules(acme)) == 3 and "more/#" not in snapshot_topics("acme")
    with pytest.raises(services.ServiceError, match="at most 3 ACL rules"):
        services.add_acl_rule(acme, topic="more/#", action="both", allow=True)
    services.delete_acl_rule(acme.acl_rules.get(position=3))       # one deleted: one may be added
    assert add(as_alice, topic="more/#").status_code == 302
