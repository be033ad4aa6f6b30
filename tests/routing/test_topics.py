"""Topic matching: TopicTrie and RetainedStore against the brute-force reference
``topic.matches``, which is itself pinned to the examples of MQTT 3.1.1 / 5.0 section 4.7."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brokerd.routing.retained import RetainedStore
from brokerd.routing.topic import InvalidTopic, is_valid_filter, is_valid_name, matches, parse_shared
from brokerd.routing.trie import TopicTrie

SETTINGS = settings(derandomize=True, max_examples=400, deadline=None)

# Few distinct level names, so that random filters and names actually meet;
# empty levels and $-levels included.
NAME_LEVELS = st.sampled_from(["a", "b", "", "$SYS", "$x", "ü"])
names = st.lists(NAME_LEVELS, min_size=1, max_size=5).map("/".join).filter(bool)


@st.composite
def filters(draw):
    levels = draw(
        st.lists(st.sampled_from(["a", "b", "", "$SYS", "$x", "ü", "+", "+"]), min_size=1, max_size=5)
    )
    if draw(st.booleans()):
        if draw(st.booleans()):
            levels[-1] = "#"
        else:
            levels.append("#")
    return "/".join(levels)


# ----------------------------------------------------------------------------- the reference itself


@pytest.mark.parametrize(
    ("filt", "name", "expected"),
    [
        # 3.1.1 4.7.1.2 / 5.0 4.7.1.2
        ("sport/tennis/player1/#", "sport/tennis/player1", True),
        ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
        ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
        ("sport/#", "sport", True),
        ("#", "sport/tennis", True),
        ("#", "/", True),
        # 4.7.1.3
        ("sport/tennis/+", "sport/tennis/player1", True),
        ("sport/tennis/+", "sport/tennis/player2", True),
        ("sport/tennis/+", "sport/tennis/player1/ranking", False),
        ("sport/+", "sport", False),
        ("sport/+", "sport/", True),
        ("+/+", "/finance", True),
        ("/+", "/finance", True),
        ("+", "/finance", False),
        ("+/tennis/#", "sport/tennis/player1", True),
        # 4.7.2: $-topics and wildcards at the first level
        ("#", "$SYS/monitor/Clients", False),
        ("+/monitor/Clients", "$SYS/monitor/Clients", False),
        ("$SYS/#", "$SYS/monitor/Clients", True),
        ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
        ("+", "$SYS", False),
        ("a/+", "a/$x", True),  # only the first level is special
        ("a/#", "a/$x/b", True),
        # levels are compared exactly, empty levels count
        ("a", "a/", False),
        ("a/", "a/", True),
        ("a//b", "a//b", True),
        ("a/+/b", "a//b", True),
        ("A", "a", False),
    ],
)
def test_reference_matcher_spec_examples(filt, name, expected):
    assert matches(filt, name) is expected


# ----------------------------------------------------------------------------- TopicTrie


def brute(filts, name):
    return sorted(f for f in filts if matches(f, name))


@SETTINGS
@given(filts=st.lists(filters(), max_size=25, unique=True), probes=st.lists(names, min_size=1, max_size=10))
def test_trie_match_equals_brute_force(filts, probes):
    trie = TopicTrie()
    for f in filts:
        assert trie.setdefault(f, lambda f=f: f) == f
    assert len(trie) == len(filts)
    for name in probes:
        got = trie.match(name)
        assert sorted(got) == brute(filts, name), name
        assert len(got) == len(set(got))  # each filter at most once


@SETTINGS
@given(filts=st.lists(filters(), min_size=1, max_size=25, unique=True), data=st.data())
def test_trie_discard_then_match(filts, data):
    trie = TopicTrie()
    for f in filts:
        trie.setdefault(f, lambda f=f: f)
    gone = data.draw(st.lists(st.sampled_from(filts), unique=True))
    for f in gone:
        trie.discard(f)
        trie.discard(f)  # twice is harmless
    left = [f for f in filts if f not in gone]
    assert len(trie) == len(left)
    assert sorted(f for f, _ in trie.items()) == sorted(left)
    for name in data.draw(st.lists(names, min_size=1, max_size=8)):
        assert sorted(trie.match(name)) == brute(left, name)
    for f in left:
        assert trie.get(f) == f
    for f in gone:
        assert trie.get(f) is None


@SETTINGS
@given(filts=st.lists(filters(), min_size=1, max_size=25, unique=True))
def test_trie_discard_prunes_every_branch(filts):
    trie = TopicTrie()
    for f in filts:
        trie.setdefault(f, dict)
    for f in reversed(filts):
        trie.discard(f)
    assert len(trie) == 0
    assert list(trie.items()) == []
    assert trie._root.children == {}  # no empty branch left behind


def test_trie_discard_keeps_branches_still_in_use():
    trie = TopicTrie()
    trie.setdefault("a/+/c", lambda: 1)
    trie.setdefault("a/+", lambda: 2)
    trie.discard("a/+/c")
    assert trie._root.children["a"].children["+"].children == {}
    assert trie.match("a/x") == [2]
    trie.discard("a/+/d")  # not a stored filter: nothing happens
    assert trie.get("a/+") == 2
    # filters without wildcards (kept apart from the tree) the same way
    trie.setdefault("a/b/c", lambda: 3)
    trie.setdefault("a", lambda: 4)
    trie.discard("a/b/c")
    assert trie.match("a") == [4]
    trie.discard("a/b")
    assert trie.get("a") == 4
    assert len(trie) == 2


def test_trie_setdefault_keeps_existing_value():
    trie = TopicTrie()
    first = trie.setdefault("x/+", list)
    first.append(1)
    assert trie.setdefault("x/+", list) is first
    assert len(trie) == 1


# ----------------------------------------------------------------------------- RetainedStore


@SETTINGS
@given(topics=st.lists(names, max_size=25, unique=True), probes=st.lists(filters(), min_size=1, max_size=10))
def test_retained_match_equals_brute_force(topics, probes):
    store = RetainedStore()
    for t in topics:
        store.set(t, "msg:" + t)
    assert len(store) == len(topics)
    for f in probes:
        got = store.match(f)
        assert sorted(got) == sorted("msg:" + t for t in topics if matches(f, t)), f
        assert len(got) == len(set(got))


@SETTINGS
@given(topics=st.lists(names, min_size=1, max_size=25, unique=True), data=st.data())
def test_retained_delete_then_match(topics, data):
    store = RetainedStore()
    for t in topics:
        store.set(t, t)
    gone = data.draw(st.lists(st.sampled_from(topics), unique=True))
    for t in gone:
        assert store.delete(t) is True
        assert store.delete(t) is False
    left = [t for t in topics if t not in gone]
    assert len(store) == len(left)
    assert sorted(t for t, _ in store.items()) == sorted(left)
    assert sorted(m for _, m in store.items()) == sorted(left)
    for f in data.draw(st.lists(filters(), min_size=1, max_size=8)):
        assert sorted(store.match(f)) == sorted(t for t in left if matches(f, t))
    for t in left:
        assert store.get(t) == t
    for t in gone:
        assert store.get(t) is None
    for t in left:
        store.delete(t)
    assert store._root.children == {}


@SETTINGS
@given(topics=st.lists(names, min_size=1, max_size=25, unique=True), filt=filters(), data=st.data())
def test_retained_iter_match_survives_changes_while_walking(topics, filt, data):
    """``iter_match`` is walked over many event-loop iterations (a subscriber taking retained
    messages as its connection allows) while topics are set and cleared: no error, nothing
    twice, every topic matching all along is given, no cleared one after its clearing, nothing
    that does not match."""
    store = RetainedStore()
    for t in topics:
        store.set(t, t)
    walk = store.iter_match(filt)
    got = []
    gone = set()
    added = set()
    steps = data.draw(st.lists(st.tuples(st.booleans(), names), max_size=30))
    for clear, t in steps:
        item = next(walk, None)
        if item is not None:
            assert item not in gone
            got.append(item)
        if clear:
            if store.delete(t):
                gone.add(t)
        else:
            store.set(t, t)
            gone.discard(t)
            added.add(t)
    got.extend(walk)
    assert len(got) == len(set(got))
    assert all(matches(filt, t) for t in got)
    steady = {t for t in topics if matches(filt, t)} - gone - added
    assert steady <= set(got)


def test_retained_set_replaces_and_none_clears():
    store = RetainedStore()
    store.set("a/b", 1)
    store.set("a/b", 2)
    assert len(store) == 1 and store.get("a/b") == 2
    store.set("a/b", None)
    assert len(store) == 0 and store.get("a/b") is None
    assert store.get("a") is None


def test_retained_parent_and_child():
    store = RetainedStore()
    store.set("a", "A")
    store.set("a/b", "AB")
    assert sorted(store.match("a/#")) == ["A", "AB"]
    store.delete("a")
    assert store.match("a/#") == ["AB"]
    assert store.get("a/b") == "AB"


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("filt", "ok"),
    [
        ("#", True),
        ("a/#", True),
        ("+", True),
        ("+/+/", True),
        ("/", True),
        ("//", True),
        ("a/+/b", True),
        ("$SYS/#", True),
        ("ü/😀", True),
        ("a b", True),
        ("", False),
        ("a#", False),
        ("a/#/b", False),
        ("#/a", False),
        ("a+", False),
        ("+a/b", False),
        ("a/b#", False),
        ("##", False),
        ("++", False),
        ("a/++/b", False),
    ],
)
def test_is_valid_filter(filt, ok):
    assert is_valid_filter(filt) is ok


def test_filter_length_limit_is_in_utf8_bytes():
    assert is_valid_filter("a" * 65535)
    assert not is_valid_filter("a" * 65536)
    assert is_valid_filter("é" * 32767)  # 65,534 bytes
    assert not is_valid_filter("é" * 32768)  # 65,536 bytes


@pytest.mark.parametrize(
    ("name", "ok"),
    [("a", True), ("/", True), ("$SYS/x", True), ("", False), ("a/+", False), ("#", False), ("a/b#", False)],
)
def test_is_valid_name(name, ok):
    assert is_valid_name(name) is ok


@pytest.mark.parametrize(
    ("filt", "expected"),
    [
        ("$share/g/a/b", ("g", "a/b")),
        ("$share/g/#", ("g", "#")),
        ("$share/g/+/x", ("g", "+/x")),
        ("$share/g//", ("g", "/")),
        ("$share/g/$SYS/#", ("g", "$SYS/#")),
        ("$share/ü/a", ("ü", "a")),
        ("a/b", None),
        ("$SHARE/g/a", None),  # the prefix is case-sensitive
        ("share/g/a", None),
        ("$share", None),
        ("$shared/g/a", None),
    ],
)
def test_parse_shared(filt, expected):
    assert parse_shared(filt) == expected


@pytest.mark.parametrize(
    "filt",
    [
        "$share/g",
        "$share/g/",
        "$share//a",
        "$share/g+/a",
        "$share/g#/a",
        "$share/+/a",
        "$share/#/a",
        "$share/g/a/#/b",
        "$share/g/a+",
        "$share/",
    ],
)
def test_parse_shared_invalid(filt):
    with pytest.raises(InvalidTopic):
        parse_shared(filt)


@SETTINGS
@given(
    group=st.text(min_size=1, max_size=5).filter(lambda g: not set(g) & set("/+#")),
    filt=filters().filter(bool),
)
def test_parse_shared_round_trip(group, filt):
    assert parse_shared(f"$share/{group}/{filt}") == (group, filt)
