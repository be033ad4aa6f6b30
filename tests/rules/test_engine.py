"""The rule engine inside a real (pure) Broker, driven without sockets
(``tests/protocol/harness.py``): rules from a policy snapshot, run on the
node's PUBLISHes and client events, republishing inside the tenant and its
ACL, with counters per rule."""

import hashlib
import json

from brokerd.protocol import properties as P
from brokerd.protocol.packets import MQTT5
from brokerd.rules.engine import RuleEngine
from brokerd.tenancy.control import TenantControl

from ..protocol.harness import Net

SECRET = b"s3cret"


def snapshot(slug, rules, acl=None):
    cred = {"id": 1, "hash": "sha256$" + hashlib.sha256(SECRET).hexdigest(), "enabled": True}
    return {"schema": 1, "tenant": slug, "status": "active", "default_acl": "deny",
            "devices": {d: {"enabled": True, "credentials": [cred]} for d in ("d1", "watch")},
            "acl": acl if acl is not None else [
                {"id": 9, "position": 0, "who": "all", "action": "both", "topic": "bench/#", "allow": True},
                {"id": 8, "position": 0, "who": "all", "action": "both", "topic": "out/#", "allow": True},
                {"id": 1, "position": 1, "who": "all", "action": "both", "topic": "sensors/#", "allow": True},
                {"id": 2, "position": 2, "who": "all", "action": "both", "topic": "alerts/#", "allow": True},
                {"id": 3, "position": 3, "who": "device", "device": "watch", "action": "subscribe", "topic": "#",
                 "allow": True}],
            "quota": {}, "rules": rules}


def rule(rid, sql, topic, **config):
    return {"id": rid, "sql": sql, "action": "republish", "config": {"topic": topic, **config}, "enabled": True}


class Scene:
    def __init__(self, rules_by_tenant):
        self.net = Net()
        self.control = TenantControl()
        self.net.broker.auth = self.control
        self.engine = RuleEngine(self.net.broker.rules)
        self.net.broker.wall_offset = 1_700_000_000.0 - self.net.now
        self.version = 1
        self.apply(rules_by_tenant)

    def apply(self, rules_by_tenant):
        for slug, rules in rules_by_tenant.items():
            self.version += 1
            _, new = self.control.apply(slug, self.version, snapshot(slug, rules))
            self.engine.apply(slug, new.rules)

    def client(self, who, cid, version=MQTT5):
        c = self.net.client(version)
        c.connect(cid, username=who, password=SECRET)
        return c

    def counters(self, slug):
        return {r["id"]: (r["matched"], r["passed"], r["no_result"], r["failed"]) for r in self.engine.view(slug)}


THRESHOLD = 'SELECT payload.temp AS t, clientid FROM "sensors/+/temp" WHERE payload.temp > 30'


def test_only_readings_above_the_threshold_are_republished_reshaped():
    s = Scene({"acme": [rule(1, THRESHOLD, "alerts/${clientid}", qos=1, user_properties={"from": "${topic}"})]})
    watch = s.client("acme/watch", "w")
    watch.subscribe("alerts/#", qos=1)
    dev = s.client("acme/d1", "d1")
    for temp in (10, 31, 30, 45.5):
        dev.publish("sensors/d1/temp", json.dumps({"temp": temp}).encode(), qos=1)
    dev.publish("sensors/d1/hum", b'{"temp": 99}')
    got = watch.publishes()
    assert [(p.topic, json.loads(p.payload), p.qos) for p in got] == [
        ("alerts/d1", {"t": 31, "clientid": "d1"}, 1), ("alerts/d1", {"t": 45.5, "clientid": "d1"}, 1)]
    assert got[0].properties[P.USER_PROPERTY] == [("from", "sensors/d1/temp")]
    assert s.counters("acme") == {1: (4, 2, 2, 0)}


