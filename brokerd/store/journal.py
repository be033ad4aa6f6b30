"""The journal: store writes the broker wants, gathered for group commit.

The broker (pure, no I/O) appends operations and "after commit" callbacks;
the asyncio ``StoreWriter`` takes everything gathered so far as one batch,
applies it to the store in one transaction, then runs the callbacks with
``ok``. While one batch is being written the next one gathers, so the batch
size follows the load and a write waits at most for the batch before it.

Operations are tuples, first element the kind:

- ``("session", tenant, cid, expiry_interval, disconnected_at, will_blob, will_due, device, sent)``
  -- ``sent``: the highest queue entry number sent to the client (``SessionRecord.sent``), or None
- ``("session_del", tenant, cid)``           -- with its subscriptions, queue and packet ids
- ``("sub", tenant, cid, SubscriptionRecord)`` / ``("unsub", tenant, cid, filter)``
- ``("q", tenant, cid, QueueEntry)``         -- append to the session's queue; the store sets
  ``entry.seq`` from the session's counter as it commits (ordered across nodes)
- ``("q_state", tenant, cid, QueueEntry)``   -- QoS 2: PUBREC received, PUBREL owed (``entry.state``)
- ``("q_del", tenant, cid, QueueEntry)``     -- acknowledged, expired or dropped
- ``("rel", tenant, cid, pid)`` / ``("rel_del", tenant, cid, pid)`` -- incoming QoS 2 ids
- ``("retain", tenant, topic, StoredMessage)`` / ``("retain_del", tenant, topic)``
"""


class Journal:
    __slots__ = ("ops", "waiters", "wake", "healthy", "generation", "committed", "error")

    def __init__(self, wake=None):
        self.ops: list = []
        self.waiters: list = []
        self.wake = wake                  # called when the journal goes from empty to not empty
        self.healthy = True               # False while the store refuses writes
        self.generation = 1               # the batch now gathering
        self.committed = 0                # the last batch known durable
        self.error: str | None = None

    def __bool__(self):
        return bool(self.ops) or bool(self.waiters)

    def add(self, op: tuple) -> None:
        if not self.ops and not self.waiters and self.wake is not None:
            self.wake()
        self.ops.append(op)

    def after_commit(self, fn) -> None:
        """Run ``fn(ok)`` once everything added so far is durable (or failed)."""
        if not self.ops and not self.waiters and self.wake is not None:
            self.wake()
        self.waiters.append(fn)

    def take(self) -> tuple[int, list, list]:
        """-> (generation, ops, waiters) of the batch to write; a new batch starts gathering."""
        gen = self.generation
        ops, waiters = self.ops, self.waiters
        self.ops, self.waiters = [], []
        self.generation = gen + 1
        return gen, ops, waiters
