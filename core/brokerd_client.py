"""The console's client of the brokerd admin API (the only way it acts on the live cluster).

Synchronous (Django views; the metrics hub calls it in a thread), standard
library only. Every call names the console user it acts for
(``X-On-Behalf-Of``), so brokerd's audit rows say who did it. Settings:
``BROKERD_ADMIN_URL`` and ``BROKERD_ADMIN_TOKEN`` (a write-scoped token).

Any node answers for the whole cluster, so the console needs one that is
alive, not a particular one. ``BROKERD_ADMIN_URL`` is a comma-separated list
of nodes' admin APIs (one URL still works), and the console also learns the
others from the cluster's membership: ``GET /api/v1/nodes`` (the metrics hub
asks every ``BROKERD_ADMIN_DISCOVERY_INTERVAL`` seconds) names each live
node's ``admin`` address. Per console process, ``AdminNodes`` remembers the
node that answered last and asks it first; a node that does not answer is
tried after the others for ``RETRY_AFTER`` seconds.

Failing over (``BrokerdClient._call``):

- no connection within ``BROKERD_ADMIN_CONNECT_TIMEOUT`` (refused, timed
  out, no route): nothing was sent, so the request -- any request -- goes to
  the next node at once;
- connected, but no whole answer (the node died or hung mid-request): a GET
  is asked of the next node; a write (kick, publish, subscribe, unsubscribe,
  retained delete) is **not** repeated, because the node may have carried
  it out already: a publish would be delivered twice, a repeated kick would
  disconnect the client again once it reconnected or answer "no such client"
  for a kick that worked. It fails with ``BrokerdInterrupted``: the page
  says it may have happened and to look before trying again;
- an HTTP answer, even an error, is the cluster's answer: no failover.

A node that waits for a hung peer (brokerd gives a peer ``PEER_TIMEOUT``
seconds when it gathers a cluster-wide answer) answers late, not never: after
a read timed out, the next nodes get at least ``PEER_TIMEOUT`` + 1 seconds.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse
from collections import OrderedDict

from django.conf import settings

RETRY_AFTER = 5.0                # seconds a node that did not answer is asked only after the others
PEER_TIMEOUT = 5.0               # brokerd's wait for a peer node (brokerd/admin/http.py request())
SAFE_METHODS = ("GET", "HEAD")   # repeated on another node when an answer was cut off
WILDCARDS = ("", "0.0.0.0", "::", "[::]")


class BrokerdError(Exception):
    """The API answered with an error (``status`` is its HTTP status)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


class BrokerdUnavailable(BrokerdError):
    """No node answered: the cluster (or every address the console knows) is down."""

    def __init__(self, message: str):
        super().__init__(503, message)


class BrokerdInterrupted(BrokerdError):
    """A write reached a node that then gave no answer: it may or may not have been done."""

    def __init__(self, message: str):
        super().__init__(504, message)


class _NotSent(Exception):
    """No connection: the request never left."""


class _NoAnswer(Exception):
    """Connected and (perhaps) sent, but no whole answer came back."""

    def __init__(self, exc: BaseException):
        super().__init__(str(exc) or type(exc).__name__)
        self.timed_out = isinstance(exc, TimeoutError)


def admin_urls(value) -> list[str]:
    """``"http://a:18083, http://b:18083"`` (or a list) -> ``["http://a:18083", "http://b:18083"]``."""
    items = value.split(",") if isinstance(value, str) else list(value or ())
    urls = []
    for item in (i.strip().rstrip("/") for i in items):
        if not item:
            continue
        parts = urllib.parse.urlsplit(item)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"BROKERD_ADMIN_URL: {item!r} is not an http:// or https:// URL")
        if item not in urls:
            urls.append(item)
    if not urls:
        raise ValueError("BROKERD_ADMIN_URL names no admin API")
    return urls


