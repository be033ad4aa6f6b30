"""A brokerd node: listeners, the housekeeping timer, signals, graceful stop.

Shutdown follows uvicorn's order: stop accepting, tell every client
(v5: DISCONNECT 0x8B Server shutting down), let the transports flush, wait a
bounded time for them to close, then drop what is left.
"""

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import os
import resource
import signal
import socket
import ssl
import sys
import threading
import time
from dataclasses import dataclass

from . import __version__
from .admin.endpoints import AdminApi, AdminTokens
from .admin.http import HttpLimits
from .broker import Broker, BrokerConfig
from .budget import QueuePacer
from .cluster.ports import ClusterError  # the rest of the cluster (redis-py: 10 MB) only by a node in one
from .config import Config, ConfigError, Listener, load
from .delayed import DelayedQueue
from .integrations.telemetry import TelemetryWriter
from .integrations.webhook import Allowance, WebhookSender
from .metrics import LatencySampler, LoopMonitor
from .metrics.history_writer import History
from .metrics.usage import UsageLog
from .persistence import Persistence
from .protocol import reason as rc
from .protocol.channel import ChannelLimits
from .rules.engine import RuleEngine
from .store import Journal, StoreError, open_store
from .store.delayed import DelayedRunner
from .store.writer import StoreWriter
from .supervisor import PARENT_GONE, supervise
from .sys_topics import SysTopics
from .tenancy.control import TenantControl
from .tenancy.source import AuditSink, PolicySource
from .transports.connection import Flusher, MqttConnection, TimeoutWheel
from .transports.tls import TlsListener
from .transports.ws import WsMqttConnection

log = logging.getLogger("brokerd")

PREAUTH_LOG_SWEEPS = 20  # sweeps (10 s) between two log lines about the pre-authentication budget
SWEEP_INTERVAL = 0.5     # keepalive / CONNECT timeout / will delay / expiry resolution, seconds
STORE_PURGE_INTERVAL = 60.0     # seconds between purges of expired sessions and messages in the store
STORE_PURGE_LEASE = 3 * STORE_PURGE_INTERVAL   # a cluster's purge lease: its holder renews it at each pass
STORE_STARTUP_TIMEOUT = 30.0    # how long start-up waits for an unavailable store
POLICY_STARTUP_TIMEOUT = 10.0   # how long start-up waits for the console's database
SOCKET_SLACK = 1024      # sockets accepted beyond --max-connections before refusing at accept
# descriptors client sockets never take (at most a quarter of the limit): the node's own -- the cluster bus's
# pool (up to 64), the admin API's connections (64), node links, the store, files. Without them a flood of
# sockets up to the descriptor limit left the node none for its cluster bus: it fenced itself, every client out
DESCRIPTOR_RESERVE = 256
DESCRIPTOR_LOG_INTERVAL = 10.0   # seconds between two log lines about sockets closed at the descriptor limit


def limits_from(config: Config) -> ChannelLimits:
    return ChannelLimits(
        max_packet_size=config.max_packet_size,
        max_keepalive=config.max_keepalive,
        max_inflight=config.max_inflight,
        max_queued=config.max_queued,
        max_queued_bytes=config.max_queued_bytes,
        topic_alias_maximum=config.topic_alias_maximum,
        connect_timeout=config.connect_timeout,
        max_session_expiry=config.max_session_expiry,
        response_information=config.response_information,
        queue_qos0=config.queue_qos0,
        max_pending=config.write_buffer_high,
        max_connect_size=config.max_connect_size,
        preauth_budget=config.preauth_budget,
    )


class TlsFilesError(Exception):
    """The TLS certificate, key or CA files could not be loaded (at start: the node does not start)."""


