"""metrics.core without a broker: rates from successive documents (restarts,
unreachable nodes), latency quantiles, and the alarm rules' decisions."""

import math

import pytest

from metrics import core
from metrics.core import DROPS, NODE_DOWN, QUOTA, RULE_DROPS, AlarmRules, AlarmSettings


def totals(msgs_in=0, msgs_out=0, connections=0, bytes_in=0, bytes_out=0, connects=0, disconnects=0,
           queue_full=0, no_subscribers=0, retained=0, q1_in=0):
    return {"connections": connections, "connections_max": connections, "connects": connects,
            "disconnects": disconnects, "messages_in": {"0": msgs_in - q1_in, "1": q1_in, "2": 0},
            "messages_out": {"0": msgs_out, "1": 0, "2": 0}, "bytes_in": bytes_in, "bytes_out": bytes_out,
            "dropped": {"queue_full": queue_full, "expired": 0, "too_large": 0, "no_subscribers": no_subscribers,
                        "acl_denied": 0, "quota": 0},
            "auth_failures": 0, "retained": retained, "subscriptions": 0, "queued": 0, "inflight": 0}


def node(name, uptime=100.0, cpu=1.0, tenants=None, health="ok", latency=None, **kw):
    t = totals(**kw)
    t.update({"node": name, "health": health, "uptime": uptime, "loop_lag": 0.002, "cpu_seconds": cpu,
              "memory_rss": 50_000_000, "latency": latency or {"buckets": [], "sum": 0, "count": 0},
              "tenants": tenants or {}})
    return t


def doc(at, *nodes, tenants=None):
    return {"at": at, "nodes": list(nodes), "cluster": totals(), "tenants": tenants or {}}


def test_flatten_sums_qos_and_drop_reasons():
    f = core.flatten(totals(msgs_in=10, q1_in=4, queue_full=2, no_subscribers=3))
    assert f["msgs_in"] == 10 and f["msgs_in_q1"] == 4 and f["msgs_in_q0"] == 6
    assert f["drops"] == 5 and f["drop_queue_full"] == 2
    assert core.flatten(None)["msgs_in"] == 0


def test_rates_per_second_and_restart_counts_zero():
    prev = core.flatten(totals(msgs_in=100, bytes_in=1000))
    cur = core.flatten(totals(msgs_in=150, bytes_in=900))
    r = core.rates(prev, cur, 2.0)
    assert r["msgs_in"] == 25.0
    assert r["bytes_in"] == 0.0              # went down: the node restarted
    assert core.rates(None, cur, 1.0)["msgs_in"] == 0.0


def test_summarize_sums_node_rates_and_skips_restarted_and_unreachable_nodes():
    t0 = doc(1000.0, node("a", msgs_in=100, cpu=10.0, tenants={"acme": totals(msgs_in=60)}),
             node("b", msgs_in=500, uptime=50))
    t1 = doc(1002.0, node("a", msgs_in=140, cpu=11.0, tenants={"acme": totals(msgs_in=90)}),
             node("b", msgs_in=7, uptime=1.5),                       # restarted in between
             {"node": "c", "health": "unreachable"},
             tenants={"acme": totals(msgs_in=90, connections=3)})
    s = core.summarize(t1, t0)
    assert s["interval"] == 2.0
    assert s["cluster"]["rates"]["msgs_in"] == 20.0                   # a only; b restarted
    a, b, c = s["nodes"]
    assert a["rates"]["msgs_in"] == 20.0 and a["cpu"] == pytest.approx(50.0)
    assert b["rates"]["msgs_in"] == 0.0 and b["cpu"] is None
    assert c == {"node": "c", "health": "unreachable", "host": "c", "worker": None}
    assert s["cluster"]["nodes"] == 3 and s["cluster"]["nodes_ok"] == 2
    assert s["tenants"]["acme"]["rates"]["msgs_in"] == 15.0
    assert s["tenants"]["acme"]["connections"] == 3


def test_quantile_interpolates_inside_the_bucket():
    buckets = [[0.001, 0], [0.002, 50], [0.005, 90], [0.01, 100], ["+Inf", 100]]
    assert core.quantile(buckets, 0.5) == pytest.approx(0.002)
    assert core.quantile(buckets, 0.25) == pytest.approx(0.0015)
    assert core.quantile(buckets, 0.99) == pytest.approx(0.0095)
    assert core.quantile([[0.001, 0], ["+Inf", 0]], 0.5) is None
    # everything above the last finite bound: that bound
    assert core.quantile([[0.001, 0], [0.002, 0], ["+Inf", 5]], 0.5) == 0.002
    assert not math.isinf(core.quantile([[0.001, 1], ["+Inf", 10]], 0.99))


