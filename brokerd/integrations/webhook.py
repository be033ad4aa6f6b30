"""The webhook sender: rules' HTTP requests, sent off the publish path.

``WebhookSender.submit`` (called by the rule engine on the node that ran the
rule, inside the publish path) only appends the rendered request to its
tenant's queue: O(1), no I/O, no await. The queues are bounded in bytes, per
tenant (``--rules-webhook-tenant-buffer``) and for the node
(``--rules-webhook-buffer``); when a bound would be passed the OLDEST request
is dropped (the tenant's own, or -- for the node's bound -- the oldest of the
tenant holding the most bytes), counted in the rule's ``dropped`` and
``failed``, and logged as a warning (at most once per 10 s per node).

``--rules-webhook-concurrency`` workers take requests round-robin over the
tenants (one tenant at most half of them) and send them with a small HTTP/1.1 client (``Connection: close``,
one request per connection, TLS verified against the system's CAs with the
URL's host name). A request that fails (connection error, timeout, 5xx, 408,
429) is tried again up to the rule's ``retries`` times after 0.5 s, 1 s, 2 s,
... (at most 30 s); past them, or on another 4xx, it counts as ``failed``
with ``last_error``. A retrying request keeps its worker (so a dead webhook
ties up at most the workers, and the buffer -- bounded -- takes the rest).

Destinations (SSRF): the host is resolved and EVERY address checked against
``--rules-webhook-allow`` before connecting, and the connection goes to the
checked address (no second lookup). Entries: ``public`` (global unicast
addresses: not loopback, private, link-local, CGNAT, multicast, reserved),
an address or CIDR (``10.1.0.0/16``), or a host name (``hooks.internal``;
``.example.com`` for its subdomains) whose addresses are then accepted
unless loopback, link-local (cloud metadata), multicast or unspecified.
Whatever the allowance, a loopback, unspecified or listener address of this
node on one of its own ports (MQTT, admin, cluster) is refused.
"""

import asyncio
import ipaddress
import logging
import socket
import ssl
import time

from .buffer import Job, TenantBuffers

log = logging.getLogger("brokerd.rules.webhook")

MAX_BACKOFF = 30.0
FIRST_BACKOFF = 0.5
MAX_RESPONSE_HEAD = 16 * 1024


class Refused(Exception):
    pass


class Allowance:
    def __init__(self, text: str, own_ports=(), own_hosts=()):
        self.public = False
        self.nets: list = []
        self.names: list = []
        for entry in [e.strip() for e in text.replace(",", " ").split() if e.strip()]:
            if entry.lower() == "public":
                self.public = True
                continue
            try:
                self.nets.append(ipaddress.ip_network(entry, strict=False))
                continue
            except ValueError:
                pass
            name = entry.lower().rstrip(".")
            if not name or not all(c.isalnum() or c in ".-_" for c in name):
                raise ValueError(f"not an address, CIDR, host name or 'public': {entry!r}")
            self.names.append(name)
        self.set_own(own_ports, own_hosts)

    def set_own(self, ports, hosts) -> None:
        self.own_ports = frozenset(ports)
        hosts = [h.split("%", 1)[0] for h in hosts if h]
        self.own_hosts = frozenset(ipaddress.ip_address(h) for h in hosts if _is_ip(h))
        # a listener on 0.0.0.0 or :: is this node's on every address of the host, not only loopback's
        self.own_any = any(h.is_unspecified for h in self.own_hosts)

    def _name_allowed(self, host: str) -> bool:
        return any(host == n or (n.startswith(".") and host.endswith(n)) for n in self.names)

    def check(self, host: str, port: int, address: str) -> None:
        """Raises Refused unless the resolved ``address`` of ``host`` may be contacted."""
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        if getattr(ip, "ipv4_mapped", None):
            ip = ip.ipv4_mapped
        if port in self.own_ports and (ip.is_loopback or ip.is_unspecified or ip in self.own_hosts
                                       or (self.own_any and _is_local(ip))):
            raise Refused(f"{host}:{port} ({ip}) is this node's own port")
        if any(ip in net for net in self.nets if net.version == ip.version):
            return
        if self.public and ip.is_global and not ip.is_multicast:
            return
        if self._name_allowed(host) and not (ip.is_loopback or ip.is_link_local or ip.is_multicast
                                             or ip.is_unspecified):
            return
        raise Refused(f"{host} ({ip}) is not an allowed destination (--rules-webhook-allow)")


