"""A small HTTP/1.1 server and client for the admin API (asyncio + h11).

The admin port faces whoever can reach it, so the server does no work for a
request before it is admitted. ``admit`` sees the request line and headers
(the bearer token) and refuses -- 401, 403, 413 from ``Content-Length`` --
before a byte of the body is read; the answer goes out with
``connection: close`` and the socket closes at once (what the peer still has
in flight is read and thrown away for at most ``LINGER`` seconds and
``LINGER_BYTES``, so a client with a wrong token reads its 401 instead of a
reset). Everything else is bounded per listener (``HttpLimits``): concurrent
connections (sockets beyond the cap are closed at accept, so a flood of the
admin port never takes the descriptors MQTT clients and the store need), the
time a peer may take to send a whole request or sit idle between requests
(counted from when the node starts waiting, not reset by a trickle of bytes),
header bytes (h11's ``max_incomplete_event_size``), one body, and the body
bytes buffered across all connections (reserved from ``Content-Length``
before reading; 503 when the budget is spent). A connection does not read
while its request is being handled or while the peer leaves our answer
unread.

Admitted requests go to an async handler, one at a time per connection
(keep-alive). The client is what a node uses to ask the other nodes (one
request per connection).
"""

import asyncio
import json
import logging
import weakref
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

import h11

log = logging.getLogger("brokerd.admin")

MAX_BODY = 4 * 1024 * 1024
MAX_HEADERS = 64 * 1024
# A refused request's socket is drained (read, nothing kept) before it is closed, for at most
# LINGER seconds or LINGER_BYTES: closing with unread bytes makes the kernel send a reset, which
# can reach the client before it has read our answer. A client that sends a body of up to
# MAX_BODY and then reads sees the answer.
LINGER = 1.0
LINGER_BYTES = MAX_BODY + MAX_HEADERS
REASONS = {100: b"Continue", 200: b"OK", 201: b"Created", 204: b"No Content", 400: b"Bad Request",
           401: b"Unauthorized", 403: b"Forbidden", 404: b"Not Found", 405: b"Method Not Allowed",
           413: b"Payload Too Large", 500: b"Internal Server Error", 502: b"Bad Gateway",
           503: b"Service Unavailable"}


@dataclass(slots=True)
class HttpLimits:
    max_connections: int = 64             # sockets open at once; more are closed at accept
    timeout: float = 10.0                 # to send a whole request, or idle between requests
    max_body: int = MAX_BODY              # one request's body
    body_budget: int = 16 * 1024 * 1024   # bodies buffered by all connections at once


class HttpState:
    """What the connections of one listener share: the caps and the counters."""

    def __init__(self, limits: HttpLimits):
        self.limits = limits
        self.connections: weakref.WeakSet = weakref.WeakSet()
        self.buffered = 0           # body bytes reserved by requests being read or handled
        self.refused = 0            # sockets closed at accept: the connection cap was reached
        self.timed_out = 0          # connections closed for sending too slowly or idling
        self.rejected = 0           # requests answered before their body was read (401/403/413/503)

    def reserve(self, n: int) -> bool:
        if self.buffered + n > self.limits.body_budget:
            return False
        self.buffered += n
        return True

    def release(self, n: int) -> None:
        self.buffered -= n

    def as_dict(self) -> dict:
        return {"connections": len(self.connections), "max_connections": self.limits.max_connections,
                "refused": self.refused, "timed_out": self.timed_out, "rejected": self.rejected,
                "body_bytes": self.buffered, "body_budget": self.limits.body_budget}


class Request:
    __slots__ = ("method", "path", "query", "headers", "body", "peer", "token", "max_body")

    def __init__(self, method, target, headers, body, peer):
        self.method = method
        parts = urlsplit(target)
        self.path = parts.path
        self.query = dict(parse_qsl(parts.query, keep_blank_values=True))
        self.headers = headers
        self.body = body
        self.peer = peer
        self.token = None           # set by the server's admit()
        self.max_body = MAX_BODY    # ... which may lower it (public endpoints take no body)

    def json(self) -> dict:
        if not self.body:
            return {}
        try:
            data = json.loads(self.body)
        except RecursionError:      # "[[[[...": the decoder's recursion limit
            raise ValueError("the body is not valid JSON: nested too deeply")
        except ValueError as exc:
            raise ValueError(f"the body is not valid JSON: {exc}")
        if not isinstance(data, dict):
            raise ValueError("the body must be a JSON object")
        return data


def json_response(status: int, data, headers=()) -> tuple:
    body = json.dumps(data, separators=(",", ":")).encode() if data is not None else b""
    return status, [("content-type", "application/json"), *headers], body