def test_latency_over_the_recent_window_only():
    old = {"buckets": [[0.001, 1000], [0.01, 1000], ["+Inf", 1000]], "sum": 0.5, "count": 1000}
    new = {"buckets": [[0.001, 1000], [0.01, 1010], ["+Inf", 1010]], "sum": 0.6, "count": 1010}
    t0 = doc(10.0, node("a", latency=old))
    t1 = doc(11.0, node("a", latency=new))
    n = core.summarize(t1, t0)["nodes"][0]
    assert n["latency_count"] == 10 and 0.001 < n["p50"] <= 0.01


# ------------------------------------------------------------------ alarms

def summary(at, nodes=("a",), tenants=None, prev_tenants=None, dt=1.0):
    prev = doc(at - dt, *[node(n, tenants=prev_tenants or {}) for n in nodes])
    cur = doc(at, *[node(n, tenants=tenants or {}) for n in nodes], tenants=tenants or {})
    return core.summarize(cur, prev)


def test_quota_alarm_raised_at_90_percent_and_cleared_below():
    rules = AlarmRules(AlarmSettings(quota_percent=90))
    quotas = {"acme": {"max_connections": 10}}
    raise_, clear = rules.evaluate(1.0, summary(1.0, tenants={"acme": totals(connections=8)}), quotas, set())
    assert raise_ == [] and clear == []
    raise_, clear = rules.evaluate(2.0, summary(2.0, tenants={"acme": totals(connections=9)}), quotas, set())
    assert [c.key for c in raise_] == [(QUOTA, "acme:max_connections")]
    assert raise_[0].tenant == "acme" and "9 connections of its quota of 10 (90%" in raise_[0].message
    open_ = {(QUOTA, "acme:max_connections")}
    raise_, clear = rules.evaluate(3.0, summary(3.0, tenants={"acme": totals(connections=10)}), quotas, open_)
    assert raise_ == [] and clear == []                       # already open: nothing to do
    raise_, clear = rules.evaluate(4.0, summary(4.0, tenants={"acme": totals(connections=3)}), quotas, open_)
    assert clear == [(QUOTA, "acme:max_connections")]


def test_rate_quota_must_hold_for_a_while():
    rules = AlarmRules(AlarmSettings(quota_rate_for=5))
    quotas = {"acme": {"tenant_msgs_in": 100}}
    raised, open_ = [], set()
    for i in range(8):
        s = summary(10.0 + i, tenants={"acme": totals(msgs_in=1000 + 95 * (i + 1))},
                    prev_tenants={"acme": totals(msgs_in=1000 + 95 * i)})
        r, _ = rules.evaluate(10.0 + i, s, quotas, open_)
        raised += [(i, c.subject) for c in r]
        open_ |= {c.key for c in r}
    assert raised == [(5, "acme:tenant_msgs_in")]            # 95/s from t=10, raised at t=15


def test_node_down_after_being_seen_then_cleared_when_back():
    rules = AlarmRules(AlarmSettings(node_down_after=3))
    assert rules.evaluate(0.0, summary(0.0, nodes=("a", "b")), {}, set()) == ([], [])
    # b disappears (its membership expired)
    assert rules.evaluate(1.0, summary(1.0, nodes=("a",)), {}, set()) == ([], [])
    raise_, _ = rules.evaluate(4.0, summary(4.0, nodes=("a",)), {}, set())
    assert [c.key for c in raise_] == [(NODE_DOWN, "b")] and "no longer in the cluster" in raise_[0].message
    _, clear = rules.evaluate(5.0, summary(5.0, nodes=("a", "b")), {}, {(NODE_DOWN, "b")})
    assert clear == [(NODE_DOWN, "b")]


def test_fenced_or_unreachable_nodes_and_brokerd_not_answering():
    rules = AlarmRules(AlarmSettings(node_down_after=0))
    rules.evaluate(0.0, summary(0.0, nodes=("a", "b")), {}, set())
    s = core.summarize(doc(1.0, node("a", health="fenced"), {"node": "b", "health": "unreachable"}), None)
    raise_, _ = rules.evaluate(1.0, s, {}, set())
    assert {c.subject: c.message for c in raise_} == {
        "a": "node a is fenced (it lost the cluster bus and refuses clients)", "b": "node b is unreachable"}
    # the admin API itself does not answer: every node seen is down; quotas are not judged (nor cleared)
    rules = AlarmRules(AlarmSettings(node_down_after=0))
    rules.evaluate(0.0, summary(0.0, nodes=("a",)), {}, set())
    raise_, clear = rules.evaluate(1.0, None, {"acme": {"max_connections": 1}}, {(QUOTA, "acme:max_connections")},
                                   error="connection refused")
    assert [c.key for c in raise_] == [(NODE_DOWN, "a")] and "connection refused" in raise_[0].message
    assert clear == []


