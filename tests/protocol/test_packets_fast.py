"""The hot path's constructors without ``__init__`` (issue 18) make the same objects as the classes.

``publish_q1`` and ``new_delivery`` set every slot themselves: a field added to ``Publish`` or a
slot to ``Delivery`` and not to them would leave it unset, and the first read of it on a steady
publisher's message would raise. These compare every slot with the class's own constructor."""

from brokerd.protocol.packets import Publish, publish_q1
from brokerd.session.session import Delivery, new_delivery


def _slots(obj) -> dict:
    return {name: getattr(obj, name) for name in type(obj).__slots__ if name != "__weakref__"}


def test_publish_q1_is_a_qos1_publish_with_every_field_set():
    head = b"\x32\x0b\x00\x03a/b"
    made = publish_q1("a/b", b"payload", 7, head)
    assert _slots(made) == _slots(Publish("a/b", b"payload", 1, False, False, 7, head31=head))
    assert _slots(publish_q1("a/b", b"", 1, None)) == _slots(Publish("a/b", b"", 1, packet_id=1))


def test_new_delivery_is_a_delivery_with_every_slot_set():
    msg = Publish("a/b", b"x", 1, packet_id=3)
    share = object()
    assert _slots(new_delivery(msg, 1, True, (4,), share, 9)) == _slots(Delivery(msg, 1, True, (4,), share, 9))
    assert _slots(new_delivery(msg, 2, False, None, None, 0)) == _slots(Delivery(msg, 2, False, None, None))
