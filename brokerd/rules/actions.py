"""What a rule does with its output row.

``republish`` -- config ``{"topic": TEMPLATE, "qos": 0..2 or "${qos}", "retain": bool or
"${flags.retain}", "payload": TEMPLATE or null, "user_properties": {NAME: TEMPLATE}}`` (``${qos}`` and
``${flags.retain}``, EMQX's: the QoS and retain flag of the message that triggered the rule; for an
event, its ``qos`` field if it has one, else 0, and never retained). The
message is published inside the tenant's own namespace (a rule never sees
another tenant's topics, and its output never leaves its tenant), as the
client whose message or event triggered the rule: the topic must be one that
client's ACL lets it publish to (the tenant's ACL rules for that device), it
may not start with ``$``, and it may not hold wildcards. A refused topic
counts as a failure of the rule (``last_error`` says why); nothing is
published. The payload is the output row as JSON unless a payload template
is given. Republished messages do not run rules again (no loops).

``webhook`` -- config ``{"url": TEMPLATE, "method": "POST", "headers":
{NAME: TEMPLATE}, "body": TEMPLATE or null, "timeout": SECONDS, "retries":
N}``. ``Webhook.message`` renders the request (a ``WebhookRequest``: method,
URL, headers, body -- the output row as JSON unless a body template is
given); sending it is the I/O layer's business (``brokerd.integrations.webhook``:
a bounded buffer, the destination allowance, timeouts, retries). The URL's
scheme (http or https) and host are literal -- a template may fill in the
path and the query, never the destination.

``store`` -- config ``{"dataset": NAME}``: the output row is appended to the
tenant's telemetry dataset NAME (a short identifier: a lower-case letter,
then up to 31 lower-case letters, digits or ``_``). ``Store.message``
renders the record (a ``TelemetryRecord``: dataset, time, client id, topic,
the row as JSON); writing it is the I/O layer's business
(``brokerd.integrations.telemetry``: a bounded buffer, JSON Lines files in
the usage log's landing zone, compacted into the Parquet lake with the usage
datasets). The tenant is never the rule's to choose: it is the tenant whose
message or event ran the rule.
"""

import json
import re
from sys import getsizeof

from ..protocol.packets import RulePublish
from ..protocol.properties import USER_PROPERTY
from ..routing.topic import is_valid_name
from .errors import EVENT_PREFIX
from .functions import MAX_TEXT
from .template import Template, TemplateError

KINDS = ("republish", "webhook", "store")
RUNNABLE = KINDS
DATASET = re.compile(r"[a-z][a-z0-9_]{0,31}")
METHODS = ("POST", "PUT", "PATCH", "GET", "DELETE")
MAX_URL = 8192
MAX_TIMEOUT = 60.0
MAX_RETRIES = 10
# set by the sender: a rule may not set them (framing and the destination are the sender's)
RESERVED_HEADERS = ("host", "content-length", "transfer-encoding", "connection", "te", "upgrade", "trailer")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
MAX_TOPIC_BYTES = 65535
# an action's templates are bounded as its statement is (tenants.rules.MAX_SQL): they ride in the
# policy snapshot every node fetches, and a static one is copied into every message
MAX_TEMPLATE = 16_384
MAX_NAMED = 32              # user properties of a republish, headers of a webhook
# made once; NaN and infinities are not JSON (RFC 8259): a row holding one fails the rule, as a subscriber's
# JSON.parse would have failed on {"x":Infinity}
_to_json = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=str, allow_nan=False).encode


class ActionError(ValueError):
    pass


def out_limit(ctx) -> int:
    """The most characters a rule's output (its row as JSON, a rendered template) may hold: as
    the functions' results, 1 MiB more than twice the payload -- a statement naming the payload
    200 times made one 256 KiB message a 50 MiB republish."""
    raw = ctx.raw
    return MAX_TEXT + 2 * (len(raw) if raw is not None else 0)


def _row_json(row: dict, limit: int) -> str:
    """The row as JSON, ActionError when it would be longer than ``limit`` (``out_limit``;
    estimated before the text is built: its strings, names and items)."""
    n = 0
    for k, v in row.items():               # a flat row of texts and numbers: no walk (the common case)
        c = v.__class__
        if c is str:
            n += len(v) + len(k) + 6
        elif c is dict or c is list or c is bytes or c is bytearray:
            break
        else:
            n += len(k) + 30
    else:
        if n <= limit:
            return _to_json(row)
    n = 0
    stack = [row]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            n += len(v) + 2
        elif isinstance(v, dict):
            n += 2 + 4 * len(v) + sum(len(k) if isinstance(k, str) else 24 for k in v)
            stack.extend(v.values())
        elif isinstance(v, list):
            n += 2 + len(v)
            stack.extend(v)
        else:
            n += 24 if not isinstance(v, (bytes, bytearray)) else len(v)
        if n > limit:
            raise ActionError(f"the output row is too large (more than {limit} characters as JSON)")
    return _to_json(row)


