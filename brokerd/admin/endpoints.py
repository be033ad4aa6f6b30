"""The admin API of a node (``--admin HOST:PORT``): HTTP + JSON, bearer tokens.

Tokens are created in the console (table ``console_apitoken``: only their
SHA-256 is stored, with a scope -- ``read`` or ``write`` -- and a revoked
flag; the node re-reads them with the tenants' policies, so a revocation
takes effect within a second), or given to the node as ``BROKERD_ADMIN_TOKEN``
(a write token, for scripts and a console without database access).
GET needs ``read``; POST and DELETE need ``write``. A missing, unknown or
revoked token gets 401, a read token that tries to write 403 -- decided from
the request's headers, before its body is read (``http.py`` bounds the rest).

``X-On-Behalf-Of`` names the console user a request acts for, and the audit
row names that user (source "console", as the console's own rows). Only the console's own kind of token
may send it: the bootstrap token (``BROKERD_ADMIN_TOKEN``), which the
console shares with the nodes. A token made in the console's token table
(Grafana, scripts) that sends it gets 403: any holder of such a token could
otherwise write any name into the audit log.

Cluster-aware: asked on any node, the API answers for the whole cluster --
lists are gathered from every node (the same request with ``local=1``, the
caller's token passed on), and an action on a client goes to the node that
holds its session. Every change made through the API is written to the
audit log (``console_auditevent``) with the token's name.
"""

import asyncio
import hashlib
import hmac
import json
import logging
import os
import time
import urllib.parse
from dataclasses import dataclass
from urllib.parse import unquote, urlencode

import h11

from .. import metrics
from ..store import StoreError
from . import api
from .api import ApiError
from .http import HttpLimits, HttpState, Request, json_response, request, server_factory
from .openapi import OPENAPI

log = logging.getLogger("brokerd.admin")


def _client_order(c: dict) -> tuple:
    return c["tenant"], c["client_id"]


@dataclass(slots=True)
class Token:
    id: int | None
    name: str
    scope: str              # "read" | "write"
    revoked: bool = False
    delegates: bool = False     # may name the console user it acts for (X-On-Behalf-Of)


def _env_secret(name: str) -> str | None:
    """``$NAME``, else the contents of the file ``$NAME_FILE`` (a Docker/Kubernetes secret)."""
    value = os.environ.get(name)
    if not value and os.environ.get(name + "_FILE"):
        with open(os.environ[name + "_FILE"]) as fh:
            value = fh.read().strip()
    return value or None


def _digest(secret: str) -> str:
    return "sha256$" + hashlib.sha256(secret.encode()).hexdigest()


class AdminTokens:
    """Token hashes -> tokens; refreshed from the console's database.

    The console's own token is ``BROKERD_ADMIN_TOKEN``; while it is being
    rotated, ``BROKERD_ADMIN_TOKEN_PREVIOUS`` is accepted as the console's
    too, so a console that has not switched yet keeps acting for its users."""

    def __init__(self):
        self.by_hash: dict[str, Token] = {}
        self.console = [_digest(s) for s in (_env_secret("BROKERD_ADMIN_TOKEN"),
                                             _env_secret("BROKERD_ADMIN_TOKEN_PREVIOUS")) if s]

    def replace(self, rows) -> None:
        """Rows of (id, name, token_hash, scope, revoked)."""
        self.by_hash = {h: Token(i, n, s, bool(r)) for i, n, h, s, r in rows}

    def check(self, secret: str) -> Token | None:
        digest = _digest(secret)
        for i, known in enumerate(self.console):
            if hmac.compare_digest(digest, known):
                return Token(None, "bootstrap" if i == 0 else "bootstrap-previous", "write", delegates=True)
        token = self.by_hash.get(digest)
        return token if token is not None and not token.revoked else None


TOTAL_KEYS = ("connections", "connections_max", "connects", "disconnects", "messages_in", "messages_out", "bytes_in",
              "bytes_out", "dropped", "auth_failures", "subscriptions", "queued", "inflight", "rule_actions_dropped")


def cluster_metrics(nodes: list[dict]) -> dict:
    """The cluster's and each tenant's totals over the nodes that answered
    (retained messages are copied to every node: the largest count, not the sum)."""
    cluster: dict = {}
    tenants: dict[str, dict] = {}
    for n in nodes:
        if n.get("health") == "unreachable":
            continue
        metrics.add_totals(cluster, {k: n[k] for k in TOTAL_KEYS if k in n})     # (a node of an older version)
        cluster["retained"] = max(cluster.get("retained", 0), n["retained"])
        for slug, t in n["tenants"].items():
            into = tenants.setdefault(slug, {})
            metrics.add_totals(into, {k: t[k] for k in TOTAL_KEYS if k in t})
            into["retained"] = max(into.get("retained", 0), t["retained"])
    return {"nodes": nodes, "cluster": cluster, "tenants": tenants}


