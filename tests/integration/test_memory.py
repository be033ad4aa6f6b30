"""What an idle device costs the broker: Python memory per connection.

100,000 devices on one host (issue 18) is a question of bytes per idle
connection. The broker runs in this process under tracemalloc; a child
process opens the connections (plain sockets: CONNECT with keepalive 60 and
one SUBSCRIBE to a topic of its own each, then idle), and the Python memory
that appeared is divided by their number. Everything allocated through
Python's allocators is counted -- the broker's objects, the event loop's
transports, the growth of the tables that hold them; not the memory C code
takes from malloc itself (libuv) nor the kernel's socket buffers
(``bench/conns.py`` measures the process's RSS). Not timed.
"""

import asyncio
import gc
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import pytest

from brokerd.config import load
from brokerd.server import Server

from ..procs import free_port

CLIENTS = 1000
# Measured 2,808 bytes per connection at 1,000 (it was 4,324 before the
# per-connection tables became lazy and wildcard-free filters left the trie,
# 3,205 before the Channel's rare fields, the node-wide channel set and the
# peer string went, 3,049 before a route's lone subscriber went without a
# dict and an idle session's inflight window became the shared empty one).
CEILING = 2950

_CLIENT = textwrap.dedent("""
    import socket, struct, sys
    sys.path.insert(0, {tests!r})
    from integration import raw
    port, n = int(sys.argv[1]), int(sys.argv[2])
    socks = []
    for i in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall(raw.connect_packet(f"mem-{{i}}", keepalive=60)
                  + raw.subscribe_packet(1, [(f"mem/{{i}}/cmd", 1)]))
        socks.append(s)
    for s in socks:
        got = b""
        while len(got) < 9:                      # CONNACK (4 bytes) + SUBACK (5 bytes)
            chunk = s.recv(9 - len(got))
            if not chunk:
                sys.exit("closed by the broker")
            got += chunk
        if got[:4] != b"\\x20\\x02\\x00\\x00" or got[4] != 0x90 or got[8] != 1:
            sys.exit(f"unexpected answer {{got.hex()}}")
    print("ready", flush=True)
    sys.stdin.read()                             # idle until the test is done
""")


async def _bytes_per_connection(n: int) -> tuple[float, int]:
    port = free_port()
    config = load(["--allow-anonymous", "--log-level", "warning", "--sys-interval", "0",
                   "--listen", f"mqtt://127.0.0.1:{port}"])
    server = Server(config, asyncio.get_running_loop())
    await server.start()
    loop = asyncio.get_running_loop()
    child = None
    try:
        gc.collect()
        before = tracemalloc.take_snapshot()
        child = subprocess.Popen([sys.executable, "-c", _CLIENT.format(tests=str(Path(__file__).parents[1])),
                                  str(port), str(n)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = await asyncio.wait_for(loop.run_in_executor(None, child.stdout.readline), 120)
        assert line.strip() == "ready", "the clients did not all connect and subscribe"
        await asyncio.sleep(0.5)
        gc.collect()
        after = tracemalloc.take_snapshot()
        grown = sum(st.size_diff for st in after.compare_to(before, "filename"))
        return grown / n, len(server.connections)
    finally:
        if child is not None:
            child.stdin.close()
            child.wait(30)
        await server.stop(2.0)


def test_an_idle_subscribed_connection_costs_under_2950_bytes_of_python_memory():
    uvloop = pytest.importorskip("uvloop")
    tracemalloc.start(1)
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            per_conn, held = runner.run(_bytes_per_connection(CLIENTS))
    finally:
        tracemalloc.stop()
    assert held == CLIENTS
    assert per_conn < CEILING, f"{per_conn:,.0f} bytes of Python objects per idle subscribed connection"
