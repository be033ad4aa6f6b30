"""``--workers N``: the parent process of a host's N brokerd workers.

A node is one process: one core, and at most the per-process descriptor limit
of connections. With ``--workers N`` the host runs N worker processes that
share every MQTT/WebSocket listener with ``SO_REUSEPORT`` (the kernel spreads
new connections over them) -- and nothing else is shared: each worker is a
member of the cluster (``--cluster``) with a node id of its own,
``<node-id>.<slot>``, so the machinery that exists between nodes is what
runs between workers: messages go over the authenticated links (on
loopback), a client that reconnects on another worker takes its session over
(takeover and handoff), and the sessions of a worker that died are adopted by
another. Hence the requirements: a cluster bus and a store every worker sees.

This process only supervises (in the manner of uvicorn's and gunicorn's
arbiters): it starts the workers with their settings on a pipe, says
``brokerd ready ...`` once every one of them listens, passes SIGTERM / SIGINT
(graceful stop, as for one process: v5 clients told to go elsewhere, sessions
written) and SIGHUP on, and starts again a worker that died.

A restarted worker gets a new node id, ``<node-id>.<slot>-<k>`` for its k-th
restart, never the dead one's: the cluster adopts the dead worker's sessions
under its id (its membership key expires, a survivor reaps ``owned:<id>``),
and a newcomer with the same id would be taken for the dead node still alive
-- its sessions neither adopted nor loaded, or loaded twice. Under a new id
the restarted worker holds nothing until a client connects to it and takes
its session over through the registry like on any other node.

Ports given as 0 are chosen here, once (a socket bound with SO_REUSEPORT and
kept, not listening, so the port stays the host's while workers come and go)
and the same port goes to every worker; ``--cluster-listen HOST:P`` gives
worker ``i`` the port ``P + i`` (0: any).
"""

import asyncio
import dataclasses
import json
import logging
import os
import re
import signal
import socket
import sys

from . import __version__
from .config import Config, Listener

log = logging.getLogger("brokerd.supervisor")

READY = re.compile(r"brokerd ready node=(\S+) .*?(?: admin=(\S+))? listeners=(.*)$")
READY_TIMEOUT = 90.0         # a worker waits up to 30 s for its store, 10 s for the console's database
RESTART_DELAY = 0.5          # seconds before a dead worker is started again; doubled while it keeps dying
RESTART_DELAY_MAX = 30.0
STABLE_AFTER = 30.0          # a worker that lived this long restarts without delay next time
# what a worker gets when its supervisor dies (PR_SET_PDEATHSIG): not SIGTERM, which the kernel sends once for
# each of the supervisor's threads that exits (asyncio's child watcher has one per worker) -- and a second
# SIGTERM is the order to exit at once; a worker stops gracefully on the first of these and ignores the others
PARENT_GONE = signal.SIGUSR1


def worker_id(host: str, slot: int, restarts: int) -> str:
    """The node id of a worker: ``host.slot``, ``host.slot-k`` after its k-th restart."""
    return f"{host}.{slot}" if restarts == 0 else f"{host}.{slot}-{restarts}"


def share(total: int, n: int, slot: int) -> int:
    """Worker ``slot``'s share of a host-wide ``total`` split among ``n`` workers (the shares add up to it)."""
    return total // n + (1 if slot < total % n else 0)


def _reserve(host: str, port: int) -> tuple[socket.socket, int]:
    """A socket bound to ``host:0`` with SO_REUSEPORT (not listening: it takes no connections),
    holding the port the kernel chose; -> (socket, port)."""
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                      flags=socket.AI_PASSIVE)[0]
    s = socket.socket(family, kind, proto)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind(addr)
    return s, s.getsockname()[1]


