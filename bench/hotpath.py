#!/usr/bin/env python3
"""The Python work brokerd does per message, driven in-process (issue 18).

The socket benchmarks (``bench/run.py``, ``bench/ab.py``) measure what a
user sees, and move by ±5 % with the machine's load. This driver runs the
real connection, channel, broker and router code -- ``MqttConnection``
on a fake transport that keeps nothing, the ``Flusher`` run by hand once per
"iteration" -- with no event loop and no system call, so its cost per
message is the Python around the syscalls alone, and under callgrind an
instruction count that does not move with the machine's noise:

    python bench/hotpath.py q1 --messages 20000          # µs per message (perf_counter)
    python bench/hotpath.py q1 --messages 2000 --callgrind   # instructions per message

Scenarios, shaped like ``bench/run.py``'s:

- ``q1``: pairs at QoS 1, one PUBLISH per socket read and one PUBACK per
  read back (b20k: a steady rate, where nothing batches), ``--batch`` reads
  per loop iteration;
- ``q0``: pairs at QoS 0, ``--per-read`` PUBLISHes in each read (a2);
- ``fan``: one publisher, ``--clients`` subscribers of one topic (c1);
- ``conn``: a connect storm: each "message" is a new client's CONNECT,
  CONNACK, SUBSCRIBE (a topic of its own) and SUBACK, and it stays idle;
- ``p1``: pairs at QoS 1 with persistent sessions (clean session 0: p1 of
  ``bench/run.py``), ``--batch`` publishers per journal batch; ``--store``
  says what a commit does: ``none`` (memory://: no journal at all),
  ``journal`` (the durable path of the event-loop thread alone: the batch is
  taken and committed by hand, nothing written), ``sqlite`` (also
  ``SQLiteStore._apply`` on a temporary file, in this thread: the store
  thread's work counted with it).

``--acl`` gives every client the ACL of a tenant with 20 rules (the bench
tenant of ``bench/run.py``'s brokerd-full); ``--full`` (q0, q1, fan) is
brokerd-full itself: every client authenticated as that tenant's device
through a real ``TenantControl``, a store's journal and a one-node cluster
(``ClusterNode`` wired as the server does, its bus never started: nothing
per message reaches it); ``--usage DIR`` attaches the usage log. Nothing here asserts a speed; it is a measuring tool.
"""

import argparse
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from brokerd.broker import Broker, BrokerConfig  # noqa: E402
from brokerd.budget import QueuePacer  # noqa: E402
from brokerd.server import _tune_gc  # noqa: E402
from brokerd.transports.connection import Flusher, MqttConnection, TimeoutWheel  # noqa: E402

RULES = [{"topic": f"other/{i}/#", "action": "both", "allow": i % 2 == 0} for i in range(19)] + [
    {"topic": "bench/#", "action": "both", "allow": True}]


def _s(b: bytes) -> bytes:
    return struct.pack(">H", len(b)) + b


def _packet(b0: int, body: bytes) -> bytes:
    n, rl = len(body), b""
    while True:
        d, n = n & 0x7F, n >> 7
        rl += bytes((d | (0x80 if n else 0),))
        if not n:
            return bytes((b0,)) + rl + body


def connect(cid: str, clean: bool = True, username: str | None = None, password: bytes | None = None) -> bytes:
    flags = (2 if clean else 0) | (0xC0 if username else 0)
    creds = _s(username.encode()) + _s(password) if username else b""
    return _packet(0x10, _s(b"MQTT") + bytes((4, flags)) + struct.pack(">H", 60) + _s(cid.encode()) + creds)


def subscribe(topic: str, qos: int) -> bytes:
    return _packet(0x82, struct.pack(">H", 1) + _s(topic.encode()) + bytes((qos,)))


def publish(topic: str, payload: bytes, qos: int, pid: int = 0) -> bytes:
    return _packet(0x30 | (qos << 1), _s(topic.encode()) + (struct.pack(">H", pid) if qos else b"") + payload)


ACKS = [bytes((0x40, 2, p >> 8, p & 0xFF)) for p in range(65536)]


class FakeLoop:
    def __init__(self):
        self.ready = []
        self.now = 1000.0

    def call_soon(self, fn, *args):
        self.ready.append((fn, args))

    def call_later(self, delay, fn, *args):
        return None

    def time(self):
        return self.now

    def create_task(self, coro, name=None):
        coro.close()

    def run_ready(self):
        ready, self.ready = self.ready, []
        for fn, args in ready:
            fn(*args)