def _render(t: Template, row: dict, ctx, limit: int) -> str:
    static = t.static
    if static is not None and len(static) <= limit:
        return static
    try:
        return t.render(row, ctx, limit)
    except TemplateError as exc:
        raise ActionError(str(exc)) from None


def _sized(kind: str, texts: list, named: dict, what: str) -> None:
    if len(named) > MAX_NAMED:
        raise ActionError(f"{kind}: at most {MAX_NAMED} {what}")
    for text in texts:
        if len(text) > MAX_TEMPLATE:
            raise ActionError(f"{kind}: a template or name is at most {MAX_TEMPLATE} characters, not {len(text)}")


def validate(kind: str, config: dict) -> dict:
    """A rule's action, checked and normalised; raises ActionError."""
    if kind not in KINDS:
        raise ActionError(f"unknown action {kind!r}: one of {', '.join(KINDS)}")
    if not isinstance(config, dict):
        raise ActionError("an action's configuration is a JSON object")
    if kind == "webhook":
        return validate_webhook(config)
    if kind == "store":
        return validate_store(config)
    unknown = set(config) - {"topic", "qos", "retain", "payload", "user_properties"}
    if unknown:
        raise ActionError(f"republish: unknown settings {', '.join(sorted(unknown))}")
    topic = config.get("topic")
    if not isinstance(topic, str) or not topic:
        raise ActionError("republish: a topic (template) is required")
    if topic.startswith("$"):
        raise ActionError("republish: the topic may not start with $")
    if "+" in topic or "#" in topic:
        raise ActionError("republish: the topic may not hold wildcards (+, #)")
    qos = config.get("qos", 0)
    if (qos not in (0, 1, 2) or isinstance(qos, bool)) and qos != AS_MESSAGE_QOS:
        raise ActionError(f"republish: qos is 0, 1, 2 or {AS_MESSAGE_QOS} (the message's)")
    retain = config.get("retain", False)
    if retain in AS_MESSAGE_RETAIN:
        retain = AS_MESSAGE_RETAIN[0]
    elif not isinstance(retain, bool):
        raise ActionError(f"republish: retain is true, false or {AS_MESSAGE_RETAIN[0]} (the message's)")
    payload = config.get("payload")
    if payload is not None and not isinstance(payload, str):
        raise ActionError("republish: payload is a template string")
    props = config.get("user_properties") or {}
    if not isinstance(props, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in props.items()):
        raise ActionError("republish: user_properties maps names to template strings")
    if any("\x00" in k for k in props):
        raise ActionError("republish: a user property's name may not hold U+0000")
    _sized("republish", [topic, payload or "", *props, *props.values()], props, "user properties")
    try:
        for text in [topic, payload or "", *props.values()]:
            Template(text)
    except TemplateError as exc:
        raise ActionError(f"republish: {exc}") from None
    out = {"topic": topic, "qos": qos, "retain": retain}
    if payload is not None:
        out["payload"] = payload
    if props:
        out["user_properties"] = props
    return out


AS_MESSAGE_QOS = "${qos}"
AS_MESSAGE_RETAIN = ("${flags.retain}", "${retain}")       # (EMQX's spelling first: the one stored)


