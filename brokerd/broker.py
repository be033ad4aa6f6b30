"""The node-local broker: sessions, subscriptions, retained messages, routing.

Like EMQX's emqx_broker + emqx_cm, but in one process: channels call
``connect``, ``publish``, ``subscribe``, ``unsubscribe`` and
``channel_closed``; the broker calls back ``channel.accept/refuse``,
``channel.deliver`` and ``channel.disconnect``. Nothing here does I/O or
reads a clock: ``now`` comes from the caller and timers (will delay, session
expiry) are kept in a heap served by ``tick(now)``.

Tenants are namespaces: each :class:`Namespace` has its own subscription
trie, retained messages and client-id registry, so no topic, wildcard,
shared subscription or client id ever crosses from one tenant to another.
"""

import heapq
import itertools
import os
import random
from dataclasses import dataclass, field

from .metrics.counters import TenantCounters
from .metrics.usage import ACL as U_ACL
from .metrics.usage import AUTH as U_AUTH
from .metrics.usage import EXPIRED as U_EXPIRED
from .metrics.usage import NO_SUBS as U_NO_SUBS
from .metrics.usage import QUEUE_FULL as U_QUEUE_FULL
from .metrics.usage import QUOTA as U_QUOTA
from .protocol import properties as P
from .protocol import reason as rc
from .protocol.channel import NEVER, ChannelLimits, PreauthBudget
from .protocol.errors import RemoteProtocolError
from .protocol.packets import MQTT5, Publish
from .routing.cache import CacheBudget, TopicCache
from .routing.retained import RetainedStore
from .routing.topic import InvalidTopic, is_valid_filter, matches, parse_shared
from .routing.trie import TopicTrie
from .session.session import Delivery, MemoryBudget, Session, Subscription
from .tenancy.control import Identity

DEFAULT_TENANT = "default"
# Route cache bounds (see Namespace): bytes per namespace and per node, and the estimated
# bytes of an entry besides its topic (dict slot, result tuple, lists) and per subscriber in it.
# A 30-character topic with no subscriber measured 188 bytes besides the string (tracemalloc).
ROUTE_CACHE_BYTES = 32 * 1024 * 1024
ROUTE_CACHE_NODE_BYTES = 128 * 1024 * 1024
ROUTE_ENTRY_COST = 200
ROUTE_SUB_COST = 96
# PUBACK/PUBREC reason when a message that must be stored cannot be (v5 0x83
# Implementation specific error, with a reason string; 3.x clients are disconnected)
STORE_UNAVAILABLE = rc.IMPLEMENTATION_SPECIFIC_ERROR


@dataclass(slots=True)
class BrokerConfig:
    node_id: str = "node1"
    allow_anonymous: bool = False
    anonymous_tenant: str = DEFAULT_TENANT
    max_connections: int = 100_000
    shared_strategy: str = "round_robin"      # or "random"
    queue_budget: int = 64 * 1024 * 1024        # bytes queued node-wide before publishers are paused
    limits: ChannelLimits = field(default_factory=ChannelLimits)


class Stats:
    """Node counters: plain ints, cheap to bump on the per-message path.

    Per-connection message and byte counts live on the channels and are
    added here when a channel closes (see ``Broker.totals``).
    """

    __slots__ = ("connects", "disconnects", "auth_failures", "clients_max", "msgs_received_closed",
                 "msgs_sent_closed", "bytes_received_closed", "bytes_sent_closed", "dropped_queue_full",
                 "dropped_expired", "dropped_too_large", "dropped_no_subscribers", "dropped_refused",
                 "takeovers", "wills_published", "sessions_expired", "denied_publish", "denied_subscribe",
                 "quota_refused", "revoked")

    def __init__(self):
        for name in self.__slots__:
            setattr(self, name, 0)

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__}


class Route:
    """What a topic filter maps to: plain subscribers and shared groups."""

    __slots__ = ("subs", "groups")

    def __init__(self):
        self.subs: dict[Session, Subscription] = {}
        self.groups: dict[str, SharedGroup] = {}

    def __bool__(self):
        return bool(self.subs) or bool(self.groups)


class SharedGroup:
    """``$share/NAME/FILTER``: each message goes to one member."""

    __slots__ = ("name", "filter", "members", "order", "rr")

    def __init__(self, name: str, filt: str):
        self.name = name
        self.filter = filt
        self.members: dict[Session, Subscription] = {}
        self.order: list[Session] = []
        self.rr = 0

    def add(self, session, sub):
        if session not in self.members:
            self.order.append(session)
        self.members[session] = sub

    def remove(self, session):
        if self.members.pop(session, None) is not None:
            self.order.remove(session)

    def pick(self, strategy: str, exclude=None) -> Session | None:
        """A member to deliver to: connected and not congested first, then any
        connected member, then a persistent member that is offline."""
        order = self.order
        n = len(order)
        if n == 0:
            return None
        if strategy == "random":
            start = random.randrange(n)
        else:
            start = self.rr % n
        fallback = offline = None
        for k in range(n):
            s = order[(start + k) % n]
            if s is exclude:
                continue
            ch = s.channel
            if ch is not None:
                if not ch.congested:
                    self.rr = (start + k + 1) % n
                    return s
                if fallback is None:
                    fallback = s
            elif offline is None and s.persistent:
                offline = s
        chosen = fallback or offline
        if chosen is not None:
            self.rr = (order.index(chosen) + 1) % n
        return chosen


