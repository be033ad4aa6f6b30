"""This node's links to the other nodes (asyncio side): listen, dial, admit, send.

A node sends to another over the link it opened to it (one TCP connection,
so one publisher's messages stay in order; ``link.Link``), and answers a
request on the link it came in on. ``Peers`` owns those links: the listener
for the links other nodes open, the count of accepted sockets still proving
themselves (bounded in all and per address, so sockets that never finish
cannot crowd out a node), the membership check of a node that proved the
secret, and the links this node opens -- dialled on the first frame for a
node, frames waiting meanwhile (bounded in bytes), and not dialled again for
a second after an attempt failed. ``Link`` talks to its ``Peers`` only
(``LinkOwner`` below); the frames of authenticated links go to the node.
"""

import asyncio
import logging
import socket
import ssl
from typing import Protocol

from .link import HANDSHAKE_TIMEOUT, Link
from .ports import Clock, ClusterError

log = logging.getLogger("brokerd.cluster")

MAX_CONTROL_FRAME = 1024 * 1024     # bytes of a HANDOFF / HOLDING (a session's filters); larger: no handoff
LINK_RETRY = 1.0                    # seconds after a failed link attempt before dialling that node again
WAITING_BYTES = 16 * 1024 * 1024    # frames held for a node while its link is being opened
MAX_UNAUTHENTICATED = 64            # accepted links not yet authenticated, in all ...
MAX_UNAUTHENTICATED_PER_ADDRESS = 8     # ... and from one IP address: beyond, a new socket is closed at once