class Republish:
    __slots__ = ("topic", "qos", "retain", "payload", "props")

    def __init__(self, config: dict):
        config = validate("republish", config)
        self.topic = Template(config["topic"])
        self.qos = config["qos"]
        self.retain = config["retain"]
        self.payload = Template(config["payload"]) if "payload" in config else None
        self.props = tuple((k, Template(v)) for k, v in (config.get("user_properties") or {}).items())

    def message(self, row: dict, ctx, acl) -> RulePublish:
        """The message to publish, or ActionError why not (``acl``: the triggering client's, or None)."""
        topic = _render(self.topic, row, ctx, MAX_TOPIC_BYTES)
        if (not is_valid_name(topic) or topic.startswith("$") or "\x00" in topic
                or len(topic.encode("utf-8")) > MAX_TOPIC_BYTES):
            # (U+0000: no MQTT string may hold it [MQTT-1.5.4-2]; a client's topic never does, the codec refuses it)
            raise ActionError(f"republish topic {topic[:200]!r} is not a topic this rule may publish to")
        if acl is not None and not acl.can_publish(topic):
            raise ActionError(f"the ACL denies {ctx.clientid!r} publishing to {topic[:200]!r}")
        limit = out_limit(ctx)
        if self.payload is not None:
            payload = _render(self.payload, row, ctx, limit).encode("utf-8")
        else:
            payload = _row_json(row, limit).encode("utf-8")
        props = None
        if self.props:
            props = {USER_PROPERTY: [(k, _render(t, row, ctx, limit)) for k, t in self.props]}
            for k, v in props[USER_PROPERTY]:
                if "\x00" in v:
                    raise ActionError(f"republish user property {k!r}: U+0000 in {v[:80]!r}")
        qos = self.qos if self.qos != AS_MESSAGE_QOS else (ctx.qos or 0)
        # an event's never (message_dropped carries the dropped message's flag: its alert is no retained message)
        retain = self.retain if self.retain != AS_MESSAGE_RETAIN[0] else (
            bool(ctx.retain) and not ctx.event.startswith(EVENT_PREFIX))
        return RulePublish(topic, payload, qos, retain, properties=props)


def split_url(url: str):
    """``(scheme, host, port, target)`` of an http(s) URL whose scheme and host
    are literal; ActionError otherwise."""
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in ("http", "https"):
        raise ActionError(f"webhook: the URL must start with http:// or https://, not {url[:40]!r}")
    authority, slash, path = rest.partition("/")
    if "?" in authority:
        authority, q, query = authority.partition("?")
        path, slash = "?" + query, ""
    if "${" in authority:
        raise ActionError("webhook: the URL's host and port are literal (a template may fill in the path and query)")
    if "@" in authority:
        raise ActionError("webhook: the URL may not carry user:password@ (use a header)")
    if authority.startswith("["):
        host, _, port = authority[1:].partition("]")
        port = port[1:] if port.startswith(":") else ("" if not port else None)
    else:
        host, _, port = authority.partition(":")
    if not host or port is None or (port and not port.isdigit()) or (port and not 0 < int(port) < 65536):
        raise ActionError(f"webhook: bad host or port in {url[:80]!r}")
    if not re.fullmatch(r"[A-Za-z0-9.:_-]+", host):
        raise ActionError(f"webhook: bad host {host[:80]!r}")
    path = path.partition("#")[0]                # a fragment is not sent
    target = (slash + path) if slash else (path or "/")
    if not target.startswith(("/", "?")):
        target = "/" + target
    if target.startswith("?"):
        target = "/" + target
    return scheme, host.lower(), int(port) if port else (443 if scheme == "https" else 80), target


