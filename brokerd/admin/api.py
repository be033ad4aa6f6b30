"""What the admin API reads and does on one node (pure: broker state in, data out).

Everything returned is plain JSON-able data. The HTTP layer (``server.py``)
authenticates, parses, asks every node of the cluster and merges.

Every value a request brings is checked against what MQTT allows for it
before anything is done (400 with what was wrong): a value the codec or the
store cannot take would otherwise fail after the message was delivered or
retained on this node, or poison the store's write batch (a Message Expiry
Interval is a four-byte integer, MQTT 5 3.3.2.3.3). Fields the endpoint does
not know are refused too: a misspelt ``mesage_expiry`` must not be ignored.
"""

import base64
import heapq

from ..protocol import codec
from ..protocol import properties as P
from ..protocol import reason as rc
from ..protocol.packets import Publish, SubscriptionRequest
from ..routing.topic import is_valid_name

MAX_PAGE = 1000
U32 = 0xFFFFFFFF
DOLLAR_TOPIC = "topics starting with '$' are the broker's own ($SYS): the API does not publish or clear them"
PUBLISH_FIELDS = frozenset({"tenant", "topic", "payload", "payload_encoding", "qos", "retain", "content_type",
                            "message_expiry", "user_properties"})
SUBSCRIPTION_FIELDS = frozenset({"filter", "qos", "no_local", "retain_as_published", "retain_handling"})


class ApiError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def mqtt_text(value) -> bool:
    """A name from the API obeys what the codec enforces on one from a packet:
    a string, well-formed UTF-8 (no lone surrogates), no U+0000, at most
    65535 bytes -- else subscribers would get what MQTT forbids and the
    audit log on PostgreSQL (text without NUL) could not record the change."""
    if not isinstance(value, str) or "\x00" in value:
        return False
    try:
        return len(value.encode("utf-8")) <= 65535
    except UnicodeEncodeError:
        return False


def _fields(body: dict, known: frozenset) -> None:
    unknown = sorted(set(body) - known)
    if unknown:
        raise ApiError(400, f"unknown field(s) {', '.join(map(repr, unknown))}; this endpoint takes "
                            f"{', '.join(sorted(known))}")


def _int(body: dict, key: str, lo: int, hi: int, default):
    """An integer field in ``lo..hi`` (JSON true/false and 1.0 are not integers)."""
    value = body.get(key, default)
    if value is default:
        return value
    if type(value) is not int or not lo <= value <= hi:
        raise ApiError(400, f"{key!r} must be an integer from {lo} to {hi}, not {value!r}"[:300])
    return value


def _bool(body: dict, key: str) -> bool:
    value = body.get(key, False)
    if type(value) is not bool:
        raise ApiError(400, f"{key!r} must be true or false, not {value!r}"[:300])
    return value


def switch(q: dict, name: str, default=False):
    """A yes/no query parameter: 1/true/yes or 0/false/no (any case); absent or empty: ``default``.
    Anything else is 400 -- ``clear_session=on`` must not kick a client and keep the session
    the administrator asked to end."""
    value = q.get(name)
    if value is None or value == "":
        return default
    if value.lower() in ("1", "true", "yes"):
        return True
    if value.lower() in ("0", "false", "no"):
        return False
    raise ApiError(400, f"{name!r} must be true or false (1/0, yes/no), not {value!r}"[:300])


def _peer_ip(peer: str) -> str:
    return peer.rsplit(":", 1)[0] if peer else ""


def client_summary(node: str, ch, now: float, wall_offset: float) -> dict:
    s = ch.session
    ident = ch.identity
    return {
        "node": node,
        "tenant": ch.tenant,
        "client_id": ch.client_id,
        "username": ch.username,
        "device": ident.device if ident is not None else None,
        "ip": _peer_ip(ch.peer),
        "peer": ch.peer,
        "listener": ch.listener,
        "protocol": {3: "3.1", 4: "3.1.1", 5: "5.0"}.get(ch.version, str(ch.version)),
        "connected": True,
        "connected_at": None if ch.connected_at is None else round(ch.connected_at + wall_offset, 3),
        "keepalive": ch.keepalive,
        "clean_start": s is not None and s.expiry_interval == 0,
        "session_expiry": s.expiry_interval if s is not None else 0,
        "subscriptions": len(s.subscriptions) if s is not None else 0,
        "queued": len(s.queue) if s is not None else 0,
        "inflight": len(s.inflight) if s is not None else 0,
        "messages_in": ch.msgs_in,
        "messages_out": ch.msgs_out,
        "bytes_in": ch.bytes_in,
        "bytes_out": ch.bytes_out,
        "paced": ch.paced,
    }


