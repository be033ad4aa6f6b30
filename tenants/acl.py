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
before ``allow #``, and a request for ``#``) is decided by the first rule
that covers it; the broker must then still check each delivered message
against the rules (as Mosquitto does) so that ``secret/...`` never reaches
that subscriber.

Placeholders ``{device}`` and ``{client_id}`` each fill a whole topic level.
A rule whose value is empty or holds ``+``, ``#`` or ``/`` (which would
widen the filter or shift its levels) does not match: allow and deny alike.
"""

from fnmatch import fnmatchcase

from brokerd.routing.topic import is_valid_filter, is_valid_name, matches, parse_shared

PLACEHOLDERS = ("{device}", "{client_id}")
ACTIONS = ("publish", "subscribe")
_WILD = ("+", "#")
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


def expand(topic: str, device: str, client_id: str) -> str | None:
    """``topic`` with its placeholders filled, or None when a value is unsafe."""
    if "{" not in topic:
        return topic
    values = {"{device}": device, "{client_id}": client_id}
    levels = topic.split("/")
    for i, level in enumerate(levels):
        if level in values:
            value = values[level]
            if not value or "+" in value or "#" in value or "/" in value:
                return None
            levels[i] = value
    return "/".join(levels)


def covers(rule_filter: str, requested: str) -> bool:
    """Does ``rule_filter`` match every topic that ``requested`` can match?"""
    r, f = rule_filter.split("/"), requested.split("/")
    if r[0] in _WILD and f[0] not in _WILD and f[0].startswith("$"):
        return False  # a filter starting with a wildcard matches no "$" topic
    if f == ["#"] and r == ["+", "#"]:
        return True  # both match every topic of at least one level, i.e. all
    for i, level in enumerate(r):
        if level == "#":
            return True
        if i >= len(f) or f[i] == "#":
            return False
        if level != "+" and level != f[i]:  # a literal covers only itself
            return False
    return len(f) == len(r)


def applies_to(rule: dict, device: str) -> bool:
    """Does the rule's ``who`` select ``device``?"""
    who = rule["who"]
    if who == "all":
        return True
    if who == "device":
        return rule["device"] == device
    if who == "pattern":
        return fnmatchcase(device, rule["pattern"])
    raise ValueError(f"unknown who {who!r}")


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


def rule_matches(rule: dict, device: str, client_id: str, action: str, topic: str) -> bool:
    """Does ``rule`` match the (already normalized) request?"""
    if rule["action"] not in (action, "both") or not applies_to(rule, device):
        return False
    filt = expand(rule["topic"], device, client_id)
    if filt is None:
        return False
    return matches(filt, topic) if action == "publish" else covers(filt, topic)


def decide(rules, default_acl: str, device: str, client_id: str, action: str, topic: str):
    """``(allowed, rule)`` for the first matching rule of ``rules`` (in order),
    else ``(default_acl == "allow", None)``."""
    topic = normalize_request(action, topic)
    for rule in rules:
        if rule_matches(rule, device, client_id, action, topic):
            return rule["allow"], rule
    return default_acl == "allow", None