def tls_context(config: Config) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(config.tls_cert, config.tls_key)
        if config.tls_ca:
            ctx.load_verify_locations(config.tls_ca)
    except (OSError, ssl.SSLError) as exc:
        # (said as "cannot listen: [SSL] PEM lib", an OSError's, it named neither the cause nor the files)
        ca = f", --tls-ca {config.tls_ca}" if config.tls_ca else ""
        raise TlsFilesError(f"cannot load the TLS certificate (--tls-cert {config.tls_cert}, --tls-key "
                            f"{config.tls_key}{ca}): {exc}") from exc
    ctx.verify_mode = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL,
                       "required": ssl.CERT_REQUIRED}[config.tls_verify_client]
    return ctx


@dataclass(frozen=True, slots=True)
class WorkerIdentity:
    """A worker process of a host (``--workers N``, brokerd.supervisor): its host's
    --node-id and its slot 0..N-1. It shares the host's listeners (SO_REUSEPORT)
    and is a cluster member of its own, with the node id the supervisor gave it."""

    host: str
    slot: int


class _Refuse(asyncio.Protocol):
    """Closes sockets accepted beyond the connection limit."""

    def connection_made(self, transport):
        transport.abort()


class Server:
    def __init__(self, config: Config, loop: asyncio.AbstractEventLoop | None = None, broker: Broker | None = None,
                 worker: WorkerIdentity | None = None):
        self.config = config
        self.worker = worker
        self.loop = loop or asyncio.get_running_loop()
        self.limits = limits_from(config)
        now = self.loop.time()
        self.broker = broker or Broker(
            BrokerConfig(
                node_id=config.node_id,
                allow_anonymous=config.allow_anonymous,
                max_connections=config.max_connections,
                shared_strategy=config.shared_subscription_strategy,
                queue_budget=config.queue_budget,
                anonymous_tenant=config.anonymous_tenant,
                limits=self.limits,
            ),
            now=now,
        )
        self.broker.wall_offset = time.time() - now
        self.broker.clock = self.loop.time
        self.policy_source: PolicySource | None = None
        allow = "" if config.rules_webhook_allow.strip().lower() == "none" else config.rules_webhook_allow
        self.webhooks = WebhookSender(Allowance(allow), config.rules_webhook_buffer,
                                      config.rules_webhook_tenant_buffer, config.rules_webhook_concurrency)
        # store rules' rows go to the usage log's landing zone (none without --usage-dir: those rules fail)
        self.telemetry = (TelemetryWriter(config.usage_dir, config.node_id, config.rules_store_buffer,
                                          config.rules_store_tenant_buffer, config.rules_store_interval)
                          if config.usage_dir else None)
        # the tenants' rules, from their policy snapshots; webhooks are queued to the sender
        self.rule_engine = RuleEngine(self.broker.rules, webhook=self.webhooks.submit,
                                      telemetry=self.telemetry.submit if self.telemetry is not None else None)
        self.admin: AdminApi | None = None
        self.admin_tokens = AdminTokens()
        if config.control_plane:
            self.broker.auth = TenantControl(config.allow_anonymous, config.anonymous_tenant)
        if config.allow_anonymous:
            self.broker.namespace(self.broker.config.anonymous_tenant)
        self.sys = SysTopics(self.broker, config.sys_interval, now)
        self.broker.sampler = LatencySampler(self.loop)
        self.loop_monitor = LoopMonitor(self.loop)
        self.history = None
        self.connections: set[MqttConnection] = set()
        self.timeouts = TimeoutWheel(SWEEP_INTERVAL, now)    # when each one's keepalive is next looked at
        # the queue budget's policy (brokerd.budget): whom to pause when the queues pass it
        self.pacer = QueuePacer(self.broker.budget, self.connections, self.loop.call_later)
        self.flusher = Flusher(self.loop, self.pacer.after_writes)
        self._preauth_logged = (0, -1 << 30)   # PreauthBudget.refused and the sweep when last logged
        self.write_high = config.write_buffer_high
        self.servers: list[asyncio.AbstractServer | TlsListener] = []
        self._own_fds = 64                   # descriptors open before any client: counted once listening
        self._fd_soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]    # read again at each sweep (prlimit)
        self._fd_logged = -DESCRIPTOR_LOG_INTERVAL
        self.bound: list[Listener] = []
        self.tls: ssl.SSLContext | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self.stopped = asyncio.Event()
        self.store = None
        self.cluster = None                  # brokerd.cluster.node.ClusterNode, in a cluster
        self.writer: StoreWriter | None = None
        self._purger: asyncio.Task | None = None
        self.delayed: DelayedRunner | None = None
        self._delayed_store = None           # the node's own memory store for them, without a durable store

    def _room(self, held: int) -> bool:
        """Whether the node may hold one more client socket, ``held`` held: under --max-connections +
        SOCKET_SLACK, and under the descriptor limit (read again at each sweep, not at each accept -- a
        system call per connect --: ``prlimit`` may change it) less the descriptors open before any
        client and DESCRIPTOR_RESERVE."""
        if held >= self.config.max_connections + SOCKET_SLACK:
            return False
        soft = self._fd_soft
        if soft == resource.RLIM_INFINITY or held < soft - self._own_fds - min(DESCRIPTOR_RESERVE, soft // 4):
            return True
        now = self.loop.time()
        if now - self._fd_logged >= DESCRIPTOR_LOG_INTERVAL:
            self._fd_logged = now
            log.warning("at the descriptor limit (%d open files, %d client sockets held): new sockets are closed "
                        "at accept; raise the limit (ulimit -n, LimitNOFILE=)", soft, held)
        return False

    def _room_for_handshake(self, handshaking: int) -> bool:
        """Whether a TLS listener may take one more socket (``handshaking``: its handshakes under way)."""
        return self._room(len(self.connections) + handshaking)

    def _factory(self, listener: Listener):
        cls = WsMqttConnection if listener.websocket else MqttConnection

        def make():
            if not self._room(len(self.connections)):
                return _Refuse()
            return cls(self, listener)

        return make

    async def open_store(self) -> None:
        """Open the configured store and restore what it holds (before listening)."""
        url = self.config.store
        store = open_store(url)
        if not store.durable:
            return
        deadline = self.loop.time() + STORE_STARTUP_TIMEOUT
        while True:
            try:
                await store.open()
                if self.config.cluster:
                    # sessions belong to whichever node their clients are on: loaded on demand
                    records, retained = [], await store.load_retained()
                else:
                    records, retained = await store.load()
                break
            except StoreError as exc:
                await store.close()
                if not store.remote or self.loop.time() > deadline:
                    raise
                log.warning("session store %s unavailable (%s); retrying", url, exc)
                await asyncio.sleep(1.0)
        journal = Journal()
        persist = Persistence(journal, time.time() - self.loop.time())
        self.broker.use_store(persist)
        counts = persist.restore(self.broker, records, retained, self.loop.time())
        log.info("store %s: restored %d sessions, %d queued messages, %d retained messages (%d sessions expired, "
                 "%d wills; %d sessions and retained messages of deleted tenants removed)", url, counts["sessions"],
                 counts["messages"], counts["retained"], counts["expired"], counts["wills"], counts["deleted"])
        self.store = store
        self.writer = StoreWriter(store, journal, self.broker, self.loop)
        self.writer.start()
        self._purger = self.loop.create_task(self._purge_loop(), name="store-purge")

    async def open_delayed(self) -> None:
        """Delayed publish (``$delayed/...``): in the session store, or in a memory
        store of this node's own when there is none (--store memory://)."""
        if not self.config.max_delayed:
            return
        store = self.store
        if store is None:
            store = self._delayed_store = open_store("memory://")
            await store.open()
        queue = DelayedQueue(self.config.max_delayed)
        self.broker.use_delayed(queue)
        self.delayed = DelayedRunner(store, queue, self.broker, self.loop, self.config.node_id)

    async def _purge_loop(self) -> None:
        while True:
            await asyncio.sleep(STORE_PURGE_INTERVAL)
            try:
                if self.cluster is not None:       # one node at a time (brokerd.cluster.purge)
                    from .cluster.purge import purge_under_lease

                    n = await purge_under_lease(self.store, self.cluster.bus, time.time(), STORE_PURGE_LEASE)
                else:
                    n = await self.store.purge(time.time())
                if n:
                    log.info("store: purged %d expired rows", n)
            except StoreError as exc:
                log.warning("store purge failed: %s", exc)

    def reload_tls(self) -> bool:
        """SIGHUP: the certificate and key files read again (a rotated certificate), for the
        handshakes from now on; connected clients keep theirs. Bad files keep the old one."""
        if self.tls is None:
            return False
        try:
            self.tls.load_cert_chain(self.config.tls_cert, self.config.tls_key)
            if self.config.tls_ca:
                self.tls.load_verify_locations(self.config.tls_ca)
        except (OSError, ssl.SSLError) as exc:
            log.error("TLS certificate not reloaded (%s): still serving the previous one", exc)
            return False
        log.info("TLS certificate reloaded from %s", self.config.tls_cert)
        return True

    def advertised(self, address: str) -> str:
        """``HOST:PORT`` of something this node bound, as the other nodes reach it:
        --advertise-host, else the bound host (this host's name for 0.0.0.0 / ::)."""
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
        if self.config.advertise_host:
            host = self.config.advertise_host
        elif host in ("", "0.0.0.0", "::"):
            host = socket.gethostname()
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def mqtt_urls(self) -> list[str]:
        """The MQTT listeners' URLs as clients elsewhere reach them (a cluster node's info)."""
        return [f"{lst.scheme}://{self.advertised(f'{lst.host}:{lst.port}')}{lst.path}" for lst in self.bound]

    def admin_address(self) -> str | None:
        """The admin API's ``HOST:PORT`` as the other nodes reach it, if it listens."""
        admin = self.admin.address if self.admin is not None else None
        return admin and self.advertised(admin)

    def identity(self) -> dict:
        """Which host this node is and which of its workers (``host``, ``worker``: None without --workers)."""
        if self.worker is None:
            return {"host": self.config.node_id, "worker": None}
        return {"host": self.worker.host, "worker": self.worker.slot}

    async def start(self) -> None:
        if self.config.control_plane:
            self.policy_source = PolicySource(self.config.control_plane, self.broker.auth, self.broker, self.loop,
                                              wall=lambda: time.time(), tokens=self.admin_tokens,
                                              rules=self.rule_engine)
            await self.policy_source.load(POLICY_STARTUP_TIMEOUT)
            self.policy_source.start()
        await self.open_store()
        await self.open_delayed()
        if self.config.control_plane:
            self.broker.reauthorize_all(self.loop.time())
        for lst in self.config.listeners():
            if lst.tls and self.tls is None:
                self.tls = tls_context(self.config)
            if lst.tls:
                # each socket counted against the cap from its accept, not once its handshake is done
                srv = TlsListener(self.loop, self._factory(lst), self.tls, self.config.connect_timeout,
                                  self._room_for_handshake)
                srv.listen(lst.host, lst.port, 4096, self.worker is not None)
            else:
                srv = await self.loop.create_server(self._factory(lst), lst.host, lst.port, backlog=4096,
                                                    reuse_address=True, reuse_port=self.worker is not None,
                                                    start_serving=False)
            self.servers.append(srv)
            port = srv.sockets[0].getsockname()[1]
            self.bound.append(Listener(lst.scheme, lst.host, port, lst.path))
        if self.config.admin:
            host, _, port = self.config.admin.rpartition(":")
            audit = AuditSink(self.policy_source.db) if self.policy_source is not None else None
            limits = HttpLimits(max_connections=self.config.admin_max_connections,
                                timeout=self.config.admin_timeout, body_budget=self.config.admin_body_budget)
            self.admin = AdminApi(self, host, int(port), self.admin_tokens, audit, limits,
                                  shared=self.worker is not None)
            await self.admin.start()
        if self.config.cluster:
            from .cluster.bus import Bus
            from .cluster.node import ClusterNode
            from .cluster.peers import LinkSettings

            host, _, port = self.config.cluster_listen.rpartition(":")
            self.cluster = ClusterNode(
                self.config.node_id, Bus(self.config.cluster, self.config.node_id, ttl=5.0,
                                        claim_gap=self.config.cluster_claim_gap), self.broker,
                loop=self.loop, clock=self.loop.time, links=LinkSettings.from_config(self.config, host, int(port)),
                store=self.store, writer=self.writer, addresses=self, reference=self.config.server_reference,
                flusher=self.flusher, budget=self.broker.budget, identity=self.identity())
            await self.cluster.start()
            self.broker.attach_cluster(self.cluster)
        if self.delayed is not None:
            self.delayed.start()            # due messages are published cluster-wide from here on
        self._sweeper = self.loop.call_later(SWEEP_INTERVAL, self._sweep)
        self._own_ports()
        self.sys.tick(self.loop.time())
        self.loop_monitor.start()
        if self.config.usage_dir:
            self.broker.attach_usage(UsageLog(self.config.usage_dir, self.config.node_id, self.broker.wall_offset,
                                              float(os.environ.get("BROKERD_USAGE_INTERVAL", "60")),
                                              self.config.usage_checkpoint))
            self.broker.usage.start()
        if self.telemetry is not None:
            self.telemetry.start()
        if self.policy_source is not None and self.config.history_interval > 0:
            self.history = History(self, self.policy_source.db, self.config.history_interval)
            self.history.start()
        # The listeners are bound above (the cluster's join tells the others their addresses) but accept only
        # now that the node is whole: a CONNECT taken before the cluster was attached would skip the client
        # id's claim -- the same id left connected on another node -- and its tenant's cluster-wide quotas.
        with contextlib.suppress(OSError):
            self._own_fds = len(os.listdir("/proc/self/fd"))      # (Linux; else the guess above)
        for srv in self.servers:
            await srv.start_serving()
        if self.admin is not None:
            await self.admin.start_serving()

    def _sweep(self) -> None:
        now = self.loop.time()
        try:
            self.pacer.sweep()
            timeouts = self.timeouts
            for conn in timeouts.due(now):
                if conn.closed:
                    if timeouts.dead:
                        timeouts.dead -= 1
                    continue
                ch = conn.channel
                if conn.paused:
                    # Its pings wait unread in the socket: not the client's fault.
                    ch.last_rx = now
                again = ch.handle_timeout(now)
                if again is not None:
                    timeouts.add(conn, again)
            self.broker.tick(now)
            self.sys.tick(now)
            self._log_preauth()
            self._fd_soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        except Exception:  # housekeeping must never stop
            log.exception("housekeeping failed")
        self._sweeper = self.loop.call_later(SWEEP_INTERVAL, self._sweep)

    def _log_preauth(self) -> None:
        """At most every PREAUTH_LOG_SWEEPS sweeps (10 s): how many connections the pre-authentication
        budget closed."""
        refused = self.broker.preauth.refused
        logged, at = self._preauth_logged
        sweeps = self.pacer.sweeps
        if refused != logged and sweeps - at >= PREAUTH_LOG_SWEEPS:
            log.warning("closed %d connections whose incomplete CONNECTs would have passed --preauth-budget "
                        "(%d bytes held by unauthenticated connections at most)", refused - logged,
                        self.broker.preauth.limit)
            self._preauth_logged = (refused, sweeps)

    def _own_ports(self) -> None:
        """What a rule's webhook may never call: this node's own listeners, as bound -- the addresses and
        ports of their sockets, not the settings' (a host name, or port 0 for one the OS picks)."""
        socks = [sock for srv in self.servers for sock in srv.sockets]
        if self.admin is not None:
            socks += self.admin.sockets()        # a worker's shared port and its own
        if self.cluster is not None:
            socks += self.cluster.peers.sockets()
        ports, hosts = set(), set()
        for sock in socks:
            host, port = sock.getsockname()[:2]
            ports.add(port)
            hosts.add(host)
        self.webhooks.allowance.set_own(ports, hosts)

    async def stop(self, timeout: float = 5.0) -> None:
        await self.webhooks.close()
        for srv in self.servers:
            srv.close()
        self.loop_monitor.stop()
        if self.history is not None:
            await self.history.stop()
        if self.admin is not None:
            await self.admin.stop()
        if self._sweeper is not None:
            self._sweeper.cancel()
        now = self.loop.time()
        reference = self.cluster.other_node_url() if self.cluster is not None else None
        if reference:
            # hand the clients over: v5 clients are told where to go
            self.broker.shutdown(now, rc.USE_ANOTHER_SERVER, reference)
        else:
            self.broker.shutdown(now)
        for conn in list(self.connections):
            conn.close()
        deadline = self.loop.time() + timeout
        while self.connections and self.loop.time() < deadline:
            await asyncio.sleep(0.02)
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.abort()
        for srv in self.servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(srv.wait_closed(), 1)
        if self.broker.usage is not None:
            await self.broker.usage.stop()              # the closed connections' rows go out too
        if self.telemetry is not None:
            await self.telemetry.stop()                 # store rules' rows still queued (disconnect events too)
        if self.delayed is not None:
            if not await self.delayed.drain(timeout):
                log.error("delayed messages: %d not written at shutdown", len(self.broker.delayed.pending))
            await self.delayed.stop()
            if self._delayed_store is not None:
                await self._delayed_store.close()
        if self.cluster is not None:
            if self.writer is not None:
                await self.writer.drain(timeout)        # the others adopt what is stored
            await self.cluster.stop(graceful=True)
            self.broker.attach_cluster(None)
        if self.policy_source is not None:
            await self.policy_source.stop()
        if self.writer is not None:
            if self._purger is not None:
                self._purger.cancel()
            if not await self.writer.drain(timeout):
                log.error("session store: %d operations not written at shutdown", len(self.broker.journal.ops))
            await self.writer.stop()
            await self.store.close()
        self.stopped.set()


def _tune_gc() -> None:
    """The cyclic garbage collector, tuned for a long-running server.

    Per-message objects are freed by reference counting (the broker keeps no
    reference cycles in them); what the collector adds is pauses: with
    Python's defaults a full collection over a few hundred thousand session
    and connection objects stopped the loop for ~40 ms under load. Objects
    from start-up are frozen out of collections, young collections run less
    often, and full ones rarely.
    """
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 50, 1000)


