"""A TLS listener that counts each socket from its accept (MQTT over TLS, ``wss://``).

A server asyncio makes with ``ssl=`` accepts every socket and calls the
protocol only once the TLS handshake is done: the connection cap
(``--max-connections``) saw no socket in its handshake, and a socket refused
over the cap was only closed after one. Sockets that never send a
ClientHello were each held for the handshake's timeout (``--connect-timeout``)
however many there were: anyone reaching the port could take every
descriptor the process has.

Here the listener accepts itself: a socket over the cap (the connections
plus the handshakes under way) is closed at once, and one under it is handed
to TLS (``connect_accepted_socket``) and counted until its handshake ends,
in success or failure. The listening sockets are made as ``create_server``
makes them (every address of the host, ``SO_REUSEADDR``, ``SO_REUSEPORT``
for a host's workers, IPv6 only on its own socket).
"""

import asyncio
import logging
import socket
import ssl

log = logging.getLogger("brokerd.connection")


class TlsListener:
    """``close()`` / ``wait_closed()`` as an ``asyncio.Server``'s; ``sockets``: the listening ones."""

    def __init__(self, loop: asyncio.AbstractEventLoop, factory, context: ssl.SSLContext, timeout: float,
                 room):
        self.loop = loop
        self.factory = factory           # () -> the connection's protocol
        self.context = context
        self.timeout = timeout           # of a handshake
        self.room = room                 # (handshakes under way) -> whether one more socket may be taken
        self.sockets: list[socket.socket] = []
        self.handshaking = 0
        self.refused = 0
        self._tasks: list[asyncio.Task] = []

    def listen(self, host: str | None, port: int, backlog: int, reuse_port: bool) -> None:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        seen = set()
        try:
            for family, kind, proto, _, addr in infos:
                if (family, addr) in seen:
                    continue
                seen.add((family, addr))
                sock = socket.socket(family, kind, proto)
                self.sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if reuse_port:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(addr)
                sock.listen(backlog)
                sock.setblocking(False)
        except OSError:
            self.close()
            raise

    async def start_serving(self) -> None:
        """Accept from here on (until then a connection waits in the listen backlog)."""
        if not self._tasks:
            self._tasks = [self.loop.create_task(self._accept(s), name="tls-accept") for s in self.sockets]

    async def _accept(self, sock: socket.socket) -> None:
        loop = self.loop
        while True:
            try:
                conn, _ = await loop.sock_accept(sock)
            except asyncio.CancelledError:
                raise
            except OSError as exc:          # out of descriptors: accept again a little later
                log.warning("TLS listener: accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            if not self.room(self.handshaking):
                self.refused += 1
                conn.close()
                continue
            self.handshaking += 1
            loop.create_task(self._handshake(conn))

    async def _handshake(self, conn: socket.socket) -> None:
        try:
            await self.loop.connect_accepted_socket(self.factory, conn, ssl=self.context,
                                                    ssl_handshake_timeout=self.timeout)
        except Exception as exc:            # a bad certificate, no TLS at all, the handshake's timeout, a reset
            log.debug("TLS handshake failed: %s", exc or type(exc).__name__)
            conn.close()
        finally:
            self.handshaking -= 1

    def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        for s in self.sockets:
            s.close()

    async def wait_closed(self) -> None:
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