class AdminNodes:
    """The admin APIs one console process knows, and the order to ask them in.

    ``configured`` come from the setting and are never forgotten; ``learned``
    come from ``GET /api/v1/nodes`` and are replaced by each new listing.
    Shared by the threads of a process (views, the hub's polls): a lock."""

    def __init__(self, configured: list[str]):
        self.configured = list(configured)
        self.learned: list[str] = []
        self.current = self.configured[0]
        self.failed_at: dict[str, float] = {}
        self._lock = threading.Lock()

    def order(self, now: float | None = None) -> list[str]:
        """The last node that answered, then the others; those that failed lately last (oldest failure first)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            every = [self.current] + [u for u in self.configured + self.learned if u != self.current]
            recent = {u: t for u, t in self.failed_at.items() if now - t < RETRY_AFTER}
        return [u for u in every if u not in recent] + sorted((u for u in every if u in recent), key=recent.get)

    def answered(self, url: str) -> None:
        with self._lock:
            self.current = url
            self.failed_at.pop(url, None)

    def failed(self, url: str, now: float | None = None) -> None:
        with self._lock:
            self.failed_at[url] = time.monotonic() if now is None else now

    def learn(self, nodes: list[dict]) -> list[str]:
        """The live nodes' admin addresses from a ``GET /api/v1/nodes`` listing -> the learned URLs.
        Addresses no one else can reach (a wildcard bind) are skipped; the scheme is the configured one's."""
        scheme = urllib.parse.urlsplit(self.configured[0]).scheme
        found = []
        for n in nodes:
            address = n.get("admin") or ""
            host, _, port = address.rpartition(":")
            if n.get("health") != "ok" or host in WILDCARDS or not port.isdigit():
                continue
            url = f"{scheme}://{address}"
            if url not in self.configured and url not in found:
                found.append(url)
        with self._lock:
            self.learned = found
            for url in [u for u in self.failed_at if u not in self.configured and u not in found]:
                del self.failed_at[url]
        return found


_nodes: OrderedDict[tuple[str, ...], AdminNodes] = OrderedDict()
_nodes_lock = threading.Lock()


def admin_nodes(urls: list[str]) -> AdminNodes:
    """The process's ``AdminNodes`` for this configuration (a handful are kept: tests change settings)."""
    key = tuple(urls)
    with _nodes_lock:
        nodes = _nodes.get(key)
        if nodes is None:
            nodes = _nodes[key] = AdminNodes(urls)
            while len(_nodes) > 8:
                _nodes.popitem(last=False)
        _nodes.move_to_end(key)
        return nodes


