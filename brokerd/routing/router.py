"""The router: each tenant's subscription table, the route of a topic, shared groups.

After EMQX's emqx_router and the subscriber tables of emqx_broker, in one
process. A tenant is a :class:`Namespace`; a topic filter maps to a
:class:`Route` (its plain subscribers and its ``$share`` groups) in the
namespace's trie; the route of a topic -- every subscriber it reaches,
merged per session -- is cached per topic, bounded in bytes. The router
decides who; delivering is the broker's (``brokerd.broker``), forwarding to
other nodes the cluster's.

The admin API, ``$SYS``, the metrics and the cluster read the tenants through
the query methods at the end of :class:`Router`; nothing outside the broker
walks a namespace.
"""

import random
from collections.abc import Iterator
from types import MappingProxyType

from ..metrics.counters import TenantCounters
from ..session.session import Session, Subscription
from .cache import CacheBudget, TopicCache
from .retained import RetainedStore
from .trie import TopicTrie

# Route cache bounds (see Namespace): bytes per namespace and per node, and the estimated
# bytes of an entry besides its topic (dict slot, result tuple, lists) and per subscriber in it.
# A 30-character topic with no subscriber measured 188 bytes besides the string (tracemalloc).
ROUTE_CACHE_BYTES = 32 * 1024 * 1024
ROUTE_CACHE_NODE_BYTES = 128 * 1024 * 1024
ROUTE_ENTRY_COST = 200
ROUTE_SUB_COST = 96

# the shared groups of a route that has none (most): one read-only mapping, a dict from the first group
_NO_GROUPS = MappingProxyType({})
_NO_SUBS = MappingProxyType({})


class OneSub:
    """The plain subscribers of a route that has one (a device on a topic of its own,
    the common case): read as the dict would be (``items``, iteration, ``len``, ``in``,
    ``get``), 48 bytes instead of a one-entry dict's 224. ``Router.add`` makes it a
    dict when a second session subscribes."""

    __slots__ = ("session", "sub")

    def __init__(self, session: Session, sub: Subscription):
        self.session = session
        self.sub = sub

    def items(self):
        return ((self.session, self.sub),)

    def values(self):
        return (self.sub,)

    def __iter__(self):
        return iter((self.session,))

    def __len__(self):
        return 1

    def __contains__(self, session) -> bool:
        return session is self.session

    def get(self, session, default=None):
        return self.sub if session is self.session else default


class Route:
    """What a topic filter maps to: plain subscribers (no one: a shared empty
    mapping; one: a :class:`OneSub`; more: a dict by session) and shared groups."""

    __slots__ = ("subs", "groups")

    def __init__(self):
        self.subs: dict[Session, Subscription] | OneSub = _NO_SUBS
        self.groups: dict[str, SharedGroup] = _NO_GROUPS

    def __bool__(self):
        return bool(self.subs) or bool(self.groups)

    def add_sub(self, session: Session, sub: Subscription) -> None:
        subs = self.subs
        if type(subs) is dict:
            subs[session] = sub
        elif not subs or subs.session is session:
            self.subs = OneSub(session, sub)
        else:
            self.subs = {subs.session: subs.sub, session: sub}

    def remove_sub(self, session: Session) -> None:
        subs = self.subs
        if type(subs) is dict:
            subs.pop(session, None)
            if not subs:
                self.subs = _NO_SUBS
        elif session in subs:
            self.subs = _NO_SUBS


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

    def connected(self) -> bool:
        """Whether a member is connected (``pick`` would not fall back to an offline one)."""
        return any(s.channel is not None for s in self.order)


class Namespace:
    """One tenant's space on this node: nothing in it is ever matched,
    delivered or looked up across tenants.

    Who owns what: the router owns ``trie``, ``cache`` and ``retained``
    (subscriptions and matching); the client registry owns ``sessions``
    (client id -> session), ``channels`` and ``connects``; the accounting
    owns ``m`` and ``closed``. Outside brokerd's core, a namespace is read
    through :class:`Router`'s queries, never walked.

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

    def reset_counters(self) -> None:
        """Counters from zero: the namespace outlives its tenant, and a tenant made again under a
        deleted one's name must not take over what the deleted one did."""
        self.closed = [0, 0, 0, 0]
        self.connects = 0
        self.m = TenantCounters()

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


def inner_filter(sub: Subscription) -> str:
    """The filter a subscription matches with (``$share/GROUP/`` taken off)."""
    return sub.filter if sub.group is None else sub.filter.split("/", 2)[2]


