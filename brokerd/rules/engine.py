"""The rules of every tenant, as the broker runs them.

``RuleEngine.apply`` takes a tenant's rules from its policy snapshot
(``"rules": [{"id", "sql", "action", "config", "enabled"}]``) and compiles
each rule once (a rule whose statement and action did not change keeps its
compiled form and its counters). ``RuleEngine.active`` -- the dict the broker
holds as ``Broker.rules`` -- has an entry only for tenants with at least one
enabled rule, so a tenant without rules costs the publish path one dict
lookup that misses.

Rules run on the node that received the message, after its ACL and quota
checks passed, before it is delivered; a rule's failure (an evaluation error,
a refused republish) is counted and never reaches the publisher. Counters
per rule and per node: ``matched`` (the FROM matched), ``passed`` (WHERE was
true and the action done), ``no_result`` (WHERE was not true), ``failed``,
``last_error`` and ``last_error_at`` (wall-clock seconds); webhook rules also
``sent``, ``retried``, ``dropped``; store rules ``stored`` (rows written to the
landing zone) and ``dropped`` (rows the full buffer or a failed write lost).
"""

import logging

from ..protocol import reason as rc
from ..protocol.properties import USER_PROPERTY
from ..routing.cache import CacheBudget, TopicCache
from ..routing.trie import TopicTrie
from .actions import ActionError, build
from .context import Context
from .errors import EVENTS, RuleEvalError, RuleSyntaxError

log = logging.getLogger("brokerd.rules")


MAX_ERROR = 300          # characters of a rule's last_error


class RuleState:
    __slots__ = ("id", "sql", "kind", "config", "enabled", "rule", "action", "broken", "matched", "passed",
                 "no_result", "failed", "last_error", "last_error_at", "sent", "retried", "dropped", "stored")

    def __init__(self, spec: dict):
        self.id = int(spec["id"])
        self.sql = spec["sql"]
        self.kind = spec.get("action", "republish")
        self.config = spec.get("config") or {}
        self.enabled = bool(spec.get("enabled", True))
        self.rule = self.action = self.broken = None
        self.matched = self.passed = self.no_result = self.failed = self.sent = self.retried = self.dropped = 0
        self.stored = 0
        self.last_error = self.last_error_at = None
        from .compiler import compile_rule  # sqlglot: loaded by the first rule a node gets (errors.py)

        try:
            self.rule = compile_rule(self.sql)
            self.action = build(self.kind, self.config)
        except (RuleSyntaxError, ActionError) as exc:
            # the console validates before it stores: this is a node older or newer than the console
            self.broken = str(exc)
            self.last_error = f"not loaded: {exc}"

    def same(self, spec: dict) -> bool:
        return (self.sql, self.kind, self.config) == (spec["sql"], spec.get("action", "republish"),
                                                      spec.get("config") or {})

    def fail(self, error: str, wall: float) -> None:
        self.failed += 1
        if len(error) > MAX_ERROR:
            # (a function's message may quote its argument: float() of a 512 KiB payload quoted all of it,
            # and every node's admin API sent it, the console's Rules page showed it)
            error = error[:MAX_ERROR - 3] + "..."
        self.last_error = error
        self.last_error_at = wall

    def view(self) -> dict:
        return {"id": self.id, "sql": self.sql, "action": self.kind, "config": self.config,
                "enabled": self.enabled, "loaded": self.broken is None, "matched": self.matched,
                "passed": self.passed, "no_result": self.no_result, "failed": self.failed,
                "last_error": self.last_error, "last_error_at": self.last_error_at,
                **self._action_counters()}

    def _action_counters(self) -> dict:
        if self.kind == "webhook":
            return {"sent": self.sent, "retried": self.retried, "dropped": self.dropped}
        if self.kind == "store":
            return {"stored": self.stored, "dropped": self.dropped}
        return {}


# which rules a topic matches, remembered per tenant: bounded in bytes (a tenant with one rule, flooding
# 3,000 distinct 60 KB topics, held 180 MB when this was 4,096 topics), topics over 512 characters never
# remembered (routing.cache); every tenant's table together at most RULE_CACHE_NODE_BYTES
RULE_CACHE_BYTES = 1 << 20
RULE_CACHE_NODE_BYTES = 32 << 20


