"""The node-local broker: the publish path, and the façade a channel talks to.

Like EMQX's emqx_broker: a PUBLISH is checked (ACL, quotas, the store's
health), matched by the router (``routing.router``), delivered to this node's
subscribers -- straight to their channels, or into their (stored) queues --
and forwarded to the other nodes that have subscribers (``cluster``); its ack
waits for every store that must hold it. Subscriptions go through the same
checks into the router.

The rest is done by the parts it wires together, each in its own module:

- ``registry.ClientRegistry`` -- CONNECT to a session, takeover, wills,
  session expiry, letting a session go to another node (EMQX's emqx_cm);
- ``routing.router.Router`` -- the tenants' subscription tables and the route
  of a topic, and the read-only queries the admin API, ``$SYS`` and the
  metrics use;
- ``tenancy.enforcement.Enforcement`` -- ACLs, quotas and credentials applied
  to live clients and stored sessions;
- ``metrics.accounting.Accounting`` -- what was refused or dropped, counted
  for the node, the tenant and the usage log;
- ``budget`` -- the node's memory budgets.

A channel sees the broker only through ``protocol.ports.ChannelBroker``; the
methods of that port are marked below. Nothing here does I/O or reads a
clock: ``now`` comes from the caller.

Tenants are namespaces: no topic, wildcard, shared subscription or client id
ever crosses from one tenant to another.
"""

import logging
from dataclasses import dataclass, field
from functools import partial

from .budget import MemoryBudget, PreauthBudget
from .delayed import PREFIX as DELAYED_PREFIX
from .delayed import DelayedTopicError, parse_delayed
from .metrics.accounting import Accounting, Stats
from .protocol import reason as rc
from .protocol.channel import ChannelLimits
from .protocol.errors import RemoteProtocolError
from .protocol.packets import Publish, RulePublish, SubscriptionRequest
from .protocol.reason import AFTER_COMMIT, STORE_UNAVAILABLE
from .registry import ClientRegistry
from .routing.router import Namespace, Router, SharedGroup, _merge
from .routing.topic import InvalidTopic, is_valid_filter, matches, parse_shared
from .session.session import Delivery, Session, Subscription
from .tenancy.autosub import for_client
from .tenancy.control import Identity
from .tenancy.enforcement import Enforcement

log = logging.getLogger("brokerd.autosub")

DEFAULT_TENANT = "default"

__all__ = ["DEFAULT_TENANT", "STORE_UNAVAILABLE", "AnonymousAuth", "Broker", "BrokerConfig", "Namespace", "Stats"]


@dataclass(slots=True)
class BrokerConfig:
    node_id: str = "node1"
    allow_anonymous: bool = False
    anonymous_tenant: str = DEFAULT_TENANT
    max_connections: int = 100_000
    shared_strategy: str = "round_robin"      # or "random"
    queue_budget: int = 64 * 1024 * 1024        # bytes queued node-wide before publishers are paused
    limits: ChannelLimits = field(default_factory=ChannelLimits)


class _Publisher:
    """The client that published a delayed message, as the rules see it at its release
    (the client may be gone: its id, user name and ACL are what a rule reads of it)."""

    __slots__ = ("client_id", "username", "peer", "acl", "quota")
    limit_in = None     # no rates to charge a rule's republish to (``publish_rule``): it paid at its publish

    def __init__(self, publisher: tuple, acl, quota=None):
        self.client_id, self.username, _ = publisher
        self.peer = None
        self.acl = acl
        self.quota = quota


class AnonymousAuth:
    """Authentication without a control plane: anonymous clients (any
    credentials accepted) into the default tenant, or nobody. The same
    interface as ``brokerd.tenancy.control.TenantControl``."""

    def __init__(self, allow_anonymous: bool, tenant: str = DEFAULT_TENANT):
        self.allow_anonymous = allow_anonymous
        self.tenant = tenant

    throttling = False                  # it throttles no address: ``admit`` refuses nobody

    def admit(self, peer: str, now: float) -> tuple[int, str] | None:
        return None

    def authenticate(self, connect, channel, now: float, wall: float, replaces=None):
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

    def limiters(self, tenant, now, client_id=None):
        return None, None

    def keep_limiters(self, tenant, client_id, limit_in, limit_out, now) -> None:
        pass

    def still_valid(self, identity, wall):
        return None if self.allow_anonymous else "anonymous access disabled"