def validate_webhook(config: dict) -> dict:
    unknown = set(config) - {"url", "method", "headers", "body", "timeout", "retries"}
    if unknown:
        raise ActionError(f"webhook: unknown settings {', '.join(sorted(unknown))}")
    url = config.get("url")
    if not isinstance(url, str) or not url:
        raise ActionError("webhook: a URL (template) is required")
    if len(url) > MAX_URL or _BAD_VALUE.search(url) or " " in url:
        raise ActionError("webhook: the URL may not hold spaces or control characters")
    split_url(url)
    method = config.get("method", "POST")
    if not isinstance(method, str) or method.upper() not in METHODS:
        raise ActionError(f"webhook: method is one of {', '.join(METHODS)}")
    headers = config.get("headers") or {}
    if not isinstance(headers, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        raise ActionError("webhook: headers map names to template strings")
    for name, value in headers.items():
        if not _TOKEN.fullmatch(name):
            raise ActionError(f"webhook: bad header name {name!r}")
        if name.lower() in RESERVED_HEADERS:
            raise ActionError(f"webhook: the {name} header is set by the sender")
        if _BAD_VALUE.search(value):
            raise ActionError(f"webhook: header {name}: control characters")
    body = config.get("body")
    if body is not None and not isinstance(body, str):
        raise ActionError("webhook: body is a template string")
    timeout = config.get("timeout", 5.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_TIMEOUT:
        raise ActionError(f"webhook: timeout is more than 0 and at most {MAX_TIMEOUT:g} seconds")
    retries = config.get("retries", 3)
    if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= MAX_RETRIES:
        raise ActionError(f"webhook: retries is 0..{MAX_RETRIES}")
    _sized("webhook", [body or "", *headers, *headers.values()], headers, "headers")
    try:
        for text in [url, body or "", *headers.values()]:
            Template(text)
    except TemplateError as exc:
        raise ActionError(f"webhook: {exc}") from None
    out = {"url": url, "method": method.upper(), "timeout": float(timeout), "retries": retries}
    if headers:
        out["headers"] = headers
    if body is not None:
        out["body"] = body
    return out


class WebhookRequest:
    """A rendered request, handed to the sender (``size``: what it holds in the buffer)."""
    __slots__ = ("method", "scheme", "host", "port", "target", "headers", "body", "timeout", "retries", "size")

    def __init__(self, method, scheme, host, port, target, headers, body, timeout, retries):
        self.method, self.scheme, self.host, self.port, self.target = method, scheme, host, port, target
        self.headers, self.body, self.timeout, self.retries = headers, body, timeout, retries
        # what it holds in memory: a text of 4-byte characters holds 4 bytes a character (len() counted 1)
        self.size = len(body) + getsizeof(target) + sum(getsizeof(k) + getsizeof(v) for k, v in headers) + 64


class Webhook:
    __slots__ = ("url", "method", "headers", "body", "timeout", "retries")

    def __init__(self, config: dict):
        config = validate("webhook", config)
        self.url = Template(config["url"])
        self.method = config["method"]
        self.headers = tuple((k, Template(v)) for k, v in (config.get("headers") or {}).items())
        self.body = Template(config["body"]) if "body" in config else None
        self.timeout = config["timeout"]
        self.retries = config["retries"]

    def message(self, row: dict, ctx, acl) -> WebhookRequest:
        """The request to send, or ActionError why not."""
        url = _render(self.url, row, ctx, MAX_URL)
        if _BAD_VALUE.search(url) or " " in url or len(url) > MAX_URL:
            raise ActionError(f"webhook URL {url[:80]!r} holds spaces or control characters")
        scheme, host, port, target = split_url(url)
        headers = []
        for name, t in self.headers:
            value = _render(t, row, ctx, out_limit(ctx))
            if _BAD_VALUE.search(value):
                raise ActionError(f"webhook header {name}: control characters in {value[:80]!r}")
            headers.append((name, value))
        if self.body is not None:
            body = _render(self.body, row, ctx, out_limit(ctx)).encode("utf-8")
        else:
            body = _row_json(row, out_limit(ctx)).encode("utf-8")
            if not any(k.lower() == "content-type" for k, _ in headers):
                headers.append(("Content-Type", "application/json"))
        return WebhookRequest(self.method, scheme, host, port, target, tuple(headers), body, self.timeout,
                              self.retries)


def validate_store(config: dict) -> dict:
    unknown = set(config) - {"dataset"}
    if unknown:
        raise ActionError(f"store: unknown settings {', '.join(sorted(unknown))}")
    dataset = config.get("dataset")
    if not isinstance(dataset, str) or not DATASET.fullmatch(dataset):
        raise ActionError(f"store: the dataset is a short name -- a lower-case letter, then up to 31 lower-case "
                          f"letters, digits or _ (not {str(dataset)[:40]!r})")
    return {"dataset": dataset}


class TelemetryRecord:
    """A rendered row of a telemetry dataset, handed to the writer (``size``: what it holds in the buffer)."""
    __slots__ = ("dataset", "ts", "clientid", "topic", "data", "size")

    def __init__(self, dataset: str, ts: int, clientid, topic, data: str):
        self.dataset, self.ts, self.clientid, self.topic, self.data = dataset, ts, clientid, topic, data
        self.size = getsizeof(data) + getsizeof(topic) + getsizeof(clientid) + 96   # in memory (as WebhookRequest)


class Store:
    __slots__ = ("dataset",)

    def __init__(self, config: dict):
        self.dataset = validate("store", config)["dataset"]

    def message(self, row: dict, ctx, acl) -> TelemetryRecord:
        """The record to append: the row as JSON, with when (``ctx.timestamp``, Unix ms), who and where."""
        return TelemetryRecord(self.dataset, ctx.timestamp, ctx.clientid, ctx.topic, _row_json(row, out_limit(ctx)))


def build(kind: str, config: dict):
    if kind == "republish":
        return Republish(config)
    if kind == "webhook":
        return Webhook(config)
    if kind == "store":
        return Store(config)
    raise ActionError(f"unknown action {kind!r}")
