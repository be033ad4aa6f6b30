"""The console's client of the brokerd admin API (the only way it acts on the live cluster).

Synchronous (Django views), standard library only. Every call names the
console user it acts for (``X-On-Behalf-Of``), so brokerd's audit rows say who
did it. Settings: ``BROKERD_ADMIN_URL`` (any node: it answers for the whole
cluster) and ``BROKERD_ADMIN_TOKEN`` (a write-scoped token).
"""

import json
import urllib.error
import urllib.parse
import urllib.request

from django.conf import settings


class BrokerdError(Exception):
    """The API answered with an error (``status`` is its HTTP status)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


class BrokerdUnavailable(BrokerdError):
    """No node answered: the cluster (or the address in BROKERD_ADMIN_URL) is down."""

    def __init__(self, message: str):
        super().__init__(503, message)


class BrokerdClient:
    def __init__(self, base_url: str | None = None, token: str | None = None, actor: str | None = None,
                 timeout: float = 5.0):
        self.base_url = (base_url or settings.BROKERD_ADMIN_URL).rstrip("/")
        self.token = token if token is not None else settings.BROKERD_ADMIN_TOKEN
        self.actor = actor
        self.timeout = timeout

    def _call(self, method: str, path: str, query: dict | None = None, body: dict | None = None):
        query = {k: v for k, v in (query or {}).items() if v not in (None, "")}
        url = self.base_url + "/api/v1/" + path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.actor:
            # user names may be any letters (Django's \w): UTF-8, percent-encoded, in a header
            req.add_header("X-On-Behalf-Of", urllib.parse.quote(self.actor, safe=":@+-_. "))
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            try:
                message = json.loads(exc.read()).get("error") or exc.reason
            except (ValueError, AttributeError):
                message = str(exc.reason)
            raise BrokerdError(exc.code, message) from None
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            reason = getattr(exc, "reason", exc)
            raise BrokerdUnavailable(f"brokerd admin API at {self.base_url} unreachable: {reason}") from None

    @staticmethod
    def _seg(value: str) -> str:
        return urllib.parse.quote(value, safe="")

    # ------------------------------------------------------------ reads

    def nodes(self) -> list[dict]:
        return self._call("GET", "nodes")["items"]

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

    def retained(self, tenant: str, prefix: str = "", page: int = 1, per_page: int = 50) -> dict:
        return self._call("GET", "retained", {"tenant": tenant, "prefix": prefix, "page": page,
                                              "per_page": per_page})

    def retained_message(self, tenant: str, topic: str) -> dict:
        return self._call("GET", "retained", {"tenant": tenant, "topic": topic})

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
