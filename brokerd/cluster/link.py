"""Direct TCP links between brokerd nodes (asyncio side).

A node forwards messages to another over its own outgoing link to it (one TCP
connection, so one publisher's messages stay in order), and answers requests
on the connection they came in on. Output is coalesced like client output:
one write per link per event-loop iteration.
"""

import asyncio
import logging

from . import frames

log = logging.getLogger("brokerd.cluster")


class Link(asyncio.Protocol):
    """One connection between two nodes (either direction)."""

    def __init__(self, node, peer: str | None = None):
        self.node = node                    # the ClusterNode
        self.peer = peer                    # the other node's id (known after HELLO when accepted)
        self.transport = None
        self.reader = frames.FrameReader()
        self.out: list[bytes] = []
        self.closed = False
        self.congested = False

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(high=4 * 1024 * 1024)
        self.send(frames.hello(self.node.id))

    def data_received(self, data: bytes) -> None:
        try:
            for f in self.reader.feed(data):
                if f[0] == frames.HELLO:
                    if self.peer is None:
                        self.peer = f[1]
                        self.node.link_accepted(self)
                    continue
                self.node.on_frame(self, f)
        except frames.FrameError as exc:
            log.error("link with %s: %s; closing it", self.peer, exc)
            self.close()

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.node.link_lost(self)

    def pause_writing(self) -> None:
        self.congested = True

    def resume_writing(self) -> None:
        self.congested = False

    def send(self, frame: bytes) -> None:
        if self.closed:
            return
        out = self.out
        if not out:
            self.node.flusher.add(self)
        out.append(frame)

    def flush(self) -> None:
        out = self.out
        if out and self.transport is not None and not self.closed:
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))
        out.clear()

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.flush()
            self.transport.close()
