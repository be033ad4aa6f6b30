"""Fixtures of the cluster suite: a real ``redis-server`` as the cluster bus,
brokerd nodes started as real processes around it, and a TCP proxy to cut
one node off from Redis (a netsplit).

``redis_server`` is one Redis per test module; every test gets its own key
prefix on it (``?prefix=...`` in the cluster URL), so tests never see each
other's nodes. ``cluster`` starts nodes that share one SQLite store file in
the test's directory and waits until each of them forwards to every other
(a real subscribe/publish round trip between every pair of nodes).
"""

import itertools
import os
import socket
import subprocess
import threading
import time
import uuid
from urllib.parse import urlencode

import paho.mqtt.client as mqtt
import pytest

from ..durability.test_crash import Publisher
from ..integration.helpers import wait_until as _wait_until
from ..mqtt import V5, V311, PahoClient
from ..procs import BrokerProcess, free_port

REDIS_SERVER = "/usr/bin/redis-server"
_seq = itertools.count()


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.05, message: str = "condition not met"):
    """tests/integration's ``wait_until`` with the longer defaults cluster events need; -> the true value."""
    return _wait_until(predicate, timeout, interval, message)


def settle(publisher, topic: str, *subscribers, timeout: float = 10.0) -> None:
    """Until a message ``publisher`` sends to ``topic`` reaches every one of
    ``subscribers`` (PahoClients): the routes of their subscriptions are known
    to the publisher's node. QoS 0 probes, numbered; the probes that arrive
    are taken out of the subscribers' queues (per-publisher order: once the
    last probe arrived, no earlier one can come after it)."""
    deadline = time.monotonic() + timeout
    k = 0
    while True:
        k += 1
        publisher.publish(topic, b"probe:%d" % k)
        seen = [False] * len(subscribers)
        until = min(deadline, time.monotonic() + 0.3)
        while not all(seen) and time.monotonic() < until:
            for i, sub in enumerate(subscribers):
                while not sub.messages.empty():
                    msg = sub.messages.get_nowait()
                    assert msg.payload.startswith(b"probe:"), f"unexpected message while settling: {msg.payload!r}"
                    if msg.topic == topic and int(msg.payload[6:]) == k:      # not an earlier settle's probe k
                        seen[i] = True
            time.sleep(0.01)
        if all(seen):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"routes to {topic} not in place after {timeout} s: reached {seen}")


class PacedPublisher(Publisher):
    """test_crash's Publisher (numbered QoS 1 messages, acks by number) as an
    MQTT 5 client at a steady rate, in a thread, that goes on through
    negative acks, and records each number's PUBACK reason code.

        pub = PacedPublisher(port, topic, total=2000, rate=400).start()
        ...
        pub.finish()                    # waits for the stream's end and its acks
        pub.acked                       # numbers acknowledged with a reason code < 0x80
    """

    def __init__(self, port: int, topic: str, total: int, rate: float = 500.0):
        self.total = total
        self.rate = rate
        self.codes: dict[int, int] = {}          # mid -> reason code
        super().__init__(port, topic, version=V5)
        # Publisher allows 200 in flight, but paho ignores a server's Receive Maximum (brokerd's: 32),
        # and paho's setter refuses once connected: nothing is in flight yet, so set it directly
        self.client._max_inflight_messages = 30
        self.disconnects: list[int] = []         # reason codes of the connection's ends, in order
        self._gone = threading.Event()
        self.client.on_disconnect = self._on_disconnect
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self.publish_all, args=(self._stop,), daemon=True)

    def _on_publish(self, client, userdata, mid, reason_code, properties):
        self.codes[mid] = reason_code.value
        super()._on_publish(client, userdata, mid, reason_code, properties)

    def _on_disconnect(self, client, userdata, flags, reason_code, properties):
        self.disconnects.append(reason_code.value)
        self._gone.set()

    def start(self) -> "PacedPublisher":
        self._thread.start()
        return self

    def publish_all(self, stop: threading.Event) -> None:
        t0 = time.monotonic()
        for n in range(self.total):
            if stop.is_set() or self._gone.is_set():      # the stream ends with its connection
                return
            ahead = t0 + n / self.rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
            info = self.client.publish(self.topic, b"%05d" % n, qos=1)
            if info.rc != mqtt.MQTT_ERR_SUCCESS:
                return
            self._mids[info.mid] = n
            self.sent = n + 1

    def wait_acked(self, n: int, timeout: float = 30.0) -> None:
        wait_until(lambda: len(self.acked) >= n, timeout=timeout, message=f"fewer than {n} messages acknowledged")

    def finish(self, timeout: float = 60.0) -> None:
        """Wait until every message was sent and answered (positively or not), or the connection is gone."""
        self._thread.join(timeout)
        # paho's is_connected() stays True after a server's DISCONNECT until it tries to reconnect
        # (60 s later here), so the end of the connection is the on_disconnect callback
        wait_until(lambda: len(self.codes) >= self.sent or self._gone.is_set(), timeout=timeout,
                   message=f"{self.sent - len(self.codes)} publishes never answered")
        self.client.loop_stop()
        self.client.disconnect()

    def by_code(self) -> dict[int, int]:
        """reason code -> how many messages got it."""
        out: dict[int, int] = {}
        for code in self.codes.values():
            out[code] = out.get(code, 0) + 1
        return out

    def numbers_with(self, code: int) -> list[int]:
        return sorted(n for mid, n in self._mids.items() if self.codes.get(mid) == code)