PUBLIC = ("/healthz", "/openapi.json")


def rule_totals(items: list[dict]) -> list[dict]:
    """Per-node rule counters -> one row per rule, counters summed over the nodes
    (each node runs the rules on the messages it received), with the newest
    error, and each node's own figures under ``nodes``."""
    rows: dict = {}
    for item in items:
        node = item.pop("node", None)
        row = rows.get(item["id"])
        if row is None:
            row = rows[item["id"]] = dict(item, nodes={})
        else:
            for key in ("matched", "passed", "no_result", "failed", "sent", "retried", "dropped", "stored"):
                if key in item:
                    row[key] = row.get(key, 0) + item[key]
            if (item["last_error_at"] or 0) > (row["last_error_at"] or 0):
                row["last_error"], row["last_error_at"] = item["last_error"], item["last_error_at"]
            row["loaded"] = row["loaded"] and item["loaded"]
        row["nodes"][node] = {k: item[k] for k in ("matched", "passed", "no_result", "failed", "sent", "retried", "dropped",
                                                   "stored", "loaded") if k in item}
    return [rows[k] for k in sorted(rows)]


class AdminApi:
    """``shared``: a worker of a host (--workers N). The host's admin port is
    shared by its workers (SO_REUSEPORT: any worker answers, for the whole
    cluster); each worker also listens on a port of its own on the same
    address, which it advertises to the cluster for the fan-out (``address``)."""

    def __init__(self, server, host: str, port: int, tokens: AdminTokens, audit=None,
                 limits: HttpLimits | None = None, shared: bool = False):
        self.server = server
        self.broker = server.broker
        self.loop = server.loop
        self.host, self.port = host, port
        self.tokens = tokens
        self.audit = audit
        self.http = HttpState(limits or HttpLimits())
        self.address = ""
        self.public_address = ""      # the port users reach (the shared one of a worker)
        self.shared = shared
        self._servers: list = []
        self._srv = None
        self._registry = None

    async def start(self) -> None:
        factory = server_factory(self.http, self.admit, self.handle)
        # bound (its address goes into the node's info), served once the node is whole (``start_serving``)
        self._srv = await self.loop.create_server(factory, self.host, self.port, backlog=1024,
                                                  reuse_port=self.shared or None, start_serving=False)
        self._servers.append(self._srv)
        self.address = self.public_address = f"{self.host}:{self._srv.sockets[0].getsockname()[1]}"
        if self.shared:         # this worker's own, for the cluster's fan-out
            own = await self.loop.create_server(factory, self.host, 0, backlog=1024, start_serving=False)
            self._servers.append(own)
            self.address = f"{self.host}:{own.sockets[0].getsockname()[1]}"

    async def start_serving(self) -> None:
        for srv in self._servers:
            await srv.start_serving()

    def sockets(self) -> list:
        """The listening sockets (a worker's shared port and its own)."""
        return [sock for srv in self._servers for sock in srv.sockets]

    async def stop(self) -> None:
        for srv in self._servers:
            srv.close()

    @property
    def node(self) -> str:
        return self.server.config.node_id

    # ------------------------------------------------------------- dispatch

    def admit(self, req: Request) -> tuple | None:
        """Before the body is read: the token, its scope and whom it may act for;
        -> the refusal to send, or None (``req.token`` set)."""
        if (req.path.rstrip("/") or "/") in PUBLIC:
            req.max_body = 0
            return None
        token = self._authenticate(req)
        if token is None:
            return json_response(401, {"error": "a valid bearer token is required"},
                                 [("www-authenticate", 'Bearer realm="brokerd"')])
        if req.headers.get("x-on-behalf-of") and not token.delegates:
            return json_response(403, {"error": f"token {token.name!r} may not act on behalf of a console user: "
                                                "X-On-Behalf-Of is accepted only with the console's own token "
                                                "(BROKERD_ADMIN_TOKEN)"})
        if req.method not in ("GET", "HEAD") and token.scope != "write":
            return json_response(403, {"error": f"token {token.name!r} is read-only"})
        req.token = token
        return None

    async def handle(self, req: Request) -> tuple:
        path = req.path.rstrip("/") or "/"
        # no token, so no keep-alive: nothing unauthenticated holds one of the admin connections
        close = [("connection", "close")]
        if path == "/healthz":
            cluster = self.server.cluster
            if cluster is not None and cluster.fenced:      # container health checks: send traffic elsewhere
                return json_response(503, {"status": "fenced", "node": self.node}, close)
            return json_response(200, {"status": "ok", "node": self.node}, close)
        if path == "/openapi.json":
            return json_response(200, OPENAPI, close)
        token = req.token
        if token is None:                 # admit() lets no such request through
            return json_response(401, {"error": "a valid bearer token is required"})
        if path == "/metrics":
            from ..metrics import prometheus  # here: prometheus_client is 5 MB of a node's memory

            if self._registry is None:
                self._registry = prometheus.registry_for(self.server)
            return 200, [("content-type", prometheus.CONTENT_TYPE_LATEST)], prometheus.exposition(self._registry)
        try:
            return await self._route(req, path, token)
        except ApiError as exc:
            return json_response(exc.status, {"error": exc.message})
        except (ValueError, KeyError, TypeError) as exc:
            return json_response(400, {"error": f"bad request: {exc}"})

    def _authenticate(self, req: Request) -> Token | None:
        auth = req.headers.get("authorization", "")
        scheme, _, secret = auth.partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            return None
        return self.tokens.check(secret.strip())

    async def _route(self, req: Request, path: str, token: Token) -> tuple:
        now = self.loop.time()
        b = self.broker
        parts = [unquote(p) for p in path.split("/")[1:]]
        if parts[:2] != ["api", "v1"]:
            raise ApiError(404, "no such endpoint")
        parts = parts[2:]
        local = req.query.get("local") == "1"
        m = req.method
        if parts == ["nodes"] and m == "GET":
            nodes = [self.node_info()]
            if not local:
                nodes += await self._gather(req, "nodes")
            return json_response(200, {"items": sorted(nodes, key=lambda n: n["id"])})
        if parts == ["metrics"] and m == "GET":
            nodes = [metrics.node_figures(self.server)]
            if not local:
                nodes += await self._gather(req, "metrics")
            nodes.sort(key=lambda n: n["node"])
            return json_response(200, {"at": time.time(), "items": nodes, **cluster_metrics(nodes)})
        if parts == ["clients"] and m == "GET":
            page, per_page = api.page_of(req.query)
            if local and "top" in req.query:
                first = api.top_of(req.query)
            else:
                first = page * per_page
            if req.query.get("node") and req.query["node"] != self.node:
                items, total = [], 0
            else:
                items, total = api.list_clients(b, self.node, req.query, now, first)
            if local and "top" in req.query:
                return json_response(200, {"items": items, "total": total})
            if not local:
                # each other node's first page * per_page (the page is among them) and its count
                for part in await self._gather(req, "clients", {"top": str(first)}, whole=True):
                    items += part["items"]
                    total += part["total"]
                items.sort(key=_client_order)
            return json_response(200, api.paginate(items, req.query, total))
        if len(parts) >= 3 and parts[0] == "clients":
            tenant, cid = parts[1], parts[2]
            rest = parts[3:]
            if not self._here(tenant, cid) and not local:
                return await self._at_owner(req, tenant, cid)
            if rest == [] and m == "GET":
                detail = api.session_detail(b, self.node, tenant, cid, now)
                if detail is None:
                    raise ApiError(404, "no such client")
                return json_response(200, detail)
            if rest == [] and m == "DELETE":
                clear = api.switch(req.query, "clear_session")
                before = api.session_detail(b, self.node, tenant, cid, now)
                if not api.kick(b, tenant, cid, clear, now):
                    raise ApiError(404, "no such client")
                await self._audit(token, req, "client.kick" + (".clear_session" if clear else ""), "client",
                                  cid, tenant, before, None)
                return json_response(200, {"kicked": True, "session_cleared": clear})
            if rest == ["subscriptions"] and m == "POST":
                body = req.json()
                result = api.add_subscription(b, tenant, cid, body, now)
                await self._audit(token, req, "subscription.add", "subscription", f"{cid} {body.get('filter')}",
                                  tenant, None, result)
                return json_response(201, result)
            if rest == ["subscriptions"] and m == "DELETE":
                filt = req.query.get("filter")
                if not filt:
                    raise ApiError(400, "'filter' query parameter required")
                if not api.remove_subscription(b, tenant, cid, filt, now):
                    raise ApiError(404, "no such subscription")
                await self._audit(token, req, "subscription.remove", "subscription", f"{cid} {filt}", tenant,
                                  {"filter": filt}, None)
                return json_response(200, {"removed": filt})
            raise ApiError(405 if rest in ([], ["subscriptions"]) else 404, "not allowed here")
        if parts == ["publish"] and m == "POST":
            body = req.json()
            result = api.publish(b, body, now, self.tenant_exists)
            await self._audit(token, req, "message.publish", "topic", body.get("topic"), body.get("tenant"), None,
                              {k: body.get(k) for k in ("topic", "qos", "retain")})
            return json_response(200, result)
        if len(parts) == 3 and parts[0] == "tenants" and parts[2] == "rules":
            if m != "GET":
                raise ApiError(405, "not allowed here")
            tenant = parts[1]
            items = [dict(r, node=self.node) for r in self.server.rule_engine.view(tenant)]
            if local:
                return json_response(200, {"tenant": tenant, "items": items})
            items += await self._gather(req, f"tenants/{urllib.parse.quote(tenant, safe='')}/rules")
            return json_response(200, {"tenant": tenant, "items": rule_totals(items)})
        if len(parts) == 3 and parts[0] == "tenants" and parts[2] == "delayed":
            if m != "GET":
                raise ApiError(405, "not allowed here")
            return json_response(200, await self._delayed(req, parts[1], local))
        if parts == ["retained"]:
            tenant = req.query.get("tenant")
            if not tenant:
                raise ApiError(400, "'tenant' query parameter required")
            topic = req.query.get("topic")
            if m == "GET" and topic is None:
                sys_too = api.switch(req.query, "sys")
                return json_response(200, api.retained_page(b, tenant, req.query.get("prefix", ""), sys_too,
                                                             req.query))
            if m == "GET":
                msg = b.router.retained_message(tenant, topic)
                if msg is None:
                    raise ApiError(404, "no retained message on that topic")
                return json_response(200, api.retained_view(tenant, topic, msg, b.wall_offset))
            if m == "DELETE":
                if not topic:
                    raise ApiError(400, "'topic' query parameter required")
                if topic.startswith("$"):
                    raise ApiError(400, api.DOLLAR_TOPIC)
                msg = b.router.retained_message(tenant, topic)
                before = api.retained_view(tenant, topic, msg, b.wall_offset) if msg is not None else None
                if not api.retained_delete(b, tenant, topic, now):
                    raise ApiError(404, "no retained message on that topic")
                await self._audit(token, req, "retained.delete", "retained", topic, tenant, before, None)
                return json_response(200, {"deleted": topic})
        raise ApiError(404, "no such endpoint")

    async def _delayed(self, req: Request, tenant: str, local: bool) -> dict:
        """A tenant's pending delayed messages (``$delayed/...``) and its cap. In a shared
        store the store's count is the cluster's; in a node's own memory store each
        node counts its own, summed here."""
        queue = self.broker.delayed
        if queue is None:
            return {"tenant": tenant, "enabled": False, "pending": 0, "limit": None, "items": []}
        policy = self.broker.auth.policy(tenant)
        limit = queue.limit(policy.quota if policy is not None else None)
        runner = self.server.delayed
        try:
            pending = (await runner.store.delayed_counts()).get(tenant, 0) + sum(
                1 for t, *_ in queue.pending if t == tenant)
        except StoreError as exc:
            raise ApiError(503, f"session store unavailable: {exc}")
        items = [{"node": self.node, "pending": pending}]
        if self.server.store is None and not local:
            items += await self._gather(req, f"tenants/{urllib.parse.quote(tenant, safe='')}/delayed")
            pending = sum(n.get("pending", 0) for n in items)
        return {"tenant": tenant, "enabled": True, "pending": pending, "limit": limit, "items": items}

    # --------------------------------------------------------------- nodes

    def node_info(self) -> dict:
        b = self.broker
        t = b.totals()
        cluster = self.server.cluster
        return {
            "id": self.node, **self.server.identity(), "pid": os.getpid(),
            "health": "fenced" if cluster is not None and cluster.fenced else "ok",
            "uptime": round(self.loop.time() - b.started_at, 1),
            "listeners": [lst.url for lst in self.server.bound], "mqtt": self.server.mqtt_urls(),
            "admin": self.server.advertised(self.address),
            "connected": b.connected, "sessions": b.session_count(), "subscriptions": b.subscription_count(),
            "retained": b.retained_count(), "messages_received": t["msgs_received"],
            "messages_sent": t["msgs_sent"], "bytes_received": t["bytes_received"], "bytes_sent": t["bytes_sent"],
        }

    def tenant_exists(self, tenant: str) -> bool:
        """With a control plane: the tenants of its policies (and the anonymous
        tenant when anonymous clients are allowed). Without one no tenant is
        configured anywhere: the anonymous tenant and those this node holds
        sessions or retained messages of (restored from the store)."""
        config = self.server.config
        if self.server.policy_source is not None:
            return tenant in self.broker.auth.policies or (config.allow_anonymous and
                                                            tenant == config.anonymous_tenant)
        return tenant == config.anonymous_tenant or self.broker.router.has_tenant(tenant)

    def _here(self, tenant: str, cid: str) -> bool:
        return self.broker.router.session(tenant, cid) is not None

    def _peers(self) -> dict[str, str]:
        cluster = self.server.cluster
        if cluster is None:
            return {}
        return {n: info["admin"] for n, info in cluster.members.items() if info.get("admin")}

    async def _ask(self, address: str, req: Request, path: str, query: dict) -> tuple[int, bytes]:
        host, _, port = address.rpartition(":")
        target = path + ("?" + urlencode({**query, "local": "1"}))
        headers = {"authorization": req.headers.get("authorization", ""), "content-type": "application/json"}
        if req.headers.get("x-on-behalf-of"):       # the owner of a session audits what it does to it
            headers["x-on-behalf-of"] = req.headers["x-on-behalf-of"].encode("latin-1")   # as it came
        return await request(host, int(port), req.method, target, headers, req.body)

    async def _gather(self, req: Request, what: str, query: dict | None = None, whole: bool = False) -> list:
        """The same list from every other node (``whole``: their answers, each a dict; ``query``:
        what the request's page and per_page are replaced with)."""
        peers = self._peers()
        if not peers:
            return []

        members = dict(self.server.cluster.members)

        async def one(node, address):
            info = members.get(node) or {}
            try:
                status, body = await self._ask(address, req, f"/api/v1/{what}", {
                    k: v for k, v in req.query.items() if k not in ("page", "per_page", "top")} | (query or {}))
                if status != 200:
                    raise ConnectionError(f"status {status}")
                answer = json.loads(body)
                return [answer] if whole else answer["items"]
            except Exception as exc:
                log.warning("node %s did not answer the admin API: %s", node, exc)
                # a worker that does not answer is still listed under its host (its membership info as it was
                # when asked: it may have left since)
                who = {"host": info.get("host") or node, "worker": info.get("worker")}
                if what == "metrics":
                    return [{"node": node, "health": "unreachable", **who}]
                return [{"id": node, "health": "unreachable", **who}] if what == "nodes" else []

        results = await asyncio.gather(*(one(n, a) for n, a in peers.items()))
        return [x for r in results for x in r]

    async def _at_owner(self, req: Request, tenant: str, cid: str) -> tuple:
        """A client action for a session that lives on another node: ask it there."""
        cluster = self.server.cluster
        if cluster is None:
            raise ApiError(404, "no such client")
        owner = await cluster.bus.owner(tenant, cid)
        address = self._peers().get(owner) if owner else None
        if address is None:
            raise ApiError(404, "no such client")
        try:
            status, body = await self._ask(address, req, req.path, dict(req.query))
        except (OSError, TimeoutError, ValueError, h11.ProtocolError) as exc:
            raise ApiError(502, f"node {owner}, which holds the session, did not answer: {exc or type(exc).__name__}")
        return status, [("content-type", "application/json")], body

    async def _audit(self, token: Token, req: Request, action, object_type, object_id, tenant, before, after):
        actor, source = f"api-token:{token.name}", "api"
        # the console's user, percent-encoded UTF-8 (any bytes a client sends decode to something): a
        # person's action through the console is theirs, as the console's own rows name it, source console
        on_behalf = urllib.parse.unquote(req.headers.get("x-on-behalf-of") or "", errors="replace")
        if on_behalf and token.delegates:
            actor, source = on_behalf.removeprefix("console:"), "console"
        event = {"at": time.time(), "actor": actor, "source": source, "action": action, "object_type": object_type,
                 "object_id": str(object_id), "tenant": tenant, "before": before, "after": after,
                 "remote_addr": req.peer}
        if self.audit is not None:
            await self.audit.record(event)
        else:
            log.info("audit %s", json.dumps(event, default=str))