def offline_summary(node: str, tenant: str, s, wall_offset: float) -> dict:
    return {
        "node": node, "tenant": tenant, "client_id": s.client_id, "username": None, "device": s.device,
        "ip": None, "peer": None, "listener": None, "protocol": None, "connected": False, "connected_at": None,
        "keepalive": None, "clean_start": False, "session_expiry": s.expiry_interval,
        "expires_at": None if s.expires_at is None else round(s.expires_at + wall_offset, 3),
        "subscriptions": len(s.subscriptions), "queued": len(s.queue), "inflight": len(s.inflight),
        "messages_in": 0, "messages_out": 0, "bytes_in": 0, "bytes_out": 0, "paced": 0,
    }


def list_clients(broker, node: str, q: dict, now: float, first: int) -> tuple[list[dict], int]:
    """Clients of this node matching the query (connected, and offline persistent sessions) -> the
    ``first`` of them by (tenant, client id), described, and how many match. Only those are
    described: a page of 50 of a node's 100,000 clients made 100,000 dicts (tens of MB, and the
    event loop's time) on every request before."""
    tenant = q.get("tenant")
    cid = q.get("client_id")
    username = q.get("username")
    ip = q.get("ip")
    want = switch(q, "connected", None)     # None: connected or not
    total = 0

    def matching():
        nonlocal total
        for name, session in broker.router.sessions(tenant or None):
            if cid and cid not in session.client_id:
                continue
            ch = session.channel
            if ch is not None:
                if want is False:
                    continue
                if username and (ch.username or "") != username:
                    continue
                if ip and _peer_ip(ch.peer) != ip:
                    continue
            elif want is True or username or ip:
                continue
            total += 1
            yield name, session.client_id, session

    chosen = heapq.nsmallest(first, matching(), key=_name_and_id)
    out = []
    for name, _, session in chosen:
        ch = session.channel
        out.append(client_summary(node, ch, now, broker.wall_offset) if ch is not None
                   else offline_summary(node, name, session, broker.wall_offset))
    return out, total


def _name_and_id(m) -> tuple:
    return m[0], m[1]


def session_detail(broker, node: str, tenant: str, client_id: str, now: float) -> dict | None:
    session = broker.router.session(tenant, client_id)
    if session is None:
        return None
    ch = session.channel
    data = (client_summary(node, ch, now, broker.wall_offset) if ch is not None
            else offline_summary(node, tenant, session, broker.wall_offset))
    data["subscriptions"] = [
        {"filter": s.filter, "qos": s.qos, "no_local": s.no_local, "retain_as_published": s.rap,
         "retain_handling": s.rh, "subscription_id": s.sub_id, "shared_group": s.group,
         "filtered_by_acl": s.check}
        for s in session.subscriptions.values()
    ]
    data["subscription_count"] = len(session.subscriptions)
    data["persistent"] = session.persistent
    data["stored"] = session.durable
    data["awaiting_pubrel"] = len(session.awaiting_rel)
    return data


def kick(broker, tenant: str, client_id: str, clear_session: bool, now: float) -> bool:
    """Disconnect a client (v5: DISCONNECT 0x98 Administrative action); with
    ``clear_session`` its session ends too."""
    router = broker.router
    session = router.session(tenant, client_id)
    if session is None:
        return False
    if session.channel is not None:
        session.channel.disconnect(rc.ADMINISTRATIVE_ACTION, "disconnected by an administrator", now)
    session = router.session(tenant, client_id)
    if clear_session and session is not None:
        broker.end_session(session, now)
    return True