class FakeTransport:
    __slots__ = ("written",)

    def __init__(self):
        self.written = 0

    def get_extra_info(self, name, default=None):
        return ("127.0.0.1", 40000) if name == "peername" else default

    def set_write_buffer_limits(self, high=None, low=None):
        pass

    def write(self, data):
        self.written += len(data)

    def pause_reading(self):
        pass

    def resume_reading(self):
        pass

    def close(self):
        pass


class Listener:
    websocket = False
    url = "mqtt://127.0.0.1:1883"


class FakeServer:
    """What MqttConnection reads of brokerd.server.Server."""

    def __init__(self, broker: Broker):
        self.loop = FakeLoop()
        self.broker = broker
        self.limits = broker.limits
        self.connections = set()
        self.pacer = QueuePacer(broker.budget, self.connections, self.loop.call_later)
        self.flusher = Flusher(self.loop, self.pacer.after_writes)
        self.write_high = broker.limits.max_pending
        self.timeouts = TimeoutWheel(0.5, self.loop.now)
        self.full = False


SECRET = b"bench-secret"


def full_snapshot() -> dict:
    """brokerd-full's tenant as the console publishes it: 20 ACL rules (the one that allows the
    benchmark's topics last), default deny, one device d0 with a secret, no quota."""
    import hashlib

    cred = {"id": 1, "hash": "sha256$" + hashlib.sha256(SECRET).hexdigest(), "enabled": True}
    acl = [{"id": i + 1, "position": i, "who": "all", **r} for i, r in enumerate(RULES)]
    return {"schema": 1, "tenant": "bench", "status": "active", "default_acl": "deny",
            "devices": {"d0": {"enabled": True, "credentials": [cred]}}, "acl": acl, "quota": {}, "rules": []}


class NoBus:
    """A one-node cluster's bus, never started (nothing per message reaches it)."""


def attach_full(broker: Broker, server: "FakeServer") -> None:
    """--full, after the clients connected: a store's journal (nothing is written for clean
    sessions: commits by hand, none due) and a one-node cluster (brokerd-full's --cluster)."""
    from brokerd.cluster.node import ClusterNode
    from brokerd.cluster.peers import LinkSettings
    from brokerd.persistence import Persistence
    from brokerd.store import Journal

    broker.use_store(Persistence(Journal()))
    node = ClusterNode("bench", NoBus(), broker, loop=server.loop, clock=server.loop.time,
                       links=LinkSettings("127.0.0.1", 0, b"s" * 32), flusher=server.flusher, budget=broker.budget)
    broker.attach_cluster(node)


def make_broker(args) -> tuple[Broker, FakeServer]:
    broker = Broker(BrokerConfig(allow_anonymous=True))
    server = FakeServer(broker)
    server.full = args.full
    if args.full:
        from brokerd.tenancy.control import TenantControl

        broker.auth = TenantControl(allow_anonymous=False)
        broker.auth.apply("bench", 1, full_snapshot())
    if args.usage:
        from brokerd.metrics.usage import UsageLog

        broker.attach_usage(UsageLog(args.usage, "bench", 0.0))
    return broker, server


def client(server: FakeServer, cid: str, sub: str | None = None, qos: int = 0, acl=None,
           clean: bool = True) -> MqttConnection:
    conn = MqttConnection(server, Listener())
    conn.connection_made(FakeTransport())
    full = server.full
    conn.data_received(connect(cid, clean, *(("bench/d0", SECRET) if full else ())))
    if full:
        assert conn.channel.acl is not None and conn.channel.ns.name == "bench", "not authenticated"
    elif acl:
        from brokerd.tenancy.acl import ClientAcl

        conn.channel.acl = ClientAcl(RULES, False, "d0", cid)
    if sub is not None:
        conn.data_received(subscribe(sub, qos))
    server.loop.run_ready()
    return conn


