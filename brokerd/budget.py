"""The node's memory budgets, and the queue budget's policy: one home.

- :class:`MemoryBudget` -- bytes held for delivery across every session of
  the node (queued messages of connected sessions, output of congested
  connections, what waits for a slow node link). Plain counters, charged by
  the queues (``session.MessageQueue``), by channels through
  ``ChannelBroker.congestion`` and by cluster links.
- :class:`QueuePacer` -- what the node does when that budget is passed: it
  stops reading from the connections whose messages fill the queues, and
  reads again once the queues drained to half (or stopped draining). The
  transport tells it whose bytes are being handled (``reading``) and gives
  it a timer; it decides whom to pause and when to resume.
- :class:`PreauthBudget` -- bytes of incomplete CONNECTs held for
  connections that have not authenticated (``ChannelBroker.preauth_charge``).

Pure: no asyncio, no clock read; ``schedule(delay, fn)`` (the event loop's
``call_later``) is given.
"""

import logging

log = logging.getLogger("brokerd")

# Memory a queued message costs beyond its payload (Delivery, queue entry and
# its share of the Publish object), charged to the node's MemoryBudget.
QUEUED_OVERHEAD = 256

BUDGET_PAUSE = 0.1       # publishers over the queue budget read again if the queues did not shrink for this long
FEEDER_SWEEPS = 20       # a connection whose messages were queued in the last 10 s (of sweeps) is paused with the rest
PAUSE_BUDGET = 2         # the bit of ``connection.paused`` that is the budget's (brokerd.transports.connection)


class MemoryBudget:
    """Bytes held for delivery across every session of a node.

    Queues (and congested connections) ``add`` their bytes here. With a
    ``limit``, every addition calls ``on_add`` at once, from inside the
    enqueue -- the transport uses it to learn which connections' messages
    are being queued -- and an addition above ``limit`` trips the budget
    first, so that the transport stops reading from those connections in the
    same event-loop iteration; the transport clears ``tripped`` once it has
    seen the queues drain to ``half`` (see ``brokerd.server.Server``).
    """

    __slots__ = ("used", "limit", "half", "tripped", "on_add")

    def __init__(self, limit: int = 0, on_add=None):
        self.used = 0
        self.limit = limit
        self.half = limit // 2
        self.tripped = False
        self.on_add = on_add

    def add(self, delta: int) -> None:
        used = self.used = self.used + delta
        if delta > 0 and self.limit:
            if used > self.limit:
                self.tripped = True
            if self.on_add is not None:
                self.on_add()

class PreauthBudget:
    """Bytes the node holds for connections that have not sent a whole CONNECT
    (their incomplete CONNECTs), shared by every channel: plain counters."""

    __slots__ = ("used", "limit", "refused")

    def __init__(self, limit: int):
        self.used = 0
        self.limit = limit
        self.refused = 0           # connections closed because their bytes would have passed ``limit``

    def charge(self, delta: int) -> bool:
        """Hold ``delta`` more bytes (or let go of -``delta``); False when that
        passes the limit (the caller closes the connection and lets go)."""
        self.used += delta
        if delta > 0 and self.used > self.limit:
            self.refused += 1
            return False
        return True


