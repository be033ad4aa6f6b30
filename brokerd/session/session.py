"""Session state (MQTT 5.0 section 4.1), independent of any connection.

A session outlives its network connections when its expiry interval is
non-zero: the broker keeps it, with its subscriptions, its unacknowledged
inflight deliveries and its queue of messages that arrived while the client
was away or while its inflight window was full.
"""

from collections import deque

from ..budget import QUEUED_OVERHEAD, MemoryBudget

# Delivery states in the outgoing inflight window
AWAIT_ACK = 0   # PUBLISH sent, waiting for PUBACK (QoS 1) or PUBREC (QoS 2)
AWAIT_COMP = 1  # PUBREL sent, waiting for PUBCOMP (QoS 2)


class Subscription:
    """One topic filter of a session, with its MQTT 5 options."""

    __slots__ = ("filter", "qos", "no_local", "rap", "rh", "sub_id", "group", "check")

    def __init__(self, filt, qos=0, no_local=False, rap=False, rh=0, sub_id=None, group=None):
        self.check = False          # granted only in part by the ACL: check each delivery
        self.filter = filt          # the filter as subscribed, including any "$share/GROUP/" prefix
        self.qos = qos
        self.no_local = no_local
        self.rap = rap              # Retain As Published
        self.rh = rh                # Retain Handling 0/1/2
        self.sub_id = sub_id        # Subscription Identifier or None
        self.group = group          # shared subscription group name or None

    def __repr__(self):
        return f"Subscription({self.filter!r}, qos={self.qos})"


class Delivery:
    """A message on its way to one session: queued, or inflight under ``pid``."""

    __slots__ = ("msg", "qos", "retain", "sub_ids", "pid", "state", "share", "entry", "gen", "dup")

    def __init__(self, msg, qos, retain, sub_ids, share=None, pid=0):
        self.msg = msg
        self.qos = qos
        self.retain = retain
        self.sub_ids = sub_ids      # tuple of subscription identifiers or None
        self.pid = pid              # its packet id once sent (or reserved for it when stored), else 0
        self.state = AWAIT_ACK
        self.share = share          # the SharedGroup when delivered through a shared subscription
        self.entry = None           # its row in the stored queue (a QueueEntry), if stored
        self.gen = 0                # journal batch that must be durable before it is sent
        self.dup = False            # recovered from the store: may have been sent before

    def __repr__(self):
        return f"Delivery({self.msg.topic!r}, qos={self.qos}, pid={self.pid})"


_new = object.__new__


def new_delivery(msg, qos, retain, sub_ids, share, pid) -> Delivery:
    """``Delivery(msg, qos, retain, sub_ids, share, pid)`` without the Python ``__init__`` (a class
    call runs it in an interpreter frame of its own): the channel's send of a new QoS 1/2
    delivery, once per message. Every slot is set here as ``__init__`` sets it: a slot added to
    Delivery must be added here too (tests/protocol/test_packets_fast.py compares the two)."""
    d = _new(Delivery)
    d.msg = msg
    d.qos = qos
    d.retain = retain
    d.sub_ids = sub_ids
    d.pid = pid
    d.state = AWAIT_ACK
    d.share = share
    d.entry = None
    d.gen = 0
    d.dup = False
    return d


_NONE = ()      # an empty queue before its first message: falsy, len 0, no deque allocated
NO_IDS = frozenset()    # awaiting_rel before a client's first QoS 2 PUBLISH: an empty set costs 216 bytes


class _NoInflight(dict):
    """``Session.inflight`` before the session's first QoS 1/2 delivery: one shared,
    empty, read-only dict (an idle device's own empty dict cost 64 bytes). Read as
    any dict; whoever adds to a session's window first gives it a dict of its own
    (``Session.window``, or inline on the channel's delivery paths)."""

    __slots__ = ()

    def _refuse(self, *args, **kw):
        raise TypeError("NO_INFLIGHT is shared: give the session a dict of its own first")

    __setitem__ = setdefault = update = _refuse


NO_INFLIGHT = _NoInflight()