class BrokerdClient:
    def __init__(self, base_url: str | None = None, token: str | None = None, actor: str | None = None,
                 timeout: float = 5.0, connect_timeout: float | None = None):
        self.endpoints = admin_nodes(admin_urls(base_url or settings.BROKERD_ADMIN_URL))
        self.token = token if token is not None else settings.BROKERD_ADMIN_TOKEN
        self.actor = actor
        self.timeout = timeout
        self.connect_timeout = (connect_timeout if connect_timeout is not None
                                else float(getattr(settings, "BROKERD_ADMIN_CONNECT_TIMEOUT", 1.0)))

    @property
    def base_url(self) -> str:
        """The node asked first (the last that answered)."""
        return self.endpoints.current

    def _headers(self, has_body: bool) -> dict:
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        if has_body:
            headers["Content-Type"] = "application/json"
        if self.actor:
            # user names may be any letters (Django's \w): UTF-8, percent-encoded, in a header
            headers["X-On-Behalf-Of"] = urllib.parse.quote(self.actor, safe=":@+-_. ")
        return headers

    def _send(self, url: str, method: str, target: str, data: bytes | None, timeout: float) -> tuple[int, bytes]:
        """One request to one node -> (status, body); _NotSent / _NoAnswer."""
        parts = urllib.parse.urlsplit(url)
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        conn = cls(parts.hostname, parts.port, timeout=self.connect_timeout)
        try:
            try:
                conn.connect()
            except OSError as exc:
                raise _NotSent(str(exc) or type(exc).__name__) from None
            conn.sock.settimeout(timeout)
            try:
                conn.request(method, parts.path + target, body=data, headers=self._headers(data is not None))
                resp = conn.getresponse()
                return resp.status, resp.read()
            except (OSError, http.client.HTTPException) as exc:
                raise _NoAnswer(exc) from None
        finally:
            conn.close()

    def _call(self, method: str, path: str, query: dict | None = None, body: dict | None = None):
        query = {k: v for k, v in (query or {}).items() if v not in (None, "")}
        target = "/api/v1/" + path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = None if body is None else json.dumps(body).encode()
        timeout, tried = self.timeout, []
        for url in self.endpoints.order():
            try:
                status, raw = self._send(url, method, target, data, timeout)
            except _NotSent as exc:
                self.endpoints.failed(url)
                tried.append(f"{url}: {exc}")
                continue
            except _NoAnswer as exc:
                self.endpoints.failed(url)
                if method not in SAFE_METHODS:
                    raise BrokerdInterrupted(
                        f"brokerd at {url} stopped answering after the request was sent ({exc}): it may have "
                        f"been carried out -- check before trying again") from None
                tried.append(f"{url}: {exc}")
                if exc.timed_out:        # the next node may be waiting for the same hung peer
                    timeout = max(timeout, PEER_TIMEOUT + 1)
                continue
            self.endpoints.answered(url)
            return self._result(status, raw)
        raise BrokerdUnavailable("brokerd admin API unreachable: " + "; ".join(tried))

    @staticmethod
    def _result(status: int, raw: bytes):
        if status >= 400:
            try:
                message = json.loads(raw).get("error") or http.client.responses.get(status, str(status))
            except (ValueError, AttributeError):
                message = http.client.responses.get(status, str(status))
            raise BrokerdError(status, message)
        try:
            return json.loads(raw or b"null")
        except ValueError:
            raise BrokerdError(502, "brokerd answered something that is not JSON") from None

    @staticmethod
    def _seg(value: str) -> str:
        return urllib.parse.quote(value, safe="")

    # ------------------------------------------------------------ reads

    def nodes(self) -> list[dict]:
        """Every node of the cluster; the live ones' admin APIs are learned on the way."""
        items = self._call("GET", "nodes")["items"]
        self.endpoints.learn(items)
        return items

    def discover(self) -> list[str]:
        """Learn the live nodes' admin APIs from the cluster's membership -> the learned URLs."""
        self.nodes()
        return list(self.endpoints.learned)

    def metrics(self) -> dict:
        """The whole cluster's counters (any node answers for all of them):
        ``{"at", "nodes": [...], "cluster": {...}, "tenants": {slug: {...}}}``;
        see README "Live metrics" for the fields."""
        return self._call("GET", "metrics")

    def clients(self, *, tenant=None, client_id=None, username=None, ip=None, node=None, connected=None,
                page: int = 1, per_page: int = 50) -> dict:
        """``{"items": [...], "total", "page", "per_page"}``."""
        return self._call("GET", "clients", {"tenant": tenant, "client_id": client_id, "username": username,
                                             "ip": ip, "node": node, "connected": connected, "page": page,
                                             "per_page": per_page})

    def client(self, tenant: str, client_id: str) -> dict:
        return self._call("GET", f"clients/{self._seg(tenant)}/{self._seg(client_id)}")

    def retained(self, tenant: str, prefix: str = "", page: int = 1, per_page: int = 50, sys: bool = False) -> dict:
        return self._call("GET", "retained", {"tenant": tenant, "prefix": prefix, "page": page,
                                              "per_page": per_page, "sys": int(sys)})

    def retained_message(self, tenant: str, topic: str) -> dict:
        return self._call("GET", "retained", {"tenant": tenant, "topic": topic})

    def rules(self, tenant: str) -> dict:
        """A tenant's rules as the nodes run them, counters summed over the cluster:
        ``{"tenant", "items": [{"id", "enabled", "loaded", "matched", "passed", "no_result",
        "failed", "last_error", "last_error_at", "nodes": {node: {...}}}]}``."""
        return self._call("GET", f"tenants/{self._seg(tenant)}/rules")

    # ----------------------------------------------------------- writes

    def kick(self, tenant: str, client_id: str, clear_session: bool = False) -> dict:
        q = "?clear_session=1" if clear_session else ""
        return self._call("DELETE", f"clients/{self._seg(tenant)}/{self._seg(client_id)}{q}")

    def subscribe(self, tenant: str, client_id: str, topic_filter: str, qos: int = 0) -> dict:
        return self._call("POST", f"clients/{self._seg(tenant)}/{self._seg(client_id)}/subscriptions",
                          body={"filter": topic_filter, "qos": qos})

    def unsubscribe(self, tenant: str, client_id: str, topic_filter: str) -> dict:
        return self._call("DELETE", f"clients/{self._seg(tenant)}/{self._seg(client_id)}/subscriptions",
                          {"filter": topic_filter})

    def publish(self, tenant: str, topic: str, payload: str, qos: int = 0, retain: bool = False) -> dict:
        return self._call("POST", "publish", body={"tenant": tenant, "topic": topic, "payload": payload,
                                                   "qos": qos, "retain": retain})

    def delete_retained(self, tenant: str, topic: str) -> dict:
        return self._call("DELETE", "retained", {"tenant": tenant, "topic": topic})


def client_for(user) -> BrokerdClient:
    """A client acting for the console user ``user`` (named in brokerd's audit rows)."""
    return BrokerdClient(actor=f"console:{user.get_username()}" if user is not None else None)
