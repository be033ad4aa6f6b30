"""``Persistence.enqueue`` makes a stored delivery's objects without their ``__init__`` (issue 18).

It sets every slot of the message's ``StoredMessage``, the ``QueueEntry`` and the ``Delivery``
itself: a field added to one of those classes and not there would be left unset, and the first
read of it on a durable subscriber's message (or the store's write of its row) would raise. These
compare every slot with what the classes' own constructors make, and the journal operation with
the one the store writes."""

from brokerd.persistence import Persistence
from brokerd.protocol.packets import Publish
from brokerd.routing.router import SharedGroup
from brokerd.session.session import AWAIT_ACK, Delivery, Session
from brokerd.store.journal import Journal
from brokerd.store.records import QueueEntry, StoredMessage


def _slots(obj) -> dict:
    return {name: getattr(obj, name) for name in type(obj).__slots__ if name != "__weakref__"}


def _setup():
    journal = Journal()
    journal.generation = 7
    persist = Persistence(journal, wall_offset=1000.0)
    session = Session("c1", ns=None, expiry_interval=3600)
    return journal, persist, session


def test_a_stored_delivery_has_every_slot_its_classes_would_give_it():
    journal, persist, session = _setup()
    msg = Publish("a/b", b"payload", 2, True, False, 5, properties={"user": [("k", "v")]})
    msg.expiry_at = 50.0
    group = SharedGroup("g", "a/#")
    d = persist.enqueue(session, "t1", msg, 1, True, (4, 9), group)

    stored = StoredMessage("a/b", b"payload", 2, True, {"user": [("k", "v")]}, 1050.0)
    entry = QueueEntry(0, stored, 1, True, (4, 9), ("g", "a/#"), d.pid, AWAIT_ACK)
    expected = Delivery(msg, 1, True, (4, 9), group, d.pid)
    expected.entry, expected.gen = entry, 7

    assert d.pid == 1 and session.reserved == {1}
    assert _slots(msg.stored) == _slots(stored)
    assert _slots(d.entry) == _slots(entry)
    assert _slots(d) == {**_slots(expected), "entry": d.entry}
    assert journal.ops == [("q", "t1", "c1", d.entry)]


def test_the_message_is_stored_once_for_all_its_durable_sessions_and_ids_are_not_reused():
    journal, persist, session = _setup()
    other = Session("c2", ns=None, expiry_interval=3600)
    msg = Publish("x", b"1", 1, packet_id=1)
    first = persist.enqueue(session, "t1", msg, 1, False, None, None)
    second = persist.enqueue(session, "t1", msg, 1, False, None, None)
    third = persist.enqueue(other, "t1", msg, 1, False, None, None)

    assert first.entry.msg is second.entry.msg is third.entry.msg is msg.stored
    assert _slots(msg.stored) == _slots(StoredMessage("x", b"1", 1, False, None, None))
    assert (first.pid, second.pid, third.pid) == (1, 2, 1)
    assert first.entry.share is None and first.share is None and not first.dup
    assert [op[2] for op in journal.ops] == ["c1", "c1", "c2"]