def test_a_republish_the_acl_forbids_is_counted_as_failed_and_not_sent():
    s = Scene({"acme": [rule(1, 'SELECT * FROM "sensors/#"', "secret/${clientid}")]})
    watch = s.client("acme/watch", "w")
    watch.subscribe("#")
    dev = s.client("acme/d1", "d1")
    dev.publish("sensors/x", b"1")
    assert [p.topic for p in watch.publishes()] == ["sensors/x"]
    [view] = s.engine.view("acme")
    assert (view["matched"], view["passed"], view["failed"]) == (1, 0, 1)
    assert view["last_error"] == "the ACL denies 'd1' publishing to 'secret/d1'"
    assert view["last_error_at"] == 1_700_000_000.0


def test_rules_never_cross_tenants():
    s = Scene({"acme": [rule(1, 'SELECT * FROM "sensors/#"', "alerts/all")], "globex": []})
    spy = s.client("globex/watch", "spy")
    spy.subscribe("#")
    acme_watch = s.client("acme/watch", "w")
    acme_watch.subscribe("alerts/#")
    s.client("acme/d1", "d1").publish("sensors/x", b"1")
    assert spy.publishes() == [] and [p.topic for p in acme_watch.publishes()] == ["alerts/all"]
    s.client("globex/d1", "g1").publish("sensors/x", b"1")       # globex has no rules
    assert [p.topic for p in acme_watch.publishes()] == []
    assert "globex" not in s.net.broker.rules


def test_events():
    s = Scene({"acme": [
        rule(1, 'SELECT clientid, username, event FROM "$events/client_connected"', "alerts/conn"),
        rule(2, 'SELECT clientid FROM "$events/client_disconnected"', "alerts/gone"),
        rule(3, 'SELECT clientid, topic, qos FROM "$events/session_subscribed" WHERE topic = \'sensors/#\'',
             "alerts/sub"),
        rule(4, 'SELECT topic, payload, reason FROM "$events/message_dropped"', "alerts/dropped")]})
    watch = s.client("acme/watch", "w")
    watch.subscribe("alerts/#")
    dev = s.client("acme/d1", "d1")
    dev.subscribe("sensors/#", qos=1)
    dev.publish("alerts/nobody-reads-this-either")    # delivered to watch: not dropped
    s.client("acme/d1", "d2").publish("sensors/none", b"x")     # d1 reads sensors/#: delivered
    dev.disconnect()
    lonely = s.client("acme/d1", "d3")
    lonely.publish("sensors/none", b"lost")           # d1 is gone: nobody subscribes
    got = [(p.topic, json.loads(p.payload)) for p in watch.publishes() if p.topic != "alerts/nobody-reads-this-either"]
    assert got == [
        ("alerts/conn", {"clientid": "d1", "username": "acme/d1", "event": "$events/client_connected"}),
        ("alerts/sub", {"clientid": "d1", "topic": "sensors/#", "qos": 1}),
        ("alerts/conn", {"clientid": "d2", "username": "acme/d1", "event": "$events/client_connected"}),
        ("alerts/gone", {"clientid": "d1"}),
        ("alerts/conn", {"clientid": "d3", "username": "acme/d1", "event": "$events/client_connected"}),
        ("alerts/dropped", {"topic": "sensors/none", "payload": "lost", "reason": "no_subscribers"}),
    ]


def test_a_changed_snapshot_keeps_the_counters_of_unchanged_rules_and_disabling_empties_the_hook():
    s = Scene({"acme": [rule(1, THRESHOLD, "alerts/a"), rule(2, 'SELECT * FROM "sensors/#"', "alerts/b")]})
    dev = s.client("acme/d1", "d1")
    dev.publish("sensors/d1/temp", b'{"temp": 50}')
    assert s.counters("acme") == {1: (1, 1, 0, 0), 2: (1, 1, 0, 0)}
    s.apply({"acme": [rule(1, THRESHOLD, "alerts/a"), rule(2, 'SELECT clientid FROM "sensors/#"', "alerts/b")]})
    assert s.counters("acme") == {1: (1, 1, 0, 0), 2: (0, 0, 0, 0)}    # rule 2 changed: compiled afresh
    s.apply({"acme": [dict(rule(1, THRESHOLD, "alerts/a"), enabled=False)]})
    assert "acme" not in s.net.broker.rules and s.counters("acme") == {1: (1, 1, 0, 0)}
    dev.publish("sensors/d1/temp", b'{"temp": 50}')
    assert s.counters("acme") == {1: (1, 1, 0, 0)}
    s.apply({"acme": []})
    assert s.engine.view("acme") == []


