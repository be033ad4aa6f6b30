"""Direct TCP links between brokerd nodes (asyncio side).

A node forwards messages to another over its own outgoing link to it (one TCP
connection, so one publisher's messages stay in order), and answers requests
on the connection they came in on. Output is coalesced like client output:
one write per link per event-loop iteration.

Nothing a link carries is acted on before both ends proved they hold the
cluster secret (``handshake``): until then a link accepts only HELLO and AUTH
frames of at most ``frames.PREAUTH_FRAME`` bytes, for at most
``HANDSHAKE_TIMEOUT`` seconds. An authenticated link that hears nothing for
``IDLE_TIMEOUT`` seconds is closed (each end sends PING when it sent nothing
for ``PING_EVERY``), so a peer that vanished without a FIN does not hold
requests forever. A peer's requests that wait on this node's bus (a
TAKEOVER's lock check) are at most ``MAX_IN_PROGRESS`` per link: beyond, the
link is not read until half of them are done (the frames of the read that
passed it wait, in order).
"""

import asyncio
import logging
import os

from . import frames, handshake

log = logging.getLogger("brokerd.cluster")

HANDSHAKE_TIMEOUT = 5.0     # seconds from connect to an authenticated link
PING_EVERY = 5.0            # seconds of silence after which a link sends PING
IDLE_TIMEOUT = 30.0         # seconds without a byte from the peer after which a link is closed
MAX_BACKLOG = 256 * 1024 * 1024     # bytes waiting for a peer that does not read before the link is cut
# a peer's requests being handled here at once (each a task waiting on Redis); more: the link is not read
# until half are done -- a member sending TAKEOVERs without end made a task each, the node's Redis calls
# (its heartbeat too) queued behind them and the other nodes took it for dead
MAX_IN_PROGRESS = 256

HANDSHAKE, ADMITTING, READY = 0, 1, 2     # ADMITTING: the accepting side checks the peer's membership


