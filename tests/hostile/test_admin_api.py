"""Hostile clients of the admin API port (``--admin``): tokenless request bodies,
idle and trickling sockets, more sockets than the node has descriptors, and
authenticated bodies beyond the node's body budget.

Each is a real brokerd and real sockets with a canary MQTT pair (QoS 1) on
the same node that must keep working during and after the attack: whoever
can reach the admin port must not be able to take the node's memory, its
descriptors or its event loop. RSS is the broker's (``/proc``), which starts
at about 40 MB; each test states its bound.
"""

import selectors
import socket
import time

from ..integration.helpers import V311, connect, wait_until
from ..procs import BrokerProcess
from .conftest import ADMIN_TOKEN, MIB, metrics, open_fds, report, rss_kib

BODY = 4 * 1024 * 1024 - 4096          # "just under 4 MiB": what the old node buffered before looking at the token
CHUNK = b"x" * 65536


def _admin(b: BrokerProcess) -> tuple[str, int]:
    host, _, port = b.admin.rpartition(":")
    return host, int(port)


def _post_head(length: int, token: str | None = None, path: str = "/api/v1/publish") -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return (f"POST {path} HTTP/1.1\r\nHost: brokerd\r\nContent-Type: application/json\r\n{auth}"
            f"Content-Length: {length}\r\n\r\n").encode()


def _status(data: bytes) -> int | None:
    if data.startswith(b"HTTP/1.1 "):
        return int(data[9:12])
    return None


