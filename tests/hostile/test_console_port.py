"""Hostile clients of the console's port: daphne started as `make run` starts it and as the image
starts it serving TLS itself (console/serve.py in front of daphne), real sockets from loopback
addresses of their own, and a canary user at another address whose requests must keep being
answered while the attack runs.

daphne alone kept a connection open as long as it sent a byte a minute (a silent one for a
minute), kept every connection it was offered until the process ran out of descriptors (20,000
here: then no one reached the console), and wrote any request body, however large, to a
temporary file before Django looked at it.
"""

import socket
import ssl
import time

import pytest

from ..console.test_forwarded import Console, database  # noqa: F401  (database: the fixture)
from ..integration.helpers import wait_until

pytestmark = pytest.mark.slow

ATTACKER = "127.0.0.61"
OTHER = "127.0.0.62"
CANARY = "127.0.0.63"
THIRD = "127.0.0.64"


def _open(console, source, *, tls=False):
    s = socket.create_connection(("127.0.0.1", console.port), timeout=5, source_address=(source, 0))
    if tls:
        s = console.context.wrap_socket(s, server_hostname="127.0.0.1")
    return s


def _closed(s) -> bool:
    """The server closed (or reset) ``s``: what it sent before, if anything, is read and dropped."""
    s.setblocking(False)
    try:
        while True:
            if not s.recv(65536):
                return True
    except (BlockingIOError, ssl.SSLWantReadError):
        return False
    except OSError:                         # reset
        return True
    finally:
        try:
            s.setblocking(True)
        except OSError:
            pass


def _canary(console) -> float:
    started = time.monotonic()
    status = console.request("GET", "/healthz", source=CANARY)[0]
    assert status == 200
    return time.monotonic() - started


def _answered(console) -> bool:
    try:
        return console.request("GET", "/healthz", source=CANARY)[0] == 200
    except OSError:                         # (accepted and closed: still full)
        return False


def _send_quietly(s, data: bytes) -> None:
    try:
        s.setblocking(True)
        s.sendall(data)
    except OSError:
        pass