class MessageQueue:
    """A bounded FIFO of deliveries with the drop policy "QoS 0 first, then oldest".

    When full (``max_len`` messages or ``max_bytes`` of payload), adding a
    message first drops the oldest queued QoS 0 message; if none is queued,
    a new QoS 0 message is dropped itself, and a new QoS 1/2 message pushes
    out the oldest queued one. ``put`` returns what it dropped so the caller
    can count it.
    """

    __slots__ = ("max_len", "max_bytes", "_q0", "_q12", "_seq", "bytes", "budget")

    def __init__(self, max_len=1000, max_bytes=0, budget: MemoryBudget | None = None):
        self.max_len = max_len
        self.max_bytes = max_bytes
        # (seq, delivery) of QoS 0 and of QoS 1/2: deques made on the first
        # put -- an empty deque costs 760 bytes, and most sessions never queue
        self._q0 = _NONE
        self._q12 = _NONE
        self._seq = 0
        self.bytes = 0
        self.budget = budget

    def __len__(self):
        return len(self._q0) + len(self._q12)

    def __bool__(self):
        return bool(self._q0) or bool(self._q12)

    def full(self, size: int) -> bool:
        """Whether a message of ``size`` payload bytes would push another out (or be dropped itself)."""
        return self._full(size) or bool(self.max_bytes) and size > self.max_bytes

    def _full(self, extra):
        if len(self._q0) + len(self._q12) >= self.max_len:
            return True
        return bool(self.max_bytes) and self.bytes + extra > self.max_bytes

    def put(self, d: Delivery) -> list:
        dropped = []
        size = len(d.msg.payload)
        if self.max_bytes and size > self.max_bytes:
            return [d]
        while self._full(size):
            if self._q0:
                old = self._q0.popleft()[1]
            elif d.qos == 0:
                return dropped + [d]
            elif self._q12:
                old = self._q12.popleft()[1]
            else:
                return dropped + [d]
            self._account(-len(old.msg.payload), -1)
            dropped.append(old)
        self._seq += 1
        if d.qos:
            q = self._q12
            if q is _NONE:
                q = self._q12 = deque()
        else:
            q = self._q0
            if q is _NONE:
                q = self._q0 = deque()
        q.append((self._seq, d))
        self._account(size, 1)
        return dropped

    def put_front(self, ds: list) -> None:
        """Put the QoS 1/2 deliveries ``ds`` (oldest first) before everything
        queued: stored deliveries a connection held to send after their commit
        when it closed. Not bounded by ``max_len``: they were taken in already
        (and are at most a window's worth)."""
        q0, q12 = self._q0, self._q12
        first = self._seq + 1
        if q0:
            first = q0[0][0]
        if q12:
            first = min(first, q12[0][0])
        if q12 is _NONE:
            q12 = self._q12 = deque()
        size = 0
        for d in reversed(ds):
            first -= 1
            q12.appendleft((first, d))
            size += len(d.msg.payload)
        self._account(size, len(ds))

    def attach_budget(self, budget: "MemoryBudget | None") -> None:
        """Charge (or, with None, stop charging) this queue to a node budget.

        Only the queues of connected sessions count: they are the ones that
        can drain. An offline session's queue is bounded by its own limits.
        """
        if self.budget is budget:
            return
        held = self.bytes + len(self) * QUEUED_OVERHEAD
        if self.budget is not None:
            self.budget.add(-held)
        self.budget = budget
        if budget is not None:
            budget.add(held)

    def _account(self, delta: int, messages: int) -> None:
        self.bytes += delta
        if self.budget is not None:
            self.budget.add(delta + messages * QUEUED_OVERHEAD)

    def peek(self) -> Delivery | None:
        """The delivery ``pop`` would return, left in place."""
        q0, q12 = self._q0, self._q12
        if q0 and (not q12 or q0[0][0] < q12[0][0]):
            return q0[0][1]
        return q12[0][1] if q12 else None

    def pop(self) -> Delivery | None:
        q0, q12 = self._q0, self._q12
        if q0 and (not q12 or q0[0][0] < q12[0][0]):
            d = q0.popleft()[1]
        elif q12:
            d = q12.popleft()[1]
        else:
            return None
        self._account(-len(d.msg.payload), -1)
        return d

    def remove(self, unwanted) -> list:
        """Take out the queued deliveries ``unwanted(delivery)`` is true of; -> them."""
        out = []
        for name in ("_q0", "_q12"):
            q = getattr(self, name)
            if not q or not any(unwanted(d) for _, d in q):
                continue
            kept = deque()
            for item in q:
                d = item[1]
                if unwanted(d):
                    out.append(d)
                    self._account(-len(d.msg.payload), -1)
                else:
                    kept.append(item)
            setattr(self, name, kept if kept else _NONE)
        return out

    def drain(self) -> list:
        """Remove and return everything, oldest first."""
        out = []
        while True:
            d = self.pop()
            if d is None:
                self._q0 = self._q12 = _NONE
                return out
            out.append(d)


