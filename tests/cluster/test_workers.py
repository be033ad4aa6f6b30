"""Workers per host (issue 18): ``--workers N`` runs N brokerd processes on one
host that share its MQTT listener (SO_REUSEPORT) and are members of the
cluster, each with a node id of its own (``host.slot``).

Real processes and a real Redis. Which worker holds a client is asked of the
admin API (the host's shared admin port answers for the whole cluster);
where a test needs a client on a given worker it connects again until the
kernel gave it that one (bounded).
"""

import concurrent.futures
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest
import trustme

from ..durability.test_crash import drain, drain_until, received_in_order
from ..integration.helpers import Client, connect
from ..mqtt import V5, V311, PacketTypes, props
from ..procs import ROOT, BrokerProcess, free_port, sigstop
from .conftest import PacedPublisher, settle, wait_until
from .test_failover import ranges

TOKEN = "workers-test-token-" + uuid.uuid4().hex
EXPIRY = 300
TRIES = 60          # connections tried before giving up on landing on a given worker (each: about 1 in 2)


class Host:
    """One host of the cluster: a supervisor and its ``n`` workers."""

    def __init__(self, cluster, name: str = "h", n: int = 2, *flags: str, listen=("mqtt://127.0.0.1:0",)):
        self.name = name
        self.proc = BrokerProcess("--workers", str(n), "--node-id", name, "--store", cluster.store,
                                  "--cluster", cluster.url(), "--admin", "127.0.0.1:0", *flags,
                                  listen=listen,
                                  env={"BROKERD_CLUSTER_SECRET": cluster.secret, "BROKERD_ADMIN_TOKEN": TOKEN},
                                  timeout=60)
        self.n = n

    def start(self) -> "Host":
        self.proc.start()
        wait_until(lambda: len(self.workers()) == self.n, timeout=15,
                   message=f"the admin API does not list {self.n} workers:\n{self.proc.log}")
        self.wait_linked()
        return self

    def wait_linked(self) -> None:
        """Until a message published on each worker reaches a subscriber on every other one."""
        tag = f"link-{uuid.uuid4().hex[:8]}"
        subs = {}
        for i in range(self.n):
            subs[i], _ = self.on_worker(lambda i=i: connect(self.port, f"{tag}-s{i}", V311), f"{tag}-s{i}",
                                        lambda node, i=i: node.startswith(f"{self.name}.{i}"))
            subs[i].subscribe(f"{tag}/{i}/#")
        for i in range(self.n):
            pub, _ = self.on_worker(lambda i=i: connect(self.port, f"{tag}-p{i}", V311), f"{tag}-p{i}",
                                    lambda node, i=i: node.startswith(f"{self.name}.{i}"))
            for j in range(self.n):
                if j != i:
                    settle(pub, f"{tag}/{j}/from{i}", subs[j])
            pub.disconnect()
        for s in subs.values():
            s.disconnect()

    @property
    def port(self) -> int:
        return self.proc.port()

    def api(self, path: str, at: str | None = None):
        """GET ``path`` from the host's shared admin port, or from a worker's own (``at``: HOST:PORT)."""
        base = f"http://{at}" if at else self.proc.admin_url
        req = urllib.request.Request(f"{base}{path}", headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())

    def workers(self) -> dict[str, dict]:
        """node id -> item of GET /api/v1/nodes, for this host's live workers."""
        items = self.api("/api/v1/nodes")["items"]
        return {n["id"]: n for n in items if n.get("host") == self.name and n.get("health") == "ok"}

    def holder(self, client_id: str) -> str | None:
        """The worker holding ``client_id``'s session (one at most: asserted)."""
        items = [c for c in self.api(f"/api/v1/clients?client_id={client_id}")["items"]
                 if c["client_id"] == client_id]
        assert len(items) <= 1, f"{client_id} held by several nodes: {[c['node'] for c in items]}"
        return items[0]["node"] if items else None

    def connected_on(self, client_id: str) -> str | None:
        """The worker ``client_id`` is connected to."""
        items = [c for c in self.api(f"/api/v1/clients?client_id={client_id}&connected=true")["items"]
                 if c["client_id"] == client_id]
        return items[0]["node"] if len(items) == 1 else None

    def on_worker(self, make, client_id: str, want) -> tuple[Client, str]:
        """``make()`` a connected client until the worker it is on satisfies ``want(node)``."""
        for _ in range(TRIES):
            c = make()
            node = wait_until(lambda: self.connected_on(client_id), timeout=5, message=f"{client_id} not listed")
            if want(node):
                return c, node
            c.disconnect()
            if c.clean:
                wait_until(lambda: self.holder(client_id) is None, timeout=5, message=f"{client_id} stays")
        raise AssertionError(f"{client_id}: no connection of {TRIES} landed on the wanted worker")

    def pid_of(self, node: str) -> int:
        return int(self.workers()[node]["pid"])


def started(cluster, host: Host) -> Host:
    """``host`` started, its process killed with the test's cluster (and its log in a failure's report)."""
    cluster.nodes.append(host.proc)
    cluster.names[id(host.proc)] = host.name
    return host.start()


@pytest.fixture
def host(cluster):
    return started(cluster, Host(cluster))


def persistent(port: int, client_id: str) -> Client:
    c = Client(client_id, V5, clean=False)
    return c.connect(port, properties=props(PacketTypes.CONNECT, SessionExpiryInterval=EXPIRY))


# ---------------------------------------------------------------------- refusals

