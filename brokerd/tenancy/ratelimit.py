"""Token buckets (pure; time comes in as ``now``)."""


class Bucket:
    """``rate`` tokens per second, at most ``burst`` saved up (one second's worth by default)."""

    __slots__ = ("rate", "burst", "tokens", "at", "spent")

    def __init__(self, rate: float, burst: float | None = None, now: float = 0.0):
        self.rate = float(rate)
        self.burst = float(burst if burst is not None else rate)
        self.tokens = self.burst
        self.at = now
        self.spent = 0.0                # tokens taken in all (a host's workers share a tenant's rates by it)

    def take(self, n: float, now: float) -> float:
        """Spend ``n`` tokens (possibly going into debt); -> seconds until the
        bucket is back to zero (0.0 when it never went below)."""
        tokens = self.tokens + (now - self.at) * self.rate
        if tokens > self.burst:
            tokens = self.burst
        tokens -= n
        self.tokens = tokens
        self.at = now
        self.spent += n
        return 0.0 if tokens >= 0 else -tokens / self.rate

    def allow(self, now: float, n: float = 1.0) -> bool:
        """Spend ``n`` tokens only if they are there."""
        tokens = self.tokens + (now - self.at) * self.rate
        if tokens > self.burst:
            tokens = self.burst
        self.at = now
        if tokens < n:
            self.tokens = tokens
            return False
        self.tokens = tokens - n
        self.spent += n
        return True


class Limiter:
    """The rate limits of one direction of one client: its own buckets and its
    tenant's shared ones. ``charge`` -> seconds the client must wait."""

    __slots__ = ("buckets",)

    def __init__(self, buckets: list):
        self.buckets = buckets        # [(bucket, "msgs" | "bytes")]

    def __bool__(self):
        return bool(self.buckets)

    def owing(self, now: float) -> float:
        """Seconds until every bucket is back to zero (0.0 when none is in debt)."""
        wait = 0.0
        for bucket, _ in self.buckets:
            tokens = bucket.tokens + (now - bucket.at) * bucket.rate
            if tokens < 0 and -tokens / bucket.rate > wait:
                wait = -tokens / bucket.rate
        return wait

    def charge(self, msgs: int, nbytes: int, now: float) -> float:
        wait = 0.0
        for bucket, unit in self.buckets:
            w = bucket.take(msgs if unit == "msgs" else nbytes, now)
            if w > wait:
                wait = w
        return wait
