"""Tenancy on live clients: their ACL, quotas and rate limits, re-checked
when the console changes a tenant's policy, and their credentials' expiry.

The control plane (``control.TenantControl``) says what a client may do;
this module applies it to what the node holds: a connecting client gets its
ACL, quota and limiters; a resumed session's subscriptions are checked
against the client's ACL of now (those refused are removed, those granted in
part are checked on each delivery); a policy change disconnects clients whose
credentials are no longer valid and re-checks every session of the tenant;
a deleted tenant's sessions and retained messages go. Pure: ``now``, the
wall clock and ``policy_steps``' pacing clock come from the caller.
"""

from typing import Protocol

from ..protocol import reason as rc
from ..protocol.packets import Publish
from .control import Identity

UNKNOWN = object()          # the device of a will whose session is not known here (a dead node's client)
# policy_steps: the event loop's longest wait while a tenant's connections and sessions are judged again
STEP_SECONDS = 0.005


class EnforcementBroker(Protocol):
    """What enforcement reaches, through the broker."""

    auth: object            # TenantControl (or the broker's AnonymousAuth)
    router: object          # brokerd.routing.router.Router
    registry: object        # brokerd.registry.ClientRegistry: end_session
    persist: object         # brokerd.persistence.Persistence, or None
    acct: object            # brokerd.metrics.accounting.Accounting
    limits: object
    wall_offset: float

    def queue_denied(self, session, denied: list, now: float) -> None:
        """Queued deliveries taken out: the client may no longer read their topics (shared ones go
        to another member of their group)."""


