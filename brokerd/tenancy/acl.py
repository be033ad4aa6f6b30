"""ACL decisions for one client (pure).

A tenant's rules are ordered; the first rule that applies decides, else the
tenant default. A rule applies to a client by who it names (every device, one
device, or a device-name glob) and by action (publish, subscribe or both).
Its topic filter may use ``{device}`` and ``{client_id}``, each a whole
level; a value that is empty or holds ``+``, ``#`` or ``/`` would widen the
filter (and one starting with ``$`` in the first level would reach system
topics), so the rule simply does not apply to that client.

- PUBLISH to a topic: the first publish rule whose filter matches the topic.
- SUBSCRIBE to a filter F: the first subscribe rule whose filter *covers* F
  (matches every topic F can match) decides. Rules before it that only
  *intersect* F govern part of what F would receive: the subscription is
  then granted if any of them (or the deciding verdict) allows, and every
  message is checked on delivery ("read" check), so a subscriber to ``#``
  never receives a topic a rule denies it. (Mosquitto also checks read
  access per delivered message.)

Decisions are cached per client and topic (bounded), so the per-message
cost of a check is one dict lookup.
"""

from fnmatch import fnmatchcase

from ..routing.topic import matches

PLACEHOLDERS = ("{device}", "{client_id}")
CACHE_MAX = 4096


def covers(a: str, b: str) -> bool:
    """Does filter ``a`` match every topic that filter ``b`` matches?"""
    la, lb = a.split("/"), b.split("/")
    dollar_b = b.startswith("$")
    for i, x in enumerate(la):
        if x == "#":
            return not (i == 0 and dollar_b)
        if i >= len(lb):
            return False
        y = lb[i]
        if y == "#":
            # "#" at the top also means "one level or more", which "+/#" covers too
            return i == 0 and la[i:] == ["+", "#"] and not dollar_b
        if x == "+":
            if i == 0 and dollar_b:
                return False
            continue
        if x != y:
            return False
    return len(la) == len(lb)


def intersects(a: str, b: str) -> bool:
    """Is there a topic name that both filters match?"""
    la, lb = a.split("/"), b.split("/")
    for i in range(max(len(la), len(lb))):
        x = la[i] if i < len(la) else None
        y = lb[i] if i < len(lb) else None
        if x == "#" or y == "#":
            other = y if x == "#" else x
            # a leading wildcard never matches a "$" topic
            return not (i == 0 and other is not None and other.startswith("$"))
        if x is None or y is None:
            return False
        if x == "+" or y == "+":
            if i == 0 and (x.startswith("$") or y.startswith("$")):
                return False
            continue
        if x != y:
            return False
    return True


def expand(topic: str, device: str, client_id: str) -> str | None:
    """The rule filter for one client, or None when a value would widen it."""
    if "{" not in topic:
        return topic
    values = {"{device}": device, "{client_id}": client_id}
    levels = topic.split("/")
    for i, level in enumerate(levels):
        if level in values:
            v = values[level]
            if not v or "+" in v or "#" in v or "/" in v or (i == 0 and v.startswith("$")):
                return None          # would widen the filter, or reach "$" topics
            levels[i] = v
    return "/".join(levels)


def rule_applies(rule: dict, device: str | None) -> bool:
    who = rule.get("who", "all")
    if who == "all":
        return True
    if device is None:
        return False
    if who == "device":
        return rule.get("device") == device
    if who == "pattern":
        return fnmatchcase(device, rule.get("pattern") or "")
    return False


class ClientAcl:
    """The compiled rules of one client: (filter, allow) per action."""

    __slots__ = ("publish_rules", "subscribe_rules", "default", "_pub", "_read")

    def __init__(self, rules: list[dict], default_allow: bool, device: str | None, client_id: str):
        self.publish_rules: list[tuple[str, bool]] = []
        self.subscribe_rules: list[tuple[str, bool]] = []
        self.default = default_allow
        for rule in rules:
            if not rule_applies(rule, device):
                continue
            filt = expand(rule["topic"], device or "", client_id)
            if filt is None:
                continue
            entry = (filt, bool(rule["allow"]))
            action = rule.get("action", "both")
            if action in ("publish", "both"):
                self.publish_rules.append(entry)
            if action in ("subscribe", "both"):
                self.subscribe_rules.append(entry)
        self._pub: dict[str, bool] = {}
        self._read: dict[str, bool] = {}

    @property
    def open(self) -> bool:
        """Everything allowed: no check needed at all."""
        return self.default and not any(not allow for _, allow in self.publish_rules + self.subscribe_rules)

    def can_publish(self, topic: str) -> bool:
        cache = self._pub
        verdict = cache.get(topic)
        if verdict is None:
            verdict = _first(self.publish_rules, topic, self.default)
            if len(cache) >= CACHE_MAX:
                cache.clear()
            cache[topic] = verdict
        return verdict

    def can_read(self, topic: str) -> bool:
        """May a message on ``topic`` be delivered to this client?"""
        cache = self._read
        verdict = cache.get(topic)
        if verdict is None:
            verdict = _first(self.subscribe_rules, topic, self.default)
            if len(cache) >= CACHE_MAX:
                cache.clear()
            cache[topic] = verdict
        return verdict

    def subscribe(self, filt: str) -> tuple[bool, bool]:
        """-> (granted, check each delivery) for a SUBSCRIBE to ``filt``."""
        partial_allow = partial = False
        verdict = self.default
        for rule_filter, allow in self.subscribe_rules:
            if covers(rule_filter, filt):
                verdict = allow
                break
            if intersects(rule_filter, filt):
                partial = True
                partial_allow = partial_allow or allow
        if not partial:
            return verdict, False
        return (verdict or partial_allow), True


def _first(rules, topic: str, default: bool) -> bool:
    for rule_filter, allow in rules:
        if matches(rule_filter, topic):
            return allow
    return default