class Broker:
    def __init__(self, config: BrokerConfig | None = None, auth=None, now: float = 0.0):
        self.config = config or BrokerConfig()
        self.limits = self.config.limits
        self.auth = auth or AnonymousAuth(self.config.allow_anonymous, self.config.anonymous_tenant)
        self.acct = Accounting(Stats())
        self.router = Router(self.config.shared_strategy)
        self.registry = ClientRegistry(self, self.config.node_id, self.config.max_connections,
                                       self.config.anonymous_tenant)
        self.enforcement = Enforcement(self, self.config.anonymous_tenant)
        self.sampler = None                     # brokerd.metrics.LatencySampler: times one PUBLISH in 64
        self.budget = MemoryBudget(self.config.queue_budget)
        self.preauth = PreauthBudget(self.limits.preauth_budget)  # bytes buffered before CONNECT
        self.started_at = now
        self.persist = None                 # Persistence when a durable store is configured
        self.journal = None                 # its Journal
        self._gated: set = set()            # channels with stored deliveries waiting for a commit
        self.commit_time = 0.0              # when the store writer last said a batch was durable
        self._acks_gen = 0                  # the journal batch _acks_waiting is for
        self._acks_waiting: dict = {}       # channel -> its QoS 1 acks waiting for that batch alone
        self.cluster = None                 # the ClusterNode, when the node is part of a cluster (attach_cluster)
        self.usage = None                   # brokerd.metrics.usage.UsageLog with --usage-dir (attach_usage)
        self._waits: list = []              # requests to other nodes a publish waits for
        self.wall_offset = 0.0              # wall clock = now + wall_offset (set by the server)
        self.clock = lambda: now            # the event loop's clock (set by the server), where no caller gives now
        self._strategy = self.config.shared_strategy
        self.autosub: dict = {}             # tenant -> (tenancy.autosub.AutoSub, ...), tenants that have some
        self.rules: dict = {}               # tenant -> rules.engine.TenantRules, tenants with enabled rules only
        self._dropping = False              # the rules run on a $events/delivery_dropped (_drop_event)
        self.delayed = None                 # delayed.DelayedQueue: $delayed/{seconds}/{topic} (use_delayed)

    def use_store(self, persist) -> None:
        """Mirror durable sessions through ``persist`` (a ``Persistence``)."""
        self.persist = persist
        self.journal = persist.journal

    def use_delayed(self, queue) -> None:
        """Take ``$delayed/...`` messages into ``queue`` (a ``delayed.DelayedQueue``);
        without one they are plain topics."""
        self.delayed = queue

    def attach_cluster(self, node) -> None:
        """The ClusterNode (or None when it leaves): it claims sessions
        (``registry.claims``), hears route changes and forwards messages.
        (Plain attributes, not properties: the publish path reads them.)"""
        self.cluster = node
        self.registry.claims = node
        self.router.on_change = node.route_dirty if node is not None else None

    def attach_usage(self, log) -> None:
        """The usage log (--usage-dir): the publish path and the accounting write to it."""
        self.usage = self.acct.usage = log

    # ------------------------------------------------- the parts, as they were

    @property
    def namespaces(self) -> dict[str, Namespace]:
        return self.router.namespaces

    def namespace(self, name: str) -> Namespace:
        return self.router.namespace(name)

    @property
    def stats(self) -> Stats:
        return self.acct.stats

    @property
    def connected(self) -> int:
        return self.registry.connected

    @property
    def channels(self) -> list:
        return self.registry.channels

    @property
    def route_budget(self):
        return self.router.route_budget

    def add_subscription(self, ns: Namespace, session: Session, sub: Subscription) -> None:
        self.router.add(ns, session, sub)

    def shared_group(self, ns: Namespace, share: tuple) -> "SharedGroup | None":
        return self.router.group(ns, *share)

    def new_session(self, ns: Namespace, client_id: str, expiry: int) -> Session:
        """A session restored from the store (``Persistence.restore``), with its tenant's queue quota."""
        return self.registry.restored_session(ns, client_id, expiry)

    def schedule_expiry(self, session: Session) -> None:
        self.registry.schedule_expiry(session)

    def restore_will(self, ns, rec, session, due, now) -> None:
        self.registry.restore_will(ns, rec, session, due, now)

    def end_session(self, session: Session, now: float) -> None:
        self.registry.end_session(session, now)

    def release(self, tenant: str, client_id: str, now: float) -> bool:
        return self.registry.release(tenant, client_id, now)

    def end_held(self, tenant: str, client_id: str, now: float) -> bool:
        return self.registry.end_held(tenant, client_id, now)

    def drop_all_sessions(self) -> None:
        self.registry.drop_all_sessions()

    def publish_gone_will(self, tenant: str, client_id: str, will, now: float) -> None:
        self.registry.publish_gone_will(tenant, client_id, will, now)

    def reauthorize_all(self, now: float) -> None:
        self.enforcement.reauthorize_all(now)

    def policy_changed(self, tenant: str, old, new, now: float, wall: float) -> None:
        self.enforcement.policy_changed(tenant, old, new, now, wall)

    def policy_steps(self, tenant: str, old, new, now: float, wall: float, clock=None):
        """``policy_changed`` as a generator yielding between short steps of ``clock``
        (``Enforcement.policy_steps``)."""
        return self.enforcement.policy_steps(tenant, old, new, now, wall, clock)

    def next_timer(self) -> float | None:
        return self.registry.next_timer()

    def tick(self, now: float) -> None:
        """Fire due timers: credential expiry, delayed wills, session expiry."""
        self.enforcement.tick(now)
        self.registry.tick(now)

    def shutdown(self, now: float, code: int = rc.SERVER_SHUTTING_DOWN, server_reference: str | None = None):
        """Disconnect every client (v5: DISCONNECT ``code``).

        The server closes the network connections, so wills follow the usual
        rules ([MQTT-3.1.2-8]): published now, or kept with a persistent
        session while their delay runs.
        """
        self.registry.shutdown(now, code, server_reference)

    def session_count(self) -> int:
        return self.router.session_count()

    def subscription_count(self) -> int:
        return self.router.subscription_count()

    def retained_count(self) -> int:
        return self.router.retained_count()

    def totals(self) -> dict:
        """Messages and bytes in/out since start, closed and live connections together."""
        st = self.stats
        # in local variables: each node's heartbeat runs this every second over every connection
        # (20,000 of them: 0.9 ms, against 2.5 adding into the dict)
        m_in, m_out = st.msgs_received_closed, st.msgs_sent_closed
        b_in, b_out = st.bytes_received_closed, st.bytes_sent_closed
        for ns in self.router.namespaces.values():
            for ch in ns.channels:          # not self.channels: that builds a list of them all first
                m_in += ch.msgs_in
                m_out += ch.msgs_out
                b_in += ch.bytes_in
                b_out += ch.bytes_out
        return {"msgs_received": m_in, "msgs_sent": m_out, "bytes_received": b_in, "bytes_sent": b_out}

    # ======================================================= ChannelBroker port
    # (brokerd.protocol.ports: every method a channel calls, and nothing else)

    def admit(self, channel, now: float) -> tuple[int, str] | None:
        """Before anything a connection sent is decoded: (reason code, reason) to
        refuse it with (the failed-login throttle of its address), or None."""
        auth = self.auth
        if not auth.throttling:
            return None              # no address failed a login lately: its address is not even needed
        refusal = auth.admit(channel.peer, now)
        if refusal is not None:
            self.acct.throttled()
        return refusal

    def preauth_charge(self, delta: int) -> bool:
        return self.preauth.charge(delta)

    def connect(self, channel, p, now: float) -> None:
        self.registry.connect(channel, p, now)

    def connect_aborted(self, channel) -> None:
        """A channel closed while its CONNECT was being decided."""

    def channel_closed(self, channel, now: float, will: bool) -> None:
        self.registry.channel_closed(channel, now, will)

    def committed_generation(self) -> int | None:
        journal = self.journal
        return journal.committed if journal is not None else None

    def gate(self, channel) -> None:
        self._gated.add(channel)

    def congestion(self, delta: int) -> None:
        self.budget.add(delta)

    # --------------------------------------------------------------- publish

    def publish(self, msg: Publish, channel, now: float, rel: int = 0) -> int | None:
        """Route a client's PUBLISH; returns the reason code for its ack, or
        None when the ack must wait for the store (``channel.publish_done``
        follows). ``rel``: the packet id of a QoS 2 PUBLISH, to be kept until
        PUBREL."""
        ns = channel.ns
        acl = channel.acl
        topic = msg.topic
        if topic[0] == "$":
            if topic.startswith(DELAYED_PREFIX) and self.delayed is not None:
                return self._publish_delayed(ns, msg, channel, now, rel)
            if topic.startswith("$SYS"):
                # the broker's own tree: no client writes there, whatever its ACL allows (Mosquitto
                # denies it too) -- a client's retained "$SYS/..." would stand in for the broker's
                # values and escape the tenant's max_retained (the broker's $SYS is not counted)
                self.acct.publish_denied(ns, topic)
                self._authz(ns, channel, topic, "publish", "deny", "sys", now)
                return rc.NOT_AUTHORIZED
        # (ClientAcl.allowed: the last topic this client was allowed to publish to)
        if acl is not None and topic != acl.allowed and not acl.can_publish(topic):
            self.acct.publish_denied(ns, topic)
            self._authz(ns, channel, topic, "publish", "deny", "acl", now)
            return rc.NOT_AUTHORIZED
        rules = self.rules
        if rules:
            rules = rules.get(ns.name)
            if rules is not None and rules.on_authz:
                self._authz(ns, channel, topic, "publish", "allow", "default" if acl is None else "acl", now)
        else:
            rules = None
        session = channel.session
        quota = channel.quota
        if quota is not None:
            code = self._publish_quota(ns, msg, quota)
            if code:
                return code
        if rules is not None:
            rules.message(self, ns, msg, channel, now)
        sampler = self.sampler
        if sampler is not None:
            sampler.n += 1
            if not sampler.n & 63:
                sampler.start(now)
        usage = self.usage
        if usage is not None:
            usage.published(ns.name, msg.topic, msg.qos, len(msg.payload))
        journal = self.journal
        mqos = msg.qos
        if journal is None or not mqos or (not rel and journal.healthy):
            # _dispatch, written out for a client's PUBLISH (its publisher, for No Local, is
            # ``session``: msg.origin is not needed). With a store, the store writes a QoS 1
            # message causes (deliveries to stored sessions, a retained message) are counted
            # from ``before``; a QoS 2 one's PUBREL id, and a store that refuses writes, go
            # the other way below.
            before = len(journal.ops) if mqos and journal is not None else 0
            if msg.retain:
                self._retain(ns, msg)
            topic = msg.topic
            found = ns.cache.get(topic)
            if found is None:
                found = ns.route(topic)
            entries, groups = found
            mretain = msg.retain
            delivered = 0
            for sub, qos, no_local, rap, ids in entries:
                if no_local and sub is session:
                    if no_local is True:
                        continue
                    qos, rap, ids = no_local
                read_acl = sub.read_acl
                if read_acl is not None and not read_acl.can_read(topic):
                    continue
                if mqos < qos:
                    qos = mqos
                if qos and sub.durable:
                    self._deliver_stored(sub, msg, qos, mretain if rap else False, ids, None)
                else:
                    ch = sub.channel
                    if ch is not None:
                        ch.deliver(msg, qos, mretain if rap else False, ids, now)
                    else:
                        self._enqueue_offline(sub, Delivery(msg, qos, mretain if rap else False, ids))
                delivered += 1
            cluster = self.cluster
            if cluster is None or not (groups or cluster.moving or ns.name in cluster.remote_tenants):
                # no cluster, or nothing for it to do (Forwarder.forward's own first test: no shared
                # group matched, no other node has a route in this tenant, no session is moving)
                if groups:
                    for group in groups:
                        if self._deliver_shared(ns, group, msg, now):
                            delivered += 1
                if delivered:
                    if usage is not None:
                        usage.delivered(ns.name, topic, delivered, len(msg.payload))
                    code = rc.SUCCESS
                else:
                    self._no_subscribers(ns, msg, channel, now)
                    code = rc.NO_MATCHING_SUBSCRIBERS
                if not mqos or journal is None:
                    return code
                waits = ()
            else:
                # a node of a cluster: the local plain subscribers are counted in the usage log
                # here, the other nodes' by them; the cluster forwards the message and decides
                # the shared groups; QoS 1/2 waits for the nodes that store it
                if usage is not None and delivered:
                    usage.delivered(ns.name, topic, delivered, len(msg.payload))
                count, waits = cluster.forward(ns, msg, groups, now)
                if delivered or count:
                    code = rc.SUCCESS
                else:
                    code = rc.NO_MATCHING_SUBSCRIBERS
                    self._no_subscribers(ns, msg, channel, now)
                if not mqos:
                    return code
                if journal is None:
                    if waits:
                        cluster.wait_for(waits, _AckWhenDurable(channel, msg.packet_id, mqos, code, len(waits)))
                        return None
                    return code
            stored = len(journal.ops) > before
            if not stored and not waits:
                return code                     # (a clean session's QoS 1: nothing written, no node to wait for)
            return self._after_store(journal, channel, msg, code, stored, waits, 0)
        msg.origin = session                # for No Local, in _dispatch
        if not journal.healthy and self._needs_store(ns, msg, session, rel):
            self.acct.store_refused()
            return STORE_UNAVAILABLE
        before = len(journal.ops)
        if rel and session.durable:
            self.persist.rel_added(session, ns.name, rel)
        if msg.retain:
            self._retain(ns, msg)
        waits = self._waits = []
        code = rc.SUCCESS if self._dispatch(ns, msg, now) else rc.NO_MATCHING_SUBSCRIBERS
        if code:
            self._no_subscribers(ns, msg, channel, now)
        return self._after_store(journal, channel, msg, code, len(journal.ops) > before, waits, rel)

    def _after_store(self, journal, channel, msg: Publish, code: int, stored: bool, waits, rel: int) -> int | None:
        """The ack of a QoS 1/2 PUBLISH on a node with a store: now (nothing was
        written for it, no node waited for), after the journal's next commit, or
        once every part (the commit, each node that stores it) answered."""
        if not stored and not waits:
            return code
        if not waits and not rel:
            # the common case: the ack waits for this batch's commit and nothing else.
            # Counted per channel; one callback per batch tells each channel how many
            # of its acks may go (instead of an _AckWhenDurable per PUBLISH)
            waiting = self._acks_waiting
            if self._acks_gen != journal.generation:
                waiting = self._acks_waiting = {}
                self._acks_gen = journal.generation
                journal.after_commit(partial(_acks_committed, waiting))
            waiting[channel] = waiting.get(channel, 0) + 1
            return code | AFTER_COMMIT
        ack = _AckWhenDurable(channel, msg.packet_id, msg.qos, code, int(stored) + len(waits))
        if stored:
            journal.after_commit(ack)
        if waits:
            self.cluster.wait_for(waits, ack)
        return None

    def _publish_delayed(self, ns: Namespace, msg: Publish, channel, now: float, rel: int) -> int | None:
        """``$delayed/{seconds}/{topic}`` (brokerd.delayed): checked as a publish to
        ``topic``, handed to the delayed queue; the ack waits until it is stored."""
        delayed = self.delayed
        try:
            seconds, target = parse_delayed(msg.topic)
        except DelayedTopicError:
            self.acct.publish_denied(ns, msg.topic)
            return rc.DELAYED_TOPIC_INVALID
        msg.topic = target
        msg.head31 = None               # its received bytes carry the $delayed/ topic
        acl = channel.acl
        if acl is not None and not acl.can_publish(target):
            self.acct.publish_denied(ns, target)
            self._authz(ns, channel, target, "publish", "deny", "acl", now)
            return rc.NOT_AUTHORIZED
        self._authz(ns, channel, target, "publish", "allow", "default" if acl is None else "acl", now)
        quota = channel.quota
        if quota is not None:
            code = self._publish_quota(ns, msg, quota)        # its payload; a retained one, the retained cap
            if code:
                return code
        if delayed.full(ns.name, quota):
            delayed.refused += 1
            self.acct.publish_over_quota(ns, target)
            return rc.DELAYED_QUOTA_EXCEEDED
        if not delayed.healthy and msg.qos:
            self.acct.store_refused()
            return STORE_UNAVAILABLE
        usage = self.usage
        if usage is not None:
            usage.published(ns.name, target, msg.qos, len(msg.payload))
        msg.origin = None
        ack = None
        if msg.qos:
            session = channel.session
            durable_rel = rel and session.durable and self.persist is not None
            ack = _AckWhenDurable(channel, msg.packet_id, msg.qos, rc.SUCCESS, 2 if durable_rel else 1)
            if durable_rel:
                self.persist.rel_added(session, ns.name, rel)
                self.journal.after_commit(ack)
        ident = channel.identity
        publisher = (channel.client_id, channel.username, getattr(ident, "device", None))
        delayed.take(ns.name, now + self.wall_offset + seconds, msg, ack, publisher)
        return None if ack is not None else rc.SUCCESS

    def release_delayed(self, tenant: str, msg: Publish, now: float, publisher: tuple | None = None) -> int:
        """A delayed message is due: published in its tenant as the broker's own; -> deliveries.
        The tenant's rules run on it as on its publisher's publish (``publisher``:
        ``(client_id, username, device)``; its ACL as it is now decides a republish);
        a message stored without its publisher (by an older node) runs none."""
        if tenant != self.config.anonymous_tenant and self.auth.policy(tenant) is None:
            # the tenant was deleted (its messages deleted from the store with it, but this one
            # was claimed first, or the node was down then): not into its gone namespace
            if self.delayed is not None:
                self.delayed.dropped += 1
            return 0
        ns = self.namespace(tenant)
        rules = self.rules.get(tenant) if publisher is not None else None
        origin = None
        if rules is not None:
            policy = self.auth.policy(tenant)
            origin = _Publisher(publisher, self.auth.client_acl(Identity(tenant, publisher[2]), publisher[0]),
                                policy.quota or None if policy is not None else None)
            rules.message(self, ns, msg, origin, now)
        delivered = self.publish_internal(ns, msg, now)
        if not delivered:
            self.acct.no_subscribers(ns, msg.topic)
            if origin is not None:
                rules.event("message_dropped", self, ns, origin, now, msg=msg, reason="no_subscribers")
        return delivered

    def _no_subscribers(self, ns: Namespace, msg: Publish, channel, now: float) -> None:
        """A client's PUBLISH matched no subscription: counted for the node, the tenant and the usage log."""
        self.acct.no_subscribers(ns, msg.topic)
        rules = self.rules.get(ns.name)
        if rules is not None:
            rules.event("message_dropped", self, ns, channel, now, msg=msg, reason="no_subscribers")

    def _publish_quota(self, ns: Namespace, msg: Publish, quota: dict) -> int:
        """A tenant quota a PUBLISH breaks: its reason code (0: none)."""
        limit = quota.get("max_payload")
        if limit is not None and len(msg.payload) > limit:
            self.acct.publish_over_quota(ns, msg.topic)
            return rc.PACKET_TOO_LARGE            # the channel disconnects with 0x95
        limit = quota.get("max_retained")
        if (limit is not None and msg.retain and msg.payload and ns.retained.tenant_count >= limit
                and ns.retained.get(msg.topic) is None):
            self.acct.publish_over_quota(ns, msg.topic)
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

    def publish_will(self, ns: Namespace, msg: Publish, now: float, quota: dict | None = None) -> bool:
        """A will, as the registry hands it over (retained if it says so), within the tenant's quota of
        now (``quota``): a payload over ``max_payload`` is not published (the CONNECT was refused if it
        was over then); a retained one past ``max_retained`` is published without being retained (EMQX's
        retainer, full, does the same). Both counted as over quota. -> whether it was published."""
        if quota is not None:
            code = self._publish_quota(ns, msg, quota)
            if code == rc.PACKET_TOO_LARGE:
                return False
            if code:
                msg.retain = False          # (a message of its own: made for this will by the registry)
        self.publish_internal(ns, msg, now)
        return True

    def publish_rule(self, ns: Namespace, msg: Publish, origin, now: float) -> int:
        """A rule's republish, as its triggering client's (``origin``) publish: the tenant's
        quotas on a message (its payload, its retained-messages cap) as for that client's own
        PUBLISH, and its inbound rates -- the republish is charged to the client's buckets (its
        own and the tenant's), so a message that five rules republish costs six messages of the
        rate and the client waits for them as for its own (else the rules multiplied what the
        tenant's rate lets in by up to their number); -> 0 (published) or the reason code it was
        refused with."""
        quota = origin.quota
        if quota is not None:
            code = self._publish_quota(ns, msg, quota)
            if code:
                return code
            limit = origin.limit_in
            if limit is not None:
                limit.charge(1, len(msg.payload) + len(msg.topic), now)
        self.publish_internal(ns, msg, now)
        return 0

    def publish_internal(self, ns: Namespace, msg: Publish, now: float) -> int:
        """Publish a message the broker itself originates ($SYS, admin); -> deliveries. (Nothing waits
        for the nodes it goes to. It may run inside a client's publish -- a rule's republish on a
        delivery that publish dropped, ``_drop_event`` --: the requests that publish waits for,
        ``_waits``, are its own again afterwards.)"""
        outer = self._waits
        self._waits = []
        try:
            if msg.retain:
                self._retain(ns, msg)
            return self._dispatch(ns, msg, now)
        finally:
            self._waits = outer

    def clear_retained(self, ns: Namespace, topic: str) -> None:
        """Take the retained message on ``topic`` out (the admin API's delete): from this node,
        the store and every node's copy -- sent to no subscriber, as a client's empty retained
        PUBLISH would be."""
        self._retain(ns, Publish(topic, b"", 0, True))

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
                self._deliver_stored(session, msg, qos, mretain if rap else False, ids, None)
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

    def redeliver_shared(self, ns, group, msg: Publish, now: float, exclude) -> bool:
        """A message owed through a shared subscription whose session ended (``exclude``; None: one
        that ended while its node was down): to another member -- in a cluster, of any node.
        ``group``: the SharedGroup, or its (name, filter) -- this node may have none. -> whether
        a member was found."""
        name, filt = (group.name, group.filter) if group.__class__ is SharedGroup else group
        cluster = self.cluster
        if cluster is not None:
            return cluster.redeliver(ns.name, name, filt, msg, now, exclude)
        local = self.router.group(ns, name, filt)
        return local is not None and self._deliver_shared(ns, local, msg, now, exclude)

    def group_members(self, tenant: str, name: str, filt: str, exclude=None) -> int:
        """Members of the shared group ``name`` on ``filt`` here, ``exclude`` (a session) not counted;
        negative when none of them is connected (as ``Router.route_counts`` announces them)."""
        ns = self.router.namespaces.get(tenant)
        group = self.router.group(ns, name, filt) if ns is not None else None
        if group is None:
            return 0
        n = len(group.members) - (exclude is not None and exclude in group.members)
        return n if any(s.channel is not None for s in group.order if s is not exclude) else -n

    def deliver_group(self, tenant: str, name: str, filt: str, msg: Publish, now: float, exclude=None) -> bool:
        """To one member here of the shared group ``name`` on ``filt`` but ``exclude``."""
        ns = self.router.namespaces.get(tenant)
        group = self.router.group(ns, name, filt) if ns is not None else None
        return group is not None and self._deliver_shared(ns, group, msg, now, exclude)

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
        session = group.pick(self._strategy, exclude)
        if session is None:
            return False
        sub = group.members[session]
        if session.read_acl is not None and not session.read_acl.can_read(msg.topic):
            return False
        qos = msg.qos if msg.qos < sub.qos else sub.qos
        retain = msg.retain if sub.rap else False
        ids = (sub.sub_id,) if sub.sub_id else None
        if qos and session.durable:
            self._deliver_stored(session, msg, qos, retain, ids, group)
            return True
        ch = session.channel
        if ch is not None:
            ch.deliver(msg, qos, retain, ids, now, group)
        else:
            self._enqueue_offline(session, Delivery(msg, qos, retain, ids, group))
        return True

    def _deliver_stored(self, session: Session, msg: Publish, qos: int, retain: bool, ids, group) -> None:
        """A QoS 1/2 delivery to a durable session: written to its stored
        queue, sent once that write is durable."""
        d = self.persist.enqueue(session, session.ns.name, msg, qos, retain, ids, group)
        ch = session.channel
        if ch is not None:
            ch.queue_delivery(d)
            self._gated.add(ch)
        else:
            dropped = session.queue.put(d)
            if dropped:
                self.queue_dropped(session, dropped, d)

    def _enqueue_offline(self, session: Session, d: Delivery) -> None:
        if d.qos == 0 and not self.limits.queue_qos0:
            self.acct.queue_full(session.ns, [d])
            self._drop_event(session, None, [(d.msg, 0, d.retain)], "qos0_msg")
            return
        dropped = session.queue.put(d)
        if dropped:
            self.queue_dropped(session, dropped, d)

    def commit_done(self, generation: int, now: float) -> None:
        """The journal batch ``generation`` is durable: send what waited for it (the store writer)."""
        self.commit_time = now
        gated, self._gated = self._gated, set()
        for ch in gated:
            ch.resume_output(now)

    # drop accounting, called by channels
    def queue_dropped(self, session, dropped: list, by=None) -> None:
        self.acct.queue_full(session.ns, dropped)
        self._forget_queued(session, dropped)
        if self.rules and (by is None or by.msg.__class__ is not RulePublish):
            # (none for what a rule's message pushed out, here or on the node it was forwarded to: a
            # rule alerting on the event into full queues would raise it again with each alert, from
            # queue to queue and node to node -- one message into 60 full queues of 1,000 ran 60,000
            # events of 60 deliveries each, and held the node 12 s)
            self._drop_event(session, None, [(d.msg, d.qos, d.retain) for d in dropped], "queue_full")

    def _authz(self, ns, channel, topic: str, action: str, result: str, source: str, now: float) -> None:
        """``$events/client_check_authz_complete`` of a PUBLISH or a SUBSCRIBE filter decided, for the
        tenant's rules (``source``: acl, default -- no ACL applies --, sys)."""
        rules = self.rules.get(ns.name)
        if rules is not None and rules.on_authz:
            rules.event("client_check_authz_complete", self, ns, channel, now, topic=topic, action=action,
                        result=result, authz_source=source)

    def _drop_event(self, session, channel, deliveries: list, reason: str) -> None:
        """``$events/delivery_dropped`` for the tenant's rules: messages a client was owed that it
        will not get. One dict lookup when the tenant has no rule."""
        ns = session.ns if session is not None else channel.ns
        if ns.name not in self.rules:
            return
        # not for a message a rule made: a rule republishing this event would feed itself
        deliveries = [d for d in deliveries if d[0].__class__ is not RulePublish]
        if not deliveries:
            return
        if self._dropping:
            return          # (raised by what the rules do on a drop: not run inside it)
        self._dropping = True
        try:
            rules = self.rules[ns.name]
            # (the broker's clock: the paths that drop -- a queue's put, a send -- have no now)
            rules.delivery_dropped(self, ns, session, channel, deliveries, reason, self.clock())
        finally:
            self._dropping = False

    def offline_client(self, tenant: str, session):
        """The client of an offline ``session``, as a rule reads it: its id, no user name, its
        device's ACL (to judge a rule's republish)."""
        device = session.device
        acl = self.auth.client_acl(Identity(tenant, device), session.client_id)
        policy = self.auth.policy(tenant)
        return _Publisher((session.client_id, None, device), acl, policy.quota or None if policy is not None else None)

    def _forget_queued(self, session, dropped: list) -> None:
        """Deliveries taken out of ``session``'s queue unsent: out of its stored queue, their packet ids free."""
        if session.durable:
            for d in dropped:
                if d.entry:
                    self.persist.done(session, session.ns.name, d)
        reserved = session.reserved
        if reserved:
            # (one sent before, waiting to go again past the client's Receive Maximum, kept its id)
            for d in dropped:
                reserved.discard(d.pid)

    def queue_denied(self, session, denied: list, now: float) -> None:
        """Queued deliveries taken out because the client may no longer read their topics. Those
        owed through a shared subscription go to another member of the group, as when a member's
        session ends (``ClientRegistry.end_session``) -- except a QoS 2 one sent before, which the
        client may have processed ([MQTT-4.8.2-5])."""
        self._forget_queued(session, denied)
        ns = session.ns
        lost = []
        for d in denied:
            if d.share is None or (d.qos == 2 and d.dup) or not self.redeliver_shared(ns, d.share, d.msg, now, session):
                lost.append(d)
        if lost:
            self.acct.delivery_denied(ns, lost)

    def discarded(self, session, d: Delivery, expired: bool) -> None:
        """A queued delivery left without being sent: expired, or too large for the client."""
        if expired:
            self.acct.expired(session.ns, d.msg.topic)
        else:
            self.acct.too_large(session.ns)
        self._drop_event(session, None, [(d.msg, d.qos, d.retain)], "expired" if expired else "too_large")
        if d.entry and session.durable:
            self.persist.done(session, session.ns.name, d)
        elif d.pid and session.reserved:
            session.reserved.discard(d.pid)     # (one sent before, waiting past the Receive Maximum)

    def acked(self, session, d: Delivery) -> None:
        """The client acknowledged a stored delivery (PUBACK / PUBCOMP)."""
        if session.durable:
            self.persist.done(session, session.ns.name, d)

    def message_acked(self, channel, d: Delivery, now: float) -> None:
        """``$events/message_acked`` for the tenant's rules (the channel asks only while some tenant
        has rules); not for a message a rule made: a rule republishing it would feed itself."""
        rules = self.rules.get(channel.ns.name)
        if rules is not None and d.msg.__class__ is not RulePublish:
            rules.event("message_acked", self, channel.ns, channel, now, msg=d.msg, qos=d.qos, retain=d.retain)

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

    def rel_refused(self, session, pid: int) -> None:
        """A QoS 2 PUBLISH answered with a negative PUBREC: its id is free again. Its
        stored copy goes too -- written when the id was taken, in a batch that may have
        failed and be retried (the store unavailable: 0x83): left in the store, it would
        make the client's next message under that id a "copy" after a restart, never delivered."""
        if session.durable:
            self.persist.rel_removed(session, session.ns.name, pid)

    def after_commit(self, fn) -> None:
        self.journal.after_commit(fn)

    def durable_pending(self, session) -> bool:
        """Must the client's ack of what just changed in ``session`` wait for the store?"""
        return session.durable and self.journal is not None and bool(self.journal.ops)

    def expired(self, channel, msg, retain: bool) -> None:
        self.acct.expired(None, None)       # (counted for the node only, as ever)
        self._drop_event(None, channel, [(msg, 0, retain)], "expired")

    def too_large(self, channel, msg, qos: int, retain: bool) -> None:
        self.acct.too_large(channel.ns)
        self._drop_event(None, channel, [(msg, qos, retain)], "too_large")

    def dropped(self, channel, msg, code) -> None:
        self.acct.store_refused()

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
        rules = self.rules.get(ns.name)
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
                source = "sys"
                policy = self.auth.policy(ns.name)
                if policy is not None and not policy.sys_enabled:
                    self.acct.subscribe_denied(ns)
                    self._authz(ns, channel, filt, "subscribe", "deny", source, now)
                    codes.append(rc.NOT_AUTHORIZED)
                    continue
            elif acl is not None:
                source = "acl"
                granted, check = acl.subscribe(inner)
                if not granted:
                    self.acct.subscribe_denied(ns)
                    self._authz(ns, channel, filt, "subscribe", "deny", source, now)
                    codes.append(rc.NOT_AUTHORIZED)
                    continue
            else:
                source = "default"
            if rules is not None and rules.on_authz:
                self._authz(ns, channel, filt, "subscribe", "allow", source, now)
            if max_subs is not None and not existed and len(session.subscriptions) >= max_subs:
                self.acct.subscription_over_quota(ns)
                codes.append(rc.QUOTA_EXCEEDED)
                continue
            sub = Subscription(filt, req.qos, req.no_local, req.retain_as_published, req.retain_handling, sub_id,
                               group)
            if check:
                sub.check = True
                session.read_acl = acl
            self.router.add(ns, session, sub)
            if session.durable:
                self.persist.subscribed(session, ns.name, sub)
            codes.append(req.qos)
            if rules is not None:
                rules.event("session_subscribed", self, ns, channel, now, topic=filt, qos=req.qos)
            # (a filter naming one topic with no retained message -- most devices' -- costs a lookup,
            # not a walk and its feed)
            if (group is None and (req.retain_handling == 0 or (req.retain_handling == 1 and not existed))
                    and ("+" in inner or "#" in inner or ns.retained.get(inner) is not None)):
                ids = (sub_id,) if sub_id else None
                retained.append((filt, _retained_for(ns, inner, req.qos, ids, acl if check else None, now)))
        if ns.cache:
            ns.cache.clear()
        return codes, retained

    def auto_subscribe(self, channel, entries, now: float) -> None:
        """A tenant's auto-subscriptions for a client that just connected: each
        one goes through ``subscribe`` as if the client had sent it (ACL, quota,
        persistence, retained messages per its retain handling)."""
        identity = channel.identity
        device = identity.device if identity is not None else None
        for entry, filt in for_client(entries, device, channel.session.client_id):
            req = SubscriptionRequest(filt, entry.qos, entry.no_local, entry.rap, entry.rh)
            codes, retained = self.subscribe(channel, [req], None, None, now)
            if codes[0] >= 0x80:
                log.info("tenant %s: auto-subscription %d of %r to %r refused (reason 0x%02x)",
                         channel.ns.name, entry.id, channel.session.client_id, filt, codes[0])
                continue
            channel.send_retained(retained, now)

    def deliver_retained(self, channel, msg: Publish, qos: int, sub_ids, now: float) -> None:
        """A retained message a subscription matched, sent as it is made. To a stored
        session a QoS 1/2 one goes through its stored queue, as any delivery to it: it
        is part of the session's state until acknowledged (sent again with DUP by the
        node the session moves to, or after a restart) and its packet id is reserved
        in the store. (Straight to the channel it was in this node's memory alone.)"""
        acl = channel.acl
        if acl is not None and not acl.can_read(msg.topic) and not msg.topic.startswith("$SYS"):
            return                  # (the feed was made with the ACL of its SUBSCRIBE: the client's changed since)
        session = channel.session
        if qos and session.durable and self.persist is not None:
            self._deliver_stored(session, msg, qos, True, sub_ids, None)
        else:
            channel.deliver(msg, qos, True, sub_ids, now)

    def retained_owed(self, session: Session, feed: list, now: float) -> None:
        """A connection closed before it took every retained message its new subscriptions were
        owed (``Channel.send_retained``), and its session lives on: what is left goes to the
        session's queue as any message for a disconnected client (a stored session's QoS 1/2 ones
        to its stored queue), sent when the client is back, here or on another node. Only while
        the queue has room: a subscription matching millions of retained messages queues at most
        ``--max-queued`` of them (as Mosquitto's ``max_queued_messages``); the first that does
        not fit is counted as a queue overflow and the rest are not sent. One expired since the
        SUBSCRIBE (the feed judged expiry then) is not queued: it would take the room of one
        that can be sent."""
        queue = session.queue
        stored = session.durable and self.persist is not None
        qos0 = self.limits.queue_qos0
        for filt, it in feed:
            if filt not in session.subscriptions:
                continue
            for msg, qos, ids in it:
                if not qos and not qos0:
                    continue
                if msg.expiry_at is not None and now > msg.expiry_at:
                    continue
                if queue.full(len(msg.payload)):
                    self.acct.queue_full(session.ns, [Delivery(msg, qos, True, ids)])
                    self._drop_event(session, None, [(msg, qos, True)], "queue_full")
                    return
                if qos and stored:
                    self._deliver_stored(session, msg, qos, True, ids, None)
                else:
                    dropped = queue.put(Delivery(msg, qos, True, ids))
                    if dropped:
                        self.queue_dropped(session, dropped)

    def unsubscribe(self, channel, filters, now: float) -> list:
        session = channel.session
        ns = session.ns
        codes = []
        rules = self.rules.get(ns.name)
        for filt in filters:
            sub = session.subscriptions.pop(filt, None)
            if sub is None:
                try:
                    valid = parse_shared(filt) is not None or is_valid_filter(filt)
                except InvalidTopic:
                    valid = False
                codes.append(rc.NO_SUBSCRIPTION_EXISTED if valid else rc.TOPIC_FILTER_INVALID)
                continue
            self.router.remove(ns, session, sub)
            if session.durable:
                self.persist.unsubscribed(session, ns.name, filt)
            codes.append(rc.SUCCESS)
            if rules is not None:
                rules.event("session_unsubscribed", self, ns, channel, now, topic=filt, qos=sub.qos)
        ns.cache.clear()
        return codes

    # ------------------------------------------------------ administration

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
        self.router.add(ns, session, sub)
        if session.durable:
            self.persist.subscribed(session, ns.name, sub)
        ch = session.channel
        if ch is not None and group is None and (req.retain_handling == 0 or (req.retain_handling == 1
                                                                             and not existed)):
            ch.send_retained([(req.filter, _retained_for(ns, inner, req.qos, None, None, now))], now)
        return req.qos

    def admin_unsubscribe(self, session: Session, filt: str, now: float) -> bool:
        sub = session.subscriptions.pop(filt, None)
        if sub is None:
            return False
        self.router.remove(session.ns, session, sub)
        if session.durable:
            self.persist.unsubscribed(session, session.ns.name, filt)
        return True

    # ================================================= ClusterBroker port
    # (brokerd.cluster.ports: what the cluster's parts ask of the broker besides
    # release, deliver_shared, publish_gone_will and drop_all_sessions -- by
    # tenant and client id; the cluster never walks a namespace, the
    # persistence or the journal)

    def forwarded(self, tenant: str, msg: Publish, group: str | None, gfilter: str | None, now: float) -> int:
        """A message another node forwarded: for this node's subscribers (or one member of ``group``)."""
        return self.receive_forward(self.namespace(tenant), msg, group, gfilter, now)

    def deliver_to_client(self, tenant: str, client_id: str, msg: Publish, now: float) -> bool:
        """``deliver_to`` the session of ``client_id`` held here, if it is (a session on the move)."""
        session = self.router.session(tenant, client_id)
        return session is not None and self.deliver_to(session, msg, now)

    def retained_copy(self, tenant: str, topic: str, msg: Publish | None) -> None:
        """Another node's retained message (None: cleared): kept here, neither stored nor announced."""
        retained = self.namespace(tenant).retained
        if msg is None:
            retained.delete(topic)
        else:
            retained.set(topic, msg)

    def tenant_gone(self, tenant: str) -> bool:
        """Whether the control plane says ``tenant`` does not exist (False when it cannot say)."""
        return self.enforcement.tenant_gone(tenant)

    def forget_gone_tenants(self, now: float) -> None:
        """What this node holds of tenants that do not exist goes (their deletion was not seen here)."""
        for ns in list(self.router.namespaces.values()):
            if self.enforcement.tenant_gone(ns.name):
                self.enforcement.policy_changed(ns.name, None, None, now, now + self.wall_offset)

    def restore_sessions(self, records: list, now: float) -> bool:
        """Stored sessions brought into this node (a takeover, an adoption); False: no store."""
        if self.persist is None:
            return False
        self.persist.restore(self, records, [], now)
        return True

    def discard_stored(self, tenant: str, client_id: str) -> None:
        """A CONNECT with Clean Start of a session this node does not hold (another node let go
        of it, or it awaits adoption): the stored session -- subscriptions, queue, messages in
        flight both ways -- is over, before the new one is opened ([MQTT-3.1.2-4]). (Left in
        the store, the session's next CONNECT without Clean Start on another node loaded it.)"""
        if self.persist is not None:
            self.persist.session_ended(tenant, client_id)

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
        return self.router.local_filters()

    def local_route_counts(self, tenant: str, filt: str) -> tuple[int, int, dict[str, int]]:
        """(subscriptions, of durable sessions, {shared group: members}) on ``filt`` here."""
        return self.router.route_counts(tenant, filt)

    def holds(self, tenant: str, client_id: str) -> bool:
        return self.router.session(tenant, client_id) is not None

    def holds_connected(self, tenant: str, client_id: str) -> bool:
        """Whether ``client_id``'s client is connected here (counted in its tenant's connections)."""
        return self.registry.replaces(tenant, client_id)

    def quota_refused(self, tenant: str) -> None:
        """A CONNECT of ``tenant`` refused 0x97 by its claim: counted with the tenant's quota refusals."""
        self.acct.connect_refused(self.router.namespace(tenant))

    def holds_stored(self, tenant: str, client_id: str) -> bool:
        """Whether a session of ``client_id`` in the store is on this node."""
        session = self.router.session(tenant, client_id)
        return session is not None and session.durable

    def session_filters(self, tenant: str, client_id: str) -> list[str] | None:
        """The filters of the session held here, as subscribed; None: not held here."""
        session = self.router.session(tenant, client_id)
        return None if session is None else list(session.subscriptions)

    def handoff_filters(self, tenant: str, client_id: str) -> list[str]:
        """The plain (not shared) filters, sorted, of the durable session held here; [] if none."""
        session = self.router.session(tenant, client_id)
        if session is None or not session.durable:
            return []
        return sorted({sub.filter for sub in session.subscriptions.values() if sub.group is None})

    def connection_counts(self) -> dict[str, int]:
        """Connected clients per tenant here, for the cluster's sums -- a tenant with a connection
        quota that no device of has reached this node included, at 0: its total over the other
        nodes is read all the same (the quota counts every node; without it, a node new to the
        tenant admitted devices up to the whole quota on its own)."""
        counts = self.router.connection_counts()
        for slug, policy in getattr(self.auth, "policies", {}).items():
            if slug not in counts and policy.quota.get("max_connections") is not None:
                counts[slug] = 0
        return counts

    def remote_connections(self, counts: dict[str, int]) -> None:
        """Connected clients per tenant on the other nodes (tenant connection quotas count them)."""
        if hasattr(self.auth, "remote_connected"):
            self.auth.remote_connected = counts

    def host_shares(self, others: dict[str, int], workers: int, now: float, claims=None) -> None:
        """A worker (--workers): each tenant's connections on its host's other workers, their claims
        on its rates, and how many live workers the host has -- the tenants' rates are the host's
        (``TenantControl.host_shares``)."""
        if hasattr(self.auth, "host_shares"):
            self.auth.host_shares(others, workers, now, claims)

    def rate_weights(self, now: float) -> dict[str, dict[str, float]]:
        """A worker: its claims on its tenants' host-wide rates (``TenantControl.rate_weights``)."""
        return self.auth.rate_weights(now) if hasattr(self.auth, "rate_weights") else {}

    def tenant_stats(self) -> dict[str, dict]:
        """Each tenant's figures on this node, for its host's ``$SYS/broker`` trees (--workers)."""
        out = {}
        for f in self.router.all_figures():
            m = f.counters
            received, sent, bytes_in, bytes_out = f.closed
            for ch in f.live:
                received += ch.msgs_in
                sent += ch.msgs_out
                bytes_in += ch.bytes_in
                bytes_out += ch.bytes_out
            out[f.name] = {"connected": f.connected, "sessions": f.sessions, "subscriptions": f.subscriptions,
                           "retained": f.retained, "msgs_received": received, "msgs_sent": sent,
                           "bytes_received": bytes_in, "bytes_sent": bytes_out, "inflight": f.inflight,
                           "queued": f.queued, "connects": f.connects, "clients_max": m.connections_max,
                           "dropped": m.queue_full + m.expired + m.too_large}
        return out

    def node_stats(self) -> dict:
        t = self.totals()
        return {"connected": self.connected, "sessions": self.session_count(),
                "subscriptions": self.subscription_count(), "retained": self.retained_count(),
                "msgs_received": t["msgs_received"], "msgs_sent": t["msgs_sent"],
                "bytes_received": t["bytes_received"], "bytes_sent": t["bytes_sent"]}


def _retained_for(ns: Namespace, inner: str, qos: int, ids, acl, now: float):
    """The retained messages a new subscription to ``inner`` is sent, as (message, QoS, subscription
    ids), made one at a time as the subscriber's connection takes them (``Channel.send_retained``):
    a subscription to ``#`` among millions of retained messages neither builds a list of them nor
    overflows the session's queue. ``acl``: the client's ACL, when it must be asked per topic."""
    retained = ns.retained
    for msg in retained.iter_match(inner):
        if msg.expiry_at is not None and now > msg.expiry_at:
            if retained.get(msg.topic) is msg:
                retained.delete(msg.topic)
            continue
        if acl is not None and not acl.can_read(msg.topic):
            continue
        yield msg, (msg.qos if msg.qos < qos else qos), ids


def _acks_committed(waiting: dict, ok: bool) -> None:
    """A batch is durable (or failed): the acks that waited for it alone may go."""
    for channel, n in waiting.items():
        channel.acks_committed(n, ok)


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