class Router:
    """The tenants' namespaces and their subscription tables.

    ``on_change(tenant, filter)`` (the cluster's route announcements, when
    the node is in one) hears of every filter whose local subscribers changed,
    and of a shared group's filter whose member here connected or went offline
    (``presence_changed``).
    """

    def __init__(self, shared_strategy: str = "round_robin"):
        self.namespaces: dict[str, Namespace] = {}
        self.route_budget = CacheBudget(ROUTE_CACHE_NODE_BYTES)   # the route caches of every namespace
        self.strategy = shared_strategy
        self.on_change = None

    def namespace(self, name: str) -> Namespace:
        ns = self.namespaces.get(name)
        if ns is None:
            ns = self.namespaces[name] = Namespace(name, self.route_budget)
        return ns

    # ------------------------------------------------------- subscription table

    def add(self, ns: Namespace, session: Session, sub: Subscription) -> None:
        session.subscriptions[sub.filter] = sub
        inner = inner_filter(sub)
        route = ns.trie.setdefault(inner, Route)
        if sub.group is None:
            route.add_sub(session, sub)
        else:
            g = route.groups.get(sub.group)
            if g is None:
                if route.groups is _NO_GROUPS:
                    route.groups = {}
                g = route.groups[sub.group] = SharedGroup(sub.group, inner)
            g.add(session, sub)
        if ns.cache:                 # (an empty cache holds nothing to let go of)
            ns.cache.clear()
        if self.on_change is not None:
            self.on_change(ns.name, inner)

    def remove(self, ns: Namespace, session: Session, sub: Subscription) -> None:
        """Take ``sub`` out of the table (the session's own dict is the caller's)."""
        inner = inner_filter(sub)
        route = ns.trie.get(inner)
        if route is None:
            return
        if sub.group is None:
            route.remove_sub(session)
        else:
            g = route.groups.get(sub.group)
            if g is not None:
                g.remove(session)
                if not g.members:
                    del route.groups[sub.group]
        if not route:
            ns.trie.discard(inner)
        if ns.cache:                 # (an empty cache holds nothing to let go of)
            ns.cache.clear()
        if self.on_change is not None:
            self.on_change(ns.name, inner)

    def presence_changed(self, ns: Namespace, session: Session) -> None:
        """``session``'s client connected or went: its shared groups' filters are announced again
        (the other nodes send a group's messages to a node with a member online first)."""
        if self.on_change is not None:
            for sub in session.subscriptions.values():
                if sub.group is not None:
                    self.on_change(ns.name, inner_filter(sub))

    def remove_all(self, ns: Namespace, session: Session) -> None:
        """Every subscription of ``session`` out of the table, and out of the session."""
        for sub in list(session.subscriptions.values()):
            self.remove(ns, session, sub)
        session.subscriptions.clear()

    def group(self, ns: Namespace, name: str, filt: str) -> "SharedGroup | None":
        route = ns.trie.get(filt)
        return route.groups.get(name) if route is not None else None

    def pick(self, group: "SharedGroup", exclude=None) -> Session | None:
        return group.pick(self.strategy, exclude)

    # ------------------------------------------------------------------ queries

    def tenant_names(self) -> list[str]:
        return list(self.namespaces)

    def has_tenant(self, name: str) -> bool:
        return name in self.namespaces

    def sessions(self, tenant: str | None = None) -> Iterator[tuple[str, Session]]:
        """(tenant, session) of one tenant, or of every tenant."""
        if tenant is not None:
            ns = self.namespaces.get(tenant)
            spaces = [ns] if ns is not None else []
        else:
            spaces = list(self.namespaces.values())
        for ns in spaces:
            for session in list(ns.sessions.values()):
                yield ns.name, session

    def session(self, tenant: str, client_id: str) -> Session | None:
        ns = self.namespaces.get(tenant)
        return ns.sessions.get(client_id) if ns is not None else None

    def retained_items(self, tenant: str):
        """(topic, message) of each message retained in ``tenant``, made as they are taken."""
        ns = self.namespaces.get(tenant)
        return ns.retained.items() if ns is not None else iter(())

    def retained_message(self, tenant: str, topic: str):
        ns = self.namespaces.get(tenant)
        return ns.retained.get(topic) if ns is not None else None

    def figures(self, tenant: str) -> "TenantFigures | None":
        ns = self.namespaces.get(tenant)
        return TenantFigures(ns) if ns is not None else None

    def all_figures(self) -> list["TenantFigures"]:
        return [TenantFigures(ns) for ns in list(self.namespaces.values())]

    def local_filters(self) -> list[tuple[str, str]]:
        """(tenant, filter) of every route this node has."""
        return [(ns.name, filt) for ns in self.namespaces.values() for filt, _ in ns.trie.items()]

    def route_counts(self, tenant: str, filt: str) -> tuple[int, int, dict]:
        """This node's (subscriptions, those of stored sessions, {shared group: members}) for ``filt``;
        a group none of whose members here is connected counts them negative (-members): the other
        nodes send its messages here only when no node has a member online."""
        ns = self.namespaces.get(tenant)
        route = ns.trie.get(filt) if ns is not None else None
        if route is None:
            return 0, 0, _NO_GROUPS
        groups = route.groups
        # no shared group (the usual route): one read-only empty mapping, not a dict per route announced
        return (len(route.subs), sum(1 for s in route.subs if s.durable),
                {name: len(g.members) if g.connected() else -len(g.members) for name, g in groups.items()}
                if groups else _NO_GROUPS)

    def connection_counts(self) -> dict[str, int]:
        return {ns.name: len(ns.channels) for ns in self.namespaces.values()}

    def session_count(self) -> int:
        return sum(len(ns.sessions) for ns in self.namespaces.values())

    def subscription_count(self) -> int:
        return sum(len(s.subscriptions) for ns in self.namespaces.values() for s in ns.sessions.values())

    def retained_count(self) -> int:
        return sum(len(ns.retained) for ns in self.namespaces.values())


class TenantFigures:
    """A tenant's figures on this node, read at one moment ($SYS, metrics)."""

    __slots__ = ("name", "counters", "closed", "connects", "connected", "sessions", "subscriptions", "retained",
                 "inflight", "queued", "live")

    def __init__(self, ns: Namespace):
        self.name = ns.name
        self.counters: TenantCounters = ns.m
        self.closed = tuple(ns.closed)          # msgs in, msgs out, bytes in, bytes out of closed channels
        self.connects = ns.connects
        self.connected = len(ns.channels)
        sessions = list(ns.sessions.values())
        self.sessions = len(sessions)
        self.subscriptions = sum(len(s.subscriptions) for s in sessions)
        self.retained = ns.retained.tenant_count
        self.inflight = sum(len(s.inflight) for s in sessions)
        self.queued = sum(len(s.queue) for s in sessions)
        self.live = list(ns.channels)           # connected channels (their own running counts)