def add_subscription(broker, tenant: str, client_id: str, body: dict, now: float) -> dict:
    session = broker.router.session(tenant, client_id)
    if session is None:
        raise ApiError(404, "no such client")
    req = subscription_request(body)
    filt = req.filter
    code = broker.admin_subscribe(session, req, now)
    if code >= 0x80:
        raise ApiError(400, f"subscription refused: {rc.NAMES.get(code, hex(code))}")
    return {"filter": filt, "qos": code}


def subscription_request(body: dict) -> SubscriptionRequest:
    """A SUBSCRIBE's options from a request body, checked as the codec checks them (MQTT 5 3.8.3.1)."""
    _fields(body, SUBSCRIPTION_FIELDS)
    filt = body.get("filter")
    if not mqtt_text(filt) or not filt:
        raise ApiError(400, "body needs 'filter' (a topic filter: a non-empty MQTT string)")
    return SubscriptionRequest(filt, _int(body, "qos", 0, 2, 0), _bool(body, "no_local"),
                               _bool(body, "retain_as_published"), _int(body, "retain_handling", 0, 2, 0))


def remove_subscription(broker, tenant: str, client_id: str, filt: str, now: float) -> bool:
    session = broker.router.session(tenant, client_id)
    if session is None:
        raise ApiError(404, "no such client")
    return broker.admin_unsubscribe(session, filt, now)


def publish(broker, body: dict, now: float, tenant_exists=lambda tenant: True) -> dict:
    """Publish as the broker; nothing is done unless every field is valid,
    the tenant exists and the message fits the node's maximum packet size."""
    msg, tenant = publish_message(body, broker.limits.max_packet_size)
    if not tenant_exists(tenant):
        raise ApiError(404, f"no tenant {tenant!r}")
    if P.MESSAGE_EXPIRY_INTERVAL in (msg.properties or ()):
        msg.expiry_at = now + msg.properties[P.MESSAGE_EXPIRY_INTERVAL]
    deliveries = broker.publish_internal(broker.namespace(tenant), msg, now)
    return {"tenant": tenant, "topic": msg.topic, "deliveries": deliveries}


def publish_message(body: dict, max_packet_size: int) -> tuple[Publish, str]:
    """A publish request's body -> (the message, its tenant), or ApiError(400)."""
    _fields(body, PUBLISH_FIELDS)
    tenant = body.get("tenant")
    topic = body.get("topic")
    if not mqtt_text(tenant) or not tenant or not mqtt_text(topic) or not is_valid_name(topic):
        raise ApiError(400, "body needs 'tenant' and a valid 'topic' name (no wildcards)")
    if topic.startswith("$"):
        raise ApiError(400, DOLLAR_TOPIC)
    qos = _int(body, "qos", 0, 2, 0)
    retain = _bool(body, "retain")
    payload, props = _payload(body), _properties(body) or None
    size = len(codec.encode(Publish(topic, payload, qos, retain, False, 1 if qos else 0, props), codec.MQTT5))
    if size > max_packet_size:
        raise ApiError(400, f"the message would be a {size}-byte PUBLISH packet; this node's maximum packet "
                            f"size is {max_packet_size} bytes")
    return Publish(topic, payload, qos, retain, False, 0, props), tenant


def _payload(body: dict) -> bytes:
    payload = body.get("payload", "")
    encoding = body.get("payload_encoding", "utf8")
    if not isinstance(payload, str):
        raise ApiError(400, "'payload' must be a string (text, or base64 with \"payload_encoding\": \"base64\")")
    if encoding == "utf8":
        try:
            return payload.encode("utf-8")
        except UnicodeEncodeError:
            raise ApiError(400, "'payload' is not valid UTF-8 text (a lone surrogate)")
    if encoding == "base64":
        try:
            return base64.b64decode(payload, validate=True)
        except ValueError:
            raise ApiError(400, "'payload' is not valid base64")
    raise ApiError(400, "'payload_encoding' must be \"utf8\" or \"base64\"")


