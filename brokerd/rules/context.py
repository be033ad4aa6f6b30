"""What a rule sees: one message or one client event.

The payload is decoded as JSON at most once per message, and only when a
rule reads a field of it (``payload.temp``); a payload that is not JSON (or
not an object/array) reads as NULL for every field. ``timestamp`` is the
wall-clock time the node received the message, in milliseconds, given by the
caller (this package reads no clock).
"""

import json

from .functions import decode_json
from .textmatch import MAX_WORK

_UNSET = object()

# fields of every source; those a source does not have read as NULL
FIELDS = ("event", "clientid", "username", "topic", "qos", "retain", "payload", "timestamp", "user_properties",
          "peerhost", "reason", "node", "action", "result", "authz_source")


class Context:
    __slots__ = ("event", "clientid", "username", "topic", "qos", "retain", "raw", "timestamp", "props", "peerhost",
                 "reason", "node", "action", "result", "authz_source", "_json", "_text", "_uprops", "memo", "work")

    def __init__(self, event: str = "message.publish", topic: str | None = None, payload: bytes | None = None,
                 clientid: str | None = None, username: str | None = None, qos: int | None = None,
                 retain: bool | None = None, timestamp: int = 0, user_properties=None, peerhost: str | None = None,
                 reason: str | None = None, node: str | None = None, action: str | None = None,
                 result: str | None = None, authz_source: str | None = None):
        self.event = event
        self.topic = topic
        self.raw = payload
        self.clientid = clientid
        self.username = username
        self.qos = qos
        self.retain = retain
        self.timestamp = timestamp
        self.props = user_properties      # [(key, value), ...] as MQTT 5 carries them, or a dict, or None
        self.peerhost = peerhost
        self.reason = reason
        self.node = node
        self.action = action                # client_check_authz_complete: publish | subscribe
        self.result = result                # allow | deny
        self.authz_source = authz_source    # acl (the tenant's rules), default (no ACL applies), sys ($SYS)
        self._json = _UNSET
        self._text = None
        self._uprops = None
        self.memo = None                  # the rules' aliases computed for this message (compiler._once)
        self.work = MAX_WORK              # automaton states the patterns of this message's rules may still walk

    @property
    def payload(self) -> str | None:
        """The payload as text, decoded once (a statement naming it 200 times held 200 copies)."""
        text = self._text
        if text is None:
            raw = self.raw
            if raw is None:
                return None
            text = self._text = raw.decode("utf-8", "replace") if isinstance(raw, (bytes, bytearray)) else str(raw)
        return text

    @property
    def user_properties(self) -> dict:
        u = self._uprops
        if u is None:
            p = self.props
            u = self._uprops = dict(p) if p else {}
        return u

    def json(self):
        """The payload decoded as JSON (once), or None."""
        j = self._json
        if j is _UNSET:
            try:
                raw = self.raw
                if isinstance(raw, (bytes, bytearray)):
                    raw = raw.decode(json.detect_encoding(raw), "surrogatepass")      # as json.loads does
                j = decode_json(raw) if raw else None
            except (ValueError, TypeError):
                j = None
            self._json = j
        return j

    def row(self) -> dict:
        """``SELECT *``: every field this source has."""
        out = {}
        for name in FIELDS:
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if not out.get("user_properties"):
            out.pop("user_properties", None)
        return out
