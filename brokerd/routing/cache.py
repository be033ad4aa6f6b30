"""Topic-keyed caches bounded by bytes (pure).

The broker caches per topic what it would otherwise compute on every
message: a namespace's route (subscribers of a topic) and a client's ACL
verdicts. A topic may be 64 KiB, so a cache bounded only by its number of
entries is not bounded at all: one device publishing to 60,000 distinct
60 KB topics nobody subscribes to held 3.6 GB in the route cache (issue 16).

A :class:`TopicCache` is a plain ``dict`` (lookups stay one C call on the
per-message path) whose insertions go through ``put``, which

- does not cache a topic longer than ``MAX_CACHED_TOPIC`` characters: such a
  topic is matched every time (at a cost linear in its length, like parsing
  it was) instead of being kept alive by the cache;
- charges each entry its estimated size (the topic's characters, 4 bytes
  each unless it is ASCII, plus what the caller says the entry and its value
  hold besides) and clears the whole cache when ``limit`` would be passed, as
  the entry-count bound did before;
- with a shared :class:`CacheBudget` (one per kind of cache per node, so the
  per-tenant and per-client bounds do not multiply), skips caching while the
  node's total is at its limit: lookups get slower, memory does not grow.

A cache gives its bytes back to the budget when it is cleared or freed.
"""

MAX_CACHED_TOPIC = 512        # characters; longer topics are never cached
STR_COST = 64                 # bytes of a str object besides its characters (header, hash)


def topic_cost(topic: str) -> int:
    """Estimated bytes of a ``topic`` string: its characters (at most 4 bytes each) and header."""
    n = len(topic)
    return STR_COST + (n if topic.isascii() else 4 * n)


class CacheBudget:
    """Bytes held by every cache of one kind on the node."""

    __slots__ = ("used", "limit", "skipped")

    def __init__(self, limit: int):
        self.used = 0
        self.limit = limit
        self.skipped = 0              # entries not cached because the node's caches were full


class TopicCache(dict):
    """topic -> value, at most ``limit`` bytes (see the module docstring)."""

    __slots__ = ("held", "limit", "budget")

    def __init__(self, limit: int, budget: CacheBudget | None = None):
        super().__init__()
        self.held = 0
        self.limit = limit
        self.budget = budget

    def put(self, topic: str, value, extra: int) -> None:
        """Cache ``value`` for ``topic`` if the bounds allow (``extra``: bytes the
        dict slot and the value hold besides the topic)."""
        if len(topic) > MAX_CACHED_TOPIC or topic in self:
            return
        cost = topic_cost(topic) + extra
        if self.held + cost > self.limit:
            self.clear()
            if cost > self.limit:
                return
        budget = self.budget
        if budget is not None:
            if budget.used + cost > budget.limit:
                budget.skipped += 1
                return
            budget.used += cost
        self[topic] = value
        self.held += cost

    def clear(self) -> None:
        super().clear()
        if self.budget is not None:
            self.budget.used -= self.held
        self.held = 0

    def __del__(self):
        budget = self.budget
        if budget is not None:
            budget.used -= self.held