class Flood:
    """Sockets to the admin port, each sending ``head`` and then up to ``body`` bytes as fast as
    the broker takes them, until the broker closes it; what each one got back is kept.
    ``step()`` moves every socket on; ``rss_peak`` follows the broker while it runs."""

    def __init__(self, b: BrokerProcess, n: int, head: bytes, body: int, hold_last: int = 0):
        self.b = b
        self.sel = selectors.DefaultSelector()
        self.state: dict = {}
        self.statuses: list = []
        self.closed = 0
        self.rss_peak = 0
        for _ in range(n):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(_admin(b))
            self.state[s] = {"head": head, "left": body - hold_last, "got": b""}
            self.sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE)

    def run(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        last_sample = 0.0
        while self.state and time.monotonic() < deadline:
            for key, events in self.sel.select(0.05):
                self._step(key.fileobj, events)
            if time.monotonic() - last_sample > 0.05:
                self.rss_peak = max(self.rss_peak, rss_kib(self.b))
                last_sample = time.monotonic()
            if all(st["left"] <= 0 and not st["head"] for st in self.state.values()) and \
                    not self.sel.select(0.2):
                break          # everything sent (and held): nothing more will happen by itself

    def _step(self, s: socket.socket, events: int) -> None:
        st = self.state[s]
        try:
            if events & selectors.EVENT_READ:
                data = s.recv(65536)
                if not data:
                    return self._done(s)
                st["got"] += data
            if events & selectors.EVENT_WRITE:
                if st["head"]:
                    n = s.send(st["head"])
                    st["head"] = st["head"][n:]
                elif st["left"] > 0:
                    st["left"] -= s.send(CHUNK[:st["left"]])
                else:
                    self.sel.modify(s, selectors.EVENT_READ)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:           # reset: refused at accept, or closed with our bytes unread
            self._done(s)

    def _done(self, s: socket.socket) -> None:
        self.statuses.append(_status(self.state.pop(s)["got"]))
        self.closed += 1
        self.sel.unregister(s)
        s.close()

    def open(self) -> list:
        return list(self.state)

    def close(self) -> None:
        for s in list(self.state):
            self.sel.unregister(s)
            s.close()
        self.state.clear()


def test_tokenless_body_flood_is_refused_from_the_headers(hostile_broker, canary_for, request):
    """250 sockets, no token, each announcing and sending a body of just under 4 MiB (the attack
    that took the old node from 40 MB to 1,048 MB in 3.6 s: it read every body before looking at
    the token). Now the token is checked from the headers: each is answered 401 before its body
    is read and closed (what it still sends is drained for at most 1 s, never kept); the sockets
    beyond --admin-max-connections (64) are closed at accept. RSS grows by less than 32 MiB,
    every socket is closed within 20 s, the canary works throughout and the admin API answers
    its own token afterwards."""
    b = hostile_broker()
    canary = canary_for(b)
    rss0 = rss_kib(b)
    with canary.running():
        flood = Flood(b, 250, _post_head(BODY), BODY)
        flood.run(20)
        still_open = len(flood.open())
        flood.close()
    assert still_open == 0, f"{still_open} tokenless sockets still open after 20 s"
    assert flood.rss_peak - rss0 < 32 * MIB, f"RSS grew by {(flood.rss_peak - rss0) // 1024} MiB"
    answered = [s for s in flood.statuses if s is not None]
    assert answered and set(answered) == {401}, sorted(set(answered))
    canary.check()
    m = metrics(b)
    assert m["admin"]["rejected"] >= len(answered)
    wait_until(lambda: metrics(b)["admin"]["connections"] <= 1, 5, message="admin sockets not released")
    report(request, sockets=250, answered_401=len(answered), refused_at_accept=m["admin"]["refused"],
           rss_before_kib=rss0, rss_peak_kib=flood.rss_peak, canary_worst_s=round(canary.worst, 3))


def _closed_by_peer(s: socket.socket) -> bool:
    try:
        return s.recv(65536) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except (BlockingIOError, TimeoutError):
        return False


def test_idle_and_trickling_admin_connections_are_cut_at_the_timeout(hostile_broker, canary_for, request):
    """With an admin timeout of 2 s (BROKERD_ADMIN_TIMEOUT, = --admin-timeout): 56 sockets that
    never send a byte, 4 that trickle a request line a byte every 0.2 s (the bytes keep coming:
    the timeout counts from when the node started waiting, not from the last byte) and 4
    keep-alive connections that made one request and then idle. The old node kept 200 idle
    sockets open for 15 s and more. Each is closed between 2 s and 3.5 s after it opened (or
    after its answer); the canary works throughout; no descriptor leaks."""
    b = hostile_broker(env={"BROKERD_ADMIN_TIMEOUT": "2"})
    canary = canary_for(b)
    fds0 = open_fds(b)
    host, port = _admin(b)
    head = f"GET /api/v1/metrics HTTP/1.1\r\nHost: brokerd\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n\r\n".encode()
    started: dict = {}
    sent: dict = {}
    with canary.running():
        for i in range(64):
            s = socket.create_connection((host, port), timeout=5)
            if i >= 60:                        # keep-alive: one request answered, then nothing
                s.sendall(head)
                assert _status(s.recv(65536)) == 200
            elif i >= 56:
                sent[s] = 0
            started[s] = time.monotonic()
            s.setblocking(False)
        closed_at: dict = {}
        deadline = time.monotonic() + 8
        while len(closed_at) < len(started) and time.monotonic() < deadline:
            for s, t in started.items():
                if s in closed_at:
                    continue
                if s in sent:
                    try:
                        sent[s] += s.send(head[sent[s]:sent[s] + 1])
                    except OSError:
                        pass
                if _closed_by_peer(s):
                    closed_at[s] = time.monotonic() - t
            time.sleep(0.2)
    for s in started:
        s.close()
    assert len(closed_at) == len(started), f"{len(started) - len(closed_at)} admin sockets still open after 8 s"
    first, last = min(closed_at.values()), max(closed_at.values())
    assert first >= 1.9, f"closed before the timeout: {first:.2f} s"
    assert last <= 3.5, f"closed late: {last:.2f} s"
    assert all(n >= 5 for n in sent.values()), "a trickle was cut before the timeout"
    assert all(n < len(head) for n in sent.values()), "a trickled request completed"
    canary.check()
    wait_until(lambda: open_fds(b) <= fds0 + 2, 5, message="descriptors leaked")
    m = metrics(b)
    assert m["admin"]["timed_out"] >= 64
    report(request, sockets=len(started), first_close_s=round(first, 2), last_close_s=round(last, 2),
           trickled_bytes=sorted(set(sent.values())), fds_before=fds0, fds_after=open_fds(b),
           canary_worst_s=round(canary.worst, 3))


class _NofileBroker(BrokerProcess):
    """brokerd started with a low open-files limit (prlimit), so a flood can reach it."""

    def __init__(self, *args, nofile: int, **kw):
        super().__init__(*args, **kw)
        self.nofile = nofile

    def command(self) -> list[str]:
        return ["prlimit", f"--nofile={self.nofile}:{self.nofile}", "--", *super().command()]


def test_admin_connection_flood_leaves_descriptors_for_mqtt(canary_for, request):
    """The node has 256 descriptors (prlimit); 600 sockets connect to its admin port and stay.
    The old node accepted them all until accept() failed with EMFILE (with 20,000 descriptors
    that stopped new MQTT CONNECTs, the control plane's database and the cluster's view of the
    node). The admin listener now holds at most --admin-max-connections (default 64) and closes
    the rest at accept: the node's descriptors stay under its baseline + 64 + a few, and 30 new
    MQTT clients connect while the flood holds its sockets; the canary works throughout; the
    admin API answers once the flood is gone."""
    b = _NofileBroker("--connect-timeout", "2", "--sys-interval", "1", "--admin", "127.0.0.1:0",
                      nofile=256, env={"BROKERD_ADMIN_TOKEN": ADMIN_TOKEN}).start()
    try:
        canary = canary_for(b)
        fds0 = open_fds(b)
        host, port = _admin(b)
        flood, clients = [], []
        with canary.running():
            for _ in range(600):             # (paho's select() in this process needs descriptors < 1024)
                s = socket.socket()
                s.setblocking(False)
                s.connect_ex((host, port))
                flood.append(s)
            time.sleep(1.0)                    # let the node accept (and refuse) what the kernel queued
            fds_peak = open_fds(b)
            for i in range(30):
                clients.append(connect(b.port(), f"fd-flood-{i}", V311))
            fds_with_clients = open_fds(b)
        for c in clients:
            c.disconnect()
        for s in flood:
            s.close()
        assert fds_peak <= fds0 + 64 + 8, f"{fds_peak - fds0} descriptors taken by the admin flood"
        canary.check()
        wait_until(lambda: metrics(b)["admin"]["connections"] <= 1, 15, message="admin connections not released")
        m = metrics(b)
        assert m["admin"]["refused"] >= 600 - 64
        report(request, sockets=600, nofile=256, fds_before=fds0, fds_peak=fds_peak,
               fds_with_30_clients=fds_with_clients, refused_at_accept=m["admin"]["refused"],
               canary_worst_s=round(canary.worst, 3))
    finally:
        b.stop()


def test_authenticated_bodies_are_bounded_by_the_body_budget(hostile_broker, canary_for, request):
    """60 connections with a valid write token each announce a 4,000,000-byte body and send all
    of it but the last 10 bytes (so none completes). The bodies the node holds at once are
    bounded by --admin-body-budget (default 16 MiB): 4 are read, the others are answered 503
    (Retry-After) from their Content-Length before a byte is read; a body announced larger than
    4 MiB gets 413 the same way. Without the budget the node would hold 240 MB. RSS grows by
    less than 48 MiB; the canary works throughout; once the held requests are gone the budget
    is free again and a publish is answered 200."""
    b = hostile_broker()
    canary = canary_for(b)
    rss0 = rss_kib(b)
    with canary.running():
        flood = Flood(b, 60, _post_head(4_000_000, ADMIN_TOKEN), 4_000_000, hold_last=10)
        flood.run(20)
        held = len(flood.open())
        too_big = socket.create_connection(_admin(b), timeout=5)
        too_big.sendall(_post_head(5 * 1024 * 1024, ADMIN_TOKEN))
        big_status = _status(too_big.recv(65536))
        too_big.close()
        budget = metrics(b)["admin"]
        flood.close()
    assert flood.rss_peak - rss0 < 48 * MIB, f"RSS grew by {(flood.rss_peak - rss0) // 1024} MiB"
    assert held == 4, f"{held} bodies held (16 MiB budget, 4,000,000 bytes each)"
    assert sorted(set(flood.statuses)) == [503] and len(flood.statuses) == 56
    assert big_status == 413
    assert budget["body_bytes"] == 16_000_000
    canary.check()
    wait_until(lambda: metrics(b)["admin"]["body_bytes"] == 0, 5, message="budget not released")
    import urllib.request

    req = urllib.request.Request(b.admin_url + "/api/v1/publish", method="POST",
                                 data=b'{"tenant": "default", "topic": "after/flood", "payload": "x"}',
                                 headers={"Authorization": f"Bearer {ADMIN_TOKEN}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.status == 200
    report(request, connections=60, held=held, refused_503=len(flood.statuses), rss_before_kib=rss0,
           rss_peak_kib=flood.rss_peak, canary_worst_s=round(canary.worst, 3))
