"""The reference ACL semantics of tenants.acl (pure, no database)."""

import pytest

from tenants import acl


def rule(topic, allow=True, action="both", who="all", device=None, pattern=None, id=1):
    return {"id": id, "position": id, "who": who, "device": device, "pattern": pattern,
            "action": action, "topic": topic, "allow": allow}


@pytest.mark.parametrize("topic, ok", [
    ("sensors/{device}/#", True),
    ("{client_id}", True),
    ("a/{device}/{client_id}/+", True),
    ("$SYS/#", True),
    ("#", True),
    ("sensors/{device}x/#", False),     # placeholder must fill the level
    ("sensors/x{client_id}", False),
    ("sensors/{tenant}", False),        # unknown placeholder
    ("a/{b", False),
    ("a/#/b", False),
    ("a/b+", False),
    ("", False),
    ("$share/g/a/b", False),
])
def test_rule_topic_validation(topic, ok):
    assert (acl.topic_error(topic) is None) == ok


@pytest.mark.parametrize("topic, device, client_id, expected", [
    ("s/{device}/#", "d1", "c1", "s/d1/#"),
    ("s/{client_id}", "d1", "c-1.x", "s/c-1.x"),
    ("{device}/{client_id}", "d", "c", "d/c"),
    ("plain/+", "d", "c", "plain/+"),
    ("s/{client_id}", "d", "a+b", None),
    ("s/{client_id}", "d", "a#", None),
    ("s/{client_id}", "d", "a/b", None),
    ("s/{client_id}", "d", "+", None),
    ("s/{client_id}", "d", "", None),
    ("s/{device}", "", "c", None),
    ("s/{device}", "d", "a/b", "s/d"),   # only the values used count
])
def test_expand(topic, device, client_id, expected):
    assert acl.expand(topic, device, client_id) == expected


@pytest.mark.parametrize("rule_filter, requested, expected", [
    ("a/b", "a/b", True),
    ("a/b", "a/c", False),
    ("a/+", "a/b", True),
    ("a/+", "a/+", True),
    ("a/b", "a/+", False),
    ("a/+", "a/#", False),          # a/# also matches a and a/b/c
    ("a/#", "a/#", True),
    ("a/#", "a", True),             # '#' includes the parent level
    ("a/#", "a/b/+/d", True),
    ("a/+/#", "a/#", False),        # a/# matches "a"; a/+/# does not
    ("a/+/#", "a/+/#", True),
    ("a", "a/#", False),
    ("a/b", "a/b/c", False),
    ("a/b/c", "a/b", False),
    ("+/+", "a/b", True),
    ("+/+", "+/b", True),
    ("+", "a/b", False),
    ("#", "#", True),
    ("#", "a/b/c", True),
    ("+/#", "#", True),             # both match every topic
    ("+/+/#", "#", False),
    ("#", "$SYS/x", False),         # leading wildcards never reach "$" topics
    ("+/x", "$SYS/x", False),
    ("$SYS/#", "$SYS/broker/load", True),
    ("#", "+/x", True),             # "+" at the top matches no "$" topic either
    ("a//b", "a//b", True),
    ("a/+/b", "a//b", True),
])
def test_covers(rule_filter, requested, expected):
    assert acl.covers(rule_filter, requested) is expected



