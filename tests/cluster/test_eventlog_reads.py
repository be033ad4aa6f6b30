"""A node behind on the cluster event log (stopped for a while, slow, joining) catches up a few
MiB at a time. Real nodes, a real Redis."""

import os
import signal
import socket
import time

from ..integration import raw
from ..integration.helpers import V311, connect
from ..procs import sigstop
from .conftest import wait_until

MIB = 1024


def _status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def test_a_node_behind_on_the_event_log_reads_it_a_few_mib_at_a_time(cluster, tag):
    """n2 is stopped while 120 retained messages of 600 KB are published on n1: 120 entries of the
    event log (about 0.8 MB each, their copies for the other nodes). When n2 goes on, it read up to
    1,000 entries in one call: all 120 at once, with their parsed copies, about 200 MB over what
    it keeps (72 MB of retained payloads): 114 MiB here. Now it reads 16 at a time: 12 MiB."""
    n1, n2 = cluster.start(2)
    pid = n2.proc.pid
    payload = b"r" * 600_000
    sigstop(pid)
    try:
        with socket.create_connection(("127.0.0.1", n1.port()), timeout=60) as s:
            s.sendall(raw.connect_packet(f"{tag}-pub", 4))
            assert s.recv(4)[0] == 0x20
            for i in range(120):
                s.sendall(raw.publish_packet(f"{tag}/r/{i:03d}", payload, 0, True))
            s.sendall(raw.publish_packet(f"{tag}/r/last", b"last", 0, True) + b"\xc0\x00")
            got = b""
            while not got.endswith(b"\xd0\x00"):
                got += s.recv(64)
        time.sleep(1.5)                                 # n1's announcer rounds: every copy in the log
        peak0, rss0 = _status_kib(pid, "VmHWM"), _status_kib(pid, "VmRSS")
    finally:
        os.kill(pid, signal.SIGCONT)

    def has_last():
        c = connect(n2.port(), f"{tag}-probe", V311)
        try:
            c.subscribe(f"{tag}/r/last", 0)
            try:
                return c.expect(timeout=0.5).payload == b"last"
            except AssertionError:
                return None
        finally:
            c.disconnect()

    wait_until(has_last, timeout=60, message="n2 did not catch up with the event log")
    peak, kept = _status_kib(pid, "VmHWM") - peak0, _status_kib(pid, "VmRSS") - rss0
    assert kept > 60 * MIB, f"n2 keeps {kept // 1024} MiB: not the 72 MB of retained copies?"
    assert peak - kept < 32 * MIB, f"n2 caught up with a peak of {peak // 1024} MiB for {kept // 1024} MiB kept"