def _tune_process() -> None:
    # Sockets: take the hard limit of open files.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    # glibc: keep freed memory at the top of the heap instead of trimming and
    # faulting it back in on the next burst (measured: -8% CPU in DESIGN.md).
    libc_name = ctypes.util.find_library("c")
    if libc_name and sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(libc_name)
            M_TRIM_THRESHOLD, M_TOP_PAD = -1, -2
            libc.mallopt(M_TRIM_THRESHOLD, 64 * 1024 * 1024)
            libc.mallopt(M_TOP_PAD, 16 * 1024 * 1024)


async def serve(config: Config, worker: WorkerIdentity | None = None) -> None:
    loop = asyncio.get_running_loop()
    server = Server(config, loop, worker=worker)
    # SIGHUP from the start (its default action ends the process): before the certificate is loaded it has
    # nothing to reload. A worker is born with it blocked (brokerd.supervisor): one sent meanwhile comes now
    loop.add_signal_handler(signal.SIGHUP, server.reload_tls)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})
    try:
        await server.start()
    except TlsFilesError as exc:
        log.error("%s", exc)
        raise SystemExit(2)
    except OSError as exc:
        log.error("cannot listen: %s", exc)
        raise SystemExit(2)
    except StoreError as exc:
        log.error("cannot open the session store %s: %s", config.store, exc)
        raise SystemExit(2)
    except ClusterError as exc:
        log.error("%s", exc)
        raise SystemExit(2)
    stopping = asyncio.Event()
    signals = 0

    def on_signal(signame):
        nonlocal signals
        signals += 1
        if signals > 1:
            log.warning("second %s: exiting now", signame)
            _exit_now(1)
        log.info("%s: shutting down", signame)
        _exit_if_stuck(SHUTDOWN_LIMIT)
        stopping.set()

    def on_parent_gone():
        # a worker's supervisor died: the kernel says so once for each of its threads that exits (see
        # brokerd.worker), so only the first counts -- the graceful stop of a SIGTERM, never the second's exit
        if not signals:
            on_signal("supervisor gone")

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig.name)
    if worker is not None:
        loop.add_signal_handler(PARENT_GONE, on_parent_gone)
    _tune_gc()
    urls = " ".join(lst.url for lst in server.bound)
    admin = f" admin={server.admin.address}" if server.admin is not None else ""
    # one write, newline included: print() writes the newline apart, and a log line on stderr (the same
    # pipe, for whoever merges them) could land between the ports and it
    sys.stdout.write(f"brokerd ready node={config.node_id} version={__version__}{admin} listeners={urls}\n")
    sys.stdout.flush()
    log.info("listening on %s", urls)
    await stopping.wait()
    await server.stop()
    log.info("stopped")