@pytest.mark.parametrize("rules, default, device, client_id, action, topic, expected", [
    # publish: the rule filter matches the topic name
    ([rule("s/{device}/#")], "deny", "d1", "c", "publish", "s/d1/temp", (True, 0)),
    ([rule("s/{device}/#")], "deny", "d1", "c", "publish", "s/d2/temp", (False, None)),
    ([rule("s/{device}/#")], "allow", "d1", "c", "publish", "s/d2/temp", (True, None)),
    # subscribe: the rule filter covers the requested filter
    ([rule("s/{device}/#")], "deny", "d1", "c", "subscribe", "s/d1/+", (True, 0)),
    # a rule that allows part of the requested filter grants it, filtered per message
    ([rule("s/{device}/#")], "deny", "d1", "c", "subscribe", "s/+/temp", (True, None)),
    ([rule("s/+/temp")], "deny", "d1", "c", "subscribe", "s/#", (True, None)),
    ([rule("t/#")], "deny", "d1", "c", "subscribe", "s/#", (False, None)),
    # $share/GROUP/F is judged by F
    ([rule("s/#")], "deny", "d1", "c", "subscribe", "$share/g/s/x", (True, 0)),
    ([rule("s/#")], "deny", "d1", "c", "subscribe", "$share/g/t/x", (False, None)),
    # first match wins; rules that do not cover are skipped
    ([rule("s/secret/#", allow=False, id=1), rule("s/#", id=2)], "deny", "d", "c",
     "subscribe", "s/secret/a", (False, 0)),
    ([rule("s/secret/#", allow=False, id=1), rule("s/#", id=2)], "deny", "d", "c",
     "subscribe", "s/public/a", (True, 1)),
    ([rule("s/secret/#", allow=False, id=1), rule("s/#", id=2)], "deny", "d", "c",
     "subscribe", "s/#", (True, 1)),
    # action
    ([rule("s/#", action="publish")], "deny", "d", "c", "subscribe", "s/a", (False, None)),
    ([rule("s/#", action="subscribe")], "deny", "d", "c", "subscribe", "s/a", (True, 0)),
    ([rule("s/#", action="subscribe")], "deny", "d", "c", "publish", "s/a", (False, None)),
    # who
    ([rule("#", who="device", device="d1")], "deny", "d1", "c", "publish", "x", (True, 0)),
    ([rule("#", who="device", device="d1")], "deny", "d2", "c", "publish", "x", (False, None)),
    ([rule("#", who="pattern", pattern="sensor-*")], "deny", "sensor-7", "c", "publish", "x", (True, 0)),
    ([rule("#", who="pattern", pattern="sensor-*")], "deny", "pump-7", "c", "publish", "x", (False, None)),
    ([rule("#", who="pattern", pattern="s?n[0-9]")], "deny", "sen5", "c", "publish", "x", (True, 0)),
    # client ids that would widen or shift the filter make an allow rule not match ...
    ([rule("c/{client_id}/#")], "deny", "d", "ok-1", "subscribe", "c/ok-1/#", (True, 0)),
    ([rule("c/{client_id}/#")], "deny", "d", "+", "subscribe", "c/+/#", (False, None)),
    ([rule("c/{client_id}/#")], "deny", "d", "#", "subscribe", "c/#", (False, None)),
    ([rule("c/{client_id}/#")], "deny", "d", "a/b", "publish", "c/a/b/x", (False, None)),
    # ... and a deny rule fail closed: it denies from that level down (issue 16: it was skipped,
    # so the client id "a/b" escaped "deny c/{client_id}" and the allow after it let c/a/b through)
    ([rule("c/{client_id}", allow=False), rule("c/#", id=2)], "deny", "d", "a/b", "publish", "c/a/b",
     (False, 0)),
    ([rule("c/{client_id}", allow=False), rule("c/#", id=2)], "deny", "d", "a/b", "publish", "c/x",
     (False, 0)),
    ([rule("c/{client_id}", allow=False), rule("#", id=2)], "allow", "d", "a+b", "publish", "other",
     (True, 1)),
    ([rule("c/{client_id}", allow=False), rule("c/#", id=2)], "deny", "d", "ab", "publish", "c/ab",
     (False, 0)),
    ([rule("c/{client_id}", allow=False, action="publish"), rule("c/#", id=2)], "deny", "d", "a/b",
     "subscribe", "c/a/b", (True, 1)),
    ([rule("c/{client_id}/#", allow=False), rule("#", id=2)], "allow", "d", "#", "subscribe", "c/#",
     (False, 0)),
    ([rule("c/{client_id}/#", allow=False), rule("#", id=2)], "allow", "d", "#", "subscribe", "#",
     (True, 1)),                        # granted, each delivery checked (decide_detail: filtered)
    # in the first level: every topic, "$" topics too
    ([rule("{client_id}/cmd", allow=False), rule("#", id=2)], "allow", "d", "a/b", "publish", "x/y",
     (False, 0)),
    ([rule("{client_id}/cmd", allow=False), rule("#", id=2)], "allow", "d", "a/b", "publish", "$x/y",
     (False, 0)),
    ([rule("{client_id}/cmd", allow=False), rule("#", id=2)], "allow", "d", "$a", "subscribe", "$a/#",
     (False, 0)),
    ([rule("{device}/#", allow=False)], "allow", "", "c", "publish", "x", (False, 0)),
])
def test_decide(rules, default, device, client_id, action, topic, expected):
    allowed, decided_by = acl.decide(rules, default, device, client_id, action, topic)
    want_allowed, want_index = expected
    assert allowed is want_allowed
    assert decided_by is (None if want_index is None else rules[want_index])


@pytest.mark.parametrize("action, topic", [
    ("publish", "a/+"), ("publish", ""), ("subscribe", "a/#/b"), ("subscribe", "$share/g"),
    ("subscribe", "$share//a"), ("read", "a"),
])
def test_decide_refuses_invalid_requests(action, topic):
    with pytest.raises(ValueError):
        acl.decide([], "allow", "d", "c", action, topic)


@pytest.mark.parametrize("rules, default, topic, expected", [
    ([rule("s/{device}/#")], "deny", "s/+/temp", (True, None, True)),
    ([rule("s/secret/#", allow=False, id=1), rule("#", id=2)], "deny", "#", (True, 1, True)),
    ([rule("s/secret/#", allow=False, id=1), rule("#", id=2)], "deny", "s/public/#", (True, 1, False)),
    ([rule("s/secret/#", allow=False)], "deny", "s/#", (False, None, True)),
])
def test_decide_detail_reports_filtered_grants(rules, default, topic, expected):
    """As brokerd decides: granted, and each delivered message checked."""
    allowed, decided_by, filtered = acl.decide_detail(rules, default, "d1", "c", "subscribe", topic)
    want_allowed, want_index, want_filtered = expected
    assert (allowed, filtered) == (want_allowed, want_filtered)
    assert decided_by is (None if want_index is None else rules[want_index])


def test_console_and_broker_decide_alike():
    """The checker and brokerd's engine agree on every request of a small rule set."""
    from brokerd.tenancy.acl import ClientAcl

    rules = [rule("s/secret/#", allow=False, id=1), rule("s/{device}/#", id=2), rule("cmd/{client_id}/+", id=3,
             action="subscribe"), rule("#", allow=False, id=4, action="publish")]
    engine = ClientAcl(rules, False, "d1", "c1")
    for topic in ("s/d1/t", "s/secret/x", "s/d2/t", "cmd/c1/go", "other"):
        assert acl.decide(rules, "deny", "d1", "c1", "publish", topic)[0] is engine.can_publish(topic)
    for filt in ("s/#", "s/d1/#", "s/secret/#", "cmd/c1/+", "cmd/#", "#", "other/+"):
        allowed, _, filtered = acl.decide_detail(rules, "deny", "d1", "c1", "subscribe", filt)
        assert (allowed, filtered) == engine.subscribe(filt), filt