class Namespace:
    """One tenant's topic space.

    ``cache`` keeps the route of each topic recently published to (a
    :class:`~brokerd.routing.cache.TopicCache`): at most ROUTE_CACHE_BYTES per
    namespace and, through the broker's ``route_budget``, ROUTE_CACHE_NODE_BYTES
    for all of them; topics longer than MAX_CACHED_TOPIC are routed every time.
    """

    __slots__ = ("name", "trie", "cache", "sessions", "retained", "channels", "closed", "connects", "m")

    def __init__(self, name: str, budget: CacheBudget | None = None):
        self.name = name
        self.trie = TopicTrie()
        self.cache = TopicCache(ROUTE_CACHE_BYTES, budget)   # topic -> (subscriber entries, shared groups)
        self.sessions: dict[str, Session] = {}
        self.retained = RetainedStore()
        self.channels: set = set()              # connected channels of this tenant
        self.closed = [0, 0, 0, 0]              # msgs in, msgs out, bytes in, bytes out of closed channels
        self.connects = 0
        self.m = TenantCounters()               # the tenant's counters on this node (brokerd.metrics)

    def route(self, topic: str) -> tuple:
        """Subscribers of ``topic``: one merged entry per session, and the shared groups.

        Entry = (session, qos, no_local, rap, sub_ids). A session with several
        matching subscriptions gets one copy at the highest QoS carrying every
        subscription identifier (MQTT 3.1.1 3.3.5, 5.0 3.3.4). ``no_local`` is
        True when every matching subscription has it, else False, or -- when
        they disagree -- the (qos, rap, sub_ids) of the subscriptions without it.
        """
        routes = self.trie.match(topic)
        merged: dict[Session, list] = {}
        groups = []
        for route in routes:
            for session, sub in route.subs.items():
                merged.setdefault(session, []).append(sub)
            if route.groups:
                groups.extend(route.groups.values())
        entries = []
        for session, subs in merged.items():
            if len(subs) == 1:
                s = subs[0]
                entries.append((session, s.qos, s.no_local, s.rap, (s.sub_id,) if s.sub_id else None))
            else:
                qos, rap, ids = _merge(subs)
                entries.append((session, qos, _no_local(subs), rap, ids))
        result = (entries, groups)
        self.cache.put(topic, result, ROUTE_ENTRY_COST + ROUTE_SUB_COST * len(entries) + 8 * len(groups))
        return result


def _merge(subs):
    qos = max(s.qos for s in subs)
    rap = any(s.rap for s in subs)
    ids = tuple(s.sub_id for s in subs if s.sub_id) or None
    return qos, rap, ids


def _no_local(subs):
    flags = {s.no_local for s in subs}
    if flags == {True}:
        return True
    if flags == {False}:
        return False
    return _merge([s for s in subs if not s.no_local])


class AnonymousAuth:
    """Authentication without a control plane: anonymous clients (any
    credentials accepted) into the default tenant, or nobody. The same
    interface as ``brokerd.tenancy.control.TenantControl``."""

    def __init__(self, allow_anonymous: bool, tenant: str = DEFAULT_TENANT):
        self.allow_anonymous = allow_anonymous
        self.tenant = tenant

    def admit(self, peer: str, now: float) -> tuple[int, str] | None:
        return None

    def authenticate(self, connect, channel, now: float, wall: float):
        """-> (reason code, tenant, identity)."""
        if self.allow_anonymous:
            return rc.SUCCESS, self.tenant, None
        return rc.NOT_AUTHORIZED, None, None

    def policy(self, tenant):
        return None

    def connected_delta(self, tenant, delta) -> None:
        pass

    def client_acl(self, identity, client_id):
        return None

    def limiters(self, tenant, now):
        return None, None

    def still_valid(self, identity, wall):
        return None if self.allow_anonymous else "anonymous access disabled"