def test_an_evaluation_error_fails_the_rule_not_the_publish():
    s = Scene({"acme": [rule(1, 'SELECT payload.temp / 0 AS x FROM "sensors/#"', "alerts/x")]})
    dev = s.client("acme/d1", "d1")
    assert dev.publish("sensors/t", b'{"temp": 1}', qos=1).reason_code == 0x10   # no subscribers, not an error
    [view] = s.engine.view("acme")
    assert view["failed"] == 1 and view["last_error"].startswith("ZeroDivisionError")


def test_a_rule_a_node_cannot_load_is_reported_not_run():
    s = Scene({"acme": [rule(1, "SELECT nonsense(", "alerts/x"), rule(2, 'SELECT * FROM "a"', "alerts/${")]})
    views = s.engine.view("acme")
    assert [(v["loaded"], v["last_error"].split(":")[0]) for v in views] == [(False, "not loaded"),
                                                                              (False, "not loaded")]
    assert "acme" not in s.net.broker.rules


def test_counters_are_summed_over_the_nodes():
    from brokerd.admin.endpoints import rule_totals

    def item(node, matched, failed, error=None, at=None):
        return {"id": 1, "sql": "s", "action": "republish", "config": {}, "enabled": True, "loaded": True,
                "matched": matched, "passed": matched - failed, "no_result": 0, "failed": failed,
                "last_error": error, "last_error_at": at, "node": node}

    [row] = rule_totals([item("n1", 5, 1, "old", 10.0), item("n2", 3, 2, "new", 20.0), item("n3", 1, 0)])
    assert (row["matched"], row["passed"], row["failed"]) == (9, 6, 3)
    assert (row["last_error"], row["last_error_at"]) == ("new", 20.0)
    assert set(row["nodes"]) == {"n1", "n2", "n3"} and row["nodes"]["n2"]["failed"] == 2


def test_which_rules_a_topic_matches_is_remembered_within_a_bound(monkeypatch):
    import brokerd.rules.engine as engine
    from brokerd.routing.cache import topic_cost
    # three of these topics fit (each: its characters, a str header, its slot and tuple)
    monkeypatch.setattr(engine, "RULE_CACHE_BYTES", 3 * (topic_cost("sensors/a/x") + 100 + 16))
    s = Scene({"acme": [rule(1, 'SELECT * FROM "sensors/a/#"', "alerts/a"),
                        rule(2, 'SELECT * FROM "sensors/+/x"', "alerts/b")]})
    table = s.net.broker.rules["acme"]
    dev = s.client("acme/d1", "d1")
    for topic in ("sensors/a/x", "sensors/b/x", "sensors/c", "sensors/a/x"):
        dev.publish(topic, b"1")
    assert {t: [st.id for st in v] for t, v in table._by_topic.items()} == {
        "sensors/a/x": [1, 2], "sensors/b/x": [2], "sensors/c": []}
    dev.publish("sensors/d/y", b"1")                    # a fourth topic: the remembered ones are forgotten
    assert list(table._by_topic) == ["sensors/d/y"]
    dev.publish("sensors/" + "z" * 600, b"1")           # a long one is matched, never remembered
    assert list(table._by_topic) == ["sensors/d/y"]
    assert s.counters("acme") == {1: (2, 2, 0, 0), 2: (3, 3, 0, 0)}


def test_a_row_the_action_cannot_encode_fails_the_rule_not_the_publisher():
    s = Scene({"acme": [rule(1, "SELECT json_decode(payload) AS x FROM \"sensors/#\"", "alerts/x")]})
    dev = s.client("acme/d1", "d1")
    assert dev.publish("sensors/t", b'"\\ud800"', qos=1).reason_code == 0x10     # a lone surrogate in the row
    assert not dev.closed
    [view] = s.engine.view("acme")
    assert view["failed"] == 1 and view["last_error"].startswith("UnicodeEncodeError")