class Refuse(asyncio.Protocol):
    """Closes a socket accepted beyond the connection cap."""

    def connection_made(self, transport):
        transport.abort()


def server_factory(state: HttpState, admit, handler):
    """The protocol factory of a listener: ``admit(req) -> refusal | None`` sees
    each request before its body, ``handler(req) -> (status, headers, body)``."""

    def make():
        if len(state.connections) >= state.limits.max_connections:
            state.refused += 1
            return Refuse()
        proto = HttpProtocol(state, admit, handler)
        state.connections.add(proto)
        return proto

    return make


class HttpProtocol(asyncio.Protocol):
    def __init__(self, state: HttpState, admit, handler):
        self.state = state
        self.admit = admit
        self.handler = handler
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADERS)
        self.transport = None
        self.peer = ""
        self._req: Request | None = None
        self._body = bytearray()
        self._length: int | None = None    # the request's Content-Length (None: chunked)
        self._reserved = 0                 # body bytes of the budget this connection holds
        self._busy = False                 # a request is being handled
        self._write_paused = False         # the peer is not reading our answers
        self._reading = True
        self._lingering = False
        self._discarded = 0
        self._timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------ transport

    def connection_made(self, transport):
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = peer[0] if isinstance(peer, tuple) else ""
        self._arm(self.state.limits.timeout)

    def data_received(self, data: bytes):
        if self._lingering:
            self._discarded += len(data)
            if self._discarded > LINGER_BYTES:
                self.transport.abort()
            return
        self.conn.receive_data(data)
        self._next()

    def eof_received(self):
        if self._lingering:
            return False
        self.conn.receive_data(b"")
        self._next()
        return self._busy           # keep the socket open to answer a request being handled

    def pause_writing(self):
        self._write_paused = True
        self._pause_reading()

    def resume_writing(self):
        self._write_paused = False
        if not self._busy and self.transport is not None:
            self._resume_reading()
            self._next()

    def connection_lost(self, exc):
        self._disarm()
        self._release()
        self.state.connections.discard(self)
        self.transport = None

    # --------------------------------------------------------------- timers

    def _arm(self, delay: float) -> None:
        self._disarm()
        self._timer = asyncio.get_running_loop().call_later(delay, self._expire)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        if self.transport is None:
            return
        if not self._lingering:
            self.state.timed_out += 1
        self.transport.abort()

    def _pause_reading(self) -> None:
        if self._reading and self.transport is not None:
            self._reading = False
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if not self._reading and self.transport is not None:
            self._reading = True
            self.transport.resume_reading()

    def _release(self) -> None:
        if self._reserved:
            self.state.release(self._reserved)
            self._reserved = 0

    # -------------------------------------------------------------- requests

    def _next(self):
        while not self._busy and not self._write_paused and not self._lingering and self.transport is not None:
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError:
                self._refuse(*json_response(400, {"error": "malformed HTTP request"}))
                return
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return
            if isinstance(event, h11.Request):
                if not self._start(event):
                    return
            elif isinstance(event, h11.Data):
                if not self._take(event.data):
                    return
            elif isinstance(event, h11.EndOfMessage):
                self._dispatch()
            elif isinstance(event, h11.ConnectionClosed):
                self.transport.close()
                return

    def _start(self, event: h11.Request) -> bool:
        """A request's line and headers: admitted, or answered and closed; -> go on reading."""
        headers = {k.decode().lower(): v.decode("latin-1") for k, v in event.headers}
        req = Request(event.method.decode(), event.target.decode("latin-1"), headers, b"", self.peer)
        self._body = bytearray()
        self._length = None if "chunked" in headers.get("transfer-encoding", "").lower() else int(
            headers.get("content-length") or 0)
        refusal = self.admit(req)
        if refusal is not None:
            self._refuse(*refusal)
            return False
        limit = self._limit(req)
        if self._length is not None:
            if self._length > limit:
                self._refuse(*json_response(413, {"error": f"the body may have at most {limit} bytes"}))
                return False
            if not self._reserve(self._length):
                return False
        self._req = req
        if self.conn.they_are_waiting_for_100_continue:
            self.transport.write(self.conn.send(h11.InformationalResponse(status_code=100, headers=[],
                                                                          reason=REASONS[100])))
        return True

    def _limit(self, req: Request) -> int:
        limits = self.state.limits
        return min(req.max_body, limits.max_body, limits.body_budget)

    def _reserve(self, n: int) -> bool:
        if not self.state.reserve(n):
            self._refuse(*json_response(503, {"error": "the node is busy reading other requests: try again"},
                                        [("retry-after", "1")]))
            return False
        self._reserved += n
        return True

    def _take(self, data: bytes) -> bool:
        """Body bytes; a chunked body reserves its budget as it comes."""
        if self._length is None:
            limit = self._limit(self._req)
            if len(self._body) + len(data) > limit:
                self._refuse(*json_response(413, {"error": f"the body may have at most {limit} bytes"}))
                return False
            if not self._reserve(len(data)):
                return False
        self._body += data
        return True

    def _dispatch(self) -> None:
        req = self._req
        req.body = bytes(self._body)
        self._req, self._body = None, bytearray()
        self._disarm()
        self._busy = True
        self._pause_reading()
        asyncio.get_running_loop().create_task(self._handle(req))

    async def _handle(self, req: Request):
        try:
            status, headers, body = await self.handler(req)
        except Exception:
            log.exception("admin API request %s %s failed", req.method, req.path)
            status, headers, body = json_response(500, {"error": "internal error"})
        finally:
            self._release()
        self._respond(status, headers, body)

    def _respond(self, status, headers, body):
        if self.transport is None or self.transport.is_closing():
            return
        try:
            out = self.conn.send(h11.Response(status_code=status, reason=REASONS.get(status, b""),
                                              headers=[*headers, ("content-length", str(len(body)))]))
            out += self.conn.send(h11.Data(data=body)) if body else b""
            out += self.conn.send(h11.EndOfMessage())
            self.transport.write(out)
        except h11.LocalProtocolError:
            self.transport.close()
            return
        if self.conn.our_state is h11.MUST_CLOSE:
            self.transport.close()
            return
        try:
            self.conn.start_next_cycle()
        except h11.LocalProtocolError:
            self.transport.close()
            return
        self._busy = False
        self._arm(self.state.limits.timeout)          # the next request, or idle
        if self.transport is None or self._write_paused:
            return
        self._resume_reading()
        self._next()

    def _refuse(self, status, headers, body: bytes) -> None:
        """Answer before the body is read, then close: at once if the peer sent
        everything, else after draining (not keeping) what it still sends."""
        self.state.rejected += 1
        self._release()
        try:
            self.transport.write(
                self.conn.send(h11.Response(status_code=status, reason=REASONS.get(status, b""), headers=[
                    *headers, ("content-length", str(len(body))), ("connection", "close")]))
                + (self.conn.send(h11.Data(data=body)) if body else b"") + self.conn.send(h11.EndOfMessage()))
        except h11.LocalProtocolError:
            pass
        if self._all_received():
            self.transport.close()
            return
        self._lingering = True
        self._resume_reading()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._arm(LINGER)

    def _all_received(self) -> bool:
        """Has the peer sent the whole request (nothing more to drain before closing)?"""
        theirs = self.conn.their_state
        if theirs is h11.DONE or theirs is h11.MUST_CLOSE or theirs is h11.CLOSED:
            return True
        if theirs is h11.SEND_BODY and self._length is not None:
            return len(self.conn.trailing_data[0]) >= self._length - len(self._body)
        return False