def _is_local(ip) -> bool:
    """Whether ``ip`` is an address of this host (one a socket can be bound to; nothing is sent)."""
    try:
        with socket.socket(socket.AF_INET6 if ip.version == 6 else socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((str(ip), 0))
        return True
    except OSError:
        return False


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return False


class WebhookSender(TenantBuffers):
    WHAT, ITEMS = "webhook", "requests"

    def __init__(self, allowance: Allowance, node_bytes: int, tenant_bytes: int, concurrency: int,
                 wall=time.time, resolve=None):
        super().__init__(node_bytes, tenant_bytes, log, wall)
        self.allowance = allowance
        self.concurrency = concurrency
        # one tenant holds at most half the workers (a dead endpoint in its backoffs cannot starve the others)
        self.per_tenant = max(1, concurrency // 2)
        self.inflight: dict[str, int] = {}          # tenant -> requests its workers are sending
        self.sent = self.failed = 0
        self._resolve = resolve
        self._ready: asyncio.Event | None = None
        self._workers: list = []
        self._ssl: ssl.SSLContext | None = None
        self.closed = False

    # ---------------------------------------------------------------- the hot side: no I/O, no await

    def submit(self, tenant: str, req, state) -> None:
        if not self._queue(tenant, req, state):
            return
        if not self._workers:
            self._start()
        self._ready.set()

    # ---------------------------------------------------------------- the workers

    def _start(self) -> None:
        self._ready = asyncio.Event()
        self._workers = [asyncio.get_running_loop().create_task(self._worker()) for _ in range(self.concurrency)]

    def _next(self) -> Job | None:
        """The oldest request of the first tenant (in turn) below its share of the workers."""
        for tenant in self.queues:
            if self.inflight.get(tenant, 0) < self.per_tenant:
                break
        else:
            return None
        job = self._pop(tenant)
        if tenant in self.queues:                  # round robin: the tenant goes to the back
            self.queues[tenant] = self.queues.pop(tenant)
            self.queued[tenant] = self.queued.pop(tenant)
        self.inflight[tenant] = self.inflight.get(tenant, 0) + 1
        return job

    async def _worker(self) -> None:
        while not self.closed:
            job = self._next()
            if job is None:
                self._ready.clear()
                await self._ready.wait()
                continue
            try:
                await self._deliver(job)
            finally:
                left = self.inflight[job.tenant] - 1
                if left:
                    self.inflight[job.tenant] = left
                else:
                    del self.inflight[job.tenant]
                self._ready.set()                  # a tenant at its share may go on

    async def _deliver(self, job: Job) -> None:
        req, state = job.item, job.state
        delay = FIRST_BACKOFF
        attempt = 0
        while True:
            try:
                status = await asyncio.wait_for(self._send(req), req.timeout)
                if 200 <= status < 300:
                    self.sent += 1
                    state.sent += 1
                    return
                error = f"HTTP {status} from {req.host}"
                retry = status >= 500 or status in (408, 429)
            except Refused as exc:
                error, retry = str(exc), False
            except TimeoutError:
                error, retry = f"no response from {req.host} within {req.timeout:g} s", True
            except (OSError, ssl.SSLError, ValueError, EOFError, asyncio.IncompleteReadError) as exc:
                error, retry = f"{req.host}: {type(exc).__name__}: {exc}", True
            except Exception as exc:      # never the worker's end: it serves every tenant of the node
                log.exception("webhook to %s", req.host)
                error, retry = f"{req.host}: {type(exc).__name__}: {exc}", False
            if not retry or attempt >= req.retries or self.closed:
                self.failed += 1
                if attempt:
                    error += f" (after {attempt + 1} attempts)"
                state.fail(error, self.wall())
                return
            attempt += 1
            state.retried += 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_BACKOFF)

    async def _send(self, req) -> int:
        loop = asyncio.get_running_loop()
        if self._resolve is not None:
            infos = await self._resolve(req.host, req.port)
        else:
            infos = await loop.getaddrinfo(req.host, req.port, type=1)     # SOCK_STREAM
        addresses = [info[4][0] for info in infos]
        if not addresses:
            raise OSError(f"{req.host} has no address")
        for address in addresses:                 # every address, so a name cannot mix allowed and not
            self.allowance.check(req.host, req.port, address)
        tls = None
        if req.scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            tls = self._ssl
        reader, writer = await asyncio.open_connection(addresses[0], req.port, ssl=tls, limit=MAX_RESPONSE_HEAD,
                                                       server_hostname=req.host if tls else None)
        try:
            host = f"[{req.host}]" if ":" in req.host else req.host
            if req.port != (443 if tls else 80):
                host += f":{req.port}"
            head = [f"{req.method} {req.target} HTTP/1.1", f"Host: {host}", "Connection: close",
                    f"Content-Length: {len(req.body)}", "User-Agent: brokerd-rules"]
            head += [f"{k}: {v}" for k, v in req.headers]
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode("utf-8") + req.body)
            await writer.drain()
            try:
                line = await reader.readuntil(b"\r\n")
            except asyncio.LimitOverrunError:
                raise ValueError(f"no HTTP status line within {MAX_RESPONSE_HEAD} bytes") from None
            parts = line.split(None, 2)
            if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
                raise ValueError(f"not an HTTP response: {line[:60]!r}")
            return int(parts[1])             # the rest (headers, body) is not read
        finally:
            writer.transport.abort()         # no waiting for a close handshake once the status is known

    async def close(self) -> None:
        self.closed = True
        for t in self._workers:
            t.cancel()
        for t in self._workers:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        self._workers = []