@pytest.mark.parametrize("flags, says", [
    ((), "--workers 2 needs --cluster"),
    (("--cluster", "redis://127.0.0.1:1/0"), "--workers 2 needs a --store all the workers share"),
])
def test_workers_need_a_cluster_and_a_shared_store(flags, says):
    res = subprocess.run([sys.executable, "-m", "brokerd", "--workers", "2", "--allow-anonymous", *flags],
                         cwd=ROOT, env={"BROKERD_CLUSTER_SECRET": "s" * 32, "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], res.stderr


# ---------------------------------------------------------------------- one host

def test_workers_are_listed_under_their_host(host):
    workers = host.workers()
    assert sorted(workers) == ["h.0", "h.1"]
    assert sorted(w["worker"] for w in workers.values()) == [0, 1]
    assert len({w["pid"] for w in workers.values()}) == 2
    # the host's admin port is shared; each worker also has its own (the cluster's fan-out reaches it there)
    assert len({w["admin"] for w in workers.values()} | {host.proc.admin}) == 3
    metrics = host.api("/api/v1/metrics")
    assert sorted((n["node"], n["host"], n["worker"]) for n in metrics["items"]) == [("h.0", "h", 0),
                                                                                    ("h.1", "h", 1)]
    # a worker that does not answer is still listed under its host (asked on the other worker's own port:
    # the shared one may hand the connection to the stopped worker)
    sigstop(workers["h.1"]["pid"])
    try:        # both at once: stopped for one admin timeout (5 s), within its membership's lifetime
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            asked = [pool.submit(host.api, f"/api/v1/{what}", workers["h.0"]["admin"]) for what in ("nodes", "metrics")]
            items, metrics = (f.result()["items"] for f in asked)
    finally:
        os.kill(workers["h.1"]["pid"], signal.SIGCONT)
    assert sorted((n["id"], n["host"], n["worker"], n["health"]) for n in items) == [
        ("h.0", "h", 0, "ok"), ("h.1", "h", 1, "unreachable")]
    assert sorted((n["node"], n["host"], n["worker"], n["health"]) for n in metrics) == [
        ("h.0", "h", 0, "ok"), ("h.1", "h", 1, "unreachable")]


def test_a_message_from_a_device_on_one_worker_reaches_a_subscriber_on_the_other_in_order(host, tag):
    sub, a = host.on_worker(lambda: connect(host.port, f"{tag}-sub", V311), f"{tag}-sub", lambda n: True)
    sub.subscribe(f"{tag}/t/#", qos=1)
    pub, b = host.on_worker(lambda: connect(host.port, f"{tag}-pub", V311), f"{tag}-pub", lambda n: n != a)
    settle(pub, f"{tag}/t/probe", sub)
    infos = [pub.client.publish(f"{tag}/t/x", b"%05d" % i, qos=1) for i in range(500)]
    for info in infos:
        info.wait_for_publish(10)
    got = [int(m.payload) for m in drain_until(sub, range(500), idle=2.0)]
    assert got == list(range(500)), f"{a} <- {b}: {len(got)} messages, first out of order at " \
        f"{next((i for i, n in enumerate(got) if n != i), None)}"


def test_takeover_across_workers_loses_nothing(host, tag):
    """A persistent QoS 1 subscriber moves from one worker to the other while a
    stream is published: every acknowledged message reaches it, in order."""
    cid = f"{tag}-sub"
    topic = f"{tag}/stream"
    sub, a = host.on_worker(lambda: persistent(host.port, cid), cid, lambda n: True)
    sub.subscribe(topic, qos=1)
    settle(connect(host.port, f"{tag}-probe", V5), topic, sub)
    pub = PacedPublisher(host.port, topic, total=4000, rate=400).start()
    pub.wait_acked(500)
    received = []
    # every connection tried takes the session over from the one before (on the same worker, or across)
    for _ in range(TRIES):
        again = persistent(host.port, cid)
        received += drain(sub, idle=0.1, limit=1)       # what the connection taken over had received
        node = wait_until(lambda: host.connected_on(cid), timeout=5, message=f"{cid} not listed")
        if node != a:
            break
        sub = again
    else:
        raise AssertionError("the subscriber never landed on the other worker")
    assert pub.sent < pub.total, "the stream was over before the session moved"
    pub.finish()
    got = received_in_order(received + drain_until(again, pub.acked - {int(m.payload) for m in received}))
    missing = sorted(pub.acked - set(got))
    assert not missing, (f"{len(missing)} acknowledged messages lost in the move {a} -> {node}: {missing[:20]} "
                         f"(reason codes {pub.by_code()})")


@pytest.mark.slow
def test_sigkill_of_a_worker_loses_no_acknowledged_message_and_it_is_restarted(cluster, tag):
    """A persistent QoS 1 session (offline) held by worker B, a publisher on
    worker A, a plain client on B; B is SIGKILLed mid-stream. The plain client
    reconnects (to a live worker); the session is adopted by one node (never
    by the restarted B as well as another); the supervisor restarts B under a
    new id; the subscriber gets every acknowledged message."""
    host = started(cluster, Host(cluster, "h", 2, "--max-queued", "10000"))
    cid = f"{tag}-sub"
    topic = f"{tag}/stream"
    pub_c, a = host.on_worker(lambda: connect(host.port, f"{tag}-probe", V5), f"{tag}-probe", lambda n: True)
    sub, b = host.on_worker(lambda: persistent(host.port, cid), cid, lambda n: n != a)
    sub.subscribe(topic, qos=1)
    settle(pub_c, topic, sub)
    sub.disconnect()
    plain, _ = host.on_worker(lambda: connect(host.port, f"{tag}-plain", V311), f"{tag}-plain", lambda n: n == b)
    pub = None
    for _ in range(TRIES):       # the publisher on A
        pub = PacedPublisher(host.port, topic, total=3000, rate=400)
        pub_id = pub.client._client_id.decode()
        if wait_until(lambda pub_id=pub_id: host.connected_on(pub_id), timeout=5) == a:
            break
        pub.client.loop_stop()
        pub.client.disconnect()
    else:
        raise AssertionError("the publisher never landed on worker A")
    pub.start()
    pub.wait_acked(800)
    os_pid = host.pid_of(b)
    os.kill(os_pid, signal.SIGKILL)
    killed_at = pub.sent
    plain.expect_disconnect()
    back = wait_until(lambda: _try_connect(host.port, f"{tag}-plain"), timeout=10,
                      message="the killed worker's client could not connect again")
    pub.finish()
    acked = pub.acked
    restarted = wait_until(lambda: re.search(rf"worker {re.escape(b)} \(pid {os_pid}\) exited with SIGKILL.*"
                                             rf"starting it again as (\S+)", host.proc.log), timeout=10,
                           message=f"no restart of {b} logged").group(1)
    assert restarted != b
    wait_until(lambda: restarted in host.workers() and b not in host.workers(), timeout=20,
               message=f"{restarted} not listed in place of {b}: {sorted(host.workers())}")
    # the dead worker's session is adopted by exactly one live node
    adopter = wait_until(lambda: re.search(rf"\[(\S+)\]: adopted \d+ sessions of node {re.escape(b)}\b",
                                           host.proc.log), timeout=20, message=f"{b}'s sessions not adopted")
    assert len(re.findall(rf"adopted \d+ sessions of node {re.escape(b)}\b", host.proc.log)) == 1
    holder = host.holder(cid)
    assert holder == adopter.group(1), f"{cid} held by {holder}, adopted by {adopter.group(1)}"
    again = persistent(host.port, cid)
    assert again.session_present
    got = received_in_order(drain_until(again, acked))
    missing = sorted(acked - set(got))
    assert not missing, (f"{len(missing)} acknowledged messages lost: {ranges(missing)}, received {ranges(got)} "
                         f"on {host.connected_on(cid)} (killed at #{killed_at}; reason codes {pub.by_code()})")
    assert max(acked) > killed_at, "the stream did not go on after the kill"
    back.disconnect()


@pytest.mark.slow
def test_a_worker_of_a_restarted_host_that_dies_is_adopted_and_its_clients_wills_published(cluster, tag):
    """A host's workers take the same node ids each time the host starts
    (h.0, h.1). What the cluster kept in Redis about a former h.0 -- that a
    survivor adopted it (``reap:``), that it left gracefully (``left:``) --
    must not decide what happens when this h.0 dies: a survivor adopts its
    sessions and publishes the wills of its clients. (``reap:h.0`` lived an
    hour: no survivor adopted the new h.0, its sessions stayed orphaned and
    its clients' wills were never published; a stale ``left:h.1`` made the
    survivor take the killed h.1 for one that left gracefully, and publish
    none of its wills.)"""
    first = started(cluster, Host(cluster, "h", 2))
    os.kill(first.pid_of("h.0"), signal.SIGKILL)        # h.1 adopts h.0 (reap:h.0)
    wait_until(lambda: re.search(r"adopted \d+ sessions of node h\.0\b", first.proc.log), timeout=20,
               message=f"h.0 not adopted:\n{first.proc.log}")
    wait_until(lambda: "h.0-1" in first.workers(), timeout=20, message="h.0 not restarted as h.0-1")
    assert first.proc.stop() == 0       # the workers leave together, none left to adopt the others (left:h.1)

    host = started(cluster, Host(cluster, "h", 2))
    for dead, survivor in (("h.0", "h.1"), ("h.1", "h.0-1")):
        wait_until(lambda survivor=survivor: survivor in host.workers(), timeout=20,
                   message=f"{survivor} not listed: {sorted(host.workers())}")
        will = f"{tag}/will/{dead}"
        watcher, _ = host.on_worker(lambda dead=dead: connect(host.port, f"{tag}-w-{dead}", V5), f"{tag}-w-{dead}",
                                    lambda n, survivor=survivor: n == survivor)
        watcher.subscribe(will, qos=1)
        host.on_worker(lambda dead=dead, will=will: Client(f"{tag}-d-{dead}", V5).connect(
            host.port, will=(will, b"gone", 1, False)), f"{tag}-d-{dead}", lambda n, dead=dead: n == dead)
        # the will is registered in Redis just after the CONNACK (a worker killed in between, within
        # milliseconds of its client's CONNECT, loses it: not what this test is about)
        wait_until(lambda dead=dead: cluster.redis.client().hlen(f"{cluster.prefix}:wills:{dead}") > 0, timeout=10,
                   message=f"the will of {dead}'s client was never registered")
        os.kill(host.pid_of(dead), signal.SIGKILL)
        wait_until(lambda dead=dead: re.search(rf"adopted \d+ sessions of node {re.escape(dead)}\b", host.proc.log),
                   timeout=20, message=f"the killed {dead} of the restarted host was not adopted:\n{host.proc.log}")
        assert watcher.expect(timeout=10).payload == b"gone", f"the will of {dead}'s client:\n{host.proc.log}"
        watcher.disconnect()


def _try_connect(port: int, client_id: str):
    try:
        return connect(port, client_id, V311)
    except Exception:
        return None


def test_sys_broker_shows_the_hosts_figures_on_every_worker(cluster, tag):
    h = started(cluster, Host(cluster, "h", 2, "--sys-interval", "1"))
    # two clients on each worker, so that the host's count (4 + the watchers) differs from a worker's
    held = [h.on_worker(lambda i=i: connect(h.port, f"{tag}-c{i}", V311), f"{tag}-c{i}",
                        lambda n, i=i: n == f"h.{i % 2}")[0] for i in range(4)]
    watchers = [h.on_worker(lambda i=i: connect(h.port, f"{tag}-w{i}", V311), f"{tag}-w{i}",
                            lambda n, i=i: n == f"h.{i}")[0] for i in range(2)]
    for w in watchers:
        w.subscribe("$SYS/broker/clients/connected")

    last = [None, None]

    def both_see_six():
        for i, w in enumerate(watchers):
            while not w.messages.empty():
                last[i] = int(w.messages.get_nowait().payload)
        return last == [6, 6] or None

    wait_until(both_see_six, timeout=15, interval=0.5, message="$SYS/broker/clients/connected is not the host's 6")
    for c in held + watchers:
        c.disconnect()


def test_a_tenants_sys_tree_shows_its_figures_over_the_hosts_workers(cluster, tag, tmp_path):
    """With a control plane (production) every tenant's $SYS/broker tree has its own figures: they
    were the figures of the worker the subscriber landed on, so a tenant with clients on both
    workers read a count that changed with where its watcher connected, never its own total."""
    from ..controlplane import ControlPlane
    from ..mqtt import PahoClient

    (tmp_path / "console").mkdir()
    plane = ControlPlane(tmp_path / "console")
    secrets = plane.provision([{"slug": "acme", "default_acl": "allow", "devices": ["d"]},
                               {"slug": "other", "default_acl": "allow", "devices": ["d"]},
                               {"slug": "default", "default_acl": "allow", "devices": []}])   # (Host's probes)
    plane.manage("shell", "-c", "from tenants import services; from tenants.models import Tenant; "
                 "services.update_system_topics(Tenant.objects.get(slug='acme'), interval=1, parts=['clients'])")
    h = Host(cluster, "h", 2, "--sys-interval", "1")
    h.proc.env = {**plane.env, **h.proc.env}
    started(cluster, h)

    def device(who, cid):
        return lambda: PahoClient(cid, V311, username=who, password=secrets[who]).connect(h.port)

    # two of acme's clients on each worker, one of another tenant's, and a watcher of acme's on each
    held = [h.on_worker(device("acme/d", f"{tag}-c{i}"), f"{tag}-c{i}", lambda n, i=i: n == f"h.{i % 2}")[0]
            for i in range(4)]
    held.append(device("other/d", f"{tag}-o")())
    watchers = [h.on_worker(device("acme/d", f"{tag}-w{i}"), f"{tag}-w{i}", lambda n, i=i: n == f"h.{i}")[0]
                for i in range(2)]
    for w in watchers:
        w.subscribe("$SYS/broker/clients/connected", 0)

    last = [None, None]

    def both_see_six():
        for i, w in enumerate(watchers):
            while not w.messages.empty():
                last[i] = int(w.messages.get_nowait().payload)
        return last == [6, 6] or None

    wait_until(both_see_six, timeout=15, interval=0.5,
               message="acme's $SYS/broker/clients/connected is not its 6 on the host (each worker's 3?)")
    for c in held + watchers:
        c.disconnect()


# ---------------------------------------------------------------------- settings

def _settings(tmp_path, *argv, env=None, toml=None):
    from brokerd.config import load

    environ = {"BROKERD_CLUSTER_SECRET": "s" * 32, **(env or {})}
    if toml is not None:
        (tmp_path / "brokerd.toml").write_text(toml)
        argv = ("--config", str(tmp_path / "brokerd.toml"), *argv)
    return load(["--cluster", "redis://127.0.0.1:1/0", "--store", f"sqlite:///{tmp_path}/s.sqlite3", *argv],
                environ=environ)


def test_workers_auto_is_the_usable_cores_from_a_flag_the_environment_or_a_file(tmp_path):
    cores = len(os.sched_getaffinity(0))
    assert _settings(tmp_path, "--workers", "auto").worker_count() == cores
    assert _settings(tmp_path, "--workers", " AUTO ").worker_count() == cores
    assert _settings(tmp_path, env={"BROKERD_WORKERS": "auto"}).worker_count() == cores
    assert _settings(tmp_path, toml='workers = "auto"\n').worker_count() == cores
    assert _settings(tmp_path, toml="workers = 3\n").worker_count() == 3
    assert _settings(tmp_path, "--workers", "2", env={"BROKERD_WORKERS": "5"}).worker_count() == 2   # flag wins
    assert _settings(tmp_path).worker_count() == 1


@pytest.mark.parametrize("value", ["0", "-1", "two", "1025", "2.5"])
def test_workers_must_be_a_count_or_auto(tmp_path, value):
    from brokerd.config import ConfigError

    with pytest.raises(ConfigError, match="--workers must be"):
        _settings(tmp_path, "--workers", value)


# ---------------------------------------------------------------------- the supervisor's end

def _gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie not yet reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in "ZX"
    except FileNotFoundError:
        return True


def test_a_supervisor_killed_with_sigkill_leaves_its_workers_to_stop_gracefully(cluster, tag):
    """The workers die with their supervisor (PR_SET_PDEATHSIG) and stop as on
    one SIGTERM: v5 clients get DISCONNECT 0x8B, each worker logs its stop.
    The kernel sends the death signal once for each of the supervisor's
    threads that exits while the worker is its child -- asyncio's child
    watcher has one per worker -- and when that signal was SIGTERM the second
    one made the workers exit at once (how often depends on the order the
    threads end in; the next test makes that order)."""
    host = started(cluster, Host(cluster, "h", 2))
    clients = [host.on_worker(lambda i=i: connect(host.port, f"{tag}-c{i}", V5), f"{tag}-c{i}",
                              lambda n, i=i: n == f"h.{i}")[0] for i in range(2)]
    pids = [host.pid_of(f"h.{i}") for i in range(2)]
    host.proc.proc.kill()
    host.proc.proc.wait(10)
    for i, c in enumerate(clients):
        code, _ = c.expect_disconnect(timeout=20)
        assert code.value == 0x8B, f"the client on h.{i} got {code} instead of DISCONNECT 0x8B:\n{host.proc.log}"
    wait_until(lambda: all(_gone(p) for p in pids), timeout=30, message="the workers outlive their supervisor")
    wait_until(lambda: all(re.search(rf"\[h\.{i}\]: stopped$", host.proc.log, re.M) for i in range(2)), timeout=5,
               message=f"a worker did not stop gracefully:\n{host.proc.log}")
    assert "second SIGTERM" not in host.proc.log, host.proc.log


def test_a_worker_whose_supervisor_died_before_it_ran_exits_at_once(cluster, tmp_path):
    """A worker checks its parent against the supervisor's pid its settings name (a supervisor
    killed while the worker was starting, before its main ran, left it to another parent: it
    took that one for its supervisor, joined the cluster and bound the host's ports, with no
    one to stop it). Here its parent is this test, not the pid the settings name."""
    from brokerd.config import load
    from brokerd.supervisor import Supervisor, Worker

    sup = Supervisor(load(["--workers", "2", "--node-id", "orphan", "--store", cluster.store, "--cluster",
                           cluster.url(), "--listen", "mqtt://127.0.0.1:0", "--allow-anonymous"],
                          {**os.environ, "BROKERD_CLUSTER_SECRET": cluster.secret}))
    spec = sup.worker_config(sup.resolve(), Worker(0, node_id="orphan.0"))
    assert spec["parent"] == os.getpid()
    spec["parent"] = 1                               # the supervisor that started it is gone
    proc = subprocess.run([sys.executable, "-m", "brokerd.worker"], input=json.dumps(spec).encode(),
                          capture_output=True, timeout=30, env={**os.environ, "BROKERD_CLUSTER_SECRET": cluster.secret})
    assert proc.returncode == 1 and b"ready" not in proc.stdout, proc.stderr.decode()[-2000:]


# A parent standing in for the supervisor, whose threads end in the order that shows what the kernel does: the
# thread that started the worker ends (the worker gets the death signal and passes to the process's other
# thread), and once the worker is stopping (its listener closed) that thread ends too (the death signal again).
_PARENT = r"""
import json, os, socket, subprocess, sys, threading, time
from brokerd.config import load
from brokerd.supervisor import Supervisor, Worker

sup = Supervisor(load(sys.argv[1:]))
spec = json.dumps(sup.worker_config(sup.resolve(), Worker(0, node_id=sup.host + ".0"))).encode()
port = []

def start():
    proc = subprocess.Popen([sys.executable, "-m", "brokerd.worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            start_new_session=True)
    proc.stdin.write(spec)
    proc.stdin.close()
    ready = proc.stdout.readline().decode()
    port.append(int(ready.rsplit(":", 1)[1]))
    sys.stdout.write(ready)
    sys.stdout.flush()
    while not os.path.exists(os.environ["GO"]):
        time.sleep(0.05)

thread = threading.Thread(target=start)
thread.start()
thread.join()
while True:
    try:
        socket.create_connection(("127.0.0.1", port[0])).close()
    except OSError:
        os._exit(0)
    time.sleep(0.001)
"""


class _StandIn(BrokerProcess):
    def command(self) -> list[str]:
        return [sys.executable, "-c", _PARENT, *super().command()[3:]]


def test_a_worker_told_more_than_once_that_its_supervisor_died_stops_gracefully(cluster, tag, tmp_path):
    go = tmp_path / "go"
    parent = _StandIn("--workers", "2", "--node-id", "h", "--store", cluster.store, "--cluster", cluster.url(),
                      listen=("mqtt://127.0.0.1:0",), env={"BROKERD_CLUSTER_SECRET": cluster.secret, "GO": str(go)},
                      timeout=60)
    cluster.nodes.append(parent)
    cluster.names[id(parent)] = "h.0 under a stand-in parent"
    parent.start()
    wait_until(lambda: "listening on" in parent.log, timeout=10, message=parent.log)
    client = connect(parent.port(), f"{tag}-c", V5)
    go.touch()
    code, _ = client.expect_disconnect(timeout=20)
    assert code.value == 0x8B, f"got {code} instead of DISCONNECT 0x8B:\n{parent.log}"
    wait_until(lambda: re.search(r"\[h\.0\]: stopped$|exiting now", parent.log, re.M), timeout=20,
               message=f"the worker did not stop:\n{parent.log}")
    assert "exiting now" not in parent.log, parent.log


# ---------------------------------------------------------------------- tenant rates

def test_a_tenants_rates_are_the_hosts_not_each_workers(cluster, tag, tmp_path):
    """A tenant limited to 1,000 bytes/s with a publisher on each worker: each one's 3,000-byte
    message puts the host's bucket in debt, shared by the two workers, so neither publisher's next
    message goes for more than 3 s (at least 3.5 s at two thirds of the rate). Before, each worker
    applied the whole rate: both went after 2 s, the tenant sending twice its quota (16 times with
    ``--workers auto`` on 16 cores). And a tenant's connect rate of 2/s lets 2 of a burst of 20
    CONNECTs in on the host, not 2 per worker."""
    from ..controlplane import ControlPlane
    from ..integration.raw import connect_packet
    from ..mqtt import PahoClient

    (tmp_path / "console").mkdir()
    plane = ControlPlane(tmp_path / "console")
    secrets = plane.provision([{"slug": "acme", "default_acl": "allow", "devices": ["d"],
                                "quota": {"tenant_bytes_in": 1000}},
                               {"slug": "burst", "default_acl": "allow", "devices": ["d"],
                                "quota": {"connect_rate": 2}},
                               {"slug": "default", "default_acl": "allow", "devices": []}])   # (Host's probes)
    h = Host(cluster, "h", 2)
    h.proc.env = {**plane.env, **h.proc.env}
    started(cluster, h)

    def device(cid):
        return lambda: PahoClient(cid, V311, username="acme/d", password=secrets["acme/d"]).connect(h.port)

    sub = device(f"{tag}-sub")()
    sub.subscribe("t", 1)
    pubs = [h.on_worker(device(f"{tag}-p{i}"), f"{tag}-p{i}", lambda n, i=i: n == f"h.{i}")[0] for i in range(2)]
    time.sleep(2.5)                     # membership rounds (every second): each worker learns the other's share
    for p in pubs:
        p.publish("t", b"x" * 3000, qos=1, wait=False)
    assert [len(m.payload) for m in sub.expect_n(2, timeout=10)] == [3000, 3000]
    for i, p in enumerate(pubs):
        p.publish("t", b"after%d" % i, qos=1, wait=False)
    sub.expect_none(3.0)                # each worker owes at least 2,333 bytes at most 667 bytes/s
    assert sorted(m.payload for m in sub.expect_n(2, timeout=15)) == [b"after0", b"after1"]
    for c in [sub, *pubs]:
        c.disconnect()

    socks = []
    for i in range(20):
        s = socket.create_connection(("127.0.0.1", h.port), timeout=10)
        s.sendall(connect_packet(f"{tag}-b{i}", 5, username="burst/d", password=secrets["burst/d"].encode()))
        socks.append(s)
    codes = [s.recv(64)[3] for s in socks]          # CONNACK: 0x20, length, flags, reason
    for s in socks:
        s.close()
    assert 1 <= codes.count(0) <= 2 and codes.count(0x9F) >= 18, codes


# ---------------------------------------------------------------------- the host's limits

def test_max_connections_is_the_hosts_not_each_workers(cluster, tag):
    """--max-connections 4 on a host of 2 workers: the host takes at most 4 connections (each worker
    its share), the others are refused with CONNACK 0x97 (v5) -- not 4 on each worker, 8 on the host."""
    from ..integration.raw import RawClient

    h = started(cluster, Host(cluster, "h", 2, "--max-connections", "4"))
    wait_until(lambda: not h.api("/api/v1/clients?connected=true")["items"], timeout=10,
               message="the start-up's link probes are still connected")
    held, codes = [], []
    for i in range(12):
        c = RawClient(h.port)
        codes.append(c.connect(f"{tag}-{i}", version=5).code)
        held.append(c)
    try:
        assert codes.count(0) <= 4, f"the host took {codes.count(0)} connections past --max-connections 4: {codes}"
        assert set(codes) <= {0, 0x97}, codes
        assert codes.count(0) >= 1
    finally:
        for c in held:
            c.close()


def test_preauth_budget_is_the_hosts_not_each_workers(cluster, tag):
    """--preauth-budget 640000 on a host of 2 workers: 40 sockets each holding a 60 KB CONNECT short of its
    last 10 bytes -- the host holds at most 640000 bytes of them (10 sockets), not that much on each worker."""
    from ..integration import raw

    budget = 640_000
    h = started(cluster, Host(cluster, "h", 2, "--preauth-budget", str(budget)))
    data = raw.connect_packet("partial", version=5, username="u", password=b"p" * 60_000)
    socks = []
    try:
        for _ in range(40):
            s = socket.create_connection(("127.0.0.1", h.port), timeout=5)
            socks.append(s)
            try:
                s.sendall(data[:-10])
            except OSError:
                pass
        time.sleep(1.0)             # let the workers read what is in flight
        held = 0
        for s in socks:
            s.setblocking(False)
            try:
                held += s.recv(65536) != b""
            except BlockingIOError:
                held += 1
            except OSError:
                pass
        assert held <= budget // (len(data) - 10), f"the host holds {held} incomplete CONNECTs of {len(data)} bytes"
        assert held >= 1
    finally:
        for s in socks:
            s.close()
    c = Client(f"{tag}-after", V5).connect(h.port)
    c.disconnect()


@pytest.mark.parametrize("flags, want", [
    (("--max-connections", "5", "--queue-budget", "3000000", "--preauth-budget", "1000001"),
     [(3, 1_500_000, 500_001), (2, 1_500_000, 500_000)]),
    # no queue budget stays none; a worker's pre-authentication share holds one CONNECT of the largest size
    (("--queue-budget", "0", "--preauth-budget", "65536"), [(50_000, 0, 65536), (50_000, 0, 65536)]),
])
def test_each_worker_gets_its_share_of_the_hosts_limits(flags, want):
    from brokerd.config import Config, load
    from brokerd.supervisor import Supervisor, Worker

    base = load(["--workers", "2", "--cluster", "redis://127.0.0.1:1/0", "--store", "sqlite:////tmp/unused.db",
                 *flags], environ={"BROKERD_CLUSTER_SECRET": "s" * 32})
    sup = Supervisor(base)
    got = [Config(**sup.worker_config(base, Worker(i))["config"]) for i in range(2)]
    assert [(c.max_connections, c.queue_budget, c.preauth_budget) for c in got] == want
    assert all(c.worker_count() == 1 for c in got)


# ---------------------------------------------------------------------- the supervisor

def test_sighup_while_a_worker_restarts_does_not_kill_it(cluster, tag):
    """SIGHUP (a rotated certificate: a deploy hook's reload) reaches the supervisor while it starts a
    worker again: the starting worker, not yet listening for it, must not be killed by it (the default
    action of SIGHUP) -- it starts, and reads the certificate files as they are then."""
    h = started(cluster, Host(cluster, "h", 2))
    os.kill(h.pid_of("h.0"), signal.SIGKILL)
    wait_until(lambda: "starting it again as h.0-1" in h.proc.log, timeout=10, message=h.proc.log)
    deadline = time.monotonic() + 4.0           # over the restart delay (0.5 s) and the new worker's start
    while time.monotonic() < deadline:
        h.proc.proc.send_signal(signal.SIGHUP)
        time.sleep(0.05)
    wait_until(lambda: "h.0-1" in h.workers(), timeout=20,
               message=f"h.0-1 not listed: {sorted(h.workers())}\n{h.proc.log}")
    assert "exited with SIGHUP" not in h.proc.log, h.proc.log
    assert h.proc.proc.poll() is None


def test_sighup_rotates_the_certificate_of_every_worker_and_a_broken_one_keeps_a_restarted_worker_out(
        cluster, tag, tmp_path):
    """SIGHUP to the supervisor reaches every worker: each serves the rotated certificate. A broken key
    file keeps the certificate in use; a worker restarted while it is broken cannot start: the
    supervisor says why and tries again, less often, while the other worker serves; once the file is
    good again the worker is back."""
    import shutil

    from ..deploy.test_operations import handshake_fails, server_cert, tls_client

    old_crt, old_key, old_ca = server_cert(trustme.CA(), tmp_path, "old")
    live_crt, live_key = str(tmp_path / "server.crt"), str(tmp_path / "server.key")
    shutil.copy(old_crt, live_crt)
    shutil.copy(old_key, live_key)
    h = started(cluster, Host(cluster, "h", 2, "--tls-cert", live_crt, "--tls-key", live_key,
                              listen=("mqtt://127.0.0.1:0", "mqtts://127.0.0.1:0")))
    tls_port = h.proc.port("mqtts")
    new_crt, new_key, new_ca = server_cert(trustme.CA(), tmp_path, "new")
    shutil.copy(new_crt, live_crt)
    shutil.copy(new_key, live_key)
    h.proc.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: len(re.findall(r"\[h\.\d\]: TLS certificate reloaded", h.proc.log)) == 2, timeout=10,
               message=h.proc.log)
    for _ in range(8):          # over both workers (each connection: about 1 in 2)
        assert handshake_fails(tls_port, old_ca), "a worker still serves the old certificate"
    seen = set()
    for i in range(TRIES):
        c = tls_client(f"{tag}-t{i}", new_ca).connect(tls_port)
        seen.add(wait_until(lambda i=i: h.connected_on(f"{tag}-t{i}"), timeout=5))
        c.disconnect()
        if len(seen) == 2:
            break
    assert seen == {"h.0", "h.1"}

    (tmp_path / "server.key").write_text("not a key")
    h.proc.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: len(re.findall(r"\[h\.\d\]: TLS certificate not reloaded", h.proc.log)) == 2, timeout=10,
               message=h.proc.log)
    os.kill(h.pid_of("h.1"), signal.SIGKILL)
    wait_until(lambda: len(re.findall(r"worker h\.1-\d+ \(pid \d+\) exited with exit code 2", h.proc.log)) >= 2,
               timeout=15, message=h.proc.log)
    # the worker says why, naming the files (was: "cannot listen: [SSL] PEM lib (_ssl.c:3926)")
    assert re.search(rf"\[h\.1-1\]: cannot load the TLS certificate \(--tls-cert {re.escape(live_crt)}, "
                     rf"--tls-key {re.escape(live_key)}\)", h.proc.log), h.proc.log
    # tried again less and less often: 0.5 s, 1 s, 2 s ...
    delays = [float(d) for d in re.findall(r"starting it again as h\.1-\d+ in ([\d.]+) s", h.proc.log)]
    assert delays[:3] == [0.5, 1.0, 2.0][:len(delays[:3])], delays
    for _ in range(4):          # the other worker serves meanwhile
        with tls_client(f"{tag}-during", new_ca).connect(tls_port):
            pass
    shutil.copy(new_key, live_key)
    wait_until(lambda: any(n.startswith("h.1-") for n in h.workers()), timeout=30,
               message=f"h.1 not back: {sorted(h.workers())}\n{h.proc.log}")
    assert h.proc.proc.poll() is None


