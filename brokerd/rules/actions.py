"""What a rule does with its output row.

``republish`` -- config ``{"topic": TEMPLATE, "qos": 0..2, "retain": bool,
"payload": TEMPLATE or null, "user_properties": {NAME: TEMPLATE}}``. The
message is published inside the tenant's own namespace (a rule never sees
another tenant's topics, and its output never leaves its tenant), as the
client whose message or event triggered the rule: the topic must be one that
client's ACL lets it publish to (the tenant's ACL rules for that device), it
may not start with ``$``, and it may not hold wildcards. A refused topic
counts as a failure of the rule (``last_error`` says why); nothing is
published. The payload is the output row as JSON unless a payload template
is given. Republished messages do not run rules again (no loops).

``webhook`` and ``store`` are named in the configuration's vocabulary but
not run by this version: ``validate`` refuses them, so no rule that would do
nothing is ever stored.
"""

import json

from ..protocol.packets import Publish
from ..protocol.properties import USER_PROPERTY
from ..routing.topic import is_valid_name
from .template import Template, TemplateError

KINDS = ("republish", "webhook", "store")
RUNNABLE = ("republish",)
MAX_TOPIC_BYTES = 65535
_to_json = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=str).encode   # made once


class ActionError(ValueError):
    pass


def validate(kind: str, config: dict) -> dict:
    """A rule's action, checked and normalised; raises ActionError."""
    if kind not in KINDS:
        raise ActionError(f"unknown action {kind!r}: one of {', '.join(KINDS)}")
    if kind not in RUNNABLE:
        raise ActionError(f"the {kind} action is not available yet (this version runs republish only)")
    if not isinstance(config, dict):
        raise ActionError("an action's configuration is a JSON object")
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
    if qos not in (0, 1, 2) or isinstance(qos, bool):
        raise ActionError("republish: qos is 0, 1 or 2")
    retain = config.get("retain", False)
    if not isinstance(retain, bool):
        raise ActionError("republish: retain is true or false")
    payload = config.get("payload")
    if payload is not None and not isinstance(payload, str):
        raise ActionError("republish: payload is a template string")
    props = config.get("user_properties") or {}
    if not isinstance(props, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in props.items()):
        raise ActionError("republish: user_properties maps names to template strings")
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


class Republish:
    __slots__ = ("topic", "qos", "retain", "payload", "props")

    def __init__(self, config: dict):
        config = validate("republish", config)
        self.topic = Template(config["topic"])
        self.qos = config["qos"]
        self.retain = config["retain"]
        self.payload = Template(config["payload"]) if "payload" in config else None
        self.props = tuple((k, Template(v)) for k, v in (config.get("user_properties") or {}).items())

    def message(self, row: dict, ctx, acl) -> Publish:
        """The message to publish, or ActionError why not (``acl``: the triggering client's, or None)."""
        topic = self.topic.render(row, ctx)
        if not is_valid_name(topic) or topic.startswith("$") or len(topic.encode("utf-8")) > MAX_TOPIC_BYTES:
            raise ActionError(f"republish topic {topic!r} is not a topic this rule may publish to")
        if acl is not None and not acl.can_publish(topic):
            raise ActionError(f"the ACL denies {ctx.clientid!r} publishing to {topic!r}")
        if self.payload is not None:
            payload = self.payload.render(row, ctx).encode("utf-8")
        else:
            payload = _to_json(row).encode("utf-8")
        props = None
        if self.props:
            props = {USER_PROPERTY: [(k, t.render(row, ctx)) for k, t in self.props]}
        return Publish(topic, payload, self.qos, self.retain, properties=props)


def build(kind: str, config: dict):
    if kind == "republish":
        return Republish(config)
    raise ActionError(f"the {kind} action is not available yet")
