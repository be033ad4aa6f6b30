"""Unit tests of the session queue (drop policy "QoS 0 first, then oldest") and packet ids."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brokerd.protocol.packets import Publish
from brokerd.session.session import Delivery, MessageQueue, Session

try:
    from brokerd.budget import MemoryBudget
except ImportError:  # pragma: no cover - older tree without the node-wide budget
    MemoryBudget = None


def d(name, qos, size=1):
    return Delivery(
        Publish("t", name.encode().ljust(size, b".")[: max(size, len(name))], qos), qos, False, None
    )


def names(ds):
    return [x.msg.payload.rstrip(b".").decode() for x in ds]


def test_fifo_across_qos_levels():
    q = MessageQueue(10)
    for n, qos in [("a", 1), ("b", 0), ("c", 2), ("d", 0)]:
        assert q.put(d(n, qos)) == []
    assert len(q) == 4 and q
    assert names(q.drain()) == ["a", "b", "c", "d"]
    assert not q and q.pop() is None


def test_full_queue_drops_oldest_qos0_first():
    q = MessageQueue(3)
    for n, qos in [("m1", 1), ("a", 0), ("m2", 1)]:
        q.put(d(n, qos))
    assert names(q.put(d("b", 0))) == ["a"]
    assert names(q.put(d("m3", 1))) == ["b"]
    assert names(q.put(d("c", 0))) == ["c"]  # nothing QoS 0 queued: the new QoS 0 message goes
    assert names(q.put(d("m4", 2))) == ["m1"]  # then the oldest QoS 1/2
    assert names(q.drain()) == ["m2", "m3", "m4"]


def test_byte_bound():
    q = MessageQueue(100, max_bytes=10)
    assert q.put(d("a", 1, 4)) == []
    assert q.put(d("b", 0, 4)) == []
    assert names(q.put(d("c", 1, 4))) == ["b"]
    assert q.bytes == 8
    assert names(q.put(d("huge", 1, 11))) == ["huge"]
    assert names(q.drain()) == ["a", "c"]
    assert q.bytes == 0


@settings(derandomize=True, max_examples=300, deadline=None)
@given(
    ops=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 8), st.booleans()), max_size=60),
    max_len=st.integers(1, 6),
    max_bytes=st.sampled_from([0, 10, 20]),
)
def test_queue_model(ops, max_len, max_bytes):
    """Against a list model: bounds always hold, nothing is lost or duplicated, FIFO order."""
    q = MessageQueue(max_len, max_bytes)
    model, seen_dropped, popped = [], [], []
    for qos, size, do_pop in ops:
        if do_pop:
            x = q.pop()
            if model:
                assert x is model.pop(0)
                popped.append(x)
            else:
                assert x is None
            continue
        new = Delivery(Publish("t", b"x" * size, qos), qos, False, None)
        dropped = q.put(new)
        seen_dropped += dropped
        model.append(new)
        for x in dropped:
            if x is new:
                assert x.qos == 0 or (max_bytes and size > max_bytes)
            model.remove(x)
        assert len(q) == len(model) <= max_len
        assert q.bytes == sum(len(x.msg.payload) for x in model)
        if max_bytes:
            assert q.bytes <= max_bytes
    assert q.drain() == model
    assert len({id(x) for x in seen_dropped + popped + model}) == len(seen_dropped) + len(popped) + len(model)


@pytest.mark.skipif(MemoryBudget is None, reason="no MemoryBudget in this tree")
def test_budget_returns_to_zero():
    budget = MemoryBudget(10**9)
    q = MessageQueue(3, 0, budget)
    for i in range(6):
        q.put(d(f"x{i}", i % 2, 5))
    q.pop()
    q.drain()
    assert budget.used == 0


@pytest.mark.skipif(MemoryBudget is None, reason="no MemoryBudget in this tree")
def test_budget_counts_empty_payloads():
    budget = MemoryBudget(10**9)
    q = MessageQueue(10, 0, budget)
    q.put(Delivery(Publish("t", b""), 1, False, None))
    assert budget.used > 0  # a queued message costs memory even without payload
    q.pop()
    assert budget.used == 0  # and everything it charged is given back


def test_allocate_pid_wraps_and_skips_inflight():
    s = Session("c", None)
    assert [s.allocate_pid() for _ in range(3)] == [1, 2, 3]
    s.next_pid = 65534
    s.inflight = {65535: object(), 1: object()}
    assert s.allocate_pid() == 65534
    assert s.allocate_pid() == 2  # 65535 and 1 are in use
    s.inflight = {p: object() for p in range(1, 65536)}
    with pytest.raises(RuntimeError):
        s.allocate_pid()
