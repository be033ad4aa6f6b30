"""ACL evaluation, the reference semantics (plain Python, no Django).

It works on rules shaped like the ``"acl"`` entries of the policy snapshot
(dicts with ``who``, ``device``, ``pattern``, ``action``, ``topic``,
``allow``), so the console's "would this client be allowed?" checker and any
broker-side implementation evaluate exactly the same data.

Rules are evaluated in order (position, then id); the first rule that matches
decides; when none matches the tenant's ``default_acl`` does.

A rule matches a request when
- its ``who`` applies to the device: ``all``; ``device`` with the same name;
  ``pattern`` whose glob (``fnmatch.fnmatchcase``, case-sensitive) matches;
- its ``action`` is the requested one or ``both``;
- its topic filter, after placeholder expansion, matches the request:
  - publish: the filter matches the topic name;
  - subscribe (the requested filter; for ``$share/GROUP/F`` the inner F):
    the filter **covers** the request: every topic the request can match,
    the rule's filter matches too (``a/#`` covers ``a/+/b``; ``a/+`` does
    not cover ``a/#``).

A subscription that earlier rules only partly govern (``deny secret/#``
before ``allow #``, and a request for ``#``) is granted when the first rule
that covers it, or one of those earlier rules, allows; the broker then
checks each delivered message against the rules (as Mosquitto does), so
``secret/...`` never reaches that subscriber. ``decide_detail`` reports such
a grant as *filtered*.

Placeholders ``{device}`` and ``{client_id}`` each fill a whole topic level.
A value that is empty or holds ``+``, ``#`` or ``/`` (which would widen the
filter or shift its levels), or starts with ``$`` in the first level, is
never written into a filter: an *allow* rule with it does not match; a
*deny* rule fails closed and denies everything from that level down
(``a/{client_id}/b`` -> ``a/#``; every topic when it is the first level).

The evaluation itself is brokerd's (``brokerd.tenancy.acl``: the rules are
compiled for the client by ``compile_rules`` and decided by
``decide_publish`` / ``decide_subscribe``, pure Python), so the console's
checker and the broker decide with the same code.
"""

from typing import NamedTuple

from brokerd.routing.topic import is_valid_filter, is_valid_name, parse_shared
from brokerd.tenancy.acl import (
    compile_rules,
    covers,
    decide_publish,
    decide_subscribe,
    deny_filter,
    expand,
    intersects,
)
from brokerd.tenancy.acl import rule_applies as applies_to

__all__ = ["ACTIONS", "PLACEHOLDERS", "Decision", "applies_to", "covers", "decide", "decide_detail", "deny_filter",
           "expand", "intersects", "normalize_request", "topic_error"]

PLACEHOLDERS = ("{device}", "{client_id}")
ACTIONS = ("publish", "subscribe")
_SAMPLE = "sample"


def topic_error(topic: str) -> str | None:
    """Why ``topic`` is not a valid rule filter, or None when it is."""
    if not topic:
        return "the topic filter is empty"
    if topic.startswith("$share/"):
        return "a rule filter cannot be a $share/ subscription (rules apply to the inner filter)"
    for level in topic.split("/"):
        if ("{" in level or "}" in level) and level not in PLACEHOLDERS:
            return (
                f"invalid topic level {level!r}: a placeholder ({', '.join(PLACEHOLDERS)}) "
                "must fill a whole level, and no other braces are allowed"
            )
    sample = "/".join(_SAMPLE if lvl in PLACEHOLDERS else lvl for lvl in topic.split("/"))
    if not is_valid_filter(sample):
        return f"invalid topic filter {topic!r}"
    return None


def normalize_request(action: str, topic: str) -> str:
    """The topic to evaluate, validated: a name to publish to, or the filter of
    a subscription (the inner filter of ``$share/GROUP/F``). ValueError if invalid."""
    if action == "publish":
        if not is_valid_name(topic):
            raise ValueError(f"invalid topic name {topic!r}")
        return topic
    if action == "subscribe":
        shared = parse_shared(topic)  # raises InvalidTopic (a ValueError)
        filt = shared[1] if shared else topic
        if not is_valid_filter(filt):
            raise ValueError(f"invalid topic filter {topic!r}")
        return filt
    raise ValueError(f"action must be one of {', '.join(ACTIONS)}, not {action!r}")


class Decision(NamedTuple):
    allowed: bool
    rule: dict | None          # the rule that decided, None for the tenant default
    filtered: bool = False     # subscribe: granted, each delivered message checked


def decide_detail(rules, default_acl: str, device: str, client_id: str, action: str, topic: str) -> Decision:
    """What brokerd decides for this request (see the module docstring)."""
    topic = normalize_request(action, topic)
    publish, subscribe = compile_rules(rules, device, client_id)
    default = default_acl == "allow"
    if action == "publish":
        allowed, rule = decide_publish(publish, topic, default)
        return Decision(allowed, rule)
    return Decision(*decide_subscribe(subscribe, topic, default))


def decide(rules, default_acl: str, device: str, client_id: str, action: str, topic: str):
    """``(allowed, rule)``: the first rule that decides (matching a published
    topic, covering a subscribed filter), else ``(default_acl == "allow", None)``."""
    allowed, rule, _ = decide_detail(rules, default_acl, device, client_id, action, topic)
    return allowed, rule