class Link(asyncio.Protocol):
    """One connection between two nodes (either direction).

    ``expected`` is the node this side dialled (None on an accepted link);
    ``peer`` is the other node's id once it is authenticated.
    """

    def __init__(self, node, expected: str | None = None):
        self.node = node                    # its owner, a peers.Peers (peers.LinkOwner)
        self.expected = expected
        self.peer: str | None = None
        self.claimed: str | None = None     # the node id the peer's HELLO named
        self.address = ""                   # the peer's IP address
        self.transport = None
        self.reader = frames.FrameReader(frames.PREAUTH_FRAME)
        self.state = HANDSHAKE
        self.nonce = os.urandom(frames.NONCE)
        self.peer_nonce: bytes | None = None
        self.ready = node.loop.create_future()      # True once authenticated, False if that failed
        self.out: list[bytes] = []
        self.closed = False
        self.congested = False
        self.counted = False                # among the node's unauthenticated accepted links
        self.charged = 0                    # bytes sent while congested, charged to the queue budget
        self.last_rx = self.last_tx = node.loop.time()
        self._timer = None
        self.in_progress = 0                # the peer's requests being handled (request_started / _done)
        self.held: list | None = None       # frames read, waiting while too many requests are in progress

    # ---------------------------------------------------------- asyncio side

    def connection_made(self, transport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.address = peer[0] if isinstance(peer, tuple) else str(peer or "")
        # too many unauthenticated links (counted per address and in all; one accepted on TLS was counted
        # before its handshake)
        if self.expected is None and not self.counted and not self.node.link_socket_opened(self):
            transport.abort()
            return
        transport.set_write_buffer_limits(high=4 * 1024 * 1024)
        self._timer = self.node.loop.call_later(HANDSHAKE_TIMEOUT, self._handshake_timeout)
        self._write(frames.hello(self.node.id, self.nonce))

    def data_received(self, data: bytes) -> None:
        self.last_rx = self.node.loop.time()
        try:
            got = self.reader.feed(data)
        except frames.FrameError as exc:
            self.fail(str(exc))
            return
        if self.held is not None:           # (read while reading was being paused)
            self.held.extend(got)
            return
        self._handle(got)

    def _handle(self, got: list) -> None:
        for i, f in enumerate(got):
            if self.state == READY:
                if f[0] != frames.PING:
                    self.node.on_frame(self, f)
            else:
                self._handshake(f)
            if self.closed:
                return
            if self.in_progress >= MAX_IN_PROGRESS:
                self.held = got[i + 1:]
                self.transport.pause_reading()
                return

    def request_started(self) -> None:
        """A request of the peer is being handled (``request_done`` when it no longer waits on the bus)."""
        self.in_progress += 1

    def request_done(self) -> None:
        self.in_progress -= 1
        if self.held is None or self.in_progress > MAX_IN_PROGRESS // 2 or self.closed:
            return
        held, self.held = self.held, None
        self._handle(held)
        if self.held is None and not self.closed:
            self.transport.resume_reading()

    def connection_lost(self, exc) -> None:
        self.closed = True
        self._uncharge()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.ready.done():
            self.ready.set_result(False)
        self.node.link_lost(self)

    def pause_writing(self) -> None:
        self.congested = True

    def resume_writing(self) -> None:
        self.congested = False
        self._uncharge()

    def _uncharge(self) -> None:
        if self.charged:
            self.node.budget.add(-self.charged)
            self.charged = 0

    # ------------------------------------------------------------ handshake

    def _handshake(self, f: tuple) -> None:
        kind = f[0]
        if kind == frames.HELLO and self.peer_nonce is None:
            self._on_hello(f[1], f[2])
        elif kind == frames.AUTH and self.peer_nonce is not None and self.claimed is not None:
            self._on_auth(f[1])
        else:
            self.fail(f"frame of type {kind} before the link was authenticated")

    def _on_hello(self, name: str, nonce: bytes) -> None:
        if not name or name == self.node.id:
            self.fail(f"HELLO names node {name!r}")
            return
        if self.expected is not None and name != self.expected:
            self.fail(f"dialled node {self.expected!r} but {name!r} answered")
            return
        self.claimed, self.peer_nonce = name, nonce
        if self.expected is not None:       # the side that opened the link proves itself first
            self._write(frames.auth(self._proof()))

    def _on_auth(self, got: bytes) -> None:
        node = self.node
        if self.state == ADMITTING:
            self.fail("second AUTH")
            return
        if not handshake.check(node.secret, got, self.claimed, node.id, self.nonce, self.peer_nonce):
            self.fail("wrong cluster secret")
            return
        if self.expected is not None:
            self._authenticated()
            return
        self.state = ADMITTING
        node.admit(self)

    def _proof(self) -> bytes:
        return handshake.proof(self.node.secret, self.node.id, self.claimed, self.peer_nonce, self.nonce)

    def admitted(self) -> None:
        """The accepting side: the peer is a member; prove ourselves and open the link."""
        if self.closed:
            return
        self._write(frames.auth(self._proof()))
        self._authenticated()

    def _authenticated(self) -> None:
        self.state = READY
        self.peer = self.claimed
        self.reader.max_frame = self.node.max_frame
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.expected is None:
            self.node.link_accepted(self)
        if not self.ready.done():
            self.ready.set_result(True)

    def _handshake_timeout(self) -> None:
        self._timer = None
        if self.state != READY:
            self.fail(f"not authenticated within {HANDSHAKE_TIMEOUT:g} s")

    def fail(self, why: str) -> None:
        """Close the link at once, saying why in the log."""
        who = self.peer or self.claimed or "?"
        log.warning("cluster link %s %s (node %s): %s; closing it",
                    "to" if self.expected else "from", self.address, who, why)
        self.closed = True
        if not self.ready.done():
            self.ready.set_result(False)
        if self.transport is not None:
            self.transport.abort()

    # ---------------------------------------------------------------- output

    def _write(self, frame: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(frame)
            self.last_tx = self.node.loop.time()

    def send(self, frame: bytes) -> None:
        """Queue ``frame`` for this event-loop iteration's write. While the peer
        does not keep up (the transport's buffer is over its high mark), what
        is sent is charged to the node's queue budget -- so the publishers
        feeding this link are paced like those of a slow subscriber -- and a
        peer that lets MAX_BACKLOG pile up is cut off (its requests fail, the
        publishers are told and send again)."""
        if self.closed:
            return
        if self.congested:
            n = len(frame)
            self.charged += n
            self.node.budget.add(n)
            if self.charged > MAX_BACKLOG:
                self.fail(f"the node does not read: {self.charged} bytes waiting")
                return
        out = self.out
        if not out:
            self.node.flusher.add(self)
        out.append(frame)

    def flush(self) -> None:
        out = self.out
        if out and self.transport is not None and not self.closed:
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))
            self.last_tx = self.node.loop.time()
        out.clear()

    def tick(self, now: float) -> None:
        """From the node's timer: keep a quiet link alive, close a dead one."""
        if self.state != READY or self.closed:
            return
        if now - self.last_rx > IDLE_TIMEOUT:
            self.fail(f"nothing heard for {IDLE_TIMEOUT:g} s")
        elif now - self.last_tx > PING_EVERY and not self.out:
            self.send(frames.ping())

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.flush()
            self.transport.close()