# Every step of a graceful stop has its own timeout (connections, store drains: ~5 s each); a stop still
# running after this long is stuck (a task that ignores its cancellation, a library's thread) and the
# process exits rather than stay behind as an orphan holding its ports and its session store.
SHUTDOWN_LIMIT = 60.0


def _exit_now(code: int) -> None:
    """Leave at once: no asyncio teardown, which waits for every task to finish its cancellation."""
    logging.shutdown()
    sys.stderr.flush()
    os._exit(code)


def _exit_if_stuck(limit: float) -> None:
    def stuck():
        log.error("shutdown still running after %.0f s: exiting", limit)
        _exit_now(1)

    timer = threading.Timer(limit, stuck)
    timer.daemon = True
    timer.start()


def main(argv=None) -> int:
    try:
        config = load(argv)
    except ConfigError as exc:
        print(f"brokerd: {exc}", file=sys.stderr)
        return 2
    setup_logging(config)
    if config.worker_count() > 1:
        return supervise(config)            # this process is the parent of the host's workers
    return run(config)


def setup_logging(config: Config, worker: WorkerIdentity | None = None) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if config.log_format == "json":         # one JSON object a line, for a log collector
        from pythonjsonlogger.json import JsonFormatter

        static = {"node": config.node_id} if worker is None else {"node": config.node_id, "host": worker.host,
                                                                   "worker": worker.slot}
        handler.setFormatter(JsonFormatter("%(asctime)s %(levelname)s %(name)s %(message)s", rename_fields={
            "asctime": "time", "levelname": "level", "name": "logger"}, static_fields=static))
    else:
        # the workers of a host write to one stream: each line says which
        who = f"[{config.node_id}]" if worker is not None else ""
        handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s %(name)s{who}: %(message)s"))
    logging.basicConfig(level=config.log_level.upper(), handlers=[handler], force=True)


def run(config: Config, worker: WorkerIdentity | None = None) -> int:
    """Serve until a signal: this process is the node (or one worker of the host)."""
    _tune_process()
    try:
        import uvloop
    except ImportError:
        uvloop = None
    if uvloop is not None:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(serve(config, worker))
    else:
        asyncio.run(serve(config, worker))
    return 0
