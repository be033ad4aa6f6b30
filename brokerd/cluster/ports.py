"""What the cluster asks of the rest of brokerd, and what the rest asks of it.

The cluster's classes each do one job (``node.py`` lists them) and name their
collaborators here, as ``typing.Protocol`` classes: the broker as the
cluster sees it (``ClusterBroker``), the session store, the store writer's
drain, this node's addresses, the Redis bus (cut by concern), and the clock.
``server.py`` passes the real ones to ``node.ClusterNode``; the unit tests
(``tests/cluster/fakes.py``) pass in-memory ones and a fake clock.

The clock: every decision that depends on time (a request's deadline, when
a node fences itself, how long a dead node's sessions await adoption, how
long a moving session's messages are held) takes ``now`` or reads the
injected ``Clock`` -- the event loop's in production, ``loop.time`` --
never ``time.monotonic()`` or ``loop.time()`` itself.

``Cluster`` is the other direction: what the broker, the server, the admin
API and ``$SYS`` call on a ``ClusterNode``.
"""

from collections.abc import Awaitable, Callable, Sized
from typing import Any, Protocol

Clock = Callable[[], float]       # seconds, monotonic: the event loop's clock (a fake one in unit tests)


class ClusterError(Exception):
    """The node cannot join its cluster (said in one line, at start-up)."""


class FenceState(Protocol):
    """Whether this node is fenced off the cluster (``fencing.Fence``)."""

    fenced: bool


# ---------------------------------------------------------------- the broker


class TenantSpace(Protocol):
    """A tenant's namespace, as the broker hands it to ``Cluster.forward``
    (an opaque handle the cluster gives back with ``deliver_shared``)."""

    name: str


class LocalGroup(Protocol):
    """A shared group with members on this node (``$share/NAME/FILTER``), as
    the broker hands it to ``Cluster.forward``."""

    name: str
    filter: str
    members: Sized


class ClusterBroker(Protocol):
    """Exactly what the cluster uses of ``brokerd.broker.Broker`` (the query
    methods are the block "queries the cluster asks" at the end of that
    class): by tenant and client id, so that no part of the cluster walks a
    namespace, its trie or its sessions."""

    wall_offset: float              # wall clock = loop clock + wall_offset (retained messages' expiry)

    # -- messages
    def forwarded(self, tenant: str, msg, group: str | None, gfilter: str | None, now: float) -> int:
        """A message another node forwarded: to this node's subscribers (or one member of ``group``)."""

    def deliver_to_client(self, tenant: str, client_id: str, msg, now: float) -> bool:
        """To one session held here, by its own plain subscriptions (a session on the move)."""

    def deliver_shared(self, ns: TenantSpace, group: LocalGroup, msg, now: float) -> bool:
        """To one local member of ``group`` (both as ``Cluster.forward`` got them)."""

    def group_members(self, tenant: str, name: str, filt: str, exclude=None) -> int:
        """Members here of the shared group ``name`` on ``filt`` (``exclude``, a session, not counted);
        negative when none of them is connected."""

    def deliver_group(self, tenant: str, name: str, filt: str, msg, now: float, exclude=None) -> bool:
        """To one member here of the shared group ``name`` on ``filt`` but ``exclude``."""

    def publish_gone_will(self, tenant: str, client_id: str, will, now: float) -> None:
        """The will of a client of a node that died."""

    def retained_copy(self, tenant: str, topic: str, msg) -> None:
        """Another node's retained message (None: cleared) -- kept here, not stored nor announced."""

    # -- sessions
    def release(self, tenant: str, client_id: str, now: float) -> bool:
        """Another node takes the session over: its client is disconnected, the session let go."""

    def drop_all_sessions(self) -> None:
        """Every session is left to the other nodes (fencing)."""

    def end_held(self, tenant: str, client_id: str, now: float) -> bool:
        """A Clean Start of a session held here: its connection taken over, the session ended; -> whether
        its end was written to the store."""

    def discard_stored(self, tenant: str, client_id: str) -> None:
        """A CONNECT with Clean Start here of a session not held here: the stored session is over."""

    def restore_sessions(self, records: list, now: float) -> bool:
        """Bring stored sessions (``store.records.SessionRecord``) into this node; False: no store."""

    def disconnect_clients(self, code: int, reason: str, now: float, server_reference: str | None) -> None:
        """Disconnect every client (v5: DISCONNECT ``code``), without publishing wills."""

    # -- the store's commits
    def store_refusing(self) -> bool:
        """The store refuses writes at the moment (nothing durable may be taken on)."""

    def writes_pending(self) -> int:
        """Store writes gathered and not yet committed (did a delivery add one?)."""

    def when_durable(self, fn: Callable[[bool], Any]) -> None:
        """``fn(ok)`` once what was written so far is committed (at once, True, without a store)."""

    # -- queries
    def local_filters(self) -> list[tuple[str, str]]:
        """(tenant, filter) of every route with local subscribers."""

    def local_route_counts(self, tenant: str, filt: str) -> tuple[int, int, dict[str, int]]:
        """(subscriptions, of stored sessions, {shared group: members}) on ``filt`` here."""

    def holds(self, tenant: str, client_id: str) -> bool:
        """Whether a session of ``client_id`` is on this node."""

    def holds_stored(self, tenant: str, client_id: str) -> bool:
        """Whether a session of ``client_id`` in the store is on this node."""

    def holds_connected(self, tenant: str, client_id: str) -> bool:
        """Whether ``client_id``'s client is connected to this node (counted in its tenant's connections)."""

    def quota_refused(self, tenant: str) -> None:
        """A CONNECT of ``tenant`` refused 0x97 by its claim: counted with the tenant's quota refusals."""

    def session_filters(self, tenant: str, client_id: str) -> list[str] | None:
        """The filters of the session held here, as subscribed (None: not held here)."""

    def handoff_filters(self, tenant: str, client_id: str) -> list[str]:
        """The plain filters, sorted, of the stored session held here ([] if none)."""

    def connection_counts(self) -> dict[str, int]:
        """Connected clients per tenant on this node."""

    def remote_connections(self, counts: dict[str, int]) -> None:
        """Connected clients per tenant on the other nodes (tenant connection quotas)."""

    def host_shares(self, others: dict[str, int], workers: int, now: float, claims=None) -> None:
        """A worker: each tenant's connections on its host's other live workers, their claims on its
        rates, and how many live workers the host has (the tenants' rates are the host's, shared)."""

    def rate_weights(self, now: float) -> dict[str, dict[str, float]]:
        """A worker: its claims on its tenants' host-wide rates, for the other workers."""

    def node_stats(self) -> dict[str, float]:
        """This node's figures for the cluster-wide ``$SYS`` tree."""

    def tenant_stats(self) -> dict[str, dict]:
        """Each tenant's figures on this node, for its host's tenant ``$SYS`` trees (--workers)."""