def test_a_second_host_on_a_port_a_host_listens_on_is_refused(cluster):
    """--workers binds its listeners with SO_REUSEPORT, which lets any process of the same user bind them
    too: a second host started by mistake on the port of a running one must not silently take part
    of its connections (as a second single-process brokerd cannot): it exits 2, "cannot listen"."""
    port = free_port()
    first = started(cluster, Host(cluster, "h", 2, listen=(f"mqtt://127.0.0.1:{port}",)))
    res = subprocess.run([sys.executable, "-m", "brokerd", "--workers", "2", "--node-id", "g", "--allow-anonymous",
                          "--store", cluster.store, "--cluster", cluster.url(), "--listen",
                          f"mqtt://127.0.0.1:{port}"],
                         cwd=ROOT, env=dict(os.environ, BROKERD_CLUSTER_SECRET=cluster.secret),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "cannot listen" in res.stderr, (res.returncode, res.stderr[-2000:])
    assert "brokerd ready" not in res.stdout
    assert len(first.workers()) == 2
    # a host stopped and started again on its port is not taken for another (its connections in TIME_WAIT)
    c = connect(port, "tw", V311)
    c.disconnect()
    assert first.proc.stop() == 0
    again = started(cluster, Host(cluster, "h", 2, listen=(f"mqtt://127.0.0.1:{port}",)))
    assert again.port == port


@pytest.mark.parametrize("after", [0.1, 0.8])
def test_sigterm_while_a_worker_restarts_stops_the_host(cluster, tag, after):
    """SIGTERM to the supervisor while it waits to start a dead worker again (0.1 s into its 0.5 s) or
    while that worker starts (0.8 s): the host stops -- exit 0, every worker gone, none started after."""
    h = started(cluster, Host(cluster, "h", 2))
    pids = {n: int(w["pid"]) for n, w in h.workers().items()}
    os.kill(pids["h.0"], signal.SIGKILL)
    wait_until(lambda: "starting it again as h.0-1" in h.proc.log, timeout=10, message=h.proc.log)
    time.sleep(after)
    t0 = time.monotonic()
    code = h.proc.stop(timeout=20)
    took = time.monotonic() - t0
    log = h.proc.log
    assert code == 0, log
    assert took < 10, f"stopped in {took:.1f} s\n{log}"
    started_pids = [int(p) for p in re.findall(r"\(pid (\d+)\)", log)] + list(pids.values())
    left = [pid for pid in set(started_pids) if os.path.exists(f"/proc/{pid}")]
    assert not left, f"workers still running: {left}\n{log}"
    assert "did not start" not in log, log       # (was an ERROR line at a stop: told to stop, not failed)


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.parametrize("scheme", ["mqtt", "mqtts"])
def test_a_socket_flood_past_a_workers_descriptor_limit_leaves_it_working(cluster, tag, tmp_path, scheme):
    """Worker h.0 has 40 descriptors (prlimit, about 30 open before any client); 60 sockets connect to
    the host and stay silent. Each worker holds client sockets only up to its descriptor limit less
    the descriptors its own work needs: h.0 closes the rest at accept, without spinning (CPU) and
    without starving itself -- it was left no descriptor for its cluster bus, so it fenced itself and
    disconnected every client (the canary too). The canary on h.0 keeps its round trips; clients
    connect again once the flood is gone."""
    from ..deploy.test_operations import server_cert, tls_client

    crt, key, ca = server_cert(trustme.CA(), tmp_path, "s")
    h = started(cluster, Host(cluster, "h", 2, "--tls-cert", crt, "--tls-key", key,
                              listen=("mqtt://127.0.0.1:0", "mqtts://127.0.0.1:0")))
    port = h.proc.port(scheme)
    make = (lambda cid: connect(port, cid, V5)) if scheme == "mqtt" else \
        (lambda cid: tls_client(cid, ca).connect(port))
    canary, _ = h.on_worker(lambda: make(f"{tag}-canary"), f"{tag}-canary", lambda n: n == "h.0")
    canary.subscribe(f"{tag}/c", qos=1)
    pid = h.pid_of("h.0")
    limit = len(os.listdir(f"/proc/{pid}/fd")) + 10
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, limit))
    time.sleep(0.6)                 # (the worker reads its limit again at its next sweep, every 0.5 s)
    socks = []
    cpu0 = _cpu_seconds(pid)
    t0 = time.monotonic()
    try:
        for _ in range(60):
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        worst = 0.0
        while time.monotonic() - t0 < 4:
            t = time.monotonic()
            canary.publish(f"{tag}/c", b"x", qos=1)
            assert canary.expect(timeout=10).payload == b"x"
            worst = max(worst, time.monotonic() - t)
            time.sleep(0.05)
        cpu = _cpu_seconds(pid) - cpu0
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    finally:
        for s in socks:
            s.close()
    log = h.proc.log
    assert "lost the cluster bus" not in log, log
    assert worst < 1.0, f"the canary's worst round trip: {worst:.2f} s"
    assert cpu < 1.0, f"h.0 took {cpu:.2f} s of CPU in 4 s of the flood"
    assert fds < limit, f"h.0 at its descriptor limit: {fds} of {limit}"
    assert re.search(r"\[h\.0\]: at the descriptor limit", log), log
    def connects(cid):
        try:
            make(cid).disconnect()
            return True
        except Exception:           # (h.0 may not have seen the flood's sockets close yet)
            return None

    for i in range(4):
        wait_until(lambda i=i: connects(f"{tag}-after{i}"), timeout=10, message="no client connects after the flood")
    canary.disconnect()


