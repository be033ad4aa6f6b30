"""Delayed publish: ``$delayed/{seconds}/{topic}`` (EMQX's and kin-mqtt-broker's).

A client publishes to ``$delayed/15/x/y``; the broker checks it as a publish
to ``x/y`` (the client's ACL on ``x/y``, its tenant's payload limit), keeps it
in the store with a due time, acknowledges it once it is stored, and
publishes it to ``x/y`` in the client's tenant 15 seconds later -- with its
QoS, retain flag and MQTT 5 properties (a Message Expiry Interval counts from
then), as the broker itself (No Local does not apply).

The interval is whole seconds, ``0 .. MAX_INTERVAL`` (4294967, EMQX's; about
49.7 days, so the due time in milliseconds fits 32 bits as in EMQX). Where
EMQX drops a ``$delayed`` message it cannot parse without telling the
client, a refusal here is an answer: a malformed topic gets Topic Name
invalid (0x90) and a tenant over its cap Quota exceeded (0x97) in the
PUBACK/PUBREC of MQTT 5, and a 3.x client (no negative acknowledgement
there) is disconnected, so that it never takes a message that will never be
published for delivered. QoS 0 refusals are dropped and counted.

This module is pure (the broker's side): it parses topics, counts each
tenant's pending messages and gathers what publishers sent for the asyncio
writer (``brokerd.store.delayed``), which writes them, acknowledges them,
and claims and publishes due ones.
"""

PREFIX = "$delayed/"
MAX_INTERVAL = 4294967
DEFAULT_MAX_PER_TENANT = 100_000


class DelayedTopicError(ValueError):
    """A ``$delayed/...`` topic that cannot be taken (the message says why)."""


def parse_delayed(topic: str) -> tuple[int, str]:
    """``$delayed/{seconds}/{topic}`` -> (seconds, topic); DelayedTopicError otherwise."""
    interval, sep, target = topic[len(PREFIX):].partition("/")
    if not (interval.isascii() and interval.isdigit()):
        raise DelayedTopicError(f"delay {interval!r} is not a whole number of seconds")
    seconds = int(interval)
    if seconds > MAX_INTERVAL:
        raise DelayedTopicError(f"delay {seconds} s is above the maximum, {MAX_INTERVAL} s")
    if not sep or not target:
        raise DelayedTopicError("no topic after the delay")
    if target.startswith("$"):
        raise DelayedTopicError(f"topic {target[:64]!r} starts with '$'")
    return seconds, target


class DelayedQueue:
    """What the broker took and the writer has not written yet, and each
    tenant's count of pending messages (the store's, refreshed by the writer,
    plus what this node took since), for the cap."""

    __slots__ = ("pending", "counts", "wake", "healthy", "max_per_tenant", "refused", "purge", "dropped")

    def __init__(self, max_per_tenant: int | None = DEFAULT_MAX_PER_TENANT, wake=None):
        self.pending: list = []            # (tenant, due wall clock, Publish, ack(ok) or None, publisher)
        self.counts: dict[str, int] = {}
        self.wake = wake                    # called when ``pending`` goes from empty to not empty
        self.healthy = True                 # False while the store refuses delayed writes
        self.max_per_tenant = max_per_tenant
        self.refused = 0                    # over the cap, node-wide
        self.dropped = 0                    # due messages of a deleted tenant, not published
        self.purge: list[str] = []          # deleted tenants whose messages the writer deletes from the store

    def limit(self, quota: dict | None) -> int | None:
        """The cap of a tenant: its quota's ``max_delayed`` and the node's, the smaller."""
        mine = quota.get("max_delayed") if quota is not None else None
        node = self.max_per_tenant
        if mine is None:
            return node
        return mine if node is None or mine < node else node

    def full(self, tenant: str, quota: dict | None) -> bool:
        limit = self.limit(quota)
        return limit is not None and self.counts.get(tenant, 0) >= limit

    def take(self, tenant: str, due: float, msg, ack, publisher: tuple | None = None) -> None:
        """``publisher``: ``(client_id, username, device)``, kept with the message so
        that the tenant's rules run on its release as on that client's publish."""
        if not self.pending and self.wake is not None:
            self.wake()
        self.pending.append((tenant, due, msg, ack, publisher))
        self.counts[tenant] = self.counts.get(tenant, 0) + 1

    def forget(self, tenant: str) -> None:
        """The tenant was deleted: its waiting messages are never published -- not
        into its gone namespace, not to a tenant created later under its name. The
        writer deletes them from the store after what it holds is written."""
        self.purge.append(tenant)
        self.counts.pop(tenant, None)
        if self.wake is not None:
            self.wake()

    def drain(self) -> list:
        out, self.pending = self.pending, []
        return out

    def gone(self, tenant: str, n: int = 1) -> None:
        """``n`` of the tenant's messages were published (or never stored)."""
        left = self.counts.get(tenant, 0) - n
        if left > 0:
            self.counts[tenant] = left
        else:
            self.counts.pop(tenant, None)

    def refresh(self, stored: dict[str, int]) -> None:
        """The store's counts (every node's messages), plus those not yet written."""
        counts = dict(stored)
        for tenant, *_ in self.pending:
            counts[tenant] = counts.get(tenant, 0) + 1
        self.counts = counts