class ClaimingChannel(Protocol):
    """A connection whose CONNECT waits for its client id to be claimed."""

    state: int                      # 1: CONNECTING (``protocol.channel``)
    session: Any                    # its session once opened (``.durable``)

    def refuse(self, code: int, reason: str) -> None: ...


# ------------------------------------------------------ the store, the writer


class StoredSession(Protocol):
    tenant: str
    client_id: str
    will: Any


class SessionStore(Protocol):
    """The shared store (``brokerd.store``): stored sessions and the route snapshot."""

    durable: bool

    async def load(self) -> tuple[list, list]: ...

    async def load_session(self, tenant: str, client_id: str) -> StoredSession | None: ...

    async def session_keys(self, after: tuple[str, str] | None, limit: int) -> list[tuple[str, str]]:
        """Up to ``limit`` stored sessions' (tenant, client id), in order, after ``after``."""

    async def get_meta(self, key: str) -> bytes | None: ...

    async def put_meta(self, key: str, value: bytes) -> None: ...


class StoreDrain(Protocol):
    """The store writer (``store.writer.StoreWriter``): wait until what was gathered is written."""

    async def drain(self, timeout: float = 10.0) -> bool: ...

    async def written(self, timeout: float) -> bool:
        """Everything gathered so far is durable (False: not within ``timeout``, or the store failed it)."""

    def abandon(self) -> int:
        """Give up what the store has not taken (a fenced node); -> how many writes."""


class NodeAddresses(Protocol):
    """Where the other nodes and clients reach this node (``server.Server``)."""

    def advertised(self, address: str) -> str:
        """``HOST:PORT`` this node bound, as the others reach it."""

    def mqtt_urls(self) -> list[str]:
        """The MQTT listeners' URLs, as clients elsewhere reach them."""

    def admin_address(self) -> str | None:
        """The admin API's ``HOST:PORT`` (advertised), if it listens."""


# ------------------------------------------------------------------- the bus


class MemberBus(Protocol):
    url: str                        # the Redis URL (``bus.redacted`` for a log line)
    ttl: float                      # seconds a node's key lives without a heartbeat

    async def heartbeat(self, info: dict) -> None: ...

    async def members(self) -> dict[str, dict]: ...

    async def leave(self) -> None: ...

    async def forget_former(self) -> None:
        """This node's id is a member again: what was kept of a former node's end with that id goes."""

    async def set_counts(self, counts: dict[str, int], alive: set[str]) -> dict[str, int]: ...

    async def set_stats(self, stats: dict) -> None: ...

    async def all_stats(self) -> dict[str, dict]: ...

    async def set_host_tenants(self, host: str, figures: dict[str, dict]) -> dict[str, dict]:
        """Publish this worker's figures per tenant for its host; -> every worker's of the host (node -> them)."""
        ...

    async def drop_host_tenants(self, host: str, nodes: list[str]) -> None: ...