class Session:
    __slots__ = ("client_id", "ns", "subscriptions", "inflight", "queue", "awaiting_rel", "expiry_interval",
                 "channel", "next_pid", "expires_at", "pending_will", "budget", "durable", "reserved",
                 "device", "read_acl", "sent_seq",
                 "__weakref__")

    def __init__(self, client_id: str, ns, max_queued=1000, max_queued_bytes=0, expiry_interval=0,
                 budget: MemoryBudget | None = None):
        self.client_id = client_id
        self.ns = ns                       # the namespace (tenant) the session lives in
        self.subscriptions: dict[str, Subscription] = {}
        self.inflight: dict[int, Delivery] = NO_INFLIGHT  # outgoing QoS 1/2 by packet id, in send order
                                                          # (read-only NO_INFLIGHT until the first)
        self.queue = MessageQueue(max_queued, max_queued_bytes)
        self.budget = budget                       # charged with the queue while connected
        self.awaiting_rel: set[int] | frozenset = NO_IDS  # incoming QoS 2 packet ids before PUBREL (a set
                                                           # from the first; read-only NO_IDS until then)
        self.expiry_interval = expiry_interval     # seconds; properties.NEVER = does not expire
        self.channel = None                        # the connected Channel, if any
        self.next_pid = 1
        self.expires_at: float | None = None       # set while disconnected
        self.pending_will = None                   # (due_time, Will) while a will is delayed
        self.durable = False                       # mirrored in the store
        self.device = None                         # the device it belongs to (tenant ACLs)
        self.read_acl = None                       # ACL to check each delivery against, when some
                                                   # subscription was granted only in part
        self.reserved: set[int] | None = None      # packet ids given to stored, queued deliveries
        self.sent_seq = 0                          # durable: the highest stored entry number sent (or
                                                   # restored as sent): ``Persistence.session_closed``

    def __repr__(self):
        return f"Session({self.client_id!r}, connected={self.channel is not None})"

    def window(self) -> dict:
        """``inflight``, to add to: the session's own dict (made on the first use)."""
        inflight = self.inflight
        if inflight is NO_INFLIGHT:
            inflight = self.inflight = {}
        return inflight

    @property
    def persistent(self) -> bool:
        return self.expiry_interval > 0

    def allocate_pid(self) -> int:
        """A packet identifier not in use by the inflight window."""
        pid = self.next_pid
        inflight = self.inflight
        reserved = self.reserved
        if pid not in inflight and (reserved is None or pid not in reserved):
            self.next_pid = pid + 1 if pid < 65535 else 1
            return pid
        reserved = reserved or ()
        for _ in range(65535):
            if pid not in inflight and pid not in reserved:
                self.next_pid = pid + 1 if pid < 65535 else 1
                return pid
            pid = pid + 1 if pid < 65535 else 1
        raise RuntimeError("no free packet identifier")

    # The outgoing QoS 1/2 flows (MQTT 5.0 4.3.2-4.3.3), the session's as in
    # EMQX's emqx_session: the channel sends what these decide.

    def take_pid(self, d: Delivery) -> int:
        """The packet id ``d`` goes out under: the one reserved for it when it was
        stored, else a free one."""
        pid = d.pid
        if pid:
            self.reserved.discard(pid)
            return pid
        pid = self.next_pid               # allocate_pid's common case, without its call
        if pid not in self.inflight and (self.reserved is None or pid not in self.reserved):
            self.next_pid = pid + 1 if pid < 65535 else 1
        else:
            pid = self.allocate_pid()
        d.pid = pid
        return pid

    def puback(self, pid: int) -> Delivery | None:
        """PUBACK: the QoS 1 delivery it completes (out of the window), or None."""
        d = self.inflight.get(pid)
        if d is None or d.qos != 1:
            return None
        del self.inflight[pid]
        return d

    def pubrec(self, pid: int, code: int) -> tuple[Delivery | None, bool]:
        """PUBREC: (the QoS 2 delivery or None for an id not in that flow,
        whether PUBREL became owed now). A refusal (``code`` >= 0x80) ends
        the delivery: it leaves the window."""
        d = self.inflight.get(pid)
        if d is None or d.qos != 2:
            return None, False
        if code >= 0x80:
            del self.inflight[pid]
            return d, False
        if d.state == AWAIT_ACK:
            d.state = AWAIT_COMP
            return d, True
        return d, False

    def pubcomp(self, pid: int) -> Delivery | None:
        """PUBCOMP: the QoS 2 delivery it completes (out of the window), or None."""
        d = self.inflight.get(pid)
        if d is None or d.qos != 2 or d.state != AWAIT_COMP:
            return None
        del self.inflight[pid]
        return d