def _properties(body: dict) -> dict:
    props: dict = {}
    content_type = body.get("content_type")
    if content_type is not None:
        if not mqtt_text(content_type):
            raise ApiError(400, "'content_type' must be an MQTT string")
        if content_type:
            props[P.CONTENT_TYPE] = content_type
    expiry = _int(body, "message_expiry", 0, U32, None)
    if expiry is not None:
        props[P.MESSAGE_EXPIRY_INTERVAL] = expiry
    user = body.get("user_properties")
    if user is not None:
        if not isinstance(user, dict) or not all(mqtt_text(k) and isinstance(v, str) and mqtt_text(v)
                                                 for k, v in user.items()):
            raise ApiError(400, "'user_properties' must be an object of MQTT strings (names and values)")
        if user:
            props[P.USER_PROPERTY] = list(user.items())
    return props


def retained_page(broker, tenant: str, prefix: str, sys: bool, q: dict) -> dict:
    """The query's page of the tenant's retained messages under ``prefix``, by topic; the broker's
    own ``$SYS/...`` (rewritten every interval, in every tenant) only with ``sys``. Only the
    topics up to the page are kept, and only the page's are described: a tenant with millions of
    retained messages costs a walk over them, not a list of them (before, every one was made a
    dict of its own, hundreds of bytes each, for a page of 50)."""
    page, per_page = page_of(q)
    total = 0

    def topics():
        nonlocal total
        for topic, msg in broker.router.retained_items(tenant):
            if prefix and not topic.startswith(prefix):
                continue
            if not sys and topic.startswith("$SYS/"):
                continue
            total += 1
            yield topic, msg

    first = heapq.nsmallest(page * per_page, topics(), key=_topic_of)
    items = [retained_view(tenant, topic, msg, broker.wall_offset, with_payload=False)
             for topic, msg in first[(page - 1) * per_page:]]
    return {"items": items, "page": page, "per_page": per_page, "total": total,
            "pages": (total + per_page - 1) // per_page}


def _topic_of(item) -> str:
    return item[0]


def retained_view(tenant: str, topic: str, msg, wall_offset: float, with_payload: bool = True) -> dict:
    data = {"tenant": tenant, "topic": topic, "qos": msg.qos, "size": len(msg.payload),
            "expires_at": None if msg.expiry_at is None else round(msg.expiry_at + wall_offset, 3)}
    if with_payload:
        try:
            data["payload"] = msg.payload.decode("utf-8")
            data["payload_encoding"] = "utf8"
        except UnicodeDecodeError:
            data["payload"] = base64.b64encode(msg.payload).decode()
            data["payload_encoding"] = "base64"
        if msg.properties and P.CONTENT_TYPE in msg.properties:
            data["content_type"] = msg.properties[P.CONTENT_TYPE]
    return data


def retained_delete(broker, tenant: str, topic: str, now: float) -> bool:
    if broker.router.retained_message(tenant, topic) is None:
        return False
    broker.clear_retained(broker.namespace(tenant), topic)     # no empty message to current subscribers
    return True


def page_of(q: dict) -> tuple[int, int]:
    """(page, per_page) of a query."""
    try:
        return max(1, int(q.get("page", 1))), min(MAX_PAGE, max(1, int(q.get("per_page", 50))))
    except ValueError:
        raise ApiError(400, "'page' and 'per_page' must be integers")


def paginate(items: list, q: dict, total: int | None = None) -> dict:
    """The query's page of ``items`` (sorted); ``total``: how many there are in all, when
    ``items`` holds only the first of them (a cluster's, gathered with ``head``)."""
    page, per_page = page_of(q)
    total = len(items) if total is None else total
    start = (page - 1) * per_page
    return {"items": items[start:start + per_page], "page": page, "per_page": per_page, "total": total,
            "pages": (total + per_page - 1) // per_page}


def top_of(q: dict) -> int:
    """The ``top`` of a query (one node's part of a page another node gathers)."""
    try:
        return max(0, int(q["top"]))
    except ValueError:
        raise ApiError(400, "'top' must be an integer")