# ------------------------------------------------------------------ Redis

class RedisServer:
    """``redis-server`` on a free loopback port, nothing saved to disk; with
    ``password`` it requires it (``requirepass``), with ``tls`` (a trustme CA)
    it speaks only TLS on that port, with a certificate that CA signed."""

    def __init__(self, directory, password: str | None = None, tls=None):
        self.dir = str(directory)
        self.port = 0
        self.password = password
        self.ca_file: str | None = None
        self._tls_args: list[str] = []
        if tls is not None:
            from ..pki import write_cert

            cert, key = write_cert(tls.issue_cert("127.0.0.1", "localhost"), self.dir, "redis")
            self.ca_file = os.path.join(self.dir, "redis-ca.pem")
            tls.cert_pem.write_to_path(self.ca_file)
            self._tls_args = ["--tls-cert-file", cert, "--tls-key-file", key, "--tls-ca-cert-file", self.ca_file,
                              "--tls-auth-clients", "no"]
        self.proc: subprocess.Popen | None = None

    def url(self, db: int = 0, prefix: str | None = None) -> str:
        """What a node's ``--cluster`` names to reach this server."""
        auth = f":{self.password}@" if self.password else ""
        query = {"prefix": prefix} if prefix else {}
        if self.ca_file:
            query["ssl_ca_certs"] = self.ca_file
        scheme = "rediss" if self.ca_file else "redis"
        return f"{scheme}://{auth}127.0.0.1:{self.port}/{db}" + ("?" + urlencode(query) if query else "")

    def start(self) -> "RedisServer":
        self.port = free_port()
        self._spawn()
        wait_until(self.ping, timeout=10, message=f"redis-server did not start on port {self.port}")
        return self

    def ping(self) -> bool:
        try:
            return bool(self.client().ping())
        except Exception:
            return False

    def client(self):
        import redis

        tls = {"ssl": True, "ssl_ca_certs": self.ca_file} if self.ca_file else {}
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password, socket_timeout=2, **tls)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def kill(self) -> None:
        """SIGKILL: connections cut with no goodbye, everything in memory gone."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    def restart(self) -> "RedisServer":
        """A new, empty server on the same port."""
        self.kill()
        self._spawn()
        wait_until(self.ping, timeout=10, message=f"redis-server did not restart on port {self.port}")
        return self

    def _spawn(self) -> None:
        ports = ["--port", "0", "--tls-port", str(self.port), *self._tls_args] if self.ca_file else [
            "--port", str(self.port)]
        auth = ["--requirepass", self.password] if self.password else []
        self.proc = subprocess.Popen([REDIS_SERVER, *ports, *auth, "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", self.dir],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


# ------------------------------------------------------------------ a TCP proxy (netsplit)

class TcpProxy:
    """Forwards a loopback port to another one, in threads. ``stop()`` closes
    the listening socket and every connection through it (the far side sees
    the network go away); ``start()`` again listens on the same port."""

    def __init__(self, target_port: int, port: int = 0):
        self.target = target_port
        self.port = port or free_port()
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.running = False

    def start(self) -> "TcpProxy":
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(128)
        self._listener = s
        self.running = True
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()
        return self

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            if not self.running:
                client.close()
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=2)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def stop(self) -> None:
        self.running = False
        if self._listener is not None:
            try:
                self._listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._listener.close()
            self._listener = None
        with self._lock:
            conns, self._conns = self._conns, set()
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


# ------------------------------------------------------------------ brokerd nodes

class Cluster:
    """brokerd nodes on one Redis bus (a prefix of their own) and one store.

        nodes = cluster.start(3)            # and waits until every pair forwards
        n4 = cluster.add()                  # one more (waits too)
    """

    def __init__(self, redis: RedisServer, directory, store: str | None = None, flags=(), env=None):
        self.redis = redis
        self.prefix = f"c{uuid.uuid4().hex[:10]}"
        self.secret = uuid.uuid4().hex               # the node links' shared secret (BROKERD_CLUSTER_SECRET)
        self.store = store or f"sqlite:///{directory}/cluster.sqlite3"      # directory is absolute: sqlite:////
        self.flags = list(flags)
        self.env = env
        self.nodes: list[BrokerProcess] = []
        self.names: dict[int, str] = {}             # id(node) -> node id
        self._n = 0

    def url(self, redis_port: int | None = None) -> str:
        if redis_port is None:
            return self.redis.url(0, self.prefix)
        return f"redis://127.0.0.1:{redis_port}/0?prefix={self.prefix}"

    def name(self, node: BrokerProcess) -> str:
        return self.names[id(node)]

    def node(self, *flags: str, redis_port: int | None = None, wait: bool = True, anonymous: bool = True,
             env=None, store: str | None = None) -> BrokerProcess:
        """Start one more node (``redis_port``: reach Redis there, e.g. through a proxy; ``store``:
        the cluster's store by another way, e.g. through a proxy too)."""
        self._n += 1
        name = f"n{self._n}"
        node = BrokerProcess("--node-id", name, "--store", store or self.store, "--cluster", self.url(redis_port),
                             *self.flags, *flags, listen=("mqtt://127.0.0.1:0",), anonymous=anonymous,
                             env={"BROKERD_CLUSTER_SECRET": self.secret, **(env or self.env or {})})
        node.start()
        self.nodes.append(node)
        self.names[id(node)] = name
        wait_until(lambda: "joined the cluster" in node.log, timeout=10,
                   message=f"node {name} did not join:\n{node.log}")
        if wait:
            self.wait_connected()
        return node

    def start(self, n: int, *flags: str, **kwargs) -> list[BrokerProcess]:
        started = [self.node(*flags, wait=False, **kwargs) for _ in range(n)]
        self.wait_connected()
        return started

    def alive(self) -> list[BrokerProcess]:
        return [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def wait_connected(self, nodes=None, timeout: float = 15.0) -> None:
        """Until a message published on each node reaches a subscriber on
        every other one: membership, routes and links are all in place."""
        nodes = list(nodes or self.alive())
        if len(nodes) < 2:
            return
        tag = f"probe-{next(_seq)}"
        subs = []
        pubs = []
        try:
            for i, node in enumerate(nodes):
                sub = PahoClient(f"{tag}-sub{i}", V311)
                subs.append(sub)                 # before connecting: a refused one is stopped too
                sub.connect(node.port())
                sub.subscribe(f"{tag}/#", qos=0)
                pub = PahoClient(f"{tag}-pub{i}", V311)
                pubs.append(pub)
                pub.connect(node.port())
            missing = {(i, j) for i in range(len(nodes)) for j in range(len(nodes)) if i != j}
            deadline = time.monotonic() + timeout
            while missing:
                if time.monotonic() > deadline:
                    logs = "\n\n".join(f"--- {self.name(n)}\n" + "\n".join(n.output[-30:]) for n in nodes)
                    raise AssertionError(f"nodes not connected (publisher, subscriber): {sorted(missing)}\n{logs}")
                for i in {i for i, _ in missing}:
                    pubs[i].publish(f"{tag}/{i}", b"probe")
                time.sleep(0.1)
                for j, sub in enumerate(subs):
                    while not sub.messages.empty():
                        msg = sub.messages.get_nowait()
                        missing.discard((int(msg.topic.rsplit("/", 1)[1]), j))
        finally:
            for c in subs + pubs:
                try:
                    c.disconnect()
                except Exception:
                    pass

    def logs(self) -> str:
        return "\n\n".join(f"--- node {self.name(n)}\n{n.log}" for n in self.nodes)

    def stop_all(self) -> None:
        for n in self.nodes:
            n.kill()


@pytest.fixture
def cluster(redis_server, tmp_path):
    """A ``Cluster`` bound to this test: its own prefix and store; its nodes are
    killed afterwards. A failed test's report carries the nodes' logs."""
    c = Cluster(redis_server, tmp_path)
    yield c
    c.stop_all()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    c = getattr(item, "funcargs", {}).get("cluster")
    if rep.when == "call" and rep.failed and isinstance(c, Cluster):
        rep.sections.append(("brokerd node logs", c.logs()[-30000:]))
    return rep


@pytest.fixture
def tag(request):
    """A topic prefix / client id stem unique to the test."""
    return f"{request.node.name[:24].replace('[', '_').replace(']', '_')}-{os.getpid()}-{next(_seq)}"
