"""The client registry: client ids to sessions, per tenant (EMQX's emqx_cm).

Everything about a client's session that is not a message: authenticating a
CONNECT and opening (or resuming) its session, taking a session over from an
older connection, the end of a connection (its will, its session's expiry),
timers for delayed wills and session expiry, and letting a session go when
another node takes it. Pure: ``now`` comes from the caller, timers are a
heap served by ``tick(now)``.

In a cluster a session may live on another node: ``claims`` (a
:class:`SessionClaims`, the cluster node) fetches it before the CONNECT is
decided here, and hears when a connection ends. Without a cluster it is None
and a CONNECT is decided at once.
"""

import heapq
import itertools
import os
from functools import partial
from typing import Protocol

from .protocol import properties as P
from .protocol import reason as rc
from .protocol.channel import CONNECTING
from .protocol.packets import MQTT5, Publish
from .protocol.properties import NEVER
from .session.session import Session
from .tenancy.enforcement import UNKNOWN

# what a tenant's connection quota makes of a CONNECT waiting for its claim (``Registry._admit_opening``):
# refused; admitted; admitted only in place of a live connection of its client id on another node
REFUSED, ADMITTED, IN_PLACE = 0, 1, 2


class SessionClaims(Protocol):
    """What the registry asks of the cluster (``brokerd.cluster.node.ClusterNode``)."""

    def claim(self, channel, tenant: str, client_id: str, clean_start: bool, will, cont,
              live_only: bool = False) -> None:
        """Take the client id's session over from wherever it is; then ``cont(now)`` opens it here
        (or the channel is refused). ``live_only``: only in place of a live connection of the id on
        another node (else refused 0x97, nothing changed)."""

    def client_gone(self, tenant: str, client_id: str, ended: bool, had_will: bool) -> None:
        """A connection closed here; ``ended``: its session is over too."""


class RegistryBroker(Protocol):
    """The registry's collaborators, all reached through the broker."""

    auth: object            # authenticate, policy, client_acl, limiters, connected_delta
    router: object          # brokerd.routing.router.Router
    acct: object            # brokerd.metrics.accounting.Accounting
    enforcement: object     # brokerd.tenancy.enforcement.Enforcement
    persist: object         # brokerd.persistence.Persistence, or None
    budget: object          # brokerd.budget.MemoryBudget
    limits: object          # brokerd.protocol.channel.ChannelLimits
    wall_offset: float
    usage: object

    def publish_will(self, ns, msg: Publish, now: float) -> None:
        """Publish a will (retained if it says so) as the broker's own message."""

    def redeliver_shared(self, ns, group, msg: Publish, now: float, exclude) -> bool:
        """A message a shared-subscription member left undelivered: to another member (of any node)."""


class _Gone:
    """Stands for a session that expired while the node was down, to publish its will."""

    __slots__ = ("client_id", "ns", "device")

    def __init__(self, client_id, ns, device=UNKNOWN):
        self.client_id = client_id
        self.ns = ns
        self.device = device


