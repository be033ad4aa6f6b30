"""The console's server: daphne, with the bounds a port on a hostile network needs.

``python -m console.serve`` takes daphne's own arguments (``make run`` and the
image's ``console`` role start it so). daphne alone holds a connection for as
long as it sends a byte a minute, keeps every connection it is offered until
the process runs out of descriptors, and writes any request body, however
large, to a temporary file before the application sees it. Here, before
daphne parses anything:

- ``CONSOLE_REQUEST_TIMEOUT`` (20 s): a request, headers and body, must arrive
  whole within this long of the connection's start (a TLS handshake included)
  or of the previous response; a connection that has not sent one by then is
  closed. The application's own time is not counted, nor a WebSocket's life
  after its upgrade (daphne pings those);
- ``CONSOLE_MAX_CONNECTIONS_PER_ADDRESS`` (64; proxies in ``TRUSTED_PROXIES``
  are not held to it) and ``CONSOLE_MAX_CONNECTIONS`` (4096) open at once:
  more are closed as they are accepted, so one address cannot take the
  descriptors every other user needs;
- ``CONSOLE_MAX_BODY`` (4 MiB): a body announced or sent longer is answered
  413 and not read (the console takes forms and small JSON; Django refuses
  what passes 2.5 MiB itself).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import sys
import time

from twisted.protocols.policies import ProtocolWrapper, WrappingFactory
from twisted.protocols.tls import TLSMemoryBIOProtocol

log = logging.getLogger("console.serve")

LINGER_SECONDS = 2.0        # a refused body: its input is read and dropped this long after the answer
REFUSED_LOG_SECONDS = 10.0
reactor = None              # the asyncio reactor daphne.server installs (imported first in install)


def _env_number(name: str, default, kind=int):
    value = os.environ.get(name, "")
    try:
        number = default if value == "" else kind(value)
    except ValueError:
        raise SystemExit(f"{name}={value!r}: expected a number") from None
    if number <= 0:
        raise SystemExit(f"{name}={value!r}: expected a number above 0")
    return number


class Limits:
    def __init__(self):
        self.request_timeout = _env_number("CONSOLE_REQUEST_TIMEOUT", 20.0, float)
        self.max_connections = _env_number("CONSOLE_MAX_CONNECTIONS", 4096)
        self.max_per_address = _env_number("CONSOLE_MAX_CONNECTIONS_PER_ADDRESS", 64)
        self.max_body = _env_number("CONSOLE_MAX_BODY", 4 * 1024 * 1024)
        proxies = [v.strip() for v in os.environ.get("TRUSTED_PROXIES", "").split(",") if v.strip()]
        try:
            self.proxies = tuple(ipaddress.ip_network(p, strict=False) for p in proxies)
        except ValueError as exc:
            raise SystemExit(f"TRUSTED_PROXIES: {exc}") from None

    def is_proxy(self, host: str) -> bool:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in net for net in self.proxies)


class GuardedConnection(ProtocolWrapper):
    """One accepted connection, in front of daphne's protocol (the transport daphne's
    request sees as ``channel.transport``)."""

    def __init__(self, factory, wrapped, host: str):
        super().__init__(factory, wrapped)
        self.host = host
        self.timer = None
        self.dropping = False       # refused: input read and dropped until the close
        self.lost = False

    def makeConnection(self, transport):
        self._arm()
        super().makeConnection(transport)

    def dataReceived(self, data):
        if not self.dropping:
            super().dataReceived(data)

    def connectionLost(self, reason):
        self.lost = True
        self._disarm()
        super().connectionLost(reason)

    # -- called by GuardedRequest
    def request_started(self):
        """A whole request came: the application's time is not the client's."""
        self._disarm()

    def response_done(self):
        """The next request's time starts."""
        self._arm()

    def refuse(self, status: bytes, text: bytes):
        """Answer, stop reading into daphne, and close once the answer is out (the client's
        input drained meanwhile: closed with input unread, the socket would reset and the
        client lose the answer)."""
        if self.dropping:
            return
        self.dropping = True
        self._disarm()
        self.transport.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: text/plain\r\nContent-Length: "
                             + str(len(text)).encode() + b"\r\nConnection: close\r\n\r\n" + text)
        if isinstance(self.transport, TLSMemoryBIOProtocol):
            # TLS: the answer is written at the reactor's next turn, a close_notify after it (a
            # half-close of the socket now would come first and the client read nothing)
            self.transport.loseConnection()
        else:
            self.transport.loseWriteConnection()
        self.timer = reactor.callLater(LINGER_SECONDS, self._abort)

    # --
    def _arm(self):
        self._disarm()
        if self.lost:
            return
        self.timer = reactor.callLater(self.factory.limits.request_timeout, self._expired)

    def _disarm(self):
        if self.timer is not None:
            if self.timer.active():
                self.timer.cancel()
            self.timer = None

    def _expired(self):
        self.timer = None
        self.factory.note_cut(self.host)
        self._abort()

    def _abort(self):
        self.timer = None
        transport = self.transport
        if transport is None:
            return
        abort = getattr(transport, "abortConnection", None)
        (abort or transport.loseConnection)()