class TenantRules:
    """One tenant's enabled rules, sorted by what they read; which rules a topic
    matches is worked out once per topic (``_by_topic``), so rules on other
    topics cost a PUBLISH one dict lookup, not one filter match each."""

    __slots__ = ("tenant", "on_topics", "on_events", "on_authz", "_by_topic", "_trie", "webhook", "telemetry")

    def __init__(self, tenant: str, states: list, webhook=None, telemetry=None, budget: CacheBudget | None = None):
        self.tenant = tenant
        self.webhook = webhook
        self.telemetry = telemetry
        live = [s for s in states if s.enabled and s.broken is None]
        self.on_topics = tuple(s for s in live if s.rule.topics)
        # every FROM filter of the tenant's rules -> the positions of its rules in on_topics: a topic
        # not yet seen costs a walk of its levels, not a match of every filter (20 rules of 800
        # filters each: ~15 ms a topic, and a device publishing distinct topics held the event loop)
        self._trie = TopicTrie()
        for i, s in enumerate(self.on_topics):
            for f in s.rule.topics:
                self._trie.setdefault(f, list).append(i)
        self.on_events = {e: tuple(s for s in live if e in s.rule.events) for e in EVENTS}
        self.on_authz = self.on_events["client_check_authz_complete"]     # (the publish path tests it)
        self._by_topic = TopicCache(RULE_CACHE_BYTES, budget)

    def matching(self, topic: str) -> tuple:
        found = self._by_topic.get(topic)
        if found is None:
            hits = self._trie.match(topic)
            if not hits:
                found = ()
            elif len(hits) == 1 and len(hits[0]) == 1:
                found = (self.on_topics[hits[0][0]],)
            else:
                on = self.on_topics
                found = tuple(on[i] for i in sorted({i for h in hits for i in h}))
            self._by_topic.put(topic, found, 100 + 8 * len(found))     # its dict slot and tuple
        return found

    # ---- the broker's hook points

    def message(self, broker, ns, msg, channel, now: float) -> None:
        """A client's PUBLISH, accepted by the ACL and quotas."""
        states = self._by_topic.get(msg.topic)
        if states is None:
            states = self.matching(msg.topic)
        if not states:
            return
        ctx = _message_context(broker, msg, channel, now)
        for s in states:
            self._run(s, ctx, broker, ns, channel, now)

    def event(self, name: str, broker, ns, channel, now: float, **fields) -> None:
        """``client_connected``, ``client_disconnected``, ``session_subscribed`` and
        ``session_unsubscribed`` (``topic``, ``qos``), ``message_dropped`` (``msg``, ``reason``)."""
        states = self.on_events.get(name)
        if not states:
            return
        msg = fields.pop("msg", None)
        if name == "client_disconnected" and "reason" not in fields:
            fields["reason"] = disconnect_reason(getattr(channel, "close_reason", None))
        ctx = Context("$events/" + name, clientid=channel.client_id, username=channel.username,
                      timestamp=_wall_ms(broker, now), peerhost=_host(channel.peer), node=broker.config.node_id,
                      **fields)
        if msg is not None:
            # (the delivery's QoS and retain flag, when given: message_acked)
            ctx.topic, ctx.raw = msg.topic, msg.payload
            if ctx.qos is None:
                ctx.qos = msg.qos
            if ctx.retain is None:
                ctx.retain = msg.retain
            props = msg.properties
            if props:
                ctx.props = props.get(USER_PROPERTY)
        for s in states:
            self._run(s, ctx, broker, ns, channel, now)

    def delivery_dropped(self, broker, ns, session, channel, deliveries, reason: str, now: float) -> None:
        """Messages a client's session was owed and will never get (``reason``: ``queue_full``,
        ``qos0_msg`` -- a QoS 0 message for an offline session that queues none --, ``expired``,
        ``too_large``). ``clientid`` and the others are the receiver's; its ``username`` and
        ``peerhost`` are NULL while it is offline (a rule's republish is judged by its ACL)."""
        states = self.on_events.get("delivery_dropped")
        if not states:
            return
        if channel is None:
            channel = session.channel if session is not None else None
        if channel is None:
            channel = broker.offline_client(ns.name, session)
        ms = _wall_ms(broker, now)
        for msg, qos, retain in deliveries:
            props = msg.properties
            ctx = Context("$events/delivery_dropped", msg.topic, msg.payload, channel.client_id, channel.username,
                          qos, retain, ms, props.get(USER_PROPERTY) if props else None, _host(channel.peer),
                          reason, broker.config.node_id)
            for s in states:
                self._run(s, ctx, broker, ns, channel, now)

    def _run(self, s: RuleState, ctx, broker, ns, channel, now: float) -> None:
        s.matched += 1
        try:
            row = s.rule.run(ctx)
        except RuleEvalError as exc:
            s.fail(str(exc), now + broker.wall_offset)
            return
        if row is None:
            s.no_result += 1
            return
        try:
            out = s.action.message(row, ctx, channel.acl)
        except ActionError as exc:
            s.fail(str(exc), now + broker.wall_offset)
            return
        except Exception as exc:      # a value the message cannot carry (a lone surrogate from json_decode...)
            s.fail(f"{type(exc).__name__}: {exc}", now + broker.wall_offset)
            return
        if s.kind == "webhook":
            if self.webhook is None:
                s.fail("this node sends no webhooks", now + broker.wall_offset)
                return
            self.webhook(self.tenant, out, s)     # queued: the sender counts sent / failed / dropped
        elif s.kind == "store":
            if self.telemetry is None:
                s.fail("this node stores no telemetry (it runs without --usage-dir)", now + broker.wall_offset)
                return
            self.telemetry(self.tenant, out, s)   # queued: the writer counts stored / dropped
        else:
            code = broker.publish_rule(ns, out, channel, now)
            if code:
                s.fail(f"the tenant's quota refuses the republish to {out.topic!r} (reason code 0x{code:02x}: "
                       f"{'payload too large' if code == 0x95 else 'retained messages cap reached'})",
                       now + broker.wall_offset)
                return
        s.passed += 1


