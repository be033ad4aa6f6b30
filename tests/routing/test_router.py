"""The subscription table: a filter's plain subscribers, whatever their number.

A route with one subscriber (a device on a topic of its own: nearly every
route of a host with 100,000 devices) keeps it without a dict (issue 18,
bytes per idle connection); with more it is a dict by session. What the
router answers must not depend on which: checked against a plain dict of
the same subscribe/unsubscribe sequence.
"""

import random

import pytest

from brokerd.routing.router import OneSub, Router
from brokerd.session.session import Session, Subscription


def _table():
    router = Router()
    ns = router.namespace("t")
    return router, ns


@pytest.mark.parametrize("seed", range(6))
def test_routes_answer_as_a_dict_of_subscribers_would_through_any_subscribe_sequence(seed):
    rnd = random.Random(seed)
    router, ns = _table()
    sessions = [Session(f"c{i}", ns) for i in range(4)]
    filters = ["a/b", "a/+", "#"]
    model: dict[str, dict] = {f: {} for f in filters}
    for _ in range(300):
        f = rnd.choice(filters)
        s = rnd.choice(sessions)
        if rnd.random() < 0.6:
            sub = Subscription(f, qos=rnd.randrange(3), sub_id=rnd.choice((None, 1, 2)))
            router.add(ns, s, sub)
            model[f][s] = sub
        elif f in s.subscriptions:
            router.remove(ns, s, s.subscriptions.pop(f))
            del model[f][s]
        for filt, subs in model.items():
            counts = router.route_counts("t", filt)
            assert counts[:2] == (len(subs), 0)
            route = ns.trie.get(filt)
            if not subs:
                assert route is None                  # an empty route leaves the table
                continue
            assert list(route.subs.items()) == list(subs.items())       # same order as the dict
            assert list(route.subs) == list(subs) and len(route.subs) == len(subs)
            for sess in sessions:
                assert (sess in route.subs) == (sess in subs)
                assert route.subs.get(sess) is subs.get(sess)
        entries, _ = ns.route("a/b")
        expected = {}
        for filt in filters:
            for sess, sub in model[filt].items():
                expected.setdefault(sess, []).append(sub)
        assert {e[0] for e in entries} == set(expected)
        for sess, qos, _no_local, _rap, ids in entries:
            assert qos == max(sub.qos for sub in expected[sess])
            assert set(ids or ()) == {sub.sub_id for sub in expected[sess] if sub.sub_id}


def test_a_route_with_one_subscriber_holds_no_dict_and_a_second_one_makes_it_one():
    router, ns = _table()
    a, b = Session("a", ns), Session("b", ns)
    router.add(ns, a, Subscription("x/1", qos=1))
    route = ns.trie.get("x/1")
    assert type(route.subs) is OneSub
    router.add(ns, a, Subscription("x/1", qos=2))            # the same session again: replaced
    assert type(route.subs) is OneSub and route.subs.get(a).qos == 2
    router.add(ns, b, Subscription("x/1"))
    assert type(route.subs) is dict and list(route.subs) == [a, b]
    router.remove(ns, a, a.subscriptions.pop("x/1"))
    assert list(route.subs) == [b]
    router.remove(ns, b, b.subscriptions.pop("x/1"))
    assert ns.trie.get("x/1") is None