MAX_RESPONSE = 256 * 1024 * 1024     # another node's answer: 100,000 clients are about 60 MB


async def request(host: str, port: int, method: str, target: str, headers: dict, body: bytes = b"",
                  timeout: float = 5.0, max_bytes: int = MAX_RESPONSE) -> tuple[int, bytes]:
    """One HTTP request to another node; -> (status, body). An answer longer than
    ``max_bytes`` is given up on (ValueError), as one that takes over ``timeout``."""
    async def go():
        reader, writer = await asyncio.open_connection(host, port)
        try:
            conn = h11.Connection(h11.CLIENT)
            hs = [("host", f"{host}:{port}"), ("connection", "close"), ("content-length", str(len(body))),
                  *headers.items()]
            writer.write(conn.send(h11.Request(method=method, target=target, headers=hs)) +
                         (conn.send(h11.Data(data=body)) if body else b"") + conn.send(h11.EndOfMessage()))
            status, chunks, size = 0, [], 0
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(await reader.read(65536))
                    continue
                if isinstance(event, h11.Response):
                    status = event.status_code
                elif isinstance(event, h11.Data):
                    size += len(event.data)
                    if size > max_bytes:
                        raise ValueError(f"{host}:{port} answered more than {max_bytes} bytes")
                    chunks.append(event.data)
                elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                    return status, b"".join(chunks)
        finally:
            writer.close()

    return await asyncio.wait_for(go(), timeout)