class Broker:
    def __init__(self, config: BrokerConfig | None = None, auth=None, now: float = 0.0):
        self.config = config or BrokerConfig()
        self.limits = self.config.limits
        self.auth = auth or AnonymousAuth(self.config.allow_anonymous, self.config.anonymous_tenant)
        self.namespaces: dict[str, Namespace] = {}
        self.stats = Stats()
        self.sampler = None                     # brokerd.metrics.LatencySampler: times one PUBLISH in 64
        self.usage = None                       # brokerd.metrics.usage.UsageLog (--usage-dir)
        self.budget = MemoryBudget(self.config.queue_budget)
        self.route_budget = CacheBudget(ROUTE_CACHE_NODE_BYTES)   # the route caches of every namespace
        self.preauth = PreauthBudget(self.limits.preauth_budget)  # bytes buffered before CONNECT
        self.connected = 0
        self.started_at = now
        self._timers: list = []
        self._seq = itertools.count()
        self._id_prefix = f"auto-{self.config.node_id}-"
        self.channels: set = set()          # accepted, connected channels
        self.persist = None                 # Persistence when a durable store is configured
        self.journal = None                 # its Journal
        self.gated: set = set()             # channels with stored deliveries waiting for a commit
        self.cluster = None                 # the ClusterNode, when the node is part of a cluster
        self._waits: list = []              # requests to other nodes a publish waits for
        self.wall_offset = 0.0              # wall clock = now + wall_offset (set by the server)
        self.expiring: set = set()          # channels whose credential expires while connected

    def use_store(self, persist) -> None:
        """Mirror durable sessions through ``persist`` (a ``Persistence``)."""
        self.persist = persist
        self.journal = persist.journal

    # ------------------------------------------------------------ namespaces

    def namespace(self, name: str) -> Namespace:
        ns = self.namespaces.get(name)
        if ns is None:
            ns = self.namespaces[name] = Namespace(name, self.route_budget)
        return ns

    # --------------------------------------------------------------- connect

    def admit(self, channel, now: float) -> tuple[int, str] | None:
        """Before anything a connection sent is decoded: (reason code, reason) to
        refuse it with (the failed-login throttle of its address), or None."""
        refusal = self.auth.admit(channel.peer, now)
        if refusal is not None:
            self.stats.quota_refused += 1
        return refusal

    def connect(self, channel, p, now: float) -> None:
        if self.connected >= self.config.max_connections:
            channel.refuse(rc.QUOTA_EXCEEDED, "the server is at its connection limit")
            return
        auth = self.auth
        code, tenant, identity = auth.authenticate(p, channel, now, now + self.wall_offset)
        if code != rc.SUCCESS:
            m = self.namespace(tenant).m if tenant is not None else None
            if code in (rc.BAD_USERNAME_OR_PASSWORD, rc.NOT_AUTHORIZED):
                self.stats.auth_failures += 1
                if m is not None:
                    m.auth_failures += 1
                    if self.usage is not None:
                        self.usage.count(tenant, "", U_AUTH)
            else:
                self.stats.quota_refused += 1
                if m is not None:
                    m.quota += 1
            channel.refuse(code, rc.NAMES.get(code))
            return
        channel.tenant = tenant
        channel.identity = identity
        ns = self.namespace(tenant)
        policy = auth.policy(tenant)
        quota = policy.quota if policy is not None and policy.quota else None
        client_id = p.client_id
        assigned = None
        if not client_id:
            client_id = assigned = self._new_client_id(ns)
        if p.protocol_level == MQTT5:
            expiry = (p.properties or {}).get(P.SESSION_EXPIRY_INTERVAL, 0)
        else:
            # 3.x persistent sessions last until --max-session-expiry (default: forever)
            expiry = 0 if p.clean_start else self.limits.max_session_expiry
        connack_props = None
        cap = quota.get("max_session_expiry") if quota else None
        if cap is not None and expiry > cap:
            expiry = cap
            if p.protocol_level == MQTT5:
                connack_props = {P.SESSION_EXPIRY_INTERVAL: cap}
        args = (channel, p, ns, client_id, assigned, expiry, connack_props, identity, policy, quota)
        if self.cluster is not None:
            # the session may live on another node: fetch it first, then open it here
            self.cluster.claim(channel, tenant, client_id, p.clean_start, channel.will,
                               lambda later: self._open_session(*args, later))
            return
        self._open_session(*args, now)

    def _open_session(self, channel, p, ns, client_id, assigned, expiry, connack_props, identity, policy, quota,
                      now) -> None:
        auth = self.auth
        tenant = ns.name
        session = ns.sessions.get(client_id)
        if session is not None and session.channel is not None:
            # Session takeover: the old connection goes as if its network had
            # failed (its will follows the usual rules), then we look again.
            self.stats.takeovers += 1
            session.channel.disconnect(rc.SESSION_TAKEN_OVER, "another connection took over the session", now)
            session = ns.sessions.get(client_id)
        present = False
        if session is not None:
            if p.clean_start:
                self._end_session(session, now)
                session = None
            else:
                present = True
                session.expires_at = None
                session.pending_will = None      # reconnected within the will delay
        if session is None:
            session = self.new_session(ns, client_id, expiry)
        session.expiry_interval = expiry
        device = identity.device if identity is not None else None
        if quota is not None and quota.get("max_queued") is not None:
            session.queue.max_len = min(self.limits.max_queued, quota["max_queued"])
        # the client's ACL, quotas and rate limits
        channel.acl = acl = auth.client_acl(identity, client_id) if identity is not None else None
        channel.quota = quota
        channel.limit_in, channel.limit_out = auth.limiters(tenant, now)
        if present and (session.device != device or acl is not None or session.read_acl is not None):
            session.device = device
            self._reauthorize(session, acl)
        session.device = device
        if self.persist is not None and (expiry or session.durable):
            session.durable = True
            self.persist.session_opened(session, ns.name, channel.will)
        self.connected += 1
        self.stats.connects += 1
        if self.connected > self.stats.clients_max:
            self.stats.clients_max = self.connected
        self.channels.add(channel)
        ns.channels.add(channel)
        m = ns.m
        m.connects += 1
        if len(ns.channels) > m.connections_max:
            m.connections_max = len(ns.channels)
        ns.connects += 1
        auth.connected_delta(tenant, 1)
        expires = self._credential_expiry(identity, policy)
        if expires is not None:
            channel.valid_until = expires
            self.expiring.add(channel)
        channel.accept(session, present, now, assigned, connack_props)

    def new_session(self, ns: Namespace, client_id: str, expiry: int) -> Session:
        limits = self.limits
        session = Session(client_id, ns, limits.max_queued, limits.max_queued_bytes, expiry, budget=self.budget)
        ns.sessions[client_id] = session
        return session

    def schedule_expiry(self, session: Session) -> None:
        self._schedule(session.expires_at, "expire", session)

    def restore_will(self, ns, rec, session, due, now) -> None:
        """A will found in the store at start: see ``Persistence.restore``."""
        w = rec.will
        if session is None:
            self._publish_will(_Gone(rec.client_id, ns), w, now)
            return
        if due is None:   # the session was connected when the node stopped
            delay = (w.properties or {}).get(P.WILL_DELAY_INTERVAL, 0)
            if not delay:
                self._publish_will(session, w, now)
                return
            due = now + min(delay, session.expiry_interval)
        session.pending_will = (due, w)
        self._schedule(due, "will", session)

    def _credential_expiry(self, identity, policy) -> float | None:
        """Wall-clock time the client's credential expires, if it does."""
        if identity is None or identity.credential is None or policy is None:
            return None
        dev = policy.devices.get(identity.device)
        for cred in dev.credentials if dev is not None else ():
            if cred.id == identity.credential:
                return cred.expires_at
        return None

    def _reauthorize(self, session: Session, acl) -> None:
        """Check a session's subscriptions against the client's (new) ACL:
        those now refused are removed, those allowed in part are checked on
        each delivery."""
        session.read_acl = None
        ns = session.ns
        for sub in list(session.subscriptions.values()):
            if acl is None:
                sub.check = False
                continue
            inner = sub.filter if sub.group is None else sub.filter.split("/", 2)[2]
            if inner.startswith("$SYS"):
                continue                          # system-topic settings, not the ACL
            granted, check = acl.subscribe(inner)
            if not granted:
                del session.subscriptions[sub.filter]
                self._remove_subscription(ns, session, sub)
                if session.durable:
                    self.persist.unsubscribed(session, ns.name, sub.filter)
                continue
            sub.check = check
            if check:
                session.read_acl = acl
        ns.cache.clear()

    def policy_changed(self, tenant: str, old, new, now: float, wall: float) -> None:
        """A tenant's policy changed in the console: enforce it on live clients
        and stored sessions now."""
        ns = self.namespaces.get(tenant)
        if ns is None:
            return
        auth = self.auth
        for ch in list(ns.channels):
            reason = auth.still_valid(ch.identity, wall) if ch.identity is not None else None
            if reason is not None:
                self.stats.revoked += 1
                ch.disconnect(rc.NOT_AUTHORIZED, reason, now)
                continue
            ch.acl = auth.client_acl(ch.identity, ch.client_id) if ch.identity is not None else None
            ch.quota = new.quota if new is not None and new.quota else None
            ch.limit_in, ch.limit_out = auth.limiters(tenant, now)
            expires = self._credential_expiry(ch.identity, new)
            ch.valid_until = expires
            if expires is not None:
                self.expiring.add(ch)
            else:
                self.expiring.discard(ch)
        if new is None:
            # tenant deleted: its sessions and retained messages go too
            for session in list(ns.sessions.values()):
                self._end_session(session, now)
            for topic, _ in list(ns.retained.items()):
                ns.retained.delete(topic)
                if self.persist is not None:
                    self.persist.retained(ns.name, Publish(topic, b"", 0, True))
            return
        for session in list(ns.sessions.values()):
            ch = session.channel
            if ch is not None:
                acl = ch.acl
            elif session.device is None and tenant != self.config.anonymous_tenant:
                continue                         # device unknown: judged when it reconnects
            else:
                acl = auth.client_acl(Identity(tenant, session.device), session.client_id)
            self._reauthorize(session, acl)
            max_queued = new.quota.get("max_queued")
            session.queue.max_len = self.limits.max_queued if max_queued is None else min(
                self.limits.max_queued, max_queued)

    # ------------------------------------------------------ administration

    def end_session(self, session: Session, now: float) -> None:
        self._end_session(session, now)

    def admin_subscribe(self, session: Session, req, now: float) -> int:
        """Subscribe a client on an administrator's behalf (its ACL does not
        apply); -> the granted QoS or a reason code >= 0x80."""
        ns = session.ns
        try:
            shared = parse_shared(req.filter)
        except InvalidTopic:
            return rc.TOPIC_FILTER_INVALID
        if shared is None and not is_valid_filter(req.filter):
            return rc.TOPIC_FILTER_INVALID
        group, inner = shared if shared else (None, req.filter)
        existed = req.filter in session.subscriptions
        sub = Subscription(req.filter, req.qos, req.no_local and group is None, req.retain_as_published,
                           req.retain_handling, None, group)
        self.add_subscription(ns, session, sub)
        if session.durable:
            self.persist.subscribed(session, ns.name, sub)
        ch = session.channel
        if ch is not None and group is None and (req.retain_handling == 0 or (req.retain_handling == 1
                                                                             and not existed)):
            for msg in ns.retained.match(inner):
                if msg.expiry_at is None or now <= msg.expiry_at:
                    ch.deliver(msg, min(msg.qos, req.qos), True, None, now)
        return req.qos

    def admin_unsubscribe(self, session: Session, filt: str, now: float) -> bool:
        sub = session.subscriptions.pop(filt, None)
        if sub is None:
            return False
        self._remove_subscription(session.ns, session, sub)
        if session.durable:
            self.persist.unsubscribed(session, session.ns.name, filt)
        return True

    # ---------------------------------------------------- cluster hand-over

    def release(self, tenant: str, client_id: str, now: float) -> bool:
        """Another node takes this client's session over: disconnect the client
        (0x8E) and let go of the session -- its stored state is the new node's
        to load."""
        ns = self.namespaces.get(tenant)
        session = ns.sessions.get(client_id) if ns is not None else None
        if session is None:
            return False
        self.stats.takeovers += 1
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
        for sub in list(session.subscriptions.values()):
            self._remove_subscription(ns, session, sub)
        session.subscriptions.clear()
        session.queue.drain()
        session.inflight.clear()
        session.expires_at = None
        session.pending_will = None
        session.durable = durable

    def drop_all_sessions(self) -> None:
        """This node leaves (fenced): every session is left to the others."""
        for ns in self.namespaces.values():
            for session in list(ns.sessions.values()):
                self._drop_session(session)

    def publish_gone_will(self, tenant: str, client_id: str, will, now: float) -> None:
        """The will of a client of a node that died (published by a survivor)."""
        ns = self.namespace(tenant)
        self._publish_will(_Gone(client_id, ns), will, now)

    def reauthorize_all(self) -> None:
        """After start-up: restored sessions get their clients' ACLs."""
        for ns in self.namespaces.values():
            for session in ns.sessions.values():
                if session.device is None and ns.name != self.config.anonymous_tenant:
                    continue                     # device unknown: judged when it reconnects
                acl = self.auth.client_acl(Identity(ns.name, session.device), session.client_id)
                if acl is not None:
                    self._reauthorize(session, acl)

    def connect_aborted(self, channel) -> None:
        """A channel closed while its CONNECT was being decided."""

    def _new_client_id(self, ns) -> str:
        while True:
            cid = self._id_prefix + os.urandom(8).hex()
            if cid not in ns.sessions:
                return cid

    def channel_closed(self, channel, now: float, will: bool) -> None:
        session = channel.session
        channel.session = None
        if session.channel is channel:
            session.channel = None
            session.queue.attach_budget(None)
        self.channels.discard(channel)
        self.expiring.discard(channel)
        self.connected -= 1
        st = self.stats
        st.disconnects += 1
        st.msgs_received_closed += channel.msgs_in
        st.msgs_sent_closed += channel.msgs_out
        st.bytes_received_closed += channel.bytes_in
        st.bytes_sent_closed += channel.bytes_out
        ns = session.ns
        ns.channels.discard(channel)
        closed = ns.closed
        closed[0] += channel.msgs_in
        closed[1] += channel.msgs_out
        closed[2] += channel.bytes_in
        closed[3] += channel.bytes_out
        ns.m.closed(channel)
        if self.usage is not None:
            self.usage.connection_closed(channel, ns.name, now)
        self.auth.connected_delta(ns.name, -1)
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
        if self.cluster is not None:
            # a will the node registered for the cluster is no longer owed (nor one it never did)
            self.cluster.client_gone(ns.name, session.client_id, session.expiry_interval == 0, not session.durable)
        if session.expiry_interval == 0:
            self._end_session(session, now)
            return
        if session.expiry_interval != NEVER:
            session.expires_at = now + session.expiry_interval
            self._schedule(session.expires_at, "expire", session)
        if session.durable:
            self.persist.session_closed(session, session.ns.name, now)

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
        self.stats.wills_published += 1
        self._waits = []
        msg = self._will_message(w, session, now)
        if msg.retain:
            self._retain(session.ns, msg)
        self._dispatch(session.ns, msg, now)

    def _end_session(self, session: Session, now: float) -> None:
        ns = session.ns
        if ns.sessions.get(session.client_id) is session:
            del ns.sessions[session.client_id]
        if session.durable:
            self.persist.session_ended(session, ns.name)
            session.durable = False
        for sub in list(session.subscriptions.values()):
            self._remove_subscription(ns, session, sub)
        session.subscriptions.clear()
        if session.pending_will is not None:
            _, w = session.pending_will
            session.pending_will = None
            self._publish_will(session, w, now)
        # Messages owed through shared subscriptions go to another member --
        # except QoS 2 messages already sent, which the member may have
        # processed ([MQTT-4.8.2-5]).
        leftovers = [d for d in session.inflight.values() if d.qos == 1] + session.queue.drain()
        session.inflight.clear()
        session.awaiting_rel.clear()
        session.reserved = None
        for d in leftovers:
            if d.share is not None:
                self._deliver_shared(ns, d.share, d.msg, now, exclude=session)

    # ------------------------------------------------------------------ timers

    def _schedule(self, when: float, kind: str, obj) -> None:
        heapq.heappush(self._timers, (when, next(self._seq), kind, obj))

    def next_timer(self) -> float | None:
        return self._timers[0][0] if self._timers else None

    def tick(self, now: float) -> None:
        """Fire due timers: delayed wills, session expiry, credential expiry."""
        if self.expiring:
            wall = now + self.wall_offset
            for ch in [c for c in self.expiring if c.valid_until is not None and c.valid_until <= wall]:
                self.expiring.discard(ch)
                self.stats.revoked += 1
                ch.disconnect(rc.NOT_AUTHORIZED, "credential expired", now)
        timers = self._timers
        while timers and timers[0][0] <= now:
            when, _, kind, session = heapq.heappop(timers)
            if kind == "will":
                pw = session.pending_will
                if pw is not None and pw[0] == when:
                    session.pending_will = None
                    self._publish_will(session, pw[1], now)
            elif kind == "expire" and session.channel is None and session.expires_at == when:
                self.stats.sessions_expired += 1
                self._end_session(session, now)

    # --------------------------------------------------------------- publish

    def publish(self, msg: Publish, channel, now: float, rel: int = 0) -> int | None:
        """Route a client's PUBLISH; returns the reason code for its ack, or
        None when the ack must wait for the store (``channel.publish_done``
        follows). ``rel``: the packet id of a QoS 2 PUBLISH, to be kept until
        PUBREL."""
        ns = channel.ns
        session = msg.origin = channel.session
        acl = channel.acl
        if acl is not None and (not acl.can_publish(msg.topic) or msg.topic.startswith("$SYS/")):
            self.stats.denied_publish += 1
            ns.m.acl_denied += 1
            if self.usage is not None:
                self.usage.count(ns.name, msg.topic, U_ACL)
            return rc.NOT_AUTHORIZED
        quota = channel.quota
        if quota is not None:
            code = self._publish_quota(ns, msg, quota)
            if code:
                return code
        sampler = self.sampler
        if sampler is not None:
            sampler.n += 1
            if not sampler.n & 63:
                sampler.start(now)
        usage = self.usage
        if usage is not None:
            usage.published(ns.name, msg.topic, msg.qos, len(msg.payload))
        journal = self.journal
        if (journal is None or not msg.qos) and self.cluster is None:
            if msg.retain:
                self._retain(ns, msg)
            if self._dispatch(ns, msg, now):
                return rc.SUCCESS
            self._no_subscribers(ns, msg)
            return rc.NO_MATCHING_SUBSCRIBERS
        if journal is None or not msg.qos:
            return self._publish_clustered(ns, msg, channel, now)
        if not journal.healthy and self._needs_store(ns, msg, session, rel):
            self.stats.dropped_refused += 1
            return STORE_UNAVAILABLE
        before = len(journal.ops)
        if rel and session.durable:
            self.persist.rel_added(session, ns.name, rel)
        if msg.retain:
            self._retain(ns, msg)
        waits = self._waits = []
        code = rc.SUCCESS if self._dispatch(ns, msg, now) else rc.NO_MATCHING_SUBSCRIBERS
        if code:
            self._no_subscribers(ns, msg)
        stored = len(journal.ops) > before
        if not stored and not waits:
            return code
        ack = _AckWhenDurable(channel, msg.packet_id, msg.qos, code, int(stored) + len(waits))
        if stored:
            journal.after_commit(ack)
        if waits:
            self.cluster.wait_for(waits, ack)
        return None

    def _no_subscribers(self, ns: Namespace, msg: Publish) -> None:
        """A client's PUBLISH matched no subscription: counted for the node, the tenant and the usage log."""
        self.stats.dropped_no_subscribers += 1
        ns.m.no_subscribers += 1
        if self.usage is not None:
            self.usage.count(ns.name, msg.topic, U_NO_SUBS)

    def _publish_clustered(self, ns: Namespace, msg: Publish, channel, now: float) -> int | None:
        """A PUBLISH that needs no local store write, on a node of a cluster:
        QoS 1/2 still waits for the nodes that store it for their sessions."""
        if msg.retain:
            self._retain(ns, msg)
        waits = self._waits = []
        code = rc.SUCCESS if self._dispatch(ns, msg, now) else rc.NO_MATCHING_SUBSCRIBERS
        if code:
            self._no_subscribers(ns, msg)
        if not waits or not msg.qos:
            return code
        self.cluster.wait_for(waits, _AckWhenDurable(channel, msg.packet_id, msg.qos, code, len(waits)))
        return None

    def _publish_quota(self, ns: Namespace, msg: Publish, quota: dict) -> int:
        """A tenant quota a PUBLISH breaks: its reason code (0: none)."""
        limit = quota.get("max_payload")
        if limit is not None and len(msg.payload) > limit:
            self.stats.quota_refused += 1
            ns.m.quota += 1
            if self.usage is not None:
                self.usage.count(ns.name, msg.topic, U_QUOTA)
            return rc.PACKET_TOO_LARGE            # the channel disconnects with 0x95
        limit = quota.get("max_retained")
        if (limit is not None and msg.retain and msg.payload and len(ns.retained) >= limit
                and ns.retained.get(msg.topic) is None):
            self.stats.quota_refused += 1
            ns.m.quota += 1
            if self.usage is not None:
                self.usage.count(ns.name, msg.topic, U_QUOTA)
            return rc.QUOTA_EXCEEDED
        return 0

    def _needs_store(self, ns, msg, session, rel) -> bool:
        """Would this QoS 1/2 message have to be written to be acknowledged?"""
        if msg.retain and not msg.topic.startswith("$SYS/") or (rel and session.durable):
            return True
        found = ns.cache.get(msg.topic) or ns.route(msg.topic)
        entries, groups = found
        return any(e[0].durable and e[1] for e in entries) or any(
            s.durable and sub.qos for g in groups for s, sub in g.members.items())

    def publish_internal(self, ns: Namespace, msg: Publish, now: float) -> int:
        """Publish a message the broker itself originates ($SYS, admin); -> deliveries."""
        self._waits = []
        if msg.retain:
            self._retain(ns, msg)
        return self._dispatch(ns, msg, now)

    def _retain(self, ns: Namespace, msg: Publish) -> None:
        if msg.payload:
            ns.retained.set(msg.topic, msg)
        else:
            ns.retained.delete(msg.topic)
        if self.persist is not None:
            self.persist.retained(ns.name, msg)
        if self.cluster is not None:
            self.cluster.retained_changed(ns.name, msg)

    def _dispatch(self, ns: Namespace, msg: Publish, now: float, entries=None, groups=None,
                  local: bool = False) -> int:
        """Deliver to every matching subscriber; -> number of deliveries
        (``local``: this node's plain subscribers only -- a forwarded message)."""
        topic = msg.topic
        if entries is None:
            found = ns.cache.get(topic)
            if found is None:
                found = ns.route(topic)
            entries, groups = found
        origin = msg.origin
        # Needed only here (No Local). Left on the message, it would keep the
        # publisher's Session alive for as long as the message stays queued
        # for offline sessions or retained -- after the publisher has gone.
        msg.origin = None
        mqos = msg.qos
        mretain = msg.retain
        delivered = 0
        for session, qos, no_local, rap, ids in entries:
            if no_local and session is origin:
                if no_local is True:
                    continue
                qos, rap, ids = no_local
            read_acl = session.read_acl
            if read_acl is not None and not read_acl.can_read(topic):
                continue
            if mqos < qos:
                qos = mqos
            if qos and session.durable:
                self._deliver_stored(session, Delivery(msg, qos, mretain if rap else False, ids), msg)
            else:
                ch = session.channel
                if ch is not None:
                    ch.deliver(msg, qos, mretain if rap else False, ids, now)
                else:
                    self._enqueue_offline(session, Delivery(msg, qos, mretain if rap else False, ids))
            delivered += 1
        cluster = self.cluster
        usage = self.usage
        if local:
            if usage is not None and delivered:
                usage.delivered(ns.name, topic, delivered, len(msg.payload))
            return delivered
        if cluster is not None:
            if usage is not None and delivered:
                usage.delivered(ns.name, topic, delivered, len(msg.payload))
            count, waits = cluster.forward(ns, msg, groups, now)
            if waits:
                self._waits.extend(waits)
            return delivered + count
        if groups:
            for group in groups:
                if self._deliver_shared(ns, group, msg, now):
                    delivered += 1
        if usage is not None and delivered:
            usage.delivered(ns.name, topic, delivered, len(msg.payload))
        return delivered

    def receive_forward(self, ns: Namespace, msg: Publish, group: str | None, gfilter: str | None,
                        now: float) -> int:
        """A message another node forwarded: for this node's subscribers only."""
        sampler = self.sampler
        if sampler is not None:
            sampler.n += 1
            if not sampler.n & 63:
                sampler.start(now)
        if group is not None:
            route = ns.trie.get(gfilter)
            g = route.groups.get(group) if route is not None else None
            return int(g is not None and self._deliver_shared(ns, g, msg, now))
        found = ns.cache.get(msg.topic)
        if found is None:
            found = ns.route(msg.topic)
        return self._dispatch(ns, msg, now, found[0], None, local=True)

    def deliver_shared(self, ns, group, msg, now) -> bool:
        return self._deliver_shared(ns, group, msg, now)

    def deliver_to(self, session: Session, msg: Publish, now: float) -> bool:
        """Deliver ``msg`` to this one session, by its own (non-shared)
        subscriptions -- a message that reached it while the session moved
        between nodes (``cluster.node``); -> whether any subscription matched."""
        subs = [s for s in session.subscriptions.values() if s.group is None and matches(s.filter, msg.topic)]
        if not subs:
            return False
        if session.read_acl is not None and not session.read_acl.can_read(msg.topic):
            return False
        if len(subs) == 1:
            s = subs[0]
            qos, rap, ids = s.qos, s.rap, (s.sub_id,) if s.sub_id else None
        else:
            qos, rap, ids = _merge(subs)
        return bool(self._dispatch(session.ns, msg, now, [(session, qos, False, rap, ids)], None, local=True))

    def _deliver_shared(self, ns, group: SharedGroup, msg: Publish, now: float, exclude=None) -> bool:
        session = group.pick(self.config.shared_strategy, exclude)
        if session is None:
            return False
        sub = group.members[session]
        if session.read_acl is not None and not session.read_acl.can_read(msg.topic):
            return False
        qos = msg.qos if msg.qos < sub.qos else sub.qos
        retain = msg.retain if sub.rap else False
        ids = (sub.sub_id,) if sub.sub_id else None
        if qos and session.durable:
            self._deliver_stored(session, Delivery(msg, qos, retain, ids, group), msg)
            return True
        ch = session.channel
        if ch is not None:
            ch.deliver(msg, qos, retain, ids, now, group)
        else:
            self._enqueue_offline(session, Delivery(msg, qos, retain, ids, group))
        return True

    def _deliver_stored(self, session: Session, d: Delivery, msg: Publish) -> None:
        """A QoS 1/2 delivery to a durable session: written to its stored
        queue, sent once that write is durable."""
        stored = msg.stored
        if stored is None:
            stored = msg.stored = self.persist.stored_message(msg)
        self.persist.enqueue(session, session.ns.name, d, stored)
        ch = session.channel
        if ch is not None:
            ch.queue_delivery(d)
            self.gated.add(ch)
        else:
            dropped = session.queue.put(d)
            if dropped:
                self.queue_dropped(session, dropped)

    def _enqueue_offline(self, session: Session, d: Delivery) -> None:
        if d.qos == 0 and not self.limits.queue_qos0:
            self.stats.dropped_queue_full += 1
            session.ns.m.queue_full += 1
            if self.usage is not None:
                self.usage.count(session.ns.name, d.msg.topic, U_QUEUE_FULL)
            return
        dropped = session.queue.put(d)
        if dropped:
            self.queue_dropped(session, dropped)

    def committed(self, generation: int, now: float) -> None:
        """The journal batch ``generation`` is durable: send what waited for it."""
        gated, self.gated = self.gated, set()
        for ch in gated:
            ch.resume_output(now)

    # drop accounting, called by channels
    def queue_dropped(self, session, dropped: list) -> None:
        self.stats.dropped_queue_full += len(dropped)
        session.ns.m.queue_full += len(dropped)
        if self.usage is not None:
            for d in dropped:
                self.usage.count(session.ns.name, d.msg.topic, U_QUEUE_FULL)
        if session.durable:
            for d in dropped:
                if d.entry:
                    self.persist.done(session, session.ns.name, d)

    def discarded(self, session, d: Delivery, expired: bool) -> None:
        """A queued delivery left without being sent: expired, or too large for the client."""
        if expired:
            self.stats.dropped_expired += 1
            session.ns.m.expired += 1
            if self.usage is not None:
                self.usage.count(session.ns.name, d.msg.topic, U_EXPIRED)
        else:
            self.stats.dropped_too_large += 1
            session.ns.m.too_large += 1
        if d.entry and session.durable:
            self.persist.done(session, session.ns.name, d)

    def acked(self, session, d: Delivery) -> None:
        """The client acknowledged a stored delivery (PUBACK / PUBCOMP)."""
        if session.durable:
            self.persist.done(session, session.ns.name, d)

    def released(self, session, d: Delivery) -> None:
        """QoS 2 PUBREC for a stored delivery: PUBREL is now owed."""
        if session.durable:
            self.persist.released(session, session.ns.name, d)

    def rel_done(self, session, pid: int, fn) -> bool:
        """An incoming QoS 2 id was released (PUBREL). For a durable session the
        removal must be durable before PUBCOMP: then ``fn(ok)`` runs after the
        commit and True is returned."""
        if not session.durable:
            return False
        self.persist.rel_removed(session, session.ns.name, pid)
        self.journal.after_commit(fn)
        return True

    def after_commit(self, fn) -> None:
        self.journal.after_commit(fn)

    def durable_pending(self, session) -> bool:
        """Must the client's ack of what just changed in ``session`` wait for the store?"""
        return session.durable and self.journal is not None and bool(self.journal.ops)

    def expired(self, channel, msg) -> None:
        self.stats.dropped_expired += 1

    def too_large(self, channel, msg) -> None:
        self.stats.dropped_too_large += 1
        if channel.ns is not None:
            channel.ns.m.too_large += 1

    def dropped(self, channel, msg, code) -> None:
        self.stats.dropped_refused += 1

    # ------------------------------------------------------------- subscribe

    def subscribe(self, channel, requests, sub_id, props, now: float):
        """-> (reason codes, [(retained msg, qos, sub_ids)] to send after the SUBACK)."""
        session = channel.session
        ns = session.ns
        codes = []
        retained = []
        acl = channel.acl
        quota = channel.quota
        max_subs = quota.get("max_subscriptions") if quota is not None else None
        for req in requests:
            filt = req.filter
            try:
                shared = parse_shared(filt)
            except InvalidTopic:
                codes.append(rc.TOPIC_FILTER_INVALID)
                continue
            if shared is None and not is_valid_filter(filt):
                codes.append(rc.TOPIC_FILTER_INVALID)
                continue
            if shared is not None and req.no_local:
                raise RemoteProtocolError("No Local on a shared subscription")
            group, inner = shared if shared else (None, filt)
            existed = filt in session.subscriptions
            check = False
            if inner.startswith("$SYS/") or inner == "$SYS":
                # a tenant's own $SYS tree: governed by its system-topic settings, not its ACL
                policy = self.auth.policy(ns.name)
                if policy is not None and not policy.sys_enabled:
                    self.stats.denied_subscribe += 1
                    ns.m.acl_denied += 1
                    codes.append(rc.NOT_AUTHORIZED)
                    continue
            elif acl is not None:
                granted, check = acl.subscribe(inner)
                if not granted:
                    self.stats.denied_subscribe += 1
                    ns.m.acl_denied += 1
                    codes.append(rc.NOT_AUTHORIZED)
                    continue
            if max_subs is not None and not existed and len(session.subscriptions) >= max_subs:
                self.stats.quota_refused += 1
                ns.m.quota += 1
                codes.append(rc.QUOTA_EXCEEDED)
                continue
            sub = Subscription(filt, req.qos, req.no_local, req.retain_as_published, req.retain_handling, sub_id,
                               group)
            if check:
                sub.check = True
                session.read_acl = acl
            self.add_subscription(ns, session, sub)
            if session.durable:
                self.persist.subscribed(session, ns.name, sub)
            codes.append(req.qos)
            if group is None and (req.retain_handling == 0 or (req.retain_handling == 1 and not existed)):
                ids = (sub_id,) if sub_id else None
                for msg in ns.retained.match(inner):
                    if msg.expiry_at is not None and now > msg.expiry_at:
                        ns.retained.delete(msg.topic)
                        continue
                    if check and not acl.can_read(msg.topic):
                        continue
                    retained.append((msg, min(msg.qos, req.qos), ids))
        ns.cache.clear()
        return codes, retained

    def add_subscription(self, ns: Namespace, session: Session, sub: Subscription) -> None:
        session.subscriptions[sub.filter] = sub
        inner = sub.filter if sub.group is None else sub.filter.split("/", 2)[2]
        route = ns.trie.setdefault(inner, Route)
        if sub.group is None:
            route.subs[session] = sub
        else:
            g = route.groups.get(sub.group)
            if g is None:
                g = route.groups[sub.group] = SharedGroup(sub.group, inner)
            g.add(session, sub)
        ns.cache.clear()
        if self.cluster is not None:
            self.cluster.route_dirty(ns.name, inner)

    def shared_group(self, ns: Namespace, share: tuple) -> "SharedGroup | None":
        name, filt = share
        route = ns.trie.get(filt)
        return route.groups.get(name) if route is not None else None

    def unsubscribe(self, channel, filters, now: float) -> list:
        session = channel.session
        ns = session.ns
        codes = []
        for filt in filters:
            sub = session.subscriptions.pop(filt, None)
            if sub is None:
                try:
                    valid = parse_shared(filt) is not None or is_valid_filter(filt)
                except InvalidTopic:
                    valid = False
                codes.append(rc.NO_SUBSCRIPTION_EXISTED if valid else rc.TOPIC_FILTER_INVALID)
                continue
            self._remove_subscription(ns, session, sub)
            if session.durable:
                self.persist.unsubscribed(session, ns.name, filt)
            codes.append(rc.SUCCESS)
        ns.cache.clear()
        return codes

    def _remove_subscription(self, ns: Namespace, session: Session, sub: Subscription) -> None:
        inner = sub.filter if sub.group is None else sub.filter.split("/", 2)[2]
        route = ns.trie.get(inner)
        if route is None:
            return
        if sub.group is None:
            route.subs.pop(session, None)
        else:
            g = route.groups.get(sub.group)
            if g is not None:
                g.remove(session)
                if not g.members:
                    del route.groups[sub.group]
        if not route:
            ns.trie.discard(inner)
        ns.cache.clear()
        if self.cluster is not None:
            self.cluster.route_dirty(ns.name, inner)

    # ---------------------------------------------------------------- totals

    def totals(self) -> dict:
        """Messages and bytes in/out since start, closed and live connections together."""
        st = self.stats
        t = {
            "msgs_received": st.msgs_received_closed,
            "msgs_sent": st.msgs_sent_closed,
            "bytes_received": st.bytes_received_closed,
            "bytes_sent": st.bytes_sent_closed,
        }
        for ch in self.channels:
            t["msgs_received"] += ch.msgs_in
            t["msgs_sent"] += ch.msgs_out
            t["bytes_received"] += ch.bytes_in
            t["bytes_sent"] += ch.bytes_out
        return t

    def session_count(self) -> int:
        return sum(len(ns.sessions) for ns in self.namespaces.values())

    def subscription_count(self) -> int:
        return sum(len(s.subscriptions) for ns in self.namespaces.values() for s in ns.sessions.values())

    def retained_count(self) -> int:
        return sum(len(ns.retained) for ns in self.namespaces.values())

    def shutdown(self, now: float, code: int = rc.SERVER_SHUTTING_DOWN, server_reference: str | None = None):
        """Disconnect every client (v5: DISCONNECT ``code``).

        The server closes the network connections, so wills follow the usual
        rules ([MQTT-3.1.2-8]): published now, or kept with a persistent
        session while their delay runs.
        """
        for ch in list(self.channels):
            ch.disconnect(code, "server shutting down", now, will=True, server_reference=server_reference)

    # ---- queries the cluster asks (brokerd.cluster.ports.ClusterBroker)
    # Self-contained: what brokerd/cluster/ needs of the broker besides release,
    # deliver_shared, publish_gone_will and drop_all_sessions -- by tenant and
    # client id, so that the cluster never walks a Namespace (its trie, its
    # sessions, a route's subscribers) nor the persistence or the journal.

    def forwarded(self, tenant: str, msg: Publish, group: str | None, gfilter: str | None, now: float) -> int:
        """A message another node forwarded: for this node's subscribers (or one member of ``group``)."""
        return self.receive_forward(self.namespace(tenant), msg, group, gfilter, now)

    def deliver_to_client(self, tenant: str, client_id: str, msg: Publish, now: float) -> bool:
        """``deliver_to`` the session of ``client_id`` held here, if it is (a session on the move)."""
        ns = self.namespaces.get(tenant)
        session = ns.sessions.get(client_id) if ns is not None else None
        return session is not None and self.deliver_to(session, msg, now)

    def retained_copy(self, tenant: str, topic: str, msg: Publish | None) -> None:
        """Another node's retained message (None: cleared): kept here, neither stored nor announced."""
        ns = self.namespace(tenant)
        if msg is None:
            ns.retained.delete(topic)
        else:
            ns.retained.set(topic, msg)

    def restore_sessions(self, records: list, now: float) -> bool:
        """Stored sessions brought into this node (a takeover, an adoption); False: no store."""
        if self.persist is None:
            return False
        self.persist.restore(self, records, [], now)
        return True

    def disconnect_clients(self, code: int, reason: str, now: float, server_reference: str | None) -> None:
        """Every client disconnected (v5: DISCONNECT ``code``), no will published (a fenced node)."""
        for ch in list(self.channels):
            ch.disconnect(code, reason, now, will=False, server_reference=server_reference)

    def store_refusing(self) -> bool:
        journal = self.journal
        return journal is not None and not journal.healthy

    def writes_pending(self) -> int:
        journal = self.journal
        return len(journal.ops) if journal is not None else 0

    def when_durable(self, fn) -> None:
        """``fn(ok)`` once what was written so far is committed (at once, True, without a store)."""
        if self.journal is not None:
            self.journal.after_commit(fn)
        else:
            fn(True)

    def local_filters(self) -> list[tuple[str, str]]:
        return [(ns.name, filt) for ns in self.namespaces.values() for filt, _ in ns.trie.items()]

    def local_route_counts(self, tenant: str, filt: str) -> tuple[int, int, dict[str, int]]:
        """(subscriptions, of durable sessions, {shared group: members}) on ``filt`` here."""
        ns = self.namespaces.get(tenant)
        route = ns.trie.get(filt) if ns is not None else None
        if route is None:
            return 0, 0, {}
        return (len(route.subs), sum(1 for s in route.subs if s.durable),
                {name: len(g.members) for name, g in route.groups.items()})

    def holds(self, tenant: str, client_id: str) -> bool:
        ns = self.namespaces.get(tenant)
        return ns is not None and client_id in ns.sessions

    def session_filters(self, tenant: str, client_id: str) -> list[str] | None:
        """The filters of the session held here, as subscribed; None: not held here."""
        ns = self.namespaces.get(tenant)
        session = ns.sessions.get(client_id) if ns is not None else None
        return None if session is None else list(session.subscriptions)

    def handoff_filters(self, tenant: str, client_id: str) -> list[str]:
        """The plain (not shared) filters, sorted, of the durable session held here; [] if none."""
        ns = self.namespaces.get(tenant)
        session = ns.sessions.get(client_id) if ns is not None else None
        if session is None or not session.durable:
            return []
        return sorted({sub.filter for sub in session.subscriptions.values() if sub.group is None})

    def connection_counts(self) -> dict[str, int]:
        return {ns.name: len(ns.channels) for ns in self.namespaces.values()}

    def remote_connections(self, counts: dict[str, int]) -> None:
        """Connected clients per tenant on the other nodes (tenant connection quotas count them)."""
        if hasattr(self.auth, "remote_connected"):
            self.auth.remote_connected = counts

    def node_stats(self) -> dict:
        t = self.totals()
        return {"connected": self.connected, "sessions": self.session_count(),
                "subscriptions": self.subscription_count(), "retained": self.retained_count(),
                "msgs_received": t["msgs_received"], "msgs_sent": t["msgs_sent"],
                "bytes_received": t["bytes_received"], "bytes_sent": t["bytes_sent"]}


class _AckWhenDurable:
    """The PUBACK/PUBREC a publisher waits for: sent once every part it waits
    for -- the local commit, each other node that stores the message -- has
    answered (a failure of any part makes it a negative ack)."""

    __slots__ = ("channel", "pid", "qos", "code", "parts", "ok")

    def __init__(self, channel, pid, qos, code, parts: int = 1):
        self.channel = channel
        self.pid = pid
        self.qos = qos
        self.code = code
        self.parts = parts
        self.ok = True

    def __call__(self, ok: bool) -> None:
        self.ok = self.ok and ok
        self.parts -= 1
        if self.parts == 0:
            self.channel.publish_done(self.pid, self.qos, self.code if self.ok else STORE_UNAVAILABLE)


class _Gone:
    """Stands for a session that expired while the node was down, to publish its will."""

    __slots__ = ("client_id", "ns")

    def __init__(self, client_id, ns):
        self.client_id = client_id
        self.ns = ns
