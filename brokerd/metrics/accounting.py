"""Where the broker counts what it refused and dropped: one place.

A refusal or a drop is counted three times -- in the node's :class:`Stats`
(``$SYS``, the admin API), in the tenant's ``TenantCounters`` (per-tenant
figures, alarms) and, with ``--usage-dir``, in the usage log the Spark
reports read. :class:`Accounting` does the three together, so the broker's
code says what happened (``acct.no_subscribers(ns, topic)``) and not how it
is counted. These are the rare paths; messages and bytes themselves are
counted per connection by the channels (``counters``), and the usage log's
per-message calls stay on the publish path, where a method call per message
would cost (``Broker.publish``).
"""

from .usage import ACL as U_ACL
from .usage import AUTH as U_AUTH
from .usage import EXPIRED as U_EXPIRED
from .usage import NO_SUBS as U_NO_SUBS
from .usage import QUEUE_FULL as U_QUEUE_FULL
from .usage import QUOTA as U_QUOTA


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


class Accounting:
    """The node's :class:`Stats` and the usage log (``usage``, None without
    ``--usage-dir``), bumped together with a namespace's ``m`` (its tenant's
    counters). ``ns`` may be None where no tenant is known."""

    __slots__ = ("stats", "usage")

    def __init__(self, stats: Stats):
        self.stats = stats
        self.usage = None

    def _log(self, ns, topic: str, kind: str) -> None:
        if self.usage is not None and ns is not None:
            self.usage.count(ns.name, topic, kind)

    # ------------------------------------------------------------ connections
    def auth_failed(self, ns) -> None:
        self.stats.auth_failures += 1
        if ns is not None:
            ns.m.auth_failures += 1
            self._log(ns, "", U_AUTH)

    def connect_refused(self, ns) -> None:
        """A CONNECT refused for a quota or a throttle (not for its credentials)."""
        self.stats.quota_refused += 1
        if ns is not None:
            ns.m.quota += 1

    def throttled(self) -> None:
        """A connection refused before its CONNECT was decoded (failed-login throttle)."""
        self.stats.quota_refused += 1

    # ---------------------------------------------------------------- publish
    def publish_denied(self, ns, topic: str) -> None:
        self.stats.denied_publish += 1
        ns.m.acl_denied += 1
        self._log(ns, topic, U_ACL)

    def publish_over_quota(self, ns, topic: str) -> None:
        self.stats.quota_refused += 1
        ns.m.quota += 1
        self._log(ns, topic, U_QUOTA)

    def no_subscribers(self, ns, topic: str) -> None:
        self.stats.dropped_no_subscribers += 1
        ns.m.no_subscribers += 1
        self._log(ns, topic, U_NO_SUBS)

    def store_refused(self) -> None:
        """A QoS 1/2 PUBLISH refused because the store could not take it (or another reason the channel gave)."""
        self.stats.dropped_refused += 1

    # ------------------------------------------------------------ subscribe
    def subscribe_denied(self, ns) -> None:
        self.stats.denied_subscribe += 1
        ns.m.acl_denied += 1

    def delivery_denied(self, ns, deliveries) -> None:
        """Queued deliveries whose topic the client may no longer read (its ACL changed)."""
        ns.m.acl_denied += len(deliveries)
        for d in deliveries:
            self._log(ns, d.msg.topic, U_ACL)

    def subscription_over_quota(self, ns) -> None:
        self.stats.quota_refused += 1
        ns.m.quota += 1

    # --------------------------------------------------------------- delivery
    def queue_full(self, ns, deliveries) -> None:
        """Deliveries dropped by a full queue (``deliveries``: a list)."""
        self.stats.dropped_queue_full += len(deliveries)
        ns.m.queue_full += len(deliveries)
        if self.usage is not None:
            for d in deliveries:
                self.usage.count(ns.name, d.msg.topic, U_QUEUE_FULL)

    def expired(self, ns, topic: str | None) -> None:
        """A message expired before it could be sent (``ns`` None: counted for the node only)."""
        self.stats.dropped_expired += 1
        if ns is not None:
            ns.m.expired += 1
            self._log(ns, topic, U_EXPIRED)

    def too_large(self, ns) -> None:
        self.stats.dropped_too_large += 1
        if ns is not None:
            ns.m.too_large += 1