class Enforcement:
    def __init__(self, broker: EnforcementBroker, anonymous_tenant: str):
        self.b = broker
        self.anonymous_tenant = anonymous_tenant
        self.expiring: set = set()          # channels whose credential expires while connected

    # ------------------------------------------------------------ connections

    def connected(self, channel, session, identity, policy, quota, present: bool, now: float) -> None:
        """A CONNECT is accepted into ``session``: the client's ACL, quota and
        rate limits; a resumed session re-checked against that ACL."""
        auth = self.b.auth
        device = identity.device if identity is not None else None
        channel.acl = acl = auth.client_acl(identity, session.client_id) if identity is not None else None
        channel.quota = quota
        channel.limit_in, channel.limit_out = auth.limiters(session.ns.name, now, session.client_id)
        if present and (session.device != device or acl is not None or session.read_acl is not None):
            session.device = device
            self.reauthorize(session, acl, now)
        session.device = device
        expires = credential_expiry(identity, policy)
        if expires is not None:
            channel.valid_until = expires
            self.expiring.add(channel)

    def will_allowed(self, tenant: str, device, client_id: str, topic: str) -> bool:
        """May a client's will go to ``topic``? Asked at CONNECT and again when the
        will is published, with the tenant's policy of then: a will is a PUBLISH the
        client asked for, decided as one (``Broker.publish``). A deleted or suspended
        tenant's wills go nowhere, nor those of a device deleted or disabled since;
        ``device`` UNKNOWN (a will of a client of a dead node): the tenant is checked,
        the ACL was at its CONNECT."""
        if topic.startswith("$SYS"):
            return False                    # the broker's own tree (as for a PUBLISH: Broker.publish)
        auth = self.b.auth
        policy = auth.policy(tenant)
        if policy is None:
            # no control plane (AnonymousAuth): one tenant, everything allowed
            return tenant == self.anonymous_tenant
        if not policy.active:
            return False                    # a suspended tenant's devices publish nothing
        if device is UNKNOWN or (device is None and tenant != self.anonymous_tenant):
            return True                     # (a session stored without its device: judged at its CONNECT)
        if device is not None and getattr(policy, "devices", None) is not None:
            dev = policy.devices.get(device)
            if dev is None or not dev.enabled:
                return False                # a device deleted or disabled since: nor does it
        acl = auth.client_acl(Identity(tenant, device), client_id)
        return acl is None or acl.can_publish(topic)

    def tenant_gone(self, tenant: str) -> bool:
        """The control plane's first load is in and ``tenant`` is not in it (no control plane: never)."""
        auth = self.b.auth
        return getattr(auth, "loaded", False) and tenant != self.anonymous_tenant and auth.policy(tenant) is None

    def closed(self, channel, tenant: str, now: float) -> None:
        self.expiring.discard(channel)
        if channel.limit_in is not None or channel.limit_out is not None:
            # what it spent (or owes) stays with its client id: reconnecting does not refill its buckets
            self.b.auth.keep_limiters(tenant, channel.client_id, channel.limit_in, channel.limit_out, now)

    def tick(self, now: float) -> None:
        """Disconnect clients whose credential expired while they were connected."""
        if not self.expiring:
            return
        wall = now + self.b.wall_offset
        for ch in [c for c in self.expiring if c.valid_until is not None and c.valid_until <= wall]:
            self.expiring.discard(ch)
            self.b.acct.stats.revoked += 1
            ch.disconnect(rc.NOT_AUTHORIZED, "credential expired", now, will=False)

    # ---------------------------------------------------------------- sessions

    def reauthorize(self, session, acl, now: float, queued: bool = True) -> None:
        """Check a session's subscriptions against the client's (new) ACL:
        those now refused are removed, those allowed in part are checked on
        each delivery."""
        b = self.b
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
                b.router.remove(ns, session, sub)
                if session.channel is not None:
                    session.channel.stop_retained({sub.filter})     # nor the rest of its retained messages
                if session.durable:
                    b.persist.unsubscribed(session, ns.name, sub.filter)
                continue
            sub.check = check
            if check:
                session.read_acl = acl
        ns.cache.clear()
        if queued and acl is not None and session.queue:
            # what was queued for it before: a message on a topic it may no longer read is not sent
            # either (nor one of a subscription just removed, unless another still allows it) -- but a
            # QoS 2 one sent before, waiting to go again: the client holds its packet id until the
            # exchange ends, and a new message under that id would be taken for it ([MQTT-4.3.3])
            denied = session.queue.remove(lambda d: not (d.qos == 2 and d.dup) and not d.msg.topic.startswith("$SYS")
                                          and not acl.can_read(d.msg.topic))
            if denied:
                b.queue_denied(session, denied, now)

    def reauthorize_all(self, now: float) -> None:
        """After start-up: restored sessions get their clients' ACLs."""
        auth = self.b.auth
        for tenant, session in self.b.router.sessions():
            if session.device is None and tenant != self.anonymous_tenant:
                continue                     # device unknown: judged when it reconnects
            acl = auth.client_acl(Identity(tenant, session.device), session.client_id)
            if acl is not None:
                self.reauthorize(session, acl, now)

    def policy_changed(self, tenant: str, old, new, now: float, wall: float) -> None:
        """A tenant's policy changed in the console: enforce it on live clients
        and stored sessions now."""
        for _ in self.policy_steps(tenant, old, new, now, wall):
            pass

    def policy_steps(self, tenant: str, old, new, now: float, wall: float, clock=None):
        """``policy_changed`` in steps: a generator that yields every ``STEP_SECONDS`` or so of
        ``clock`` (a monotonic clock; None: no steps), for the poller to let the event loop run between. A change of a tenant's ACL judges every connection
        and stored session of it again (its ACL compiled for each: 0.7-1 s of the loop with 20,000
        connected and 20 rules, every tenant waiting) -- a tenant's administrator saving ACL rules
        again and again would stop the node. Connections and sessions gone meanwhile are skipped;
        new ones were let in under the new policy already."""
        b = self.b
        ns = b.router.namespaces.get(tenant)
        if ns is None:
            return
        if old is None and new is not None:
            # the tenant appears while the slug's namespace is here: the namespace is a deleted
            # tenant's of the same name (or held only refused logins): its figures are not this one's
            ns.reset_counters()
        auth = b.auth
        changed = new.changed_devices if new is not None and old is not None else None
        if changed is not None:
            self._devices_changed(ns, changed, new, now, wall)
            return
        if clock is None:
            def clock() -> float:
                return 0.0
        until = clock() + STEP_SECONDS
        channels = ns.channels
        for n, ch in enumerate(list(channels)):
            if n & 31 == 31 and clock() > until:
                yield
                until = clock() + STEP_SECONDS
            if ch not in channels:
                continue                         # gone while the loop ran
            reason = auth.still_valid(ch.identity, wall) if ch.identity is not None else None
            if reason is not None:
                b.acct.stats.revoked += 1
                # without its will: the will is a PUBLISH of a client whose rights just ended (as
                # Mosquitto's dynsec kicks a deleted or disabled client); a stored session keeps none
                ch.disconnect(rc.NOT_AUTHORIZED, reason, now, will=False)
                continue
            ch.acl = auth.client_acl(ch.identity, ch.client_id) if ch.identity is not None else None
            ch.quota = new.quota if new is not None and new.quota else None
            auth.keep_limiters(tenant, ch.client_id, ch.limit_in, ch.limit_out, now)
            ch.limit_in, ch.limit_out = auth.limiters(tenant, now, ch.client_id)
            self._expires(ch, new)
        if new is None:
            self._tenant_deleted(ns, now)
            return
        limits = b.limits
        # the queues are looked through only when the rules changed (a new device, a quota: not again)
        acl_changed = old is None or old.acl != new.acl or old.default_allow != new.default_allow
        sessions = ns.sessions
        for n, session in enumerate(list(sessions.values())):
            if n & 31 == 31 and clock() > until:
                yield
                until = clock() + STEP_SECONDS
            if sessions.get(session.client_id) is not session:
                continue                         # ended (or taken over) while the loop ran
            ch = session.channel
            if ch is not None:
                acl = ch.acl
            elif session.device is None and tenant != self.anonymous_tenant:
                continue                         # device unknown: judged when it reconnects
            else:
                acl = auth.client_acl(Identity(tenant, session.device), session.client_id)
            self.reauthorize(session, acl, now, acl_changed)
            max_queued = new.quota.get("max_queued")
            session.queue.max_len = limits.max_queued if max_queued is None else min(limits.max_queued, max_queued)

    def _devices_changed(self, ns, changed: frozenset, new, now: float, wall: float) -> None:
        """Only devices changed (``changed``, their names): the connections of those devices are judged
        again, and nothing else is touched -- every other connection's rights, limits and stored
        session are what they were. (A change of one device of a tenant with 20,000 connected cost the
        node's loop 0.69 s: every connection's ACL compiled again and every session's subscriptions
        checked; bench/policy_change.py.)"""
        if not changed:
            return
        auth = self.b.auth
        for ch in [ch for ch in ns.channels if ch.identity is not None and ch.identity.device in changed]:
            reason = auth.still_valid(ch.identity, wall)
            if reason is not None:
                self.b.acct.stats.revoked += 1
                ch.disconnect(rc.NOT_AUTHORIZED, reason, now, will=False)     # (no will: policy_changed)
                continue
            self._expires(ch, new)

    def _expires(self, ch, policy) -> None:
        """When the connection's credential runs out under ``policy`` (``tick`` ends it then)."""
        expires = credential_expiry(ch.identity, policy)
        ch.valid_until = expires
        if expires is not None:
            self.expiring.add(ch)
        else:
            self.expiring.discard(ch)

    def _tenant_deleted(self, ns, now: float) -> None:
        """Its sessions, retained and delayed messages go too."""
        b = self.b
        delayed = getattr(b, "delayed", None)
        if delayed is not None:
            delayed.forget(ns.name)
        for session in list(ns.sessions.values()):
            b.registry.end_session(session, now)
        for topic, _ in list(ns.retained.items()):
            ns.retained.delete(topic)
            if b.persist is not None:
                b.persist.retained(ns.name, Publish(topic, b"", 0, True))


def credential_expiry(identity, policy) -> float | None:
    """Wall-clock time the client's credential expires, if it does."""
    if identity is None or identity.credential is None or policy is None:
        return None
    dev = policy.devices.get(identity.device)
    for cred in dev.credentials if dev is not None else ():
        if cred.id == identity.credential:
            return cred.expires_at
    return None
