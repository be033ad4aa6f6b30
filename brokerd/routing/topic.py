"""Topic names and filters: validation, matching and ``$share`` parsing.

Rules (MQTT 3.1.1 section 4.7, 5.0 section 4.7-4.8):
- names and filters are non-empty UTF-8 of at most 65,535 bytes (U+0000 is
  refused by the codec already) and at most MAX_TOPIC_LEVELS levels (Mosquitto's
  limit; ``brokerd.protocol.codec``);
- a name contains no wildcard; in a filter ``+`` fills a whole level and
  ``#`` is a whole last level;
- a filter starting with a wildcard does not match names starting with ``$``;
- ``$share/GROUP/FILTER`` is a shared subscription: GROUP is non-empty and
  free of ``/``, ``+`` and ``#``; FILTER is a valid filter.
"""

from ..protocol.codec import too_deep

SHARE_PREFIX = "$share/"
MAX_TOPIC_BYTES = 65535


class InvalidTopic(ValueError):
    pass


def is_valid_name(name: str) -> bool:
    """A topic name a client may publish to (the codec already refused U+0000)."""
    return bool(name) and "+" not in name and "#" not in name and not too_deep(name)


def is_valid_filter(filt: str) -> bool:
    if not filt or len(filt.encode("utf-8")) > MAX_TOPIC_BYTES or too_deep(filt):
        return False
    if "+" not in filt and "#" not in filt:
        return True
    levels = filt.split("/")
    last = len(levels) - 1
    for i, level in enumerate(levels):
        if "#" in level:
            if level != "#" or i != last:
                return False
        elif "+" in level and level != "+":
            return False
    return True


def has_wildcards(filt: str) -> bool:
    return "+" in filt or "#" in filt


def parse_shared(filt: str) -> tuple[str, str] | None:
    """``$share/GROUP/FILTER`` -> (GROUP, FILTER); None for a plain filter.

    Raises InvalidTopic for a malformed shared subscription.
    """
    if not filt.startswith(SHARE_PREFIX):
        return None
    rest = filt[len(SHARE_PREFIX):]
    group, sep, inner = rest.partition("/")
    if not sep or not group or "+" in group or "#" in group:
        raise InvalidTopic(f"invalid shared subscription {filt!r}")
    if not is_valid_filter(inner):
        raise InvalidTopic(f"invalid topic filter in {filt!r}")
    return group, inner


def matches(filt: str, name: str) -> bool:
    """Does topic filter ``filt`` match topic name ``name``?"""
    if name.startswith("$") and filt[:1] in ("+", "#"):
        return False
    f = filt.split("/")
    t = name.split("/")
    for i, level in enumerate(f):
        if level == "#":
            return True
        if i >= len(t):
            return False
        if level != "+" and level != t[i]:
            return False
    return len(f) == len(t)