def scenario_q1(args, server):
    n = args.clients
    pubs = [client(server, f"p{i}", acl=args.acl) for i in range(n)]
    subs = [client(server, f"s{i}", f"bench/pairs/{i}", 1, acl=args.acl) for i in range(n)]
    payload = bytes(args.payload)
    # the frames, made once, whatever --messages is (so that under callgrind Ir(2M) - Ir(M) is the
    # broker's work alone): each publisher reuses packet id 1 (its PUBACK comes before its next
    # PUBLISH); the broker numbers its deliveries to a subscriber 1, 2, ... 65535, 1, ...
    frames = [publish(f"bench/pairs/{i}", payload, 1, 1) for i in range(n)]
    sent = [0] * n
    loop = server.loop
    batch = args.batch

    def run(messages):
        k = 0
        while k < messages:
            lo = k % n
            group = range(lo, min(lo + batch, n))
            for i in group:
                sent[i] = sent[i] % 65535 + 1
                pubs[i].data_received(frames[i])
            loop.run_ready()
            for i in group:
                subs[i].data_received(ACKS[sent[i]])
            loop.run_ready()
            k += len(group)
        return k
    return run


def scenario_q0(args, server):
    n = args.clients
    pubs = [client(server, f"p{i}", acl=args.acl) for i in range(n)]
    [client(server, f"s{i}", f"bench/pairs/{i}", 0, acl=args.acl) for i in range(n)]
    payload = bytes(args.payload)
    reads = [publish(f"bench/pairs/{i}", payload, 0) * args.per_read for i in range(n)]
    loop = server.loop
    batch = args.batch

    def run(messages):
        k = 0
        while k < messages:
            lo = (k // args.per_read) % n
            for i in range(lo, min(lo + batch, n)):
                pubs[i].data_received(reads[i])
                k += args.per_read
            loop.run_ready()
        return k
    return run


def scenario_fan(args, server):
    pub = client(server, "p0", acl=args.acl)
    [client(server, f"s{i}", "bench/fanout", 0, acl=args.acl) for i in range(args.clients)]
    read = publish("bench/fanout", bytes(args.payload), 0)
    loop = server.loop

    def run(messages):
        k = 0
        while k < messages:
            pub.data_received(read)
            loop.run_ready()
            k += args.clients
        return k
    return run


class HandCommit:
    """What ``StoreWriter._run`` does for one batch, synchronously: take the
    journal's batch, write it (``store``, or nothing), mark it durable, let
    the broker send what waited, run the batch's callbacks."""

    def __init__(self, broker: Broker, store=None):
        self.broker = broker
        self.journal = broker.journal
        self.store = store

    def __call__(self, now: float) -> None:
        journal = self.journal
        if not journal:
            return
        gen, ops, waiters = journal.take()
        store = self.store
        if store is not None and ops:
            store._apply(ops)
            if store._checkpoint_due(len(ops)):          # SQLiteStore.apply's checkpoints, counted too
                store._calibrate(store._checkpoint())
        journal.committed = gen
        self.broker.commit_done(gen, now)
        for fn in waiters:
            fn(True)


def use_store(args, broker: Broker):
    """-> the commit function of ``--store`` (None: memory://, no journal)."""
    if args.store == "none":
        return None
    from brokerd.persistence import Persistence
    from brokerd.store import Journal

    broker.use_store(Persistence(Journal()))
    store = None
    if args.store == "sqlite":
        from brokerd.store.sqlite import SQLiteStore

        tmp = tempfile.mkdtemp(prefix="hotpath-")
        store = SQLiteStore(f"sqlite:///{tmp}/p1.sqlite3")
        store._open()
    return HandCommit(broker, store)


def scenario_p1(args, server):
    n = args.clients
    broker = server.broker
    commit = use_store(args, broker)
    clean = commit is None
    pubs = [client(server, f"p{i}", acl=args.acl, clean=clean) for i in range(n)]
    subs = [client(server, f"s{i}", f"bench/pairs/{i}", 1, acl=args.acl, clean=clean) for i in range(n)]
    payload = bytes(args.payload)
    frames = [publish(f"bench/pairs/{i}", payload, 1, 1) for i in range(n)]
    sent = [0] * n
    loop = server.loop
    batch = args.batch
    if commit is not None:
        commit(loop.now)
        loop.run_ready()

    def run(messages):
        k = 0
        while k < messages:
            lo = k % n
            group = range(lo, min(lo + batch, n))
            for i in group:
                pubs[i].data_received(frames[i])
            loop.run_ready()
            if commit is not None:
                commit(loop.now)        # the appends (and the acks of the batch before): PUBACKs, deliveries
                loop.run_ready()
            for i in group:
                sent[i] = sent[i] % 65535 + 1
                subs[i].data_received(ACKS[sent[i]])
            loop.run_ready()
            k += len(group)
        return k
    return run


def scenario_conn(args, server):
    """One "message" is one new client: connection_made, CONNECT (clean, keepalive 60), CONNACK,
    SUBSCRIBE to a topic of its own (QoS 0), SUBACK -- then it stays connected, idle (the
    connect storm of bench/conns.py, without the sockets)."""
    made = [0]
    held = []
    # frames for every client of the run, made before it (as many in callgrind's M and 2M runs)
    cids = [f"c{i}" for i in range(args.prepare or 2 * args.messages + max(args.messages // 10, 1000))]
    reads = [connect(cid) for cid in cids]
    subs = [subscribe(f"bench/idle/{cid}", 0) for cid in cids]
    listener = Listener()
    loop = server.loop

    def run(messages):
        for _ in range(messages):
            i = made[0]
            made[0] = i + 1
            conn = MqttConnection(server, listener)
            conn.connection_made(FakeTransport())
            conn.data_received(reads[i])
            loop.run_ready()
            conn.data_received(subs[i])
            loop.run_ready()
            held.append(conn)
        return messages
    return run


SCENARIOS = {"q1": scenario_q1, "q0": scenario_q0, "fan": scenario_fan, "p1": scenario_p1, "conn": scenario_conn}


def callgrind(args, argv: list[str]) -> int:
    """Ir(2M) - Ir(M), over M: the instructions of one message, exactly."""
    rest = [a for a in argv if a != "--callgrind"]
    counts = []
    with tempfile.TemporaryDirectory() as tmp:
        for m in (args.messages, 2 * args.messages):
            out = Path(tmp) / f"cg.{m}"
            cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, __file__, *rest,
                   "--messages", str(m), "--count-only",
                   "--prepare", str(3 * args.messages + max(args.messages // 10, 1000))]
            subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "PYTHONHASHSEED": "0"})
            totals = [ln for ln in out.read_text().splitlines() if ln.startswith(("summary:", "totals:"))]
            counts.append(int(totals[-1].split()[1]))
    per = (counts[1] - counts[0]) / args.messages
    print(f"{args.scenario}: {per:,.0f} instructions per message (callgrind, {args.messages} vs "
          f"{2 * args.messages} messages)")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenario", choices=SCENARIOS)
    ap.add_argument("--messages", type=int, default=20000, help="messages delivered in the measured part")
    ap.add_argument("--clients", type=int, default=100, help="pairs (q1, q0) or subscribers (fan)")
    ap.add_argument("--payload", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=20, help="socket reads per loop iteration")
    ap.add_argument("--per-read", type=int, default=4, help="q0: PUBLISHes in one read")
    ap.add_argument("--store", choices=("none", "journal", "sqlite"), default="journal",
                    help="p1: what a commit does (none: memory://, no journal)")
    ap.add_argument("--acl", action="store_true", help="every client has the 20-rule ACL of brokerd-full's tenant")
    ap.add_argument("--full", action="store_true",
                    help="q0, q1, fan: brokerd-full's features: every client authenticated as device d0 of a "
                         "tenant with the 20 rules of --acl (TenantControl), a store's journal and a one-node "
                         "cluster")
    ap.add_argument("--usage", metavar="DIR", help="attach the usage log (nothing is written)")
    ap.add_argument("--callgrind", action="store_true",
                    help="instructions per message: runs itself under callgrind with --messages M and 2M and "
                         "prints the difference over M (start-up and warming cancel out)")
    ap.add_argument("--count-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--prepare", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.full and args.scenario not in ("q0", "q1", "fan"):
        ap.error("--full: q0, q1 or fan")
    if args.callgrind:
        return callgrind(args, argv if argv is not None else sys.argv[1:])
    if args.scenario == "fan" and args.clients == 100:
        args.clients = 1000
    if args.scenario == "fan":
        args.payload = 100 if args.payload == 1024 else args.payload
    broker, server = make_broker(args)
    run = SCENARIOS[args.scenario](args, server)
    if args.full:
        attach_full(broker, server)
    run(max(args.messages // 10, 1000))          # warm: caches, specialised bytecode, pid counters
    _tune_gc()                                   # as brokerd.server does
    if args.count_only:
        run(args.messages)
        if args.scenario == "conn":
            os._exit(0)                # not the exit's collection and freeing of the clients it holds
        return 0
    t0 = time.perf_counter()
    done = run(args.messages)
    dt = time.perf_counter() - t0
    print(f"{args.scenario}: {done} messages, {dt * 1e6 / done:.3f} µs per message (Python only, no syscalls)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