def test_a_node_without_rules_does_not_load_the_compiler():
    """sqlglot holds ~17 MB: brokerd loads it with the first rule it compiles, not at start."""
    import subprocess
    import sys

    code = ("import sys, brokerd.server\nassert 'sqlglot' not in sys.modules\n"
            "from brokerd.rules.engine import RuleEngine\nRuleEngine().apply('t', [{'id': 1, 'sql': "
            "'SELECT * FROM \"a\"', 'config': {'topic': 'b'}}])\nassert 'sqlglot' in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_a_republish_on_session_subscribed_reaches_the_new_subscription():
    s = Scene({"acme": [rule(1, 'SELECT clientid FROM "$events/session_subscribed"', "alerts/welcome/${clientid}")]})
    dev = s.client("acme/watch", "w1")
    dev.publish("alerts/welcome/w1", b"before")          # the topic's (empty) route is now cached
    dev.subscribe("alerts/welcome/#")
    assert [(p.topic, json.loads(p.payload)) for p in dev.publishes()] == [("alerts/welcome/w1", {"clientid": "w1"})]


def test_a_webhook_rule_hands_its_rendered_request_to_the_sender_and_publishes_nothing():
    queued = []
    s = Scene({})
    s.engine.webhook = lambda tenant, req, state: queued.append((tenant, req, state.id))
    hook = {"id": 5, "sql": THRESHOLD, "action": "webhook", "enabled": True,
            "config": {"url": "https://hooks.example.com/t/${clientid}?t=${t}", "method": "PUT",
                       "headers": {"X-Device": "${clientid}"}}}
    s.apply({"acme": [hook], "globex": [dict(hook, id=6)]})
    watch = s.client("acme/watch", "w")
    watch.subscribe("#", qos=1)
    dev = s.client("acme/d1", "d1")
    for temp in (10, 31):
        dev.publish("sensors/d1/temp", json.dumps({"temp": temp}).encode(), qos=1)
    assert [p.topic for p in watch.publishes()] == ["sensors/d1/temp", "sensors/d1/temp"]   # only the originals
    [(tenant, req, rid)] = queued                              # acme's rule only: never globex's
    assert (tenant, rid, req.method, req.scheme, req.host, req.port, req.target) == (
        "acme", 5, "PUT", "https", "hooks.example.com", 443, "/t/d1?t=31")
    assert req.headers == (("X-Device", "d1"), ("Content-Type", "application/json"))
    assert json.loads(req.body) == {"t": 31, "clientid": "d1"}
    assert s.counters("acme") == {5: (2, 1, 1, 0)}


def test_without_a_sender_a_webhook_rule_counts_as_failed():
    s = Scene({"acme": [{"id": 5, "sql": 'SELECT * FROM "sensors/#"', "action": "webhook", "enabled": True,
                         "config": {"url": "http://hooks.example.com/"}}]})
    s.client("acme/d1", "d1").publish("sensors/x", b"1", qos=1)
    [view] = s.engine.view("acme")
    assert (view["failed"], view["last_error"], view["sent"], view["dropped"]) == (1, "this node sends no webhooks", 0, 0)


def test_a_store_rule_hands_its_row_to_the_telemetry_writer_in_its_own_tenants_name():
    queued = []
    s = Scene({})
    s.engine.telemetry = lambda tenant, rec, state: queued.append((tenant, rec, state.id))
    keep = {"id": 7, "sql": THRESHOLD, "action": "store", "enabled": True, "config": {"dataset": "temps"}}
    s.apply({"acme": [keep], "globex": [dict(keep, id=8)]})
    dev = s.client("acme/d1", "d1")
    for temp in (10, 31):
        dev.publish("sensors/d1/temp", json.dumps({"temp": temp}).encode(), qos=1)
    [(tenant, rec, rid)] = queued                              # acme's rule only: never globex's
    assert (tenant, rid, rec.dataset, rec.clientid, rec.topic) == ("acme", 7, "temps", "d1", "sensors/d1/temp")
    assert json.loads(rec.data) == {"t": 31, "clientid": "d1"} and rec.ts == 1_700_000_000_000
    [view] = s.engine.view("acme")
    assert (view["matched"], view["passed"], view["no_result"], view["stored"], view["dropped"]) == (2, 1, 1, 0, 0)


def test_without_a_landing_zone_a_store_rule_counts_as_failed():
    s = Scene({"acme": [{"id": 5, "sql": 'SELECT * FROM "sensors/#"', "action": "store", "enabled": True,
                         "config": {"dataset": "all"}}]})
    s.client("acme/d1", "d1").publish("sensors/x", b"1", qos=1)
    [view] = s.engine.view("acme")
    assert (view["failed"], view["passed"], view["stored"]) == (1, 0, 0)
    assert "stores no telemetry" in view["last_error"]


def test_a_republish_whose_topic_or_user_property_would_hold_u0000_fails_the_rule():
    """No MQTT string may hold U+0000 ([MQTT-1.5.4-2]): a device's PUBLISH with one is refused by the
    codec, but a rule's templates filled in from the payload sent it on to the subscribers."""
    s = Scene({"acme": [rule(1, 'SELECT payload.x AS x FROM "sensors/t"', "alerts/${x}"),
                        rule(2, 'SELECT payload.x AS x FROM "sensors/t"', "alerts/p", user_properties={"x": "${x}"})]})
    watch = s.client("acme/watch", "w")
    watch.subscribe("alerts/#")
    dev = s.client("acme/d1", "d1")
    dev.publish("sensors/t", json.dumps({"x": "a\u0000b"}).encode())
    dev.publish("sensors/t", b'{"x": "ok"}')
    got = watch.publishes()
    assert [(p.topic, (p.properties or {}).get(P.USER_PROPERTY)) for p in got] == [("alerts/ok", None),
                                                                           ("alerts/p", [("x", "ok")])]
    views = {v["id"]: v for v in s.engine.view("acme")}
    assert [(views[i]["passed"], views[i]["failed"]) for i in (1, 2)] == [(1, 1), (1, 1)]
    assert "U+0000" in views[2]["last_error"]


def test_the_rules_a_topic_matches_are_those_whose_filters_match_it():
    """The tenant's filters are a trie now (a topic not seen before cost a match of every filter of
    every rule); it finds exactly what matching each filter did, in the rules' order."""
    from brokerd.routing.topic import matches

    filters = ["a/+/c", "a/#", "#", "+/b", "a/b", "+", "+/+", "a/b/#", "/a", "+/+/+", "a/+", "x/#", "/#", "a//c"]
    engine = RuleEngine({})
    specs = [rule(i + 1, f'SELECT 1 AS x FROM "{f}", "{filters[(i * 5) % len(filters)]}"', "o") for i, f in
             enumerate(filters)]
    engine.apply("acme", specs)
    table = engine.active["acme"]
    for topic in ["a", "a/b", "a/b/c", "/a", "a/", "x/b", "x", "a/x/c", "a//c", "/", "b/b", "a/b/c/d"]:
        want = [s.id for s in table.on_topics if any(matches(f, topic) for f in s.rule.topics)]
        assert [s.id for s in table.matching(topic)] == want, topic


def test_an_unsubscribe_runs_the_session_unsubscribed_rules_once_per_filter_removed():
    """EMQX's ``$events/session_unsubscribed``: one per filter the UNSUBSCRIBE removed (a filter the
    client had not subscribed to is answered 0x11 and runs nothing), with its QoS."""
    s = Scene({"acme": [rule(1, 'SELECT clientid, topic, qos FROM "$events/session_unsubscribed"',
                             "alerts/unsub/${clientid}")]})
    watch = s.client("acme/watch", "w")
    watch.subscribe("alerts/unsub/#", qos=1)
    dev = s.client("acme/d1", "d1")
    dev.subscribe("sensors/a", qos=1)
    dev.subscribe("sensors/b")
    assert s.counters("acme") == {1: (0, 0, 0, 0)}          # subscribing runs no unsubscribe rule
    dev.unsubscribe("sensors/a", "sensors/never", "sensors/b")
    got = [(p.topic, json.loads(p.payload)) for p in watch.publishes()]
    assert got == [("alerts/unsub/d1", {"clientid": "d1", "topic": "sensors/a", "qos": 1}),
                   ("alerts/unsub/d1", {"clientid": "d1", "topic": "sensors/b", "qos": 0})]
    assert s.counters("acme") == {1: (2, 2, 0, 0)}


def test_a_republish_may_take_the_messages_qos_and_retain_flag():
    """EMQX's ``${qos}`` and ``${flags.retain}`` as the republish's QoS and retain: those of the message
    that ran the rule (an event's: its qos field if it has one, else 0; never retained)."""
    s = Scene({"acme": [rule(1, 'SELECT payload FROM "sensors/#"', "alerts/copy/${topic}", qos="${qos}",
                             retain="${flags.retain}"),
                        rule(2, 'SELECT clientid FROM "$events/session_subscribed"', "alerts/sub/${clientid}",
                             qos="${qos}", retain="${retain}")]})
    watch = s.client("acme/watch", "w")
    watch.subscribe("alerts/#", qos=2)
    dev = s.client("acme/d1", "d1")
    dev.publish("sensors/a", b"x", qos=2)
    dev.publish("sensors/b", b"y", qos=1, retain=True)
    dev.publish("sensors/c", b"z", qos=0)
    got = [(p.topic, p.qos) for p in watch.publishes() if p.topic.startswith("alerts/copy/")]
    assert got == [("alerts/copy/sensors/a", 2), ("alerts/copy/sensors/b", 1), ("alerts/copy/sensors/c", 0)]
    late = s.client("acme/watch", "late")
    late.subscribe("alerts/copy/#", qos=2)
    assert [(p.topic, p.retain) for p in late.publishes()] == [("alerts/copy/sensors/b", True)]   # only b's kept
    # an event's: its own qos field where it has one (the granted QoS of a subscription), not retained
    assert [(p.topic, p.qos, p.retain) for p in watch.publishes()] == [("alerts/sub/late", 2, False)]
    assert s.counters("acme")[1] == (3, 3, 0, 0)


def test_a_republish_qos_or_retain_template_other_than_the_messages_is_refused():
    from brokerd.rules.actions import ActionError, validate

    for config, error in (({"topic": "a", "qos": "${payload.q}"}, "qos is 0, 1, 2 or ${qos}"),
                          ({"topic": "a", "retain": "${payload.r}"}, "retain is true, false or ${flags.retain}"),
                          ({"topic": "a", "qos": True}, "qos is 0, 1, 2")):
        try:
            validate("republish", config)
        except ActionError as exc:
            assert error in str(exc)
        else:
            raise AssertionError(f"{config} accepted")
    assert validate("republish", {"topic": "a", "retain": "${retain}"})["retain"] == "${flags.retain}"


def test_an_event_republished_as_the_message_was_is_never_retained():
    """'Retain as the message was' on an event: never retained (README, *Rules*) -- before, the alert of
    a $events/message_dropped of a retained message was kept as the alert topic's retained message,
    and every later subscriber to the alerts got it."""
    s = Scene({"acme": [rule(1, 'SELECT topic, retain FROM "$events/message_dropped"', "alerts/dropped",
                             qos="${qos}", retain="${flags.retain}")]})
    watch = s.client("acme/watch", "w")
    watch.subscribe("alerts/#", qos=2)
    s.client("acme/d1", "d1").publish("sensors/nobody", b"x", qos=1, retain=True)     # no subscriber: dropped
    [alert] = watch.publishes()
    assert (alert.topic, alert.qos, json.loads(alert.payload)) == ("alerts/dropped", 1,
                                                                    {"topic": "sensors/nobody", "retain": True})
    late = s.client("acme/watch", "late")
    late.subscribe("alerts/#", qos=2)
    assert late.publishes() == []                                 # no retained alert
