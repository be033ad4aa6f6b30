"""ACL decisions for one client (pure), and the one ACL engine: the console's
checker (``tenants/acl.py``, ``manage.py acl check``) evaluates its rules with
``compile_rules`` and the deciders below, so both sides decide alike.

A tenant's rules are ordered; the first rule that applies decides, else the
tenant default. A rule applies to a client by who it names (every device, one
device, or a device-name glob) and by action (publish, subscribe or both).
Its topic filter may use ``{device}`` and ``{client_id}``, each a whole
level. A value that is empty or holds ``+``, ``#`` or ``/`` would widen the
filter or shift its levels (and one starting with ``$`` in the first level
would reach system topics), so it is never written into a filter:

- an *allow* rule with such a value does not apply to that client;
- a *deny* rule fails closed: it denies, for its action, everything from
  the first such placeholder down (``a/{client_id}/b`` -> ``a/#``), and
  every topic when that placeholder is the first level. (It used to be
  skipped, so a client id such as ``x/y`` escaped the deny -- issue 16.)

Deciding:

- PUBLISH to a topic: the first publish rule whose filter matches the topic.
- SUBSCRIBE to a filter F: the first subscribe rule whose filter *covers* F
  (matches every topic F can match) decides. Rules before it that only
  *intersect* F govern part of what F would receive: the subscription is
  then granted if any of them (or the deciding verdict) allows, and every
  message is checked on delivery ("read" check), so a subscriber to ``#``
  never receives a topic a rule denies it. (Mosquitto also checks read
  access per delivered message.)

Decisions are cached per client and topic, bounded in bytes per client
(ACL_CACHE_BYTES per cache) and, through a shared budget, per node (see
``brokerd.routing.cache``), so the per-message cost of a check is one dict
lookup; topics longer than MAX_CACHED_TOPIC are checked every time.
"""

from fnmatch import fnmatchcase

from ..routing.cache import MAX_CACHED_TOPIC, CacheBudget, TopicCache
from ..routing.topic import matches

PLACEHOLDERS = ("{device}", "{client_id}")
ACL_CACHE_BYTES = 128 * 1024            # per verdict cache (a client has two: publish, read)
ACL_CACHE_NODE_BYTES = 64 * 1024 * 1024  # every client's caches on the node together
ACL_ENTRY_COST = 64                     # bytes of a cached verdict besides its topic (dict slot)
EVERYTHING = None                       # the filter of a deny rule that denies every topic


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


def _unusable(value: str, level: int) -> bool:
    """Would ``value`` widen a filter or shift its levels if written at ``level``?"""
    return not value or "+" in value or "#" in value or "/" in value or (level == 0 and value.startswith("$"))


def expand(topic: str, device: str, client_id: str) -> str | None:
    """The rule filter for one client, or None when a value would widen it."""
    if "{" not in topic:
        return topic
    values = {"{device}": device, "{client_id}": client_id}
    levels = topic.split("/")
    for i, level in enumerate(levels):
        if level in values:
            v = values[level]
            if _unusable(v, i):
                return None          # would widen the filter, or reach "$" topics
            levels[i] = v
    return "/".join(levels)


def deny_filter(topic: str, device: str, client_id: str) -> str | None:
    """The filter a *deny* rule has for one client: ``expand``'s when there is
    one, else fail closed -- the levels before the first unusable placeholder
    followed by ``#``, or EVERYTHING when that placeholder is the first level."""
    filt = expand(topic, device, client_id)
    if filt is not None:
        return filt
    values = {"{device}": device, "{client_id}": client_id}
    levels = topic.split("/")
    for i, level in enumerate(levels):
        if level in values:
            if _unusable(values[level], i):
                return EVERYTHING if i == 0 else "/".join(levels[:i] + ["#"])
            levels[i] = values[level]
    return EVERYTHING                # not reached: expand() found an unusable value


def compile_rules(rules: list[dict], device: str | None, client_id: str) -> tuple[list, list]:
    """The rules that apply to one client, in order, with their filters written
    for it: (publish entries, subscribe entries), each entry (filter, allow,
    rule); a filter of EVERYTHING matches every topic."""
    publish, subscribe = [], []
    for rule in rules:
        if not rule_applies(rule, device):
            continue
        allow = bool(rule["allow"])
        if allow:
            filt = expand(rule["topic"], device or "", client_id)
            if filt is None:
                continue             # an allow rule never widens: it does not apply
        else:
            filt = deny_filter(rule["topic"], device or "", client_id)
        entry = (filt, allow, rule)
        action = rule.get("action", "both")
        if action in ("publish", "both"):
            publish.append(entry)
        if action in ("subscribe", "both"):
            subscribe.append(entry)
    return publish, subscribe


def decide_publish(entries: list, topic: str, default: bool) -> tuple[bool, dict | None]:
    """(allowed, deciding rule or None for the default) for a PUBLISH to ``topic``."""
    for filt, allow, rule in entries:
        if filt is EVERYTHING or matches(filt, topic):
            return allow, rule
    return default, None


def decide_subscribe(entries: list, filt: str, default: bool) -> tuple[bool, dict | None, bool]:
    """(granted, deciding rule or None, check each delivery) for a SUBSCRIBE to ``filt``."""
    partial = partial_allow = False
    for rule_filter, allow, rule in entries:
        if rule_filter is EVERYTHING or covers(rule_filter, filt):
            return allow or partial_allow, rule, partial
        if intersects(rule_filter, filt):
            partial = True
            partial_allow = partial_allow or allow
    return default or partial_allow, None, partial


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
    """The compiled rules of one client and its cached verdicts."""

    __slots__ = ("publish_rules", "subscribe_rules", "default", "_pub", "_read", "allowed")

    def __init__(self, rules: list[dict], default_allow: bool, device: str | None, client_id: str,
                 budget: CacheBudget | None = None):
        self.publish_rules, self.subscribe_rules = compile_rules(rules, device, client_id)
        self.default = default_allow
        self._pub = TopicCache(ACL_CACHE_BYTES, budget)
        self._read = TopicCache(ACL_CACHE_BYTES, budget)
        # the last topic can_publish allowed (a verdict never changes for one ClientAcl: a new
        # policy makes a new one), compared first by the publish path (Broker.publish): a device
        # publishing to one topic again and again pays a string comparison. Cached topics only
        # (at most MAX_CACHED_TOPIC characters held).
        self.allowed = None

    @property
    def open(self) -> bool:
        """Everything allowed: no check needed at all."""
        return self.default and all(allow for _, allow, _ in self.publish_rules + self.subscribe_rules)

    def can_publish(self, topic: str) -> bool:
        cache = self._pub
        verdict = cache.get(topic)
        if verdict is None:
            verdict = decide_publish(self.publish_rules, topic, self.default)[0]
            cache.put(topic, verdict, ACL_ENTRY_COST)
        if verdict and len(topic) <= MAX_CACHED_TOPIC:
            self.allowed = topic
        return verdict

    def can_read(self, topic: str) -> bool:
        """May a message on ``topic`` be delivered to this client?"""
        cache = self._read
        verdict = cache.get(topic)
        if verdict is None:
            verdict = decide_publish(self.subscribe_rules, topic, self.default)[0]
            cache.put(topic, verdict, ACL_ENTRY_COST)
        return verdict

    def subscribe(self, filt: str) -> tuple[bool, bool]:
        """-> (granted, check each delivery) for a SUBSCRIBE to ``filt``."""
        granted, _, check = decide_subscribe(self.subscribe_rules, filt, self.default)
        return granted, check
