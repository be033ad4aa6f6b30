"""``GET /api/v1/retained`` (and ``/clients``) on a node with many of them: the page asked for, in their
order, with the right total, without the node making a record of every one of them first.

Before, the node built a dict for each retained message of the tenant (hundreds of bytes each),
sorted them all and cut the page out: 200,000 retained messages raised the node's peak memory
by about 70 MB for a page of 50, on every request."""

import socket

from ..integration import raw
from ..procs import BrokerProcess
from .conftest import Http

TOKEN = "retained-listing-test-token"
N = 200_000


def _peak_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def test_a_page_of_many_retained_messages_costs_the_page_not_the_list():
    b = BrokerProcess("--sys-interval", "0", "--admin", "127.0.0.1:0",
                      env={"BROKERD_ADMIN_TOKEN": TOKEN}).start()
    try:
        topics = [f"fleet/{i % 97}/dev{i}" for i in range(N)]
        with socket.create_connection(("127.0.0.1", b.port()), timeout=60) as s:
            s.sendall(raw.connect_packet("loader", 4))
            assert s.recv(4)[0] == 0x20
            for i in range(0, N, 10_000):
                s.sendall(b"".join(raw.publish_packet(t, b"v", 0, True) for t in topics[i:i + 10_000]))
            s.sendall(b"\xc0\x00")                                  # PINGREQ: answered once all before it are read
            got = b""
            while not got.endswith(b"\xd0\x00"):
                got += s.recv(64)
        api = Http(b.admin_url)

        def page(q):
            status, _, body = api("GET", f"/api/v1/retained?tenant=default&{q}", token=TOKEN)
            assert status == 200, body
            return body

        before = _peak_rss_kib(b.proc.pid)                          # (the PINGRESP came: every one is stored)
        ordered = sorted(topics)
        body = page("page=3&per_page=50")
        assert (body["total"], body["pages"]) == (N, N // 50)
        assert [r["topic"] for r in body["items"]] == ordered[100:150]
        assert body["items"][0]["size"] == 1
        grown = _peak_rss_kib(b.proc.pid) - before
        assert grown < 20 * 1024, f"a page of 50 raised the node's peak memory by {grown // 1024} MB"
        body = page("prefix=fleet/7/&page=2&per_page=100")
        under = [t for t in ordered if t.startswith("fleet/7/")]
        assert body["total"] == len(under) and [r["topic"] for r in body["items"]] == under[100:200]
        last = page(f"page={N // 1000}&per_page=1000")
        assert [r["topic"] for r in last["items"]] == ordered[-1000:]
        assert page(f"page={N}&per_page=1000")["items"] == []
    finally:
        b.stop()


def test_a_page_of_many_clients_costs_the_page_not_the_list():
    """``GET /api/v1/clients`` on a node holding 30,000 sessions: the page asked for, in (tenant,
    client id) order, with the right total. Before, every session was described as a dict (about
    1 KB each) before the page was cut out: the node's peak memory rose by tens of MB each time."""
    n = 30_000
    b = BrokerProcess("--sys-interval", "0", "--admin", "127.0.0.1:0",
                      env={"BROKERD_ADMIN_TOKEN": TOKEN}).start()
    try:
        ids = [f"dev-{i:05d}" for i in range(n)]
        for start in range(0, n, 500):
            socks = []
            for cid in ids[start:start + 500]:
                s = socket.create_connection(("127.0.0.1", b.port()), timeout=30)
                s.sendall(raw.connect_packet(cid, 4, clean=False))
                socks.append(s)
            for s in socks:
                assert s.recv(4)[:1] == b"\x20"
                s.sendall(b"\xe0\x00")                              # DISCONNECT: the session stays
                s.close()
        api = Http(b.admin_url)

        def page(q):
            status, _, body = api("GET", f"/api/v1/clients?{q}", token=TOKEN)
            assert status == 200, body
            return body

        before = _peak_rss_kib(b.proc.pid)
        body = page("page=3&per_page=50")
        grown = _peak_rss_kib(b.proc.pid) - before
        assert body["total"] == n and [c["client_id"] for c in body["items"]] == ids[100:150]
        assert body["items"][0]["connected"] is False
        assert grown < 4 * 1024, f"a page of 50 raised the node's peak memory by {grown // 1024} MB"
        assert page("client_id=dev-2999")["total"] == 10                # dev-29990 .. dev-29999
        assert page(f"page={n // 1000}&per_page=1000")["items"][-1]["client_id"] == ids[-1]
    finally:
        b.stop()