class QueuePacer:
    """Pauses the publishers whose messages fill the queues past the budget.

    ``budget.on_add`` is this pacer's ``queued``: called from inside every
    enqueue. When that passes the budget, the node stops reading from every
    connection whose messages were queued in the last FEEDER_SWEEPS sweeps,
    now; while the budget stays tripped, from any other as soon as one of
    its messages is queued.

    Only the connections whose messages are queued are paused: a publisher
    whose messages are delivered at once is never held back by another's
    slow subscriber. (Pausing every connection that had published starved
    it: after each resume the blaster's read, handled first, paused it again
    before its own was handled.) The feeders are paused together, before
    they read again, so the queues pass the budget by about one socket read
    (up to 256 KiB), not one per publisher. Connections with deliveries of
    their own outstanding keep reading: their acknowledgements are what
    frees the queues. The pause lasts until the queues are down to half the
    budget, as long as they drain; if they did not shrink at all for
    BUDGET_PAUSE (a subscriber that stopped reading holds them) reading
    resumes and the next message over the budget pauses again, so
    publishers are paced, never stopped for good by one stuck client.

    Connections are the transport's: ``.fed`` (the sweep in which a message
    of theirs was last queued), ``.paused`` (bits), ``.closed``, ``.channel``
    and ``pause_reading(bit)`` / ``resume_reading(bit)``.
    """

    def __init__(self, budget: MemoryBudget, connections, schedule):
        self.budget = budget
        self.connections = connections     # the transport's live connections (a set)
        self.schedule = schedule           # call_later(delay, fn) -> a handle with cancel()
        self.paused: list = []             # connections this pacer paused
        self.reading = None                # the connection whose bytes are being handled
        self.sweeps = 0                    # the clock of ``connection.fed``
        self._pacing = False               # the budget tripped and its feeders are paused
        self._resumed: list = []           # (connection, its bytes_in) of the feeders resumed last
        self._timer = None
        self._mark: int | None = None      # queued bytes at the last check of a pause
        self._warned = False
        budget.on_add = self.queued

    def queued(self) -> None:
        """A message was queued (from inside the enqueue): see the class docstring."""
        conn = self.reading
        if conn is not None:
            conn.fed = self.sweeps
        if not self.budget.tripped:
            return
        if self._pacing:
            if conn is not None and not conn.paused & PAUSE_BUDGET:
                self._pause(conn)
            return
        self._pacing = True
        # a feeder resumed last time that has not been read since (others' reads tripped the budget
        # first) has not shown that it stopped feeding: still one (when its mark expired instead, a
        # thousand publishers each brought one socket read of up to 256 KiB at once, 3 x the budget)
        for c, seen in self._resumed:
            if c.channel.bytes_in == seen:
                c.fed = self.sweeps
        self._resumed = []
        since = self.sweeps - FEEDER_SWEEPS
        for c in self.connections:
            if c.fed >= since and not c.paused & PAUSE_BUDGET:
                self._pause(c)
        if self._timer is None:
            # measured at the first check: the rest of the socket read that
            # tripped the budget is still being handled now
            self._mark = None
            self._timer = self.schedule(BUDGET_PAUSE, self._check_progress)
        if not self._warned:
            self._warned = True
            budget = self.budget
            log.warning("queued messages hold %d bytes (budget %d): pacing the %d publishers that fill them",
                        budget.used, budget.limit, len(self.paused))

    def _pause(self, conn) -> None:
        ch = conn.channel
        if conn.closed or ch.blocked or (ch.session is not None and ch.session.inflight):
            return
        conn.pause_reading(PAUSE_BUDGET)
        ch.paced += 1
        self.paused.append(conn)

    def _check_progress(self) -> None:
        """BUDGET_PAUSE after a pause (and after each one since): still paused
        while the queues drain -- resuming on a timer alone let publishers in
        one socket read per BUDGET_PAUSE whatever the subscribers took, and
        the queues grew past the budget until their QoS 1/2 messages were
        dropped as queue_full after having been acknowledged."""
        self._timer = None
        used = self.budget.used
        if self._mark is None or used < self._mark:
            self._mark = used
            self._timer = self.schedule(BUDGET_PAUSE, self._check_progress)
            return
        self._resume()

    def _resume(self) -> None:
        paused, self.paused = self.paused, []
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.budget.tripped = False
        self._pacing = False
        for conn in paused:
            conn.resume_reading(PAUSE_BUDGET)
        self._resumed = [(conn, conn.channel.bytes_in) for conn in paused if not conn.closed]

    def after_writes(self) -> None:
        """After each round of writes: resume publishers as soon as the queues
        have drained to half the budget."""
        budget = self.budget
        if budget.tripped and budget.used <= budget.half:
            self._resume()
            if self._warned:
                self._warned = False
                log.info("queues drained to %d bytes: publishers resumed", budget.used)

    def sweep(self) -> None:
        """The server's periodic sweep: the feeders' clock ticks; connections
        that went away are let go of."""
        self.sweeps += 1
        if self._resumed:
            self._resumed = [entry for entry in self._resumed if not entry[0].closed]
        self.after_writes()