def link_tls(config) -> tuple:
    """(server, client) SSL contexts of mutual TLS on the node links, or (None, None).

    Either side presents its certificate and requires one the cluster's CA
    signed; that is what makes a peer a member (host names are not checked:
    nodes reach each other at addresses a certificate seldom names, so the CA
    must be the cluster's own)."""
    if not config.cluster_tls_cert:
        return None, None
    try:
        server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=config.cluster_tls_ca)
        server.load_cert_chain(config.cluster_tls_cert, config.cluster_tls_key)
        server.verify_mode = ssl.CERT_REQUIRED
        client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=config.cluster_tls_ca)
        client.load_cert_chain(config.cluster_tls_cert, config.cluster_tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise ClusterError(f"cluster link TLS (--cluster-tls-cert/-key/-ca): {exc}") from None
    client.check_hostname = False
    client.verify_mode = ssl.CERT_REQUIRED
    return server, client


class LinkSettings:
    """How this node's links listen and prove themselves (from the configuration)."""

    __slots__ = ("host", "port", "secret", "tls_server", "tls_client", "max_frame")

    def __init__(self, host: str, port: int, secret: bytes | None, tls_server=None, tls_client=None,
                 max_packet_size: int = 0):
        self.host, self.port = host, port
        self.secret = secret                     # the cluster secret links prove (None: mutual TLS only)
        self.tls_server, self.tls_client = tls_server, tls_client
        # a forwarded message is at most an MQTT packet plus its tenant, shared group and filter names
        self.max_frame = max(max_packet_size, MAX_CONTROL_FRAME) + 4 * 65536

    @classmethod
    def from_config(cls, config, host: str, port: int) -> "LinkSettings":
        tls_server, tls_client = link_tls(config)
        return cls(host, port, config.link_secret(), tls_server, tls_client, config.max_packet_size)


class PeerNode(Protocol):
    """The node, as its links see it (``node.ClusterNode``)."""

    members: dict[str, dict]

    def on_frame(self, link, f: tuple) -> None: ...

    def peer_lost(self, node: str) -> None: ...

    async def look_up_member(self, node: str) -> bool: ...


class QueueBudget(Protocol):
    def add(self, n: int) -> None: ...


class Flusher(Protocol):
    def add(self, conn) -> None: ...


class LinkOwner(Protocol):
    """What ``link.Link`` uses of its owner (a ``Peers``)."""

    loop: asyncio.AbstractEventLoop
    id: str
    secret: bytes | None
    max_frame: int
    flusher: Flusher
    budget: QueueBudget

    def on_frame(self, link, f: tuple) -> None: ...

    def link_socket_opened(self, link) -> bool: ...

    def admit(self, link) -> None: ...

    def link_accepted(self, link) -> None: ...

    def link_lost(self, link) -> None: ...


class Peers:
    def __init__(self, node_id: str, settings: LinkSettings, loop, clock: Clock, flusher: Flusher,
                 budget: QueueBudget):
        self.id = node_id
        self.settings = settings
        self.secret = settings.secret
        self.max_frame = settings.max_frame
        self.loop, self.clock = loop, clock
        self.flusher = flusher                        # writes every link's output once per loop iteration
        self.budget = budget                          # what a congested link holds counts against the queue budget
        self.node: PeerNode | None = None
        self.address = ""                              # HOST:PORT of the listener, once started
        self.links: dict[str, Link] = {}              # links this node opened, by peer
        self._accepted: set[Link] = set()             # authenticated links other nodes opened to this one
        self._unauthenticated: dict[str, int] = {}    # IP address -> accepted links still proving themselves
        self._connecting: dict[str, asyncio.Task] = {}
        self._waiting: dict[str, list[bytes]] = {}    # frames for a peer whose link is being opened
        self._waiting_bytes: dict[str, int] = {}      # ... and their size
        self._retry_at: dict[str, float] = {}         # peer -> when its link may be dialled again
        self._server = None
        self._tls_listener: socket.socket | None = None     # the link port on mutual TLS (_listen_tls)
        self._accepting: asyncio.Task | None = None

    def attach(self, node: PeerNode) -> None:
        self.node = node
        self.on_frame = node.on_frame                 # Link calls it for every frame: no hop in between

    def on_frame(self, link, f: tuple) -> None:       # replaced by attach()
        raise RuntimeError("Peers not attached to a node")

    async def start(self) -> str:
        """Listen for the other nodes' links; -> HOST:PORT."""
        s = self.settings
        if s.tls_server is None:
            self._server = await self.loop.create_server(lambda: Link(self), s.host, s.port)
            port = self._server.sockets[0].getsockname()[1]
        else:
            port = self._listen_tls(s.host, s.port)
        self.address = f"{s.host}:{port}"
        return self.address

    def sockets(self) -> list:
        """The link port's listening sockets."""
        if self._server is not None:
            return list(self._server.sockets)
        return [self._tls_listener] if self._tls_listener is not None else []

    def _listen_tls(self, host: str, port: int) -> int:
        """Accept the links on mutual TLS: each socket counts against the caps on unauthenticated links from
        its accept, before its TLS handshake (a server accepting with TLS calls the protocol only once the
        handshake is done: sockets that never sent a ClientHello were all kept, each for the handshake's
        timeout). -> the port."""
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(128)
        sock.setblocking(False)
        self._tls_listener = sock
        self._accepting = self.loop.create_task(self._accept_tls(sock), name="cluster-link-accept")
        return sock.getsockname()[1]

    async def _accept_tls(self, sock: socket.socket) -> None:
        while True:
            try:
                conn, peer = await self.loop.sock_accept(sock)
            except asyncio.CancelledError:
                raise
            except OSError as exc:          # out of descriptors: accept again a little later
                log.warning("cluster link accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            link = Link(self)
            link.address = peer[0] if isinstance(peer, tuple) else str(peer or "")
            if not self.link_socket_opened(link):
                conn.close()
                continue
            self.loop.create_task(self._handshake_tls(link, conn))

    async def _handshake_tls(self, link: Link, conn: socket.socket) -> None:
        try:
            await self.loop.connect_accepted_socket(lambda: link, conn, ssl=self.settings.tls_server,
                                                    ssl_handshake_timeout=HANDSHAKE_TIMEOUT)
        except Exception as exc:            # a bad certificate, the handshake's timeout, a reset
            log.warning("cluster link from %s: TLS handshake failed (%s); closing it", link.address,
                        exc or type(exc).__name__)
            conn.close()
            if link.transport is None:      # never reached the link: its count ends here
                self._uncount(link)

    def close(self) -> None:
        for link in [*self.links.values(), *self._accepted]:
            link.close()
        if self._server is not None:
            self._server.close()
        if self._accepting is not None:
            self._accepting.cancel()
        if self._tls_listener is not None:
            self._tls_listener.close()

    # --------------------------------------------------------------- output

    def send(self, node: str, frame: bytes) -> None:
        """To ``node`` over this node's link to it, opened if need be. While a
        link is being opened its frames wait (at most WAITING_BYTES); for a
        second after an attempt failed, frames to that node are dropped (a
        request among them fails at its timeout) instead of dialling it again
        for every message."""
        link = self.links.get(node)
        if link is not None and not link.closed:
            link.send(frame)
            return
        if self._retry_at.get(node, 0.0) > self.clock():
            return
        waiting = self._waiting.setdefault(node, [])
        if self._waiting_bytes.get(node, 0) + len(frame) > WAITING_BYTES:
            return
        waiting.append(frame)
        self._waiting_bytes[node] = self._waiting_bytes.get(node, 0) + len(frame)
        if node not in self._connecting:
            self._connecting[node] = self.loop.create_task(self._open(node))

    async def _open(self, node: str) -> None:
        try:
            info = self.node.members.get(node)
            if info is None and await self.node.look_up_member(node):
                # joined since the last heartbeat round (workers of a host start together)
                info = self.node.members.get(node)
            if info is None:
                raise ConnectionError(f"node {node} is not a member")
            host, _, port = info["link"].rpartition(":")
            tls_client = self.settings.tls_client
            tls = {"ssl": tls_client, "ssl_handshake_timeout": HANDSHAKE_TIMEOUT} if tls_client else {}
            _, link = await asyncio.wait_for(self.loop.create_connection(
                lambda: Link(self, node), host.strip("[]"), int(port), **tls), HANDSHAKE_TIMEOUT)
            if not await link.ready:
                link.close()
                raise ConnectionError("the link was not authenticated")
            self.links[node] = link
            self._retry_at.pop(node, None)
            self._waiting_bytes.pop(node, None)
            for frame in self._waiting.pop(node, ()):
                link.send(frame)
        except Exception as exc:
            log.warning("no link to node %s: %s (next attempt in %g s at the earliest)", node, exc, LINK_RETRY)
            self._retry_at[node] = self.clock() + LINK_RETRY
            self._waiting.pop(node, None)
            self._waiting_bytes.pop(node, None)
            self.node.peer_lost(node)
        finally:
            self._connecting.pop(node, None)

    def drop(self, node: str) -> None:
        """``node`` left the cluster: close this node's link to it."""
        link = self.links.pop(node, None)
        if link is not None:
            link.close()

    def tick(self, now: float) -> None:
        """Keep quiet links alive, close dead ones (``Link.tick``)."""
        for link in [*self.links.values(), *self._accepted]:
            link.tick(now)

    # ------------------------------------------------- accepted links (Link)

    def link_socket_opened(self, link: Link) -> bool:
        """An accepted socket, not authenticated yet: whether it may try (bounded in
        all and per address, so sockets that never finish cannot crowd out a node)."""
        pending = self._unauthenticated
        if (sum(pending.values()) >= MAX_UNAUTHENTICATED
                or pending.get(link.address, 0) >= MAX_UNAUTHENTICATED_PER_ADDRESS):
            log.warning("cluster link from %s refused: too many links not yet authenticated", link.address)
            return False
        pending[link.address] = pending.get(link.address, 0) + 1
        link.counted = True
        return True

    def _uncount(self, link: Link) -> None:
        if link.counted:
            link.counted = False
            n = self._unauthenticated.get(link.address, 0) - 1
            if n > 0:
                self._unauthenticated[link.address] = n
            else:
                self._unauthenticated.pop(link.address, None)

    def admit(self, link: Link) -> None:
        """An accepted link proved the secret: admit it if the node it names is a
        member (a node that just joined may be newer than this node's list)."""
        if link.claimed in self.node.members:
            link.admitted()
            return

        async def look_up():
            try:
                known = await self.node.look_up_member(link.claimed)
            except Exception as exc:
                link.fail(f"membership unknown ({exc})")
                return
            if known:
                link.admitted()
            else:
                link.fail(f"node {link.claimed!r} is not a member of the cluster")

        self.loop.create_task(look_up())

    def link_accepted(self, link: Link) -> None:
        self._uncount(link)
        self._accepted.add(link)
        log.info("cluster link from node %s (%s) authenticated", link.peer, link.address)

    def link_lost(self, link: Link) -> None:
        self._uncount(link)
        self._accepted.discard(link)
        if link.peer is not None and self.links.get(link.peer) is link:
            del self.links[link.peer]
            self.node.peer_lost(link.peer)