def test_a_second_console_process_agrees_with_the_open_alarms():
    """A process that starts while an alarm is open neither clears it at once
    nor raises it again (the database says it is open)."""
    newcomer = AlarmRules(AlarmSettings(node_down_after=3, drops_for=10, drops_clear_for=30))
    open_ = {(NODE_DOWN, "b"), (DROPS, "acme")}
    s = summary(100.0, nodes=("a",), tenants={"acme": totals(queue_full=100)}, prev_tenants={"acme": totals()})
    assert newcomer.evaluate(100.0, s, {}, open_) == ([], [])


def test_drops_rising_sustained_and_cleared_after_quiet_period():
    rules = AlarmRules(AlarmSettings(drops_rate=10, drops_for=3, drops_clear_for=5))
    events = []
    open_: set = set()
    dropped = 0
    for i in range(20):
        before = dropped
        dropped += 50 if i < 8 else 0                       # 50 drops/s for 8 s, then none
        s = summary(float(i), tenants={"acme": totals(queue_full=dropped, no_subscribers=1000 * i)},
                    prev_tenants={"acme": totals(queue_full=before, no_subscribers=1000 * max(0, i - 1))})
        raise_, clear = rules.evaluate(float(i), s, {}, open_)
        for c in raise_:
            events.append((i, "raise", c.message))
            open_.add(c.key)
        for k in clear:
            events.append((i, "clear", k))
            open_.discard(k)
    assert [(i, what) for i, what, _ in events] == [(3, "raise"), (13, "clear")]
    assert "50 messages dropped per second" in events[0][2] and "queue full 50/s" in events[0][2]


def test_no_subscribers_alone_raises_nothing():
    rules = AlarmRules(AlarmSettings(drops_rate=1, drops_for=0))
    s = summary(1.0, tenants={"acme": totals(no_subscribers=500)}, prev_tenants={"acme": totals()})
    assert rules.evaluate(1.0, s, {}, set()) == ([], [])


def test_summarize_says_which_host_each_worker_is_on():
    """brokerd --workers N: each worker is a node of the cluster whose figures name its host and slot;
    a node without workers is its own host."""
    w0, w1 = node("h.0", msgs_in=10), node("h.1", msgs_in=20)
    w0.update(host="h", worker=0)
    w1.update(host="h", worker=1)
    s = core.summarize(doc(2.0, w0, w1, node("solo")), None)
    assert [(n["node"], n["host"], n["worker"]) for n in s["nodes"]] == [("h.0", "h", 0), ("h.1", "h", 1),
                                                                        ("solo", "solo", None)]
    assert s["cluster"]["nodes"] == 3


def test_rule_actions_dropping_raise_an_alarm_then_clear():
    """A tenant's webhook requests or telemetry rows pushed out of their full buffers (brokerd's
    ``rule_actions_dropped``): raised once they keep falling for drops_for, cleared after drops_clear_for."""
    rules = AlarmRules(AlarmSettings(drops_for=2, drops_clear_for=3))
    raised, cleared, open_ = [], [], set()
    dropped = [0, 5, 12, 20, 31, 31, 31, 31, 31, 31]      # dropping from t=1 to t=4, then no more
    for i in range(1, len(dropped)):
        cur, prev = totals(), totals()
        cur["rule_actions_dropped"], prev["rule_actions_dropped"] = dropped[i], dropped[i - 1]
        r, c = rules.evaluate(float(i), summary(float(i), tenants={"acme": cur}, prev_tenants={"acme": prev}), {},
                              open_)
        raised += [(i, x.key, x.message) for x in r]
        cleared += [(i, k) for k in c]
        open_ = (open_ | {x.key for x in r}) - set(c)
    (at, key, message), = raised
    assert (at, key) == (3, (RULE_DROPS, "acme"))
    assert "tenant acme: its rules' actions are dropping 8 webhook requests or telemetry rows per second" in message
    assert cleared == [(8, (RULE_DROPS, "acme"))]