def _probe(host: str, port: int) -> None:
    """Raise OSError (EADDRINUSE) if a socket listens on ``host:port`` already. The workers bind it with
    SO_REUSEPORT, which lets any process of the same user bind it too: without this a second host
    started on the port of a running one started and took part of its connections. A socket without
    SO_REUSEPORT cannot bind a port a socket listens on (SO_REUSEADDR: connections of a former run in
    TIME_WAIT are no obstacle)."""
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                      flags=socket.AI_PASSIVE)[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as exc:
            raise OSError(exc.errno, f"{host}:{port}: {exc.strerror} (another process listens on it)") from exc


@dataclasses.dataclass
class Worker:
    slot: int
    restarts: int = 0
    proc: asyncio.subprocess.Process | None = None
    node_id: str = ""
    ready: asyncio.Future | None = None
    started_at: float = 0.0
    delay: float = RESTART_DELAY


class Supervisor:
    def __init__(self, config: Config):
        self.config = config
        self.n = config.worker_count()
        self.host = config.node_id
        self.reserved: list[socket.socket] = []
        self.workers = [Worker(i) for i in range(self.n)]
        self.stopping = False
        self.signals = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self.done: asyncio.Event | None = None
        self.urls = ""

    # ------------------------------------------------------------- settings

    def resolve(self) -> Config:
        """The host's settings with every port 0 made a real one (the same for every worker)."""
        listen = []
        for lst in self.config.listeners():
            port = lst.port
            if port == 0:
                sock, port = _reserve(lst.host, 0)
                self.reserved.append(sock)
            else:
                _probe(lst.host, port)
            listen.append(Listener(lst.scheme, lst.host, port, lst.path).url)
        admin = self.config.admin
        if admin:
            host, _, port = admin.rpartition(":")
            if int(port) == 0:
                sock, p = _reserve(host.strip("[]"), 0)
                self.reserved.append(sock)
                admin = f"{host}:{p}"
            else:
                _probe(host.strip("[]"), int(port))
        return dataclasses.replace(self.config, listen=listen, admin=admin)

    def worker_config(self, base: Config, w: Worker) -> dict:
        host, _, port = base.cluster_listen.rpartition(":")
        link = f"{host}:{int(port) + w.slot}" if int(port) else base.cluster_listen
        # the host's limits split among its workers: --max-connections, --queue-budget and --preauth-budget
        # bound the host (its memory, its clients), not each worker (N times them on the host)
        n, i = self.n, w.slot
        cfg = dataclasses.replace(
            base, node_id=w.node_id, cluster_listen=link, workers="1",
            max_connections=share(base.max_connections, n, i),
            queue_budget=max(1, share(base.queue_budget, n, i)) if base.queue_budget else 0,      # 0: no budget
            # a worker holds at least one CONNECT of the largest size taken, whatever its share
            preauth_budget=max(share(base.preauth_budget, n, i), min(base.max_connect_size, base.max_packet_size)))
        return {"config": dataclasses.asdict(cfg), "host": self.host, "slot": w.slot, "parent": os.getpid()}

    # ------------------------------------------------------------- workers

    async def spawn(self, base: Config, w: Worker) -> None:
        w.node_id = worker_id(self.host, w.slot, w.restarts)
        w.ready = self.loop.create_future()
        w.started_at = self.loop.time()
        # its own session: a terminal's Ctrl-C reaches this process, which passes it on once. Born with
        # SIGHUP blocked (the mask is inherited): one passed on while it starts waits until it listens for
        # it (brokerd.server.serve) rather than kill it, SIGHUP's default action
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
        try:
            w.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "brokerd.worker", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                start_new_session=True)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        if self.stopping:           # told to stop while it was being started: on_stop did not see it
            w.proc.send_signal(signal.SIGTERM)
        # the settings on a pipe, not in argv or the environment: they may hold the cluster secret
        w.proc.stdin.write(json.dumps(self.worker_config(base, w)).encode())
        await w.proc.stdin.drain()
        w.proc.stdin.close()
        self.loop.create_task(self._read(w, w.proc), name=f"worker-{w.slot}-stdout")
        self.loop.create_task(self._watch(base, w, w.proc), name=f"worker-{w.slot}-wait")

    async def _read(self, w: Worker, proc) -> None:
        while True:
            line = await proc.stdout.readline()
            if not line:
                break
            text = line.decode(errors="replace").rstrip("\n")
            m = READY.search(text)
            if m and w.proc is proc and not w.ready.done():
                w.ready.set_result(m.group(3))
            elif not m:
                sys.stdout.write(text + "\n")      # one write: see server.serve
                sys.stdout.flush()

    async def _watch(self, base: Config, w: Worker, proc) -> None:
        code = await proc.wait()
        if w.proc is not proc:
            return
        lived = self.loop.time() - w.started_at
        if w.ready is not None and not w.ready.done():
            w.ready.set_exception(RuntimeError(f"worker {w.node_id} exited with {_how(code)} before it was ready"))
        if self.stopping:
            if all(x.proc is None or x.proc.returncode is not None for x in self.workers):
                self.done.set()
            return
        if not self.urls:               # still starting: the start-up fails
            return
        delay = RESTART_DELAY if lived >= STABLE_AFTER else w.delay
        w.delay = min(delay * 2, RESTART_DELAY_MAX)         # the next time, if it dies again soon
        log.warning("worker %s (pid %d) exited with %s after %.1f s; starting it again as %s in %.1f s",
                    w.node_id, proc.pid, _how(code), lived, worker_id(self.host, w.slot, w.restarts + 1), delay)
        await asyncio.sleep(delay)
        if self.stopping:
            return
        w.restarts += 1
        try:
            await self.spawn(base, w)
            await asyncio.wait_for(asyncio.shield(w.ready), READY_TIMEOUT)
            log.info("worker %s (pid %d) ready", w.node_id, w.proc.pid)
        except (RuntimeError, TimeoutError, OSError) as exc:
            if self.stopping:       # stopped while it started (told to stop: not an error)
                return
            log.error("worker %s did not start: %s", w.node_id, exc)
            if w.proc is not None and w.proc.returncode is None:
                w.proc.kill()       # its _watch starts it again

    def signal_all(self, sig: int) -> None:
        for w in self.workers:
            if w.proc is not None and w.proc.returncode is None:
                try:
                    w.proc.send_signal(sig)
                except ProcessLookupError:
                    pass

    def on_stop(self, sig: signal.Signals) -> None:
        self.signals += 1
        if self.signals > 1:
            log.warning("second %s: the workers exit now", sig.name)
            self.signal_all(sig)
            self.done.set()
            return
        log.info("%s: stopping the %d workers", sig.name, self.n)
        self.stopping = True
        self.signal_all(signal.SIGTERM)
        if all(w.proc is None or w.proc.returncode is not None for w in self.workers):
            self.done.set()

    # ------------------------------------------------------------- the run

    async def run(self) -> int:
        self.loop = asyncio.get_running_loop()
        self.done = asyncio.Event()
        try:
            base = self.resolve()
        except OSError as exc:
            log.error("cannot listen: %s", exc)
            return 2
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.loop.add_signal_handler(sig, self.on_stop, sig)
        self.loop.add_signal_handler(signal.SIGHUP, self.signal_all, signal.SIGHUP)
        try:
            for w in self.workers:
                await self.spawn(base, w)
            urls = await asyncio.wait_for(asyncio.gather(*(w.ready for w in self.workers)), READY_TIMEOUT)
        except (RuntimeError, TimeoutError, OSError) as exc:
            if self.stopping:       # told to stop while they started: passed on to them, not a failure
                exited = asyncio.gather(*(w.proc.wait() for w in self.workers if w.proc is not None))
                await asyncio.wait([asyncio.ensure_future(exited), asyncio.ensure_future(self.done.wait())],
                                   return_when=asyncio.FIRST_COMPLETED)
                log.info("stopped while starting")
                return 1 if self.signals > 1 else 0
            log.error("the workers did not start: %s", exc)
            self.stopping = True
            self.signal_all(signal.SIGKILL)
            await asyncio.gather(*(w.proc.wait() for w in self.workers if w.proc is not None))
            return 2
        self.urls = urls[0]
        admin = f" admin={base.admin}" if base.admin else ""
        sys.stdout.write(f"brokerd ready node={self.host} version={__version__} workers={self.n}{admin} "
                         f"listeners={self.urls}\n")          # one write: see server.serve
        sys.stdout.flush()
        log.info("%d workers listening on %s (%s)", self.n, self.urls, ", ".join(w.node_id for w in self.workers))
        await self.done.wait()
        if self.signals > 1:
            return 1
        for s in self.reserved:
            s.close()
        log.info("stopped")
        return 0


def _how(code: int) -> str:
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def supervise(config: Config) -> int:
    return asyncio.run(Supervisor(config).run())
