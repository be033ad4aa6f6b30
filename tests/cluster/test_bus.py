"""Hiccups of the cluster bus that are shorter than a netsplit: Redis refuses
a command for a moment, or drops every client connection (as a Redis restart
or a proxy's idle timeout does). Nodes must not fence for that, and must not
lose anything either: routes get announced, CONNECTs accepted."""

import socket
import threading
import time

import pytest

from ..integration.helpers import connect
from ..integration.raw import CONNACK, RawClient, connect_packet
from ..mqtt import V5
from .conftest import RedisServer, settle, wait_until


@pytest.fixture
def redis_server(tmp_path):
    """A Redis of the test's own: these tests change its ACL and kill its clients."""
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()


def connect_burst(port: int, n: int, stem: str) -> list[int]:
    """``n`` CONNECTs sent at once (each on its own socket); -> their CONNACK codes."""
    socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(n)]
    try:
        barrier = threading.Barrier(n)

        def send(i, s):
            barrier.wait()
            s.sendall(connect_packet(f"{stem}-{i}", 5))

        threads = [threading.Thread(target=send, args=(i, s)) for i, s in enumerate(socks)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        codes = []
        for s in socks:
            raw = RawClient(0, sock=s, timeout=10)
            raw.version = 5
            codes.append(raw.expect(CONNACK).code)
        return codes
    finally:
        for s in socks:
            s.close()


def test_connects_accepted_after_redis_dropped_every_connection(cluster, redis_server, tag):
    n1, n2 = cluster.start(2)
    keep = connect(n1.port(), f"{tag}-keep", V5)
    assert connect_burst(n2.port(), 20, f"{tag}-a") == [0] * 20      # the node's pool grows to many connections
    r = redis_server.client()
    r.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    codes = connect_burst(n2.port(), 20, f"{tag}-b")
    assert "fences" not in n1.log + n2.log
    assert keep.client.is_connected()
    assert codes == [0] * 20, f"CONNACK codes {codes}"


def test_a_route_whose_announcement_failed_is_announced_later(cluster, redis_server, tag):
    n1, n2 = cluster.start(2)
    r = redis_server.client()
    sub = connect(n2.port(), f"{tag}-sub", V5)
    try:
        r.execute_command("ACL", "SETUSER", "default", "-xadd")       # the event log refuses appends
        sub.subscribe(f"{tag}/x", qos=1)
        wait_until(lambda: "could not announce routes" in n2.log, timeout=5,
                   message="the announcement did not fail")
    finally:
        r.execute_command("ACL", "SETUSER", "default", "+xadd")
    assert "fences" not in n2.log
    settle(connect(n1.port(), f"{tag}-pub", V5), f"{tag}/x", sub, timeout=5)


def test_a_short_redis_hiccup_does_not_fence_nodes(cluster, redis_server, tag):
    """Every client connection of Redis dropped at once: a second later nodes
    still forward and accept clients, none fenced, no client disconnected."""
    n1, n2 = cluster.start(2)
    sub = connect(n2.port(), f"{tag}-sub", V5)
    sub.subscribe(f"{tag}/x", qos=1)
    pub = connect(n1.port(), f"{tag}-pub", V5)
    settle(pub, f"{tag}/x", sub)
    redis_server.client().execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    time.sleep(2.5)                  # a few heartbeats: each node has used (and renewed) its connections
    pub.publish(f"{tag}/x", b"after", qos=1)
    assert sub.expect().payload == b"after"
    assert "fences" not in n1.log + n2.log
    assert sub.client.is_connected() and pub.client.is_connected()
    late = connect(n2.port(), f"{tag}-late", V5)
    late.subscribe(f"{tag}/y", qos=1)
    settle(pub, f"{tag}/y", late)


def test_the_bus_parses_redis_replies_in_c():
    """redis-py's pure-Python reply parser was a tenth of a worker's CPU in a
    CONNECT storm (client-id claims, the other workers' route announcements);
    with hiredis installed (pyproject.toml) every connection of the bus parses
    replies in C: connects/s with --workers 2 +29 % (s27-perf notes)."""
    from redis._parsers.hiredis import _AsyncHiredisParser

    from brokerd.cluster.bus import Bus

    bus = Bus("redis://127.0.0.1:1/0", "n1")
    conn = bus.redis.connection_pool.make_connection()
    assert isinstance(conn._parser, _AsyncHiredisParser)


def test_a_wave_of_disconnects_frees_every_client_id_in_a_few_redis_calls(cluster, redis_server, tag):
    """200 clean-session clients of one node drop at once (a network cut, a fleet going offline):
    every client id is nobody's again and no will is owed for them, as one at a time, and the node
    told Redis so in a few calls (those closed in one event-loop iteration go together), not three
    round trips each."""
    n1, n2 = cluster.start(2)
    r = redis_server.client()
    clients, wills = f"{cluster.prefix}:clients:*", f"{cluster.prefix}:wills:n1"

    def held() -> int:
        ids = sum(sum(1 for c in r.hkeys(k) if c.decode().startswith(f"{tag}-")) for k in r.keys(clients))
        return ids + sum(1 for k in r.hkeys(wills) if f"{tag}-" in k.decode())

    def calls() -> int:
        # scripts called (Redis counts the commands a script runs as calls of their own): one per
        # closed connection before, besides a plain HDEL and SREM each
        stats = r.info("commandstats")
        return sum(stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in ("evalsha", "eval"))

    n = 200
    socks = [socket.create_connection(("127.0.0.1", n1.port()), timeout=10) for _ in range(n)]
    try:
        for i, s in enumerate(socks):
            s.sendall(connect_packet(f"{tag}-{i}", 5))
        for s in socks:
            raw = RawClient(0, sock=s, timeout=10)
            raw.version = 5
            assert raw.expect(CONNACK).code == 0
        wait_until(lambda: held() == n, timeout=10, message="the connections' client ids are not in Redis")
        before = calls()
    finally:
        for s in socks:
            s.close()
    wait_until(lambda: held() == 0, timeout=10,
               message="client ids or wills of the closed connections are still held in Redis")
    assert calls() - before < 40, f"{calls() - before} Redis scripts run to let go of {n} closed connections"
    again = connect(n2.port(), f"{tag}-7", V5)          # the id is free: the other node takes it at once
    assert again.client.is_connected()
    assert "fences" not in n1.log + n2.log
