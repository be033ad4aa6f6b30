"""Graceful stop: SIGTERM / SIGINT -> v5 clients get DISCONNECT 0x8B, everyone is disconnected,
the process exits 0 quickly and frees its ports."""

import signal
import socket
import time

import pytest

from ..procs import BrokerProcess
from . import raw
from .helpers import V5, V311, Client, MosqSub, connect
from .raw import RawClient


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_disconnects_clients_and_exits_0(sig, client_id):
    b = BrokerProcess().start()
    try:
        v5 = connect(b.port(), client_id + "5", V5)
        v3 = connect(b.port(), client_id + "3", V311)
        ws = connect(b.port("ws"), client_id + "w", V5, transport="websockets")
        rawc = RawClient(b.port())
        rawc.connect(client_id + "r", version=5)
        t0 = time.monotonic()
        rc = b.stop(sig)
        elapsed = time.monotonic() - t0
        assert rc == 0
        assert elapsed < 3, f"took {elapsed:.1f} s to stop"
        assert v5.expect_disconnect()[0].value == 0x8B
        assert ws.expect_disconnect()[0].value == 0x8B
        v3.expect_disconnect()
        got = rawc.expect_closed()
        assert [(p.type, p.code) for p in got] == [(raw.DISCONNECT, 0x8B)]
        assert raw.REASON_STRING in got[0].props
        for c in (v5, v3, ws):
            c.stop_loop()
        rawc.close()
    finally:
        b.kill()


def test_shutdown_with_busy_clients_is_quick(client_id):
    """Stopping with 20 connected clients, some of them with unacknowledged messages, takes < 3 s."""
    b = BrokerProcess().start()
    try:
        clients = [connect(b.port(), f"{client_id}-{i}", V5 if i % 2 else V311, manual_ack=True) for i in range(20)]
        for c in clients:
            c.subscribe("busy/#", 1)
        with connect(b.port(), client_id + "p", V5) as pub:
            for i in range(10):
                pub.publish("busy/x", b"%d" % i, qos=1)
        clients[0].expect_n(10)
        t0 = time.monotonic()
        assert b.stop() == 0
        assert time.monotonic() - t0 < 3
        for c in clients:
            c.stop_loop()
    finally:
        b.kill()


def test_mosquitto_sub_notices_shutdown(client_id):
    b = BrokerProcess().start()
    try:
        sub = MosqSub(b.port(), "any/#", version="mqttv5").start()
        assert b.stop() == 0
        sub.proc.wait(5)
        assert any("0x8b" in line.lower() or "shutting down" in line.lower() or "disconnect" in line.lower()
                   for line in sub.debug), sub.debug
    finally:
        b.kill()


def test_ports_released_after_stop(client_id):
    b = BrokerProcess().start()
    port = b.port()
    c = connect(port, client_id, V311)
    assert b.stop() == 0
    c.stop_loop()
    again = BrokerProcess(listen=(f"mqtt://127.0.0.1:{port}",)).start()
    try:
        connect(port, client_id, V311).disconnect()
    finally:
        again.stop()


def test_no_connections_accepted_while_stopping(client_id):
    b = BrokerProcess().start()
    port = b.port()
    keep = Client(client_id, V5).connect(port)
    b.stop()
    keep.stop_loop()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


class StuckOnStop(BrokerProcess):
    """brokerd whose graceful stop never ends: a task that ignores its cancellation, as a library's
    might. The process must still go (it stayed behind as an orphan holding its ports)."""

    SCRIPT = """
import asyncio, sys
import brokerd.server as server
server.SHUTDOWN_LIMIT = float(sys.argv.pop(1))
graceful = server.Server.stop

async def stop(self, timeout=5.0):
    await graceful(self, timeout)
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass

server.Server.stop = stop
sys.exit(server.main(sys.argv[1:]))
"""

    def __init__(self, limit: float):
        super().__init__()
        self.limit = limit

    def command(self) -> list[str]:
        return [super().command()[0], "-c", self.SCRIPT, str(self.limit)] + super().command()[3:]


def test_a_stop_that_hangs_ends_the_process_after_its_limit():
    b = StuckOnStop(limit=1.0).start()
    try:
        port = b.port()
        assert b.stop(timeout=20) == 1
        assert any("shutdown still running after 1 s: exiting" in line for line in b.output)
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))         # its port is free again
    finally:
        b.kill()


def test_a_second_signal_ends_a_hanging_stop_at_once():
    b = StuckOnStop(limit=600.0).start()
    try:
        b.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while not any("shutting down" in line for line in b.output) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert b.stop(timeout=20) == 1
        assert any("second SIGTERM: exiting now" in line for line in b.output)
    finally:
        b.kill()