# why a client left, in EMQX's words for $events/client_disconnected (others: the reason code's name)
_EMQX_REASONS = {0x8D: "keepalive_timeout", 0x8E: "takenover", 0x98: "kicked"}


def disconnect_reason(close_reason) -> str:
    """``Channel.close_reason`` ((code, text), set before the broker hears of the close) -> ``reason``."""
    if close_reason is None:
        return "unknown"
    code, text = close_reason
    if text == "client disconnected":          # its DISCONNECT, whatever its code (EMQX: normal)
        return "normal"
    if text == "connection lost":              # the socket closed without a DISCONNECT
        return "tcp_closed"
    found = _EMQX_REASONS.get(code)
    if found is not None:
        return found
    return rc.NAMES.get(code, f"0x{code:02x}").replace(" ", "_")


def _wall_ms(broker, now: float) -> int:
    return int((now + broker.wall_offset) * 1000)


def _host(peer) -> str | None:
    if not peer:
        return None
    host, sep, _ = str(peer).rpartition(":")
    return host.strip("[]") if sep else str(peer)


def _message_context(broker, msg, channel, now: float) -> Context:
    props = msg.properties
    return Context("message.publish", msg.topic, msg.payload, channel.client_id, channel.username, msg.qos,
                   msg.retain, _wall_ms(broker, now), props.get(USER_PROPERTY) if props else None, _host(channel.peer),
                   None, broker.config.node_id)


class RuleEngine:
    """Every tenant's rules on this node; ``active`` is ``Broker.rules``."""

    def __init__(self, active: dict | None = None, webhook=None, telemetry=None):
        """``webhook(tenant, WebhookRequest, RuleState)``: queues a request off the
        publish path (``brokerd.integrations.webhook.WebhookSender.submit``);
        ``telemetry(tenant, TelemetryRecord, RuleState)`` likewise a row
        (``brokerd.integrations.telemetry.TelemetryWriter.submit``; None: the node
        has no landing zone and store rules fail)."""
        self.active: dict = active if active is not None else {}
        self.webhook = webhook
        self.telemetry = telemetry
        self.states: dict[str, dict[int, RuleState]] = {}
        self.cache_budget = CacheBudget(RULE_CACHE_NODE_BYTES)

    def compile_ahead(self, tenant: str, specs: list | None) -> dict:
        """The rules of ``specs`` that ``apply`` would compile (new or changed), compiled: ~0.1 s
        for a 16 KiB statement, so the node runs this in a thread, off its event loop (a tenant
        saving 40 of them held the loop for a second). Reads ``states`` only."""
        old = self.states.get(tenant, {})
        ready = {}
        for spec in specs or ():
            prev = old.get(int(spec["id"]))
            if prev is None or not prev.same(spec):
                ready[int(spec["id"])] = RuleState(spec)
        return ready

    def apply(self, tenant: str, specs: list | None, ready: dict | None = None) -> None:
        """The tenant's rules from its new snapshot (None or []: none; a deleted tenant);
        ``ready``: what ``compile_ahead`` compiled of them."""
        old = self.states.get(tenant, {})
        new: dict[int, RuleState] = {}
        for spec in specs or ():
            prev = old.get(int(spec["id"]))
            if prev is not None and prev.same(spec):
                prev.enabled = bool(spec.get("enabled", True))
                new[prev.id] = prev
            else:
                state = ready.get(int(spec["id"])) if ready else None
                if state is None or not state.same(spec):
                    state = RuleState(spec)
                state.enabled = bool(spec.get("enabled", True))
                new[int(spec["id"])] = state
                if state.broken:
                    log.error("tenant %s, rule %s: %s", tenant, state.id, state.broken)
        if new:
            self.states[tenant] = new
        else:
            self.states.pop(tenant, None)
        table = TenantRules(tenant, list(new.values()), self.webhook, self.telemetry, self.cache_budget)
        if table.on_topics or any(table.on_events.values()):
            self.active[tenant] = table
        else:
            self.active.pop(tenant, None)

    def view(self, tenant: str) -> list[dict]:
        return [s.view() for s in sorted(self.states.get(tenant, {}).values(), key=lambda s: s.id)]
