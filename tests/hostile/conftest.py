"""Shared pieces of the hostile-client suite: a canary that must keep working
while another connection attacks the broker, the broker's RSS and open file
descriptors from /proc, and its counters from the admin API.

Every scenario starts its own brokerd (``hostile_broker``) with short
timeouts, an admin API (token ``ADMIN_TOKEN``) and ``--sys-interval 1``.
"""

import json
import os
import threading
import time
import urllib.request

import pytest

from ..integration.helpers import V5, V311, connect
from ..procs import BrokerProcess

ADMIN_TOKEN = "hostile-suite-token"
MIB = 1024


def rss_kib(broker: BrokerProcess) -> int:
    """VmRSS of the brokerd process, in KiB."""
    with open(f"/proc/{broker.proc.pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def peak_rss_kib(broker: BrokerProcess) -> int:
    """VmHWM (the most RSS the brokerd process has had), in KiB."""
    with open(f"/proc/{broker.proc.pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM")


def open_fds(broker: BrokerProcess) -> int:
    return len(os.listdir(f"/proc/{broker.proc.pid}/fd"))


def metrics(broker: BrokerProcess) -> dict:
    """This node's figures from ``GET /api/v1/metrics``."""
    req = urllib.request.Request(broker.admin_url + "/api/v1/metrics",
                                 headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.load(resp)["nodes"][0]


def client_info(broker: BrokerProcess, client_id: str, tenant: str = "default") -> dict:
    req = urllib.request.Request(f"{broker.admin_url}/api/v1/clients/{tenant}/{client_id}",
                                 headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.load(resp)


def sys_value(broker: BrokerProcess, name: str, timeout: float = 5.0) -> str:
    """The retained ``$SYS/broker/<name>`` value, as a fresh subscriber sees it."""
    c = connect(broker.port(), f"sys-reader-{time.monotonic_ns()}", V311)
    try:
        c.subscribe(f"$SYS/broker/{name}", 0)
        return c.expect(timeout).payload.decode()
    finally:
        c.disconnect()


class Canary:
    """A paho subscriber and a paho publisher (QoS 1, 3.1.1 and 5.0) on their own
    topic. ``check()`` makes one round trip; ``running()`` keeps making them
    from a thread (every ``interval``) while an attack goes on, and asserts at
    the end that every one of them arrived, in order; ``latencies`` holds the
    round trips (reported, never asserted against a speed)."""

    def __init__(self, broker: BrokerProcess, name: str):
        self.broker = broker
        self.topic = f"canary/{name}"
        self.sub = connect(broker.port(), f"{name}-canary-sub", V311)
        self.sub.subscribe(self.topic, 1)
        self.pub_id = f"{name}-canary-pub"
        self.pub = connect(broker.port(), self.pub_id, V5)
        self.seq = 0
        self.latencies: list[float] = []

    def check(self, timeout: float = 5.0) -> float:
        assert self.broker.proc.poll() is None, "brokerd died"
        self.seq += 1
        body = b"alive-%d" % self.seq
        t0 = time.monotonic()
        self.pub.publish(self.topic, body, qos=1, timeout=timeout)
        msg = self.sub.expect(timeout)
        assert msg.payload == body, f"canary got {msg.payload!r}, wanted {body!r}"
        dt = time.monotonic() - t0
        self.latencies.append(dt)
        return dt

    def running(self, interval: float = 0.05, max_rounds: int = 2000):
        canary = self

        class _Ctx:
            def __enter__(self):
                self.stop = threading.Event()
                self.errors: list[BaseException] = []

                def loop():
                    for _ in range(max_rounds):
                        if self.stop.is_set():
                            return
                        try:
                            canary.check()
                        except BaseException as exc:   # reported in __exit__
                            self.errors.append(exc)
                            return
                        self.stop.wait(interval)

                self.thread = threading.Thread(target=loop, daemon=True)
                self.thread.start()
                return canary

            def __exit__(self, *exc):
                self.stop.set()
                self.thread.join(15)
                assert not self.thread.is_alive(), "canary stuck"
                if self.errors:
                    raise AssertionError(f"canary failed during the attack: {self.errors[0]!r}")
                assert canary.latencies, "canary never ran"

        return _Ctx()

    @property
    def worst(self) -> float:
        return max(self.latencies) if self.latencies else 0.0

    def close(self) -> None:
        for c in (self.sub, self.pub):
            try:
                c.disconnect()
            except Exception:
                c.stop_loop()


@pytest.fixture
def hostile_broker(broker_factory):
    """``hostile_broker(*flags, **kw)``: brokerd with --connect-timeout 2, --sys-interval 1 and
    an admin API (BROKERD_ADMIN_TOKEN = ADMIN_TOKEN), plus the given flags."""

    def start(*flags, **kw):
        env = dict(kw.pop("env", None) or {}, BROKERD_ADMIN_TOKEN=ADMIN_TOKEN)
        base = ["--connect-timeout", "2", "--sys-interval", "1", "--admin", "127.0.0.1:0"]
        return broker_factory(*base, *flags, env=env, **kw)

    return start


@pytest.fixture
def canary_for(request):
    made = []

    def make(broker) -> Canary:
        c = Canary(broker, f"{request.node.name[:30]}-{os.getpid()}-{len(made)}".replace("[", "_").replace("]", "_"))
        made.append(c)
        c.check()
        return c

    yield make
    for c in made:
        c.close()


def report(request, **figures) -> None:
    """Print the figures the scenario measured (shown with -s, and kept in the junit output)."""
    line = " ".join(f"{k}={v}" for k, v in figures.items())
    print(f"\n[hostile] {request.node.name}: {line}")
    request.node.user_properties.extend(figures.items())