class GuardFactory(WrappingFactory):
    protocol = GuardedConnection

    def __init__(self, wrapped, limits: Limits):
        super().__init__(wrapped)
        self.limits = limits
        self.per_address: dict[str, int] = {}
        self.refused = 0
        self.cut = 0
        self.reported = 0.0

    def buildProtocol(self, addr):
        host = getattr(addr, "host", "")
        limits = self.limits
        if len(self.protocols) >= limits.max_connections or (
                self.per_address.get(host, 0) >= limits.max_per_address and not limits.is_proxy(host)):
            self.refused += 1
            self._report()
            return None                     # twisted closes the socket at once
        return self.protocol(self, self.wrappedFactory.buildProtocol(addr), host)

    def registerProtocol(self, p):
        super().registerProtocol(p)
        self.per_address[p.host] = self.per_address.get(p.host, 0) + 1

    def unregisterProtocol(self, p):
        super().unregisterProtocol(p)
        left = self.per_address.get(p.host, 0) - 1
        if left > 0:
            self.per_address[p.host] = left
        else:
            self.per_address.pop(p.host, None)

    def note_cut(self, host):
        self.cut += 1
        self._report()

    def _report(self):
        # one line per 10 s at most, whatever the attacker's rate
        now = time.monotonic()
        if now - self.reported >= REFUSED_LOG_SECONDS:
            self.reported = now
            log.warning("console connections: %d refused at accept (%d open, per address %d, in all %d), "
                        "%d cut for a request not sent within %g s, so far", self.refused, len(self.protocols),
                        self.limits.max_per_address, self.limits.max_connections, self.cut,
                        self.limits.request_timeout)


def install(limits: Limits) -> None:
    """Put the guard in front of daphne's HTTP factory and request (daphne builds them in
    ``Server.run``: the names it imported are replaced)."""
    global reactor
    import daphne.server  # (first: it installs the asyncio reactor)
    from daphne import http_protocol
    from twisted.internet import reactor

    class GuardedRequest(http_protocol.WebRequest):
        received = 0

        def _guard(self):
            transport = getattr(self.channel, "transport", None)
            return transport if isinstance(transport, GuardedConnection) else None

        def gotLength(self, length):
            super().gotLength(length)
            if length is not None and length > limits.max_body:
                self._too_large()

        def handleContentChunk(self, data):
            guard = self._guard()
            if guard is not None and guard.dropping:
                return
            self.received += len(data)
            if self.received > limits.max_body:
                self._too_large()
                return
            super().handleContentChunk(data)

        def _too_large(self):
            guard = self._guard()
            if guard is not None:
                guard.refuse(b"413 Payload Too Large",
                             b"Request body larger than %d bytes\n" % limits.max_body)

        def process(self):
            guard = self._guard()
            if guard is not None:
                if guard.dropping:
                    return
                guard.request_started()
            super().process()

        def finish(self):
            guard = self._guard()
            if guard is not None and not guard.dropping:
                guard.response_done()
            super().finish()

    class GuardedHTTPFactory(http_protocol.HTTPFactory):
        def buildProtocol(self, addr):
            protocol = super().buildProtocol(addr)
            protocol.requestFactory = GuardedRequest
            return protocol

    def factory(daphne_server):
        return GuardFactory(GuardedHTTPFactory(daphne_server), limits)

    daphne.server.HTTPFactory = factory


def main(argv: list[str] | None = None) -> None:
    install(Limits())
    from daphne.cli import CommandLineInterface

    CommandLineInterface().run(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