class ClientRegistry:
    def __init__(self, broker: RegistryBroker, node_id: str, max_connections: int, anonymous_tenant: str):
        self.b = broker
        self.max_connections = max_connections
        self.anonymous_tenant = anonymous_tenant
        self.claims: SessionClaims | None = None
        self.connected = 0
        self._timers: list = []
        self._seq = itertools.count()
        self._id_prefix = f"auto-{node_id}-"
        # tenant -> channels admitted under its connection quota whose claim is on its way to the
        # cluster (counted in once opened): they count against the quota meanwhile
        self._opening: dict[str, set] = {}
        self._replaces = self._replaces_anywhere        # (bound once: passed to every authenticate)

    @property
    def channels(self) -> list:
        """Accepted, connected channels: those of every tenant (``ns.channels``; one set per
        tenant holds them, not a second node-wide set as well -- 100 bytes per connection)."""
        return [ch for ns in self.b.router.namespaces.values() for ch in ns.channels]

    # ------------------------------------------------------------------ connect

    def connect(self, channel, p, now: float) -> None:
        b = self.b
        if self.connected >= self.max_connections:
            channel.refuse(rc.QUOTA_EXCEEDED, "the server is at its connection limit")
            return
        auth = b.auth
        code, tenant, identity = auth.authenticate(p, channel, now, now + b.wall_offset, self._replaces)
        if code != rc.SUCCESS:
            ns = b.router.namespace(tenant) if tenant is not None else None
            if code in (rc.BAD_USERNAME_OR_PASSWORD, rc.NOT_AUTHORIZED):
                b.acct.auth_failed(ns)
            else:
                b.acct.connect_refused(ns)
            channel.refuse(code, rc.NAMES.get(code))
            return
        channel.tenant = tenant
        channel.identity = identity
        ns = b.router.namespace(tenant)
        policy = auth.policy(tenant)
        quota = policy.quota if policy is not None and policy.quota else None
        client_id = p.client_id
        assigned = None
        if not client_id:
            client_id = assigned = self._new_client_id(ns)
        will = channel.will
        if will is not None and (will.topic.startswith("$SYS") if identity is None else not b.enforcement.will_allowed(
                tenant, identity.device, client_id, will.topic)):
            # a will the client may not publish is refused now (Mosquitto: CONNACK 0x87), not
            # taken and published on its behalf later
            b.acct.publish_denied(ns, will.topic)
            channel.refuse(rc.NOT_AUTHORIZED, "will topic not authorized")
            return
        if will is not None and quota is not None and len(will.payload) > quota.get("max_payload", len(will.payload)):
            # as a PUBLISH of it would be (0x95): refused now rather than published past the tenant's quota
            b.acct.publish_over_quota(ns, will.topic)
            channel.refuse(rc.PACKET_TOO_LARGE, "will payload over the tenant's max_payload")
            return
        expiry, connack_props = self._expiry(p, quota)
        args = (channel, p, ns, client_id, assigned, expiry, connack_props, identity, policy, quota)
        if self.claims is not None:
            limit = quota.get("max_connections") if quota is not None else None
            admitted = ADMITTED
            if limit is not None:
                here = self.replaces(tenant, client_id) if not assigned else False
                admitted = self._admit_opening(tenant, channel, limit, here, not (assigned or here))
                if admitted == REFUSED:
                    b.acct.connect_refused(ns)
                    channel.refuse(rc.QUOTA_EXCEEDED, rc.NAMES.get(rc.QUOTA_EXCEEDED))
                    return
            # the session may live on another node: fetch it first, then open it here
            self.claims.claim(channel, tenant, client_id, p.clean_start, channel.will,
                              lambda later: self._open_session(*args, later), admitted == IN_PLACE)
            return
        self._open_session(*args, now)

    def _expiry(self, p, quota) -> tuple[int, dict | None]:
        """The session expiry interval the CONNECT ``p`` gets under the tenant's ``quota``, and the
        CONNACK's properties saying so (v5) when its ``max_session_expiry`` lowered it."""
        if p.protocol_level == MQTT5:
            expiry = (p.properties or {}).get(P.SESSION_EXPIRY_INTERVAL, 0)
        else:
            # 3.x persistent sessions last until --max-session-expiry (default: forever)
            expiry = 0 if p.clean_start else self.b.limits.max_session_expiry
        cap = quota.get("max_session_expiry") if quota else None
        if cap is not None and expiry > cap:
            return cap, ({P.SESSION_EXPIRY_INTERVAL: cap} if p.protocol_level == MQTT5 else None)
        return expiry, None

    def replaces(self, tenant: str, client_id: str) -> bool:
        """Whether a CONNECT of ``client_id`` takes over a live connection on this node (the
        connection leaves as the new one comes in: the tenant's count does not grow). Asked only at
        the tenant's connection quota (``self._replaces``, the bound method made once: a closure made
        for every CONNECT cost the connect path 2,600 instructions)."""
        ns = self.b.router.namespaces.get(tenant)
        session = ns.sessions.get(client_id) if ns is not None else None
        return session is not None and session.channel is not None and session.channel in ns.channels

    def _replaces_anywhere(self, tenant: str, client_id: str) -> bool:
        """``authenticate``'s ``replaces``: a live connection of the id here -- or, in a cluster, perhaps
        on another node: admitted on that condition, decided by its claim (``_admit_opening``'s
        ``IN_PLACE``)."""
        return self.claims is not None or self.replaces(tenant, client_id)

    def _admit_opening(self, tenant: str, channel, limit: int, replaces: bool = False,
                       elsewhere: bool = False) -> int:
        """A CONNECT the tenant's connection quota admitted (``auth.authenticate``, by the
        connections counted in) waits for its claim: admitted only if the tenant's other
        CONNECTs waiting too leave it room; then it waits among them. (Without this, a burst
        of CONNECTs arriving together were all admitted against the count of before.)
        ``elsewhere``: it may take over a live connection of its client id on another node -- at
        the quota it is admitted on that condition. -> ``REFUSED``, ``ADMITTED`` or ``IN_PLACE``."""
        opening = self._opening.get(tenant)
        n = self.b.auth.connections(tenant)
        gone = 1 if replaces or elsewhere else 0     # the connection it takes over leaves as it comes in
        if opening and n + len(opening) >= limit:
            # those refused or gone meanwhile (never opened) leave first -- looked for only at the
            # limit: a walk over them on every CONNECT of a storm was quadratic in its size
            for ch in [ch for ch in opening if ch.state != CONNECTING]:
                opening.discard(ch)
            if n - gone + len(opening) >= limit:
                return REFUSED
        if opening is None:
            opening = self._opening[tenant] = set()
        full = elsewhere and n + len(opening) >= limit
        opening.add(channel)
        return IN_PLACE if full else ADMITTED

    def _open_session(self, channel, p, ns, client_id, assigned, expiry, connack_props, identity, policy, quota,
                      now) -> None:
        b = self.b
        if self.claims is not None:
            # authenticated before its claim went to the cluster: a policy change applied meanwhile (a
            # device disabled, a secret rotated, a tenant suspended, a quota lowered) was enforced on the
            # tenant's connections but could not see this one, not open yet -- it is judged by that policy now
            if identity is not None:
                reason = b.auth.still_valid(identity, now + b.wall_offset)
                if reason is not None:
                    b.acct.auth_failed(ns)
                    channel.refuse(rc.NOT_AUTHORIZED, reason)
                    return
            policy = b.auth.policy(ns.name)
            quota = policy.quota if policy is not None and policy.quota else None
            expiry, connack_props = self._expiry(p, quota)      # (its max_session_expiry too)
        session = self._takeover(ns, client_id, now)
        present = False
        if session is not None:
            if p.clean_start:
                stored = session.durable
                self.end_session(session, now)
                session = None
                if stored and self.claims is None:
                    # [MQTT-3.1.2-4]: the CONNACK (session present 0) goes once the old session's end
                    # is durable -- a crash before it would bring the session back for a client told it
                    # was over. (In a cluster the claim ends it and waits before this: Takeover.run_claim.)
                    args = (channel, p, ns, client_id, assigned, expiry, connack_props, identity, policy, quota)
                    b.after_commit(partial(self._old_session_ended, args))
                    return
            else:
                present = True
                session.expires_at = None
                session.pending_will = None      # reconnected within the will delay
        if session is None:
            session = self.new_session(ns, client_id, expiry)
        session.expiry_interval = expiry
        self.queue_quota(session, quota)
        b.enforcement.connected(channel, session, identity, policy, quota, present, now)
        if b.persist is not None and (expiry or session.durable):
            session.durable = True
            b.persist.session_opened(session, ns.name, channel.will)
        self._count_in(channel, ns)
        channel.accept(session, present, now, assigned, connack_props)
        if present and b.router.on_change is not None:
            b.router.presence_changed(ns, session)        # its shared groups have a member online here
        autosub = b.autosub.get(ns.name)
        if autosub is not None and session.channel is channel:
            b.auto_subscribe(channel, autosub, now)
        rules = b.rules.get(ns.name)
        if rules is not None:
            rules.event("client_connected", b, ns, channel, now)

    def _old_session_ended(self, args: tuple, ok: bool) -> None:
        """The end of the stored session a Clean Start replaces is durable (``ok``) or failed: the
        CONNECT goes on (opening a new session; one of the id opened meanwhile is taken over as
        usual), or is refused -- the store's retry writes the end later."""
        channel = args[0]
        if channel.state != CONNECTING:         # the client went away meanwhile
            return
        if not ok:
            channel.refuse(rc.SERVER_UNAVAILABLE, "the session store is unavailable")
            return
        self._open_session(*args, self.b.commit_time)

    def end_held(self, tenant: str, client_id: str, now: float) -> bool:
        """A Clean Start of ``client_id`` claimed in a cluster, its session held here: its connection
        taken over and the session ended before the new one opens; -> whether the end was written to
        the store (the CONNACK waits for it)."""
        ns = self.b.router.namespaces.get(tenant)
        session = self._takeover(ns, client_id, now) if ns is not None else None
        if session is None:
            return False
        stored = session.durable
        self.end_session(session, now)
        return stored

    def _takeover(self, ns, client_id: str, now: float) -> Session | None:
        """The session of ``client_id``, after its current connection (if any) was
        closed as if its network had failed -- its will follows the usual rules."""
        session = ns.sessions.get(client_id)
        if session is not None and session.channel is not None:
            self.b.acct.stats.takeovers += 1
            session.channel.disconnect(rc.SESSION_TAKEN_OVER, "another connection took over the session", now)
            session = ns.sessions.get(client_id)
        return session

    def _count_in(self, channel, ns) -> None:
        opening = self._opening.get(ns.name)
        if opening is not None:
            opening.discard(channel)
            if not opening:
                del self._opening[ns.name]
        stats = self.b.acct.stats
        self.connected += 1
        stats.connects += 1
        if self.connected > stats.clients_max:
            stats.clients_max = self.connected
        ns.channels.add(channel)
        m = ns.m
        m.connects += 1
        if len(ns.channels) > m.connections_max:
            m.connections_max = len(ns.channels)
        ns.connects += 1
        self.b.auth.connected_delta(ns.name, 1)

    def new_session(self, ns, client_id: str, expiry: int) -> Session:
        limits = self.b.limits
        session = Session(client_id, ns, limits.max_queued, limits.max_queued_bytes, expiry, budget=self.b.budget)
        ns.sessions[client_id] = session
        return session

    def restored_session(self, ns, client_id: str, expiry: int) -> Session:
        """A session brought back from the store (a restart, a takeover, an adoption): bounded
        as one opened here, its tenant's queue quota included -- it queues while its client is away."""
        session = self.new_session(ns, client_id, expiry)
        policy = self.b.auth.policy(ns.name)
        self.queue_quota(session, policy.quota if policy is not None and policy.quota else None)
        return session

    def queue_quota(self, session: Session, quota: dict | None) -> None:
        """The tenant's ``max_queued`` (under the node's) bounds the session's queue."""
        if quota is not None and quota.get("max_queued") is not None:
            session.queue.max_len = min(self.b.limits.max_queued, quota["max_queued"])

    def _new_client_id(self, ns) -> str:
        while True:
            cid = self._id_prefix + os.urandom(8).hex()
            if cid not in ns.sessions:
                return cid

    # ---------------------------------------------------------------- closing

    def channel_closed(self, channel, now: float, will: bool) -> None:
        b = self.b
        session = channel.session
        channel.session = None
        if session.channel is channel:
            session.channel = None
            session.queue.attach_budget(None)
            if b.router.on_change is not None:
                b.router.presence_changed(session.ns, session)
        b.enforcement.closed(channel, session.ns.name, now)
        self.connected -= 1
        st = b.acct.stats
        st.disconnects += 1
        st.msgs_received_closed += channel.msgs_in
        st.msgs_sent_closed += channel.msgs_out
        st.bytes_received_closed += channel.bytes_in
        st.bytes_sent_closed += channel.bytes_out
        ns = session.ns
        ns.channels.discard(channel)
        rules = b.rules.get(ns.name)
        if rules is not None:
            rules.event("client_disconnected", b, ns, channel, now)
        closed = ns.closed
        closed[0] += channel.msgs_in
        closed[1] += channel.msgs_out
        closed[2] += channel.bytes_in
        closed[3] += channel.bytes_out
        ns.m.closed(channel)
        if b.usage is not None:
            b.usage.connection_closed(channel, ns.name, now)
        b.auth.connected_delta(ns.name, -1)
        w = channel.will if will else None
        channel.will = None
        if w is not None:
            delay = (w.properties or {}).get(P.WILL_DELAY_INTERVAL, 0)
            if delay and session.expiry_interval:
                due = now + min(delay, session.expiry_interval)
                session.pending_will = (due, w)
                self._schedule(due, "will", session)
            else:
                self._publish_will(session, w, now)
        if self.claims is not None:
            # a will the node registered for the cluster is no longer owed (nor one it never did)
            self.claims.client_gone(ns.name, session.client_id, session.expiry_interval == 0, not session.durable)
        if session.expiry_interval == 0:
            self.end_session(session, now)
            return
        if session.expiry_interval != NEVER:
            session.expires_at = now + session.expiry_interval
            self._schedule(session.expires_at, "expire", session)
        feed = channel.retained_feed
        if feed:
            b.retained_owed(session, feed, now)
        if session.durable:
            b.persist.session_closed(session, session.ns.name, now)

    def end_session(self, session: Session, now: float) -> None:
        """The session is over: out of the registry, the store and the router; its
        pending will goes now; what shared subscriptions owed it goes to another member."""
        b = self.b
        ns = session.ns
        if ns.sessions.get(session.client_id) is session:
            del ns.sessions[session.client_id]
        if session.durable:
            b.persist.session_ended(ns.name, session.client_id)
            session.durable = False
        b.router.remove_all(ns, session)
        if session.pending_will is not None:
            _, w = session.pending_will
            session.pending_will = None
            self._publish_will(session, w, now)
        # Messages owed through shared subscriptions go to another member --
        # except QoS 2 messages already sent, which the member may have
        # processed ([MQTT-4.8.2-5]).
        leftovers = [d for d in session.inflight.values() if d.qos == 1] + session.queue.drain()
        session.inflight.clear()
        if session.awaiting_rel:
            session.awaiting_rel.clear()
        session.reserved = None
        for d in leftovers:
            if d.share is not None:
                b.redeliver_shared(ns, d.share, d.msg, now, session)

    # --------------------------------------------------------------- wills

    def _will_message(self, w, session, now) -> Publish:
        """The will as a message, published ``now`` (its expiry runs from here)."""
        props = None
        if w.properties:
            props = {k: v for k, v in w.properties.items() if k in P.FORWARDED} or None
        msg = Publish(w.topic, w.payload, w.qos, w.retain, False, 0, props)
        if props and P.MESSAGE_EXPIRY_INTERVAL in props:
            msg.expiry_at = now + props[P.MESSAGE_EXPIRY_INTERVAL]
        msg.origin = session
        return msg

    def _publish_will(self, session, w, now) -> None:
        ns = session.ns
        if not self.b.enforcement.will_allowed(ns.name, session.device, session.client_id, w.topic):
            # the client's rights changed since its CONNECT (or its tenant is gone): as its PUBLISH would be
            self.b.acct.publish_denied(ns, w.topic)
            return
        policy = self.b.auth.policy(ns.name)
        quota = policy.quota if policy is not None and policy.quota else None
        if self.b.publish_will(ns, self._will_message(w, session, now), now, quota):
            self.b.acct.stats.wills_published += 1

    def publish_gone_will(self, tenant: str, client_id: str, will, now: float) -> None:
        """The will of a client of a node that died (published by a survivor)."""
        self._publish_will(_Gone(client_id, self.b.router.namespace(tenant)), will, now)

    def restore_will(self, ns, rec, session, due, now) -> None:
        """A will found in the store at start: see ``Persistence.restore``."""
        w = rec.will
        if session is None:
            self._publish_will(_Gone(rec.client_id, ns, rec.device), w, now)
            return
        if due is None:   # the session was connected when the node stopped
            delay = (w.properties or {}).get(P.WILL_DELAY_INTERVAL, 0)
            if not delay:
                self._publish_will(session, w, now)
                return
            due = now + min(delay, session.expiry_interval)
        session.pending_will = (due, w)
        self._schedule(due, "will", session)

    # --------------------------------------------------------- cluster hand-over

    def release(self, tenant: str, client_id: str, now: float) -> bool:
        """Another node takes this client's session over: disconnect the client
        (0x8E) and let go of the session -- its stored state is the new node's
        to load."""
        ns = self.b.router.namespaces.get(tenant)
        session = ns.sessions.get(client_id) if ns is not None else None
        if session is None:
            return False
        self.b.acct.stats.takeovers += 1
        if session.channel is not None:
            session.channel.disconnect(rc.SESSION_TAKEN_OVER, "the session moved to another node", now)
        session = ns.sessions.get(client_id)
        if session is not None:
            self._drop_session(session)
        return True

    def _drop_session(self, session: Session) -> None:
        """Forget a session here without ending it (it lives on in the store)."""
        ns = session.ns
        if ns.sessions.get(session.client_id) is session:
            del ns.sessions[session.client_id]
        durable, session.durable = session.durable, False      # no journal writes for what follows
        self.b.router.remove_all(ns, session)
        session.queue.drain()
        session.inflight.clear()
        session.expires_at = None
        session.pending_will = None
        session.durable = durable

    def drop_all_sessions(self) -> None:
        """This node leaves (fenced): every session is left to the others."""
        for ns in self.b.router.namespaces.values():
            for session in list(ns.sessions.values()):
                self._drop_session(session)

    # ------------------------------------------------------------------ timers

    def _schedule(self, when: float, kind: str, obj) -> None:
        heapq.heappush(self._timers, (when, next(self._seq), kind, obj))

    def schedule_expiry(self, session: Session) -> None:
        self._schedule(session.expires_at, "expire", session)

    def next_timer(self) -> float | None:
        return self._timers[0][0] if self._timers else None

    def tick(self, now: float) -> None:
        """Fire due timers: delayed wills, session expiry."""
        timers = self._timers
        while timers and timers[0][0] <= now:
            when, _, kind, session = heapq.heappop(timers)
            if kind == "will":
                pw = session.pending_will
                if pw is not None and pw[0] == when:
                    session.pending_will = None
                    self._publish_will(session, pw[1], now)
                    if session.durable and session.channel is None:
                        # published: not owed any more in the store either (else whoever loads the
                        # session -- a restart, a survivor adopting it -- publishes it again); the
                        # disconnect time kept as it was, the session's expiry runs from it
                        gone = now if session.expires_at is None else session.expires_at - session.expiry_interval
                        self.b.persist.session_closed(session, session.ns.name, gone)
            elif kind == "expire" and session.channel is None and session.expires_at == when:
                self.b.acct.stats.sessions_expired += 1
                self.end_session(session, now)

    def shutdown(self, now: float, code: int, server_reference: str | None) -> None:
        """Disconnect every client (v5: DISCONNECT ``code``); wills follow the usual rules."""
        for ch in list(self.channels):
            ch.disconnect(code, "server shutting down", now, will=True, server_reference=server_reference)
