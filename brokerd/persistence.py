"""Mirroring durable sessions into the store's journal (pure, no I/O).

A session is *durable* when a store is configured and its expiry interval is
above 0. The broker calls this module at each point where such a session
changes; it turns the change into journal operations. What must be durable
before the client hears of it:

- a QoS 1/2 PUBLISH is acknowledged (PUBACK / PUBREC) only once it is in the
  queue of every matching durable session, with its retained copy;
- a stored message is sent to its subscriber only once its queue row is
  durable, with the packet identifier reserved for it in that row, so a
  crash can never make the server re-send it under another identifier;
- an incoming QoS 2 packet identifier is durable before PUBREC and its removal
  before PUBCOMP (exactly once across a crash).

Acknowledgements *from* subscribers (queue deletes) are written behind: a
crash before they land only means a redelivery with DUP set.
"""

from .protocol import properties as P
from .protocol.packets import Publish
from .routing.topic import parse_shared
from .session.session import AWAIT_ACK, NO_IDS, Delivery, Subscription, new_delivery
from .store.records import QueueEntry, StoredMessage, SubscriptionRecord, pack_will

SYS_PREFIX = "$SYS/"

_new = object.__new__


class Persistence:
    __slots__ = ("journal", "wall_offset")

    def __init__(self, journal, wall_offset: float = 0.0):
        self.journal = journal
        self.wall_offset = wall_offset      # wall clock = event-loop time + wall_offset

    def wall(self, t: float | None) -> float | None:
        return None if t is None else t + self.wall_offset

    def loop_time(self, wall: float | None) -> float | None:
        return None if wall is None else wall - self.wall_offset

    # -------------------------------------------------------------- sessions

    def session_opened(self, session, tenant: str, will) -> None:
        """A durable session is connected (new or resumed). (What it is sent from now on is not
        written: a record of a connected session does not say which of its entries went out.)"""
        self.journal.add(("session", tenant, session.client_id, session.expiry_interval, None, pack_will(will), None,
                          session.device, None))

    def session_closed(self, session, tenant: str, now: float) -> None:
        """Its connection is gone; the session stays, with its pending will if any, and the
        highest number of its stored entries sent to the client: a restore sends those again
        with DUP, and those after -- queued while it was away -- as first deliveries."""
        will = due = None
        if session.pending_will is not None:
            due, will = self.wall(session.pending_will[0]), session.pending_will[1]
        # stored deliveries go out in the order of their numbers, each once its number is given
        # (its append committed): those unacknowledged now are in the window
        sent = session.sent_seq
        for d in session.inflight.values():
            e = d.entry
            if e is not None and e.seq > sent:
                sent = e.seq
        session.sent_seq = sent
        self.journal.add(("session", tenant, session.client_id, session.expiry_interval, self.wall(now),
                          pack_will(will), due, session.device, sent))

    def session_ended(self, tenant: str, client_id: str) -> None:
        """The session is over: it goes from the store (also one not held here, in the store only)."""
        self.journal.add(("session_del", tenant, client_id))

    def subscribed(self, session, tenant: str, sub: Subscription) -> None:
        self.journal.add(("sub", tenant, session.client_id,
                          SubscriptionRecord(sub.filter, sub.qos, sub.no_local, sub.rap, sub.rh, sub.sub_id)))

    def unsubscribed(self, session, tenant: str, filt: str) -> None:
        self.journal.add(("unsub", tenant, session.client_id, filt))

    # --------------------------------------------------------------- queues

    def stored_message(self, msg: Publish) -> StoredMessage:
        expiry = msg.expiry_at
        return StoredMessage(msg.topic, msg.payload, msg.qos, msg.retain, msg.properties,
                             None if expiry is None else expiry + self.wall_offset)

    def enqueue(self, session, tenant: str, msg: Publish, qos: int, retain: bool, sub_ids, share) -> Delivery:
        """A QoS 1/2 delivery of ``msg`` to a durable session, written to its
        stored queue with a packet identifier reserved for it -> the Delivery
        (sent once that write is durable: ``d.gen``). The store gives the row
        its sequence number when it commits (``d.entry.seq``), so rows from
        several nodes stay ordered.

        Once per stored delivery: the message's stored form (made once for all
        its durable sessions), its QueueEntry and the Delivery (``new_delivery``)
        are made without their Python ``__init__`` (a class call runs it in a
        frame of its own). Every slot is set as their ``__init__`` sets it: a
        field added to QueueEntry or StoredMessage must be added here too
        (tests/durability/test_stored_delivery.py compares them)."""
        stored = msg.stored
        if stored is None:
            expiry = msg.expiry_at
            stored = msg.stored = _new(StoredMessage)
            stored.topic = msg.topic
            stored.payload = msg.payload
            stored.qos = msg.qos
            stored.retain = msg.retain
            stored.properties = msg.properties
            stored.expiry_at = None if expiry is None else expiry + self.wall_offset
        journal = self.journal
        reserved = session.reserved
        if reserved is None:
            reserved = session.reserved = set()
        pid = session.next_pid               # allocate_pid's common case, without its call
        if pid not in session.inflight and pid not in reserved:
            session.next_pid = pid + 1 if pid < 65535 else 1
        else:
            pid = session.allocate_pid()
        reserved.add(pid)
        entry = _new(QueueEntry)
        entry.seq = 0
        entry.msg = stored
        entry.qos = qos
        entry.retain = retain
        entry.sub_ids = sub_ids
        entry.share = (share.name, share.filter) if share is not None else None
        entry.pid = pid
        entry.state = AWAIT_ACK
        d = new_delivery(msg, qos, retain, sub_ids, share, pid)
        d.entry = entry
        d.gen = journal.generation
        ops = journal.ops
        if not ops:
            journal.add(("q", tenant, session.client_id, entry))     # (wakes the writer)
        else:
            ops.append(("q", tenant, session.client_id, entry))
        return d

    def done(self, session, tenant: str, d: Delivery) -> None:
        """Acknowledged, expired or dropped: remove it from the stored queue."""
        if session.reserved is not None:
            session.reserved.discard(d.pid)
        journal = self.journal
        ops = journal.ops
        if not ops:
            journal.add(("q_del", tenant, session.client_id, d.entry))     # (wakes the writer)
        else:
            ops.append(("q_del", tenant, session.client_id, d.entry))

    def released(self, session, tenant: str, d: Delivery) -> None:
        """QoS 2: PUBREC received, PUBREL owed."""
        d.entry.state = d.state
        self.journal.add(("q_state", tenant, session.client_id, d.entry))

    def rel_added(self, session, tenant: str, pid: int) -> None:
        self.journal.add(("rel", tenant, session.client_id, pid))

    def rel_removed(self, session, tenant: str, pid: int) -> None:
        self.journal.add(("rel_del", tenant, session.client_id, pid))

    # ------------------------------------------------------------- retained

    def retained(self, tenant: str, msg: Publish) -> None:
        if msg.topic.startswith(SYS_PREFIX):
            return
        if msg.payload:
            self.journal.add(("retain", tenant, msg.topic, self.stored_message(msg)))
        else:
            self.journal.add(("retain_del", tenant, msg.topic))

    # -------------------------------------------------------------- restore

    def message(self, m: StoredMessage) -> Publish:
        msg = Publish(m.topic, m.payload, m.qos, m.retain, False, 0, m.properties)
        msg.expiry_at = self.loop_time(m.expiry_at)
        return msg

    def restore(self, broker, records, retained, now: float) -> dict:
        """Rebuild sessions and retained messages from what ``Store.load`` returned.

        Sessions that were connected when the node stopped count as
        disconnected now: their expiry starts, and their will follows the
        usual rules (published now, or after its delay while the session
        lasts). Messages that were in flight are sent again under their
        packet identifier with DUP set; those queued after the client went
        away (numbered past ``rec.sent``) were never sent: no DUP. Where that
        is not known (the node died with the client connected), every one
        gets DUP.
        """
        counts = {"sessions": 0, "expired": 0, "messages": 0, "retained": 0, "wills": 0, "deleted": 0}
        wall_now = now + self.wall_offset
        gone = broker.tenant_gone
        for tenant, topic, m in retained:
            if m.expiry_at is not None and m.expiry_at <= wall_now:
                continue
            if gone(tenant):
                # deleted while this node was down (or not holding it): it goes, as on the deletion
                self.journal.add(("retain_del", tenant, topic))
                counts["deleted"] += 1
                continue
            broker.namespace(tenant).retained.set(topic, self.message(m))
            counts["retained"] += 1
        pending = []
        owed = []               # (ns, QueueEntry) of shared subscriptions of sessions that expired
        closed = []             # (tenant, Session) of sessions connected when the node stopped
        for rec in records:
            if gone(rec.tenant):
                # its tenant was deleted: the session goes, its will with it (a tenant created later
                # under the same name must not find the old one's sessions, queues or retained messages)
                self.journal.add(("session_del", rec.tenant, rec.client_id))
                counts["deleted"] += 1
                continue
            ns = broker.namespace(rec.tenant)
            # a --max-session-expiry lowered since the session was stored holds for it too, as for a
            # CONNECT now (an operator lowering it expects the sessions left behind to go by it)
            interval = min(rec.expiry_interval, broker.limits.max_session_expiry)
            never = interval == 0xFFFFFFFF
            gone_at = rec.disconnected_at if rec.disconnected_at is not None else wall_now
            if interval == 0 or (not never and gone_at + interval <= wall_now):
                counts["expired"] += 1
                self.journal.add(("session_del", rec.tenant, rec.client_id))
                if rec.will is not None:
                    pending.append((ns, rec, None))
                # what it owed through shared subscriptions goes to another member, as when a session
                # ends on a running node (``end_session``) -- but a QoS 2 message that may have been
                # sent, which the member may have processed ([MQTT-4.8.2-5])
                upto = rec.sent if rec.disconnected_at is not None and rec.sent is not None else None
                for e in rec.queue:
                    if e.share and not (e.qos == 2 and (e.state != AWAIT_ACK or upto is None or e.seq <= upto)) \
                            and (e.msg.expiry_at is None or e.msg.expiry_at > wall_now):
                        owed.append((ns, e))
                continue
            session = broker.new_session(ns, rec.client_id, interval)
            session.durable = True
            session.device = rec.device
            if not never:
                session.expires_at = self.loop_time(gone_at) + interval
                broker.schedule_expiry(session)
            for s in rec.subscriptions:
                shared = parse_shared(s.filter)
                group = shared[0] if shared else None
                sub = Subscription(s.filter, s.qos, s.no_local, s.rap, s.rh, s.sub_id, group)
                broker.add_subscription(ns, session, sub)
            session.awaiting_rel = set(rec.awaiting_rel) if rec.awaiting_rel else NO_IDS
            reserved = session.reserved = set()
            # the entries sent before: up to ``rec.sent`` if the record says (written at a disconnect)
            upto = rec.sent if rec.disconnected_at is not None and rec.sent is not None else None
            sent = upto or 0
            # those that may have been sent go back into the window, as the session held them (at most
            # a window's worth, the oldest): put in the bounded queue, they would be dropped to make room
            # for the messages queued behind them -- messages the node kept had it not restarted
            room = broker.limits.max_inflight
            for e in rec.queue:
                msg = self.message(e.msg)
                share = broker.shared_group(ns, e.share) if e.share else None
                d = Delivery(msg, e.qos, e.retain, e.sub_ids, share)
                dup = upto is None or e.seq <= upto
                if dup and e.seq > sent:
                    sent = e.seq
                d.entry, d.pid, d.state, d.dup = e, e.pid, e.state, dup
                if e.state != AWAIT_ACK:
                    session.window()[d.pid] = d   # PUBREL owed: resent on reconnect
                elif dup and len(session.inflight) < room and d.pid not in session.inflight:
                    # sent, not acknowledged: resent (DUP) on reconnect -- also once expired: its
                    # delivery started, and the client may hold its packet id (QoS 2)
                    session.window()[d.pid] = d
                else:
                    reserved.add(d.pid)
                    lost = session.queue.put(d)
                    if lost:
                        # over a bound lowered since (--max-queued, a tenant's quota): dropped and counted,
                        # as the queue drops at any other time
                        broker.acct.queue_full(ns, lost)
                        for gone_d in lost:
                            self.done(session, rec.tenant, gone_d)
                counts["messages"] += 1
            session.sent_seq = sent
            counts["sessions"] += 1
            if rec.disconnected_at is None:
                closed.append((rec.tenant, session))
            if rec.will is not None:
                pending.append((ns, rec, session))
        for ns, e in owed:
            # (to a member of any node in a cluster: this one may have none)
            broker.redeliver_shared(ns, e.share, self.message(e.msg), now, None)
        for ns, rec, session in pending:
            counts["wills"] += 1
            broker.restore_will(ns, rec, session, self.loop_time(rec.will_due) if rec.will_due else None, now)
        # a session that was connected counts as disconnected from now: so written, or every later
        # restart would start its expiry again, and publish its will (published above) once more
        for tenant, session in closed:
            self.session_closed(session, tenant, now)
        return counts


def will_delay(will) -> int:
    return (will.properties or {}).get(P.WILL_DELAY_INTERVAL, 0) if will is not None else 0