class EventBus(Protocol):
    async def publish_events(self, events: list[dict]) -> list[str]: ...

    async def read_events(self, after: str, block_ms: int = 1000, count: int = 1000,
                          own: str | None = None) -> list[tuple[str, dict | None]]:
        """(id, event) after ``after``; (id, None) for an event of node ``own``, not parsed."""

    async def trim_events(self, min_id: str) -> None: ...


class LeaseBus(Protocol):
    async def try_lease(self, name: str, seconds: int) -> bool: ...

    async def renew_lease(self, name: str, seconds: int) -> bool:
        """Hold ``name`` ``seconds`` more (this node took it with ``try_lease``); -> False if another node has it."""

    async def drop_lease(self, name: str) -> None: ...


class ClientBus(Protocol):
    """The client-id registry and its locks."""

    # whether the registry knew every stored session at the last claim's answer (Redis did not lose it
    # since a walk of the store): when not, a client id it calls free may have a stored session all the same
    registry_whole: bool

    async def lock(self, tenant: str, client_id: str, wait: float = 5.0) -> str | None: ...

    async def lock_holder(self, tenant: str, client_id: str) -> str | None: ...

    async def unlock(self, tenant: str, client_id: str, token: str) -> None: ...

    def try_claim(self, tenant: str, client_id: str) -> Awaitable[str | None]:
        """The client id is now this node's (-> None), or the node holding it, or "!" when locked."""

    async def owner(self, tenant: str, client_id: str) -> str | None: ...

    async def owners(self, keys: list[tuple[str, str]]) -> list[str | None]:
        """``owner`` of each (tenant, client id), in order, in one round trip."""

    async def claim(self, tenant: str, client_id: str, durable: bool, previous: str | None) -> None: ...

    async def mark_owned(self, tenant: str, client_id: str) -> None: ...

    async def set_will(self, tenant: str, client_id: str, blob: bytes | None) -> None: ...

    def gone(self, tenant: str, client_id: str, ended: bool, had_will: bool) -> Awaitable[None]:
        """A connection closed here (the update need not have begun when this returns)."""


class ReapBus(ClientBus, LeaseBus, Protocol):
    """What adopting a dead node's sessions needs."""

    async def reap(self, node: str) -> bool: ...

    async def registry_complete(self) -> None:
        """A walk of the store found every stored session held (``registry_whole`` from now on)."""

    async def left_gracefully(self, node: str) -> bool: ...

    async def owned(self, node: str) -> list[tuple[str, str]]: ...

    async def take_wills(self, node: str) -> list[tuple[str, str, bytes]]: ...

    async def forget_node(self, node: str) -> None: ...

    async def keep_lock(self, tenant: str, client_id: str, token: str, seconds: float) -> bool: ...


class ClusterBus(MemberBus, EventBus, ReapBus, Protocol):
    """All of ``bus.Bus`` the cluster uses."""

    async def close(self) -> None: ...


# ----------------------------------------------------- the other direction


class Cluster(Protocol):
    """What the rest of brokerd calls on ``node.ClusterNode``."""

    fenced: bool
    members: dict[str, dict]
    stats_totals: dict[str, float]
    # read per message (Broker.publish): ``forward`` has nothing to do for a message of a tenant
    # not in ``remote_tenants`` (no route on another node) nor ``moving`` that matched no shared group
    remote_tenants: set[str]
    moving: dict[str, list]

    def forward(self, ns: TenantSpace, msg, groups: list, now: float) -> tuple[int, list]: ...

    def redeliver(self, tenant: str, gname: str, filt: str, msg, now: float, exclude=None) -> bool:
        """A shared group's message its member here left (its session ended): to another member, of any node."""

    def wait_for(self, reqs: list, waiter: Callable[[bool], Any]) -> None: ...

    def route_dirty(self, tenant: str, filt: str) -> None: ...

    def retained_changed(self, tenant: str, msg) -> None: ...

    def claim(self, channel: ClaimingChannel, tenant: str, cid: str, clean_start: bool, will,
              cont: Callable[[float], Any], live_only: bool = False) -> None: ...

    def client_gone(self, tenant: str, cid: str, ended: bool, had_will: bool) -> None: ...

    def other_node_url(self, scheme: str = "mqtt") -> str | None: ...
