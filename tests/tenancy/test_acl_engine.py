"""brokerd's ACL engine (pure): filter relations against brute-force set
semantics, rule order, placeholders, and the read check of partly granted
subscriptions."""

import itertools

import pytest

from brokerd.routing.topic import is_valid_filter, matches
from brokerd.tenancy.acl import ClientAcl, covers, expand, intersects

LEVELS = ["a", "b", "+", "#", "$s", ""]
FILTERS = sorted({"/".join(c) for n in range(1, 4) for c in itertools.product(LEVELS, repeat=n)
                  if is_valid_filter("/".join(c))})
NAMES = sorted({"/".join(c) for n in range(1, 5) for c in itertools.product(["a", "b", "c", "$s", ""], repeat=n)})
MATCHED = {f: frozenset(t for t in NAMES if matches(f, t)) for f in FILTERS}


def test_covers_and_intersects_agree_with_set_semantics():
    """covers(A, B) == every name B matches is matched by A; intersects == some name both match
    (all pairs of filters of up to 3 levels over a, b, +, #, $s and empty levels)."""
    wrong = [(a, b) for a in FILTERS for b in FILTERS
             if covers(a, b) != (MATCHED[b] <= MATCHED[a]) or intersects(a, b) != bool(MATCHED[a] & MATCHED[b])]
    assert not wrong, wrong[:10]


def rule(topic, allow=True, action="both", who="all", device=None, pattern=None):
    return {"topic": topic, "allow": allow, "action": action, "who": who, "device": device, "pattern": pattern}


@pytest.mark.parametrize("value", ["", "a+b", "x#", "a/b"])
def test_placeholder_values_that_would_widen_a_filter_drop_the_rule(value):
    assert expand("t/{client_id}/x", "dev", value) is None
    acl = ClientAcl([rule("t/{client_id}/#")], False, "dev", value)
    assert not acl.can_publish(f"t/{value}/x")


def test_first_matching_rule_wins_and_default_applies():
    acl = ClientAcl([rule("s/{device}/secret", allow=False), rule("s/{device}/#"), rule("#", allow=False)],
                    True, "d1", "c1")
    assert acl.can_publish("s/d1/temp")
    assert not acl.can_publish("s/d1/secret")
    assert not acl.can_publish("s/d2/temp")
    assert not ClientAcl([], False, "d1", "c1").can_publish("anything")
    assert ClientAcl([], True, "d1", "c1").open


def test_rules_by_who():
    rules = [rule("x", who="device", device="d1"), rule("y", who="pattern", pattern="sensor-*")]
    assert ClientAcl(rules, False, "d1", "c").can_publish("x")
    assert not ClientAcl(rules, False, "d2", "c").can_publish("x")
    assert ClientAcl(rules, False, "sensor-7", "c").can_publish("y")
    assert not ClientAcl(rules, False, "actuator-7", "c").can_publish("y")


def test_subscribe_covered_partial_and_denied():
    acl = ClientAcl([rule("secret/#", allow=False, action="subscribe"), rule("#", action="subscribe")],
                    False, "d", "c")
    assert acl.subscribe("public/+") == (True, False)          # covered by the allow rule
    assert acl.subscribe("secret/x") == (False, False)         # covered by the deny rule
    assert acl.subscribe("#") == (True, True)                  # granted, each delivery checked
    assert acl.can_read("public/a") and not acl.can_read("secret/a")
    only_own = ClientAcl([rule("s/{device}/#", action="subscribe")], False, "d1", "c")
    assert only_own.subscribe("s/#") == (True, True)           # granted in part
    assert only_own.can_read("s/d1/t") and not only_own.can_read("s/d2/t")
    assert only_own.subscribe("other/#") == (False, False)


def test_publish_and_subscribe_actions_are_separate():
    acl = ClientAcl([rule("cmd/#", action="subscribe"), rule("tele/#", action="publish")], False, "d", "c")
    assert acl.can_publish("tele/x") and not acl.can_publish("cmd/x")
    assert acl.subscribe("cmd/#") == (True, False) and acl.subscribe("tele/#") == (False, False)


@pytest.mark.parametrize("value", ["", "a+b", "x#", "a/b", "+", "#"])
def test_an_unexpandable_deny_rule_fails_closed(value):
    """A deny rule whose {client_id} cannot be written into its filter denies everything from
    that level down (issue 16: it was skipped, and the allow after it let the client through)."""
    acl = ClientAcl([rule("own/#"), rule("t/{client_id}/x", allow=False), rule("#")], True, "dev", value)
    assert not acl.open
    for topic in (f"t/{value}/x", "t/other/x", "t/y", "t"):
        assert not acl.can_publish(topic), topic
        assert not acl.can_read(topic), topic
    assert acl.can_publish("own/1") and acl.can_publish("elsewhere")     # earlier and other rules
    assert acl.subscribe("t/#") == (False, False)
    assert acl.subscribe("#") == (True, True)                             # granted, t/... filtered out


@pytest.mark.parametrize("value", ["a/b", "$sys", ""])
def test_an_unexpandable_deny_rule_in_the_first_level_denies_every_topic(value):
    acl = ClientAcl([rule("own/#", action="publish"), rule("{client_id}/cmd", allow=False, action="publish"),
                     rule("#")], True, "dev", value)
    assert acl.can_publish("own/1")
    assert not acl.can_publish("x") and not acl.can_publish("$x/y") and not acl.can_publish(f"{value}/cmd")
    assert acl.subscribe("#") == (True, False) and acl.can_read("x")      # subscribe: another action


def test_an_unexpandable_allow_rule_still_does_not_apply():
    acl = ClientAcl([rule("t/{client_id}/#")], False, "dev", "a/b")
    assert not acl.can_publish("t/a/b/x") and not acl.can_publish("t/x")


def test_the_console_checker_decides_like_the_broker():
    """tenants.acl (``manage.py acl check``) and ClientAcl run one engine: same verdicts."""
    from tenants.acl import decide_detail

    rules = [dict(rule("own/{device}/#"), id=1, action="both"),
             dict(rule("t/{client_id}/x", allow=False), id=2, action="publish"),
             dict(rule("{client_id}/#", allow=False), id=3, action="subscribe"),
             dict(rule("#"), id=4, action="both")]
    for client_id in ("ok", "a/b", "+", "$s", ""):
        acl = ClientAcl(rules, False, "d", client_id)
        for topic in ("own/d/1", "t/ok/x", "t/a/b/x", "t/q", "x", "$s/y"):
            assert decide_detail(rules, "deny", "d", client_id, "publish", topic).allowed == acl.can_publish(topic)
        for filt in ("#", "t/#", "own/d/#", "x/+", "$s/#"):
            d = decide_detail(rules, "deny", "d", client_id, "subscribe", filt)
            assert (d.allowed, d.filtered) == acl.subscribe(filt), (client_id, filt)