@pytest.mark.xfail(reason="known defect, not fixed: each worker admits against the others' connections as of the "
                          "last membership round (1 s), so a burst spread over the workers passes the quota (4 of "
                          "10 let in here; as on two nodes of a cluster): needs an admission atomic in Redis")
def test_a_tenants_connection_quota_is_the_hosts_in_a_burst_over_its_workers(cluster, tag, tmp_path):
    """A tenant's max_connections 2 on a host of 2 workers: 10 CONNECTs sent at once (over both
    workers) -- at most 2 are let in, and none later."""
    from ..controlplane import ControlPlane
    from ..integration.raw import connect_packet

    (tmp_path / "console").mkdir()
    plane = ControlPlane(tmp_path / "console")
    secrets = plane.provision([{"slug": "acme", "default_acl": "allow", "devices": ["d"],
                                "quota": {"max_connections": 2}},
                               {"slug": "default", "default_acl": "allow", "devices": []}])   # (Host's probes)
    h = Host(cluster, "h", 2)
    h.proc.env = {**plane.env, **h.proc.env}
    started(cluster, h)
    time.sleep(2.5)                     # membership rounds: each worker has the other's counts
    socks = []
    try:
        for _ in range(10):
            s = socket.create_connection(("127.0.0.1", h.port), timeout=10)
            socks.append(s)
        for i, s in enumerate(socks):
            s.sendall(connect_packet(f"{tag}-b{i}", 5, username="acme/d", password=secrets["acme/d"].encode()))
        codes = [s.recv(64)[3] for s in socks]
        assert 1 <= codes.count(0) <= 2, codes
        time.sleep(2.5)
        with socket.create_connection(("127.0.0.1", h.port), timeout=10) as s:
            s.sendall(connect_packet(f"{tag}-late", 5, username="acme/d", password=secrets["acme/d"].encode()))
            late = s.recv(64)[3]
        assert codes.count(0) + (late == 0) <= 2, (codes, late)
    finally:
        for s in socks:
            s.close()


@pytest.mark.parametrize("after", ["spawned", "listening"])
def test_sigterm_while_the_host_starts_stops_it_without_an_error(cluster, after):
    """SIGTERM to the supervisor while its workers start (a stop right after a start: systemd, a
    deploy): the host stops -- exit 0, no worker left, no "did not start" error."""
    h = Host(cluster, "h", 2)
    cmd = h.proc.command()
    env = dict(os.environ, PYTHONUNBUFFERED="1", **h.proc.env)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    want = "store " if after == "spawned" else "listening on"
    for line in proc.stdout:
        lines.append(line)
        if want in line:
            break
    children = []
    for task in os.listdir(f"/proc/{proc.pid}/task"):
        with open(f"/proc/{proc.pid}/task/{task}/children") as fh:
            children += [int(p) for p in fh.read().split()]
    proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    log = "".join(lines) + out
    assert len(children) == 2, children
    assert proc.returncode == 0, log
    assert "did not start" not in log and "ERROR" not in log, log
    assert not [p for p in children if os.path.exists(f"/proc/{p}")], log