@pytest.mark.parametrize("launcher", ["make-run", "image-tls"])
def test_slow_and_silent_connections_are_cut_and_the_console_keeps_answering(launcher, database, tmp_path):  # noqa: F811
    """30 sockets that send nothing (for TLS: not even a ClientHello), 30 that send a request's
    headers a byte at a time, 10 that announce a body and send it a byte at a time: each is cut
    at CONSOLE_REQUEST_TIMEOUT (2 s here) although its bytes keep coming, while a user at another
    address is answered throughout."""
    console = Console(launcher, database, tmp_path, extra_env={"CONSOLE_REQUEST_TIMEOUT": "2"})
    try:
        tls = console.tls
        baseline = max(_canary(console) for _ in range(3))
        silent = [_open(console, ATTACKER) for _ in range(30)]
        trickling = [_open(console, ATTACKER, tls=tls) for _ in range(30)]
        for s in trickling:
            _send_quietly(s, b"GET /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        slow_bodies = [_open(console, ATTACKER, tls=tls) for _ in range(10)]
        for s in slow_bodies:
            _send_quietly(s, b"POST /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n"
                             b"Content-Type: application/x-www-form-urlencoded\r\n\r\n")
        attackers = silent + trickling + slow_bodies
        started, latencies, open_left = time.monotonic(), [], attackers
        while open_left and time.monotonic() - started < 12:
            for s in trickling:
                _send_quietly(s, b"X")
            for s in slow_bodies:
                _send_quietly(s, b"a")
            latencies.append(_canary(console))
            time.sleep(0.3)
            open_left = [s for s in open_left if not _closed(s)]
        took = time.monotonic() - started
        assert not open_left, f"{len(open_left)} of {len(attackers)} still open after {took:.1f} s"
        assert took < 8, took
        # the canary was answered every time; its latency stayed that of an idle console
        assert len(latencies) >= 3 and max(latencies) < max(1.0, 10 * baseline), (baseline, latencies)
        assert _canary(console) < max(1.0, 10 * baseline)
        for s in attackers:
            s.close()
    finally:
        console.stop()


def test_one_address_cannot_take_every_connection(database, tmp_path):  # noqa: F811
    """Past CONSOLE_MAX_CONNECTIONS_PER_ADDRESS (16 here) an address's connections are closed as
    they are accepted, and past CONSOLE_MAX_CONNECTIONS (40) anyone's: the users at other
    addresses are answered while one address holds all it can, and all are again once it lets go."""
    console = Console("make-run", database, tmp_path, extra_env={
        "CONSOLE_MAX_CONNECTIONS_PER_ADDRESS": "16", "CONSOLE_MAX_CONNECTIONS": "40",
        "CONSOLE_REQUEST_TIMEOUT": "60"})
    try:
        def kept(sockets):
            time.sleep(0.5)
            return [s for s in sockets if not _closed(s)]

        first = kept([_open(console, ATTACKER) for _ in range(40)])
        assert len(first) == 16
        assert _canary(console) < 2
        second = kept([_open(console, OTHER) for _ in range(40)])
        assert len(second) == 16
        third = kept([_open(console, THIRD) for _ in range(16)])
        assert len(third) == 8                                      # 40 in all
        with pytest.raises(OSError):                                # full: the canary is closed too
            console.request("GET", "/healthz", source=CANARY)
        for s in first:
            s.close()
        wait_until(lambda: _answered(console), 5, 0.1, message="the console did not take connections again "
                   "once the first address closed its own")
        for s in second + third:
            s.close()
    finally:
        console.stop()


def test_a_trusted_proxy_is_not_held_to_the_per_address_limit(database, tmp_path):  # noqa: F811
    """Behind a proxy every user comes from the proxy's address."""
    console = Console("make-run", database, tmp_path, trusted=ATTACKER, extra_env={
        "CONSOLE_MAX_CONNECTIONS_PER_ADDRESS": "4"})
    try:
        proxy = [_open(console, ATTACKER) for _ in range(12)]
        other = [_open(console, OTHER) for _ in range(12)]
        time.sleep(0.5)
        assert sum(not _closed(s) for s in proxy) == 12
        assert sum(not _closed(s) for s in other) == 4
        for s in proxy + other:
            s.close()
    finally:
        console.stop()


def _answer(s) -> bytes:
    s.settimeout(5)
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    return data


@pytest.mark.parametrize("launcher", ["make-run", "image-tls"])
def test_a_body_over_the_limit_is_answered_413_without_being_read(launcher, database, tmp_path):  # noqa: F811
    """CONSOLE_MAX_BODY (64 KiB here): a body announced longer is refused from its headers, one sent
    in chunks once it passes the limit, and the client reads the 413 although it was still
    sending; a body within the limit goes to Django as before."""
    console = Console(launcher, database, tmp_path, extra_env={"CONSOLE_MAX_BODY": "65536"})
    try:
        s = _open(console, ATTACKER, tls=console.tls)
        s.sendall(b"POST /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000000\r\n"
                  b"Content-Type: application/x-www-form-urlencoded\r\n\r\n")
        for _ in range(16):                     # 1 MiB of the 100 MB, as a client would go on sending
            _send_quietly(s, b"a" * 65536)
        assert _answer(s).startswith(b"HTTP/1.1 413"), "no 413 for an announced 100 MB body"
        s.close()

        s = _open(console, ATTACKER, tls=console.tls)
        s.sendall(b"POST /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
                  b"Content-Type: application/x-www-form-urlencoded\r\n\r\n")
        for _ in range(16):
            _send_quietly(s, b"4000\r\n" + b"a" * 0x4000 + b"\r\n")
        assert _answer(s).startswith(b"HTTP/1.1 413"), "no 413 for a chunked body past the limit"
        s.close()

        status, _, _ = console.request("POST", "/login/", source=OTHER, body=b"a=" + b"b" * 60000,
                                       headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert status == 403                    # Django's answer (no CSRF token), not the guard's
        assert _canary(console) < 2
    finally:
        console.stop()
