"""A small HTTP/1.1 server and client for the admin API (asyncio + h11).

The server hands each complete request (method, path, query, headers, body)
to an async handler and writes its (status, headers, body) back, keeping the
connection alive between requests; request bodies are capped. The client is
what a node uses to ask the other nodes (one request per connection).
"""

import asyncio
import json
from urllib.parse import parse_qsl, urlsplit

import h11

MAX_BODY = 4 * 1024 * 1024
REASONS = {200: b"OK", 201: b"Created", 204: b"No Content", 400: b"Bad Request", 401: b"Unauthorized",
           403: b"Forbidden", 404: b"Not Found", 405: b"Method Not Allowed", 413: b"Payload Too Large",
           500: b"Internal Server Error", 502: b"Bad Gateway", 503: b"Service Unavailable"}


class Request:
    __slots__ = ("method", "path", "query", "headers", "body", "peer")

    def __init__(self, method, target, headers, body, peer):
        self.method = method
        parts = urlsplit(target)
        self.path = parts.path
        self.query = dict(parse_qsl(parts.query, keep_blank_values=True))
        self.headers = headers
        self.body = body
        self.peer = peer

    def json(self) -> dict:
        if not self.body:
            return {}
        data = json.loads(self.body)
        if not isinstance(data, dict):
            raise ValueError("the body must be a JSON object")
        return data


def json_response(status: int, data, headers=()) -> tuple:
    body = json.dumps(data, separators=(",", ":")).encode() if data is not None else b""
    return status, [("content-type", "application/json"), *headers], body


class HttpProtocol(asyncio.Protocol):
    def __init__(self, handler):
        self.handler = handler
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=64 * 1024)
        self.transport = None
        self.peer = ""
        self._busy = False
        self._pending: dict = {}

    def connection_made(self, transport):
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = peer[0] if isinstance(peer, tuple) else ""

    def data_received(self, data: bytes):
        self.conn.receive_data(data)
        self._next()

    def eof_received(self):
        self.conn.receive_data(b"")
        self._next()
        return False

    def _next(self):
        while not self._busy:
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError:
                self._send_simple(400, b"bad request")
                return
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return
            if isinstance(event, h11.Request):
                self._pending = {"method": event.method.decode(), "target": event.target.decode(),
                                 "headers": {k.decode().lower(): v.decode("latin-1") for k, v in event.headers},
                                 "body": bytearray()}
            elif isinstance(event, h11.Data):
                self._pending["body"] += event.data
                if len(self._pending["body"]) > MAX_BODY:
                    self._send_simple(413, b"body too large")
                    return
            elif isinstance(event, h11.EndOfMessage):
                p = self._pending
                req = Request(p["method"], p["target"], p["headers"], bytes(p["body"]), self.peer)
                self._busy = True
                asyncio.get_running_loop().create_task(self._handle(req))
            elif isinstance(event, h11.ConnectionClosed):
                if self.transport is not None:
                    self.transport.close()
                return

    async def _handle(self, req: Request):
        try:
            status, headers, body = await self.handler(req)
        except Exception:
            import logging

            logging.getLogger("brokerd.admin").exception("admin API request %s %s failed", req.method, req.path)
            status, headers, body = json_response(500, {"error": "internal error"})
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
        self._next()

    def _send_simple(self, status, text: bytes):
        try:
            self.transport.write(self.conn.send(h11.Response(status_code=status, headers=[
                ("content-length", str(len(text))), ("connection", "close")])) + self.conn.send(h11.Data(data=text))
                + self.conn.send(h11.EndOfMessage()))
        except h11.LocalProtocolError:
            pass
        self.transport.close()

    def connection_lost(self, exc):
        self.transport = None


async def request(host: str, port: int, method: str, target: str, headers: dict, body: bytes = b"",
                  timeout: float = 5.0) -> tuple[int, bytes]:
    """One HTTP request to another node; -> (status, body)."""
    async def go():
        reader, writer = await asyncio.open_connection(host, port)
        try:
            conn = h11.Connection(h11.CLIENT)
            hs = [("host", f"{host}:{port}"), ("connection", "close"), ("content-length", str(len(body))),
                  *headers.items()]
            writer.write(conn.send(h11.Request(method=method, target=target, headers=hs)) +
                         (conn.send(h11.Data(data=body)) if body else b"") + conn.send(h11.EndOfMessage()))
            status, chunks = 0, []
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(await reader.read(65536))
                    continue
                if isinstance(event, h11.Response):
                    status = event.status_code
                elif isinstance(event, h11.Data):
                    chunks.append(event.data)
                elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                    return status, b"".join(chunks)
        finally:
            writer.close()

    return await asyncio.wait_for(go(), timeout)
