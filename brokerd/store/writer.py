"""Group commit: the asyncio task that writes the journal to the store.

It takes whatever the broker gathered as one batch, applies it (one
transaction on the store's thread), marks the batch durable, lets the broker
send what waited for it, and runs the batch's callbacks. While a batch is
being written the next one gathers: under load batches grow, idle they hold
one operation, and nothing waits for a timer.

When the store fails, the batch's callbacks learn it at once (publishers get
their negative acks), the journal is marked unhealthy -- new QoS 1/2 messages
that need the store are refused -- and the failed operations are retried,
with backoff, ahead of newer ones until the store takes them again.

That is right while the store is unavailable, and wrong for an operation the
store can never take (``StoreDataError``, see ``base.py``): retried ahead of
everything it would keep the store "unavailable" until a restart (an admin
publish with a Message Expiry Interval of -1 did: every persistent QoS 1
message of every tenant got 0x83). Such a batch is halved until the failing
operations stand alone; each of those is dropped -- logged, counted in
``dropped`` (the admin API's metrics, ``store.writes_dropped``, and
Prometheus) -- and the rest is written in order; the batch's callbacks hear
"durable" (what was dropped never could be). Nothing is dropped because the
store is down: a single operation is dropped only when it fails by itself
with a data error.

Pipelining. A store with ``pipeline`` > 1 (HBase: a batch is a few network
round trips) gets the next batch once the previous one is prepared, while it
is still being sent, up to ``pipeline`` batches in flight. Batches finish in
any order; they are committed in the order they were taken (``committed``
only moves forward, callbacks run batch by batch). When one fails, every
batch taken after it fails with it -- their callbacks hear False, however
their own writes went: no acknowledgement is released ahead of an earlier
batch's -- and all of them are written again, in order, one batch at a time
(the retry above; a data error is isolated the same way) until the store
takes them; then pipelining resumes.

Abandoning. A node of a cluster that fenced itself (cut off from the bus,
``cluster.fencing``) leaves its sessions to the others, who read them from
the store once its membership expires. What its store has not taken by then
is given up (``abandon``): written later -- when the network heals, say --
it would land over what the others wrote since (a subscription a client
made again there, removed by the old UNSUBSCRIBE). The batches taken
before are not retried, their callbacks hear False; the journal's health is
found again by pinging the store, since nothing may be left to retry. A
batch already on its way to the store cannot be called back: it lands
within the store's own call timeout, or fails.
"""

import asyncio
import collections
import logging

from .base import StoreDataError, StoreError

log = logging.getLogger("brokerd.store")

RETRY_MIN = 0.05
RETRY_MAX = 2.0


class StoreWriter:
    def __init__(self, store, journal, broker, loop: asyncio.AbstractEventLoop):
        self.store = store
        self.journal = journal
        self.broker = broker
        self.loop = loop
        self._event = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._retry: list = []
        self._delay = RETRY_MIN                # the next retry's backoff
        self._task: asyncio.Task | None = None
        self.batches = 0
        self.ops_written = 0
        self.dropped = 0                   # operations the store could never take
        self.last_dropped: str | None = None
        self.abandoned = 0                 # operations given up by ``abandon`` (a fenced node)
        self._abandoned_below = 0          # batches of an older generation are never retried
        self._single = False               # the next batch alone (after batches given up while failing)
        self._probe: asyncio.Task | None = None
        journal.wake = self._wake

    def _wake(self) -> None:
        self._event.set()
        self._idle.clear()

    def start(self) -> None:
        self._task = self.loop.create_task(self._run(), name="store-writer")
        if self.journal:
            self._wake()        # gathered before the writer existed (restore at start-up)

    async def _run(self) -> None:
        journal = self.journal
        depth = max(1, int(getattr(self.store, "pipeline", 1)))
        while True:
            if depth > 1 and not self._retry and not self._single:
                await self._pipelined(depth)         # returns after a failure, with _retry set
                continue
            await self._event.wait()
            self._event.clear()
            if not journal and not self._retry:
                self._idle.set()
                continue
            gen, ops, waiters = journal.take()
            batch = self._retry + ops if self._retry else ops
            try:
                await self._write(batch)
            except _Unwritten as failed:
                await self._failed(failed, waiters, gen)
                continue
            self._committed(gen, batch, waiters)
            if journal:
                self._event.set()
            else:
                self._idle.set()

    async def _pipelined(self, depth: int) -> None:
        """Up to ``depth`` batches in flight, committed in order (module docstring)."""
        journal = self.journal
        flight: collections.deque = collections.deque()     # _InFlight, oldest first
        while True:
            if self._single and not flight:
                return                               # the next batch alone (``_failed``)
            self._event.clear()
            while len(flight) < depth and journal and (not flight or flight[-1].prepared.done()):
                gen, ops, waiters = journal.take()
                prepared = self.loop.create_future()
                flight.append(_InFlight(gen, ops, waiters, prepared,
                                        self.loop.create_task(self.store.apply(ops, prepared))))
            if not flight:
                self._idle.set()
                await self._event.wait()
                continue
            wake = [flight[0].task]
            if len(flight) < depth:
                # room for another batch: once the last one is prepared and there is something to take
                wake.append(flight[-1].task if flight[-1].prepared.done() else flight[-1].prepared)
                waiting = self.loop.create_task(self._event.wait())
                wake.append(waiting)
            else:
                waiting = None
            await asyncio.wait(wake, return_when=asyncio.FIRST_COMPLETED)
            if waiting is not None:
                waiting.cancel()
            while flight and flight[0].task.done():
                done = flight.popleft()
                exc = done.task.exception()
                if exc is None:
                    self._committed(done.gen, done.ops, done.waiters)
                    continue
                # it failed: so do the batches after it, whatever became of them
                later = list(flight)
                flight.clear()
                if later:
                    await asyncio.wait([b.task for b in later])
                    for b in later:
                        b.task.exception()           # (retrieved: they count as failed)
                waiters = [fn for b in (done, *later) for fn in b.waiters]
                # batches taken before ``abandon`` are given up, not written again
                failed = [b for b in (done, *later) if b.gen >= self._abandoned_below]
                self._given_up([op for b in (done, *later) if b.gen < self._abandoned_below for op in b.ops])
                ops = [op for b in failed for op in b.ops]
                gen = failed[-1].gen if failed else 0
                if not failed or not isinstance(exc, StoreDataError):
                    error = exc if isinstance(exc, StoreError) else StoreError(f"{type(exc).__name__}: {exc}")
                    await self._failed(_Unwritten(ops, error), waiters, gen)
                    return
                try:
                    await self._write(ops)         # one at a time: isolates what can never be written
                except _Unwritten as unwritten:
                    await self._failed(unwritten, waiters, gen)
                    return
                self._committed(gen, ops, waiters)

    async def _failed(self, failed: "_Unwritten", waiters: list, gen: int) -> None:
        """The store did not take a batch (``gen``: its newest generation): tell its waiters,
        retry it after a backoff -- unless it was given up while on its way (``abandon``)."""
        journal = self.journal
        exc = failed.error
        if journal.healthy:
            log.error("session store unavailable: %s; refusing QoS 1/2 messages that need it", exc)
        journal.healthy = False
        journal.error = str(exc)
        self._call(waiters, False)
        if gen < self._abandoned_below:
            # nothing to write again; the next batch goes alone, as a retry would (a pipelining store
            # refuses batches in flight after a failure until one is written by itself)
            self._given_up(failed.ops)
            self._single = True
            self._start_probe()
            self._event.set()
            return
        self._retry = failed.ops
        await asyncio.sleep(self._delay)
        self._delay = min(self._delay * 2, RETRY_MAX)
        self._event.set()

    def abandon(self) -> int:
        """Give up every write not taken by the store yet, and any batch on its way there that
        fails (module docstring: a fenced node); their callbacks hear False. -> how many
        operations were given up now."""
        journal = self.journal
        _, ops, waiters = journal.take()
        given = self._retry + ops
        self._retry = []
        self._delay = RETRY_MIN
        self._abandoned_below = journal.generation
        self._given_up(given)
        self._call(waiters, False)
        if not journal.healthy:
            self._single = True
            self._start_probe()
            self._event.set()
        return len(given)

    def _given_up(self, ops: list) -> None:
        self.abandoned += len(ops)

    def _start_probe(self) -> None:
        """Nothing may be left to retry: ping the store until it answers, then the journal is healthy."""
        if self._probe is None or self._probe.done():
            self._probe = self.loop.create_task(self._ping_until_healthy(), name="store-probe")

    async def _ping_until_healthy(self) -> None:
        journal = self.journal
        delay = RETRY_MIN
        while not journal.healthy and not self._retry:
            try:
                await self.store.ping()
            except Exception as exc:
                journal.error = f"{type(exc).__name__}: {exc}"
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)
                continue
            if not journal.healthy and not self._retry:
                log.warning("session store available again")
                journal.healthy = True
                journal.error = None
            return

    def _committed(self, gen: int, batch: list, waiters: list) -> None:
        """Batch ``gen`` (and every one before it) is durable."""
        journal = self.journal
        self._retry = []
        self._single = False
        self._delay = RETRY_MIN
        self.batches += 1
        self.ops_written += len(batch)
        if not journal.healthy:
            log.warning("session store available again")
            journal.healthy = True
            journal.error = None
        journal.committed = gen
        try:
            self.broker.commit_done(gen, self.loop.time())
        except Exception:
            log.exception("sending after commit failed")
        self._call(waiters, True)

    async def _write(self, batch: list) -> None:
        """Apply ``batch`` in order, dropping the operations the store can never
        take; raises ``_Unwritten`` with what is left when the store is unavailable."""
        pending = [batch]                  # chunks still to write, the next one last
        while pending:
            chunk = pending.pop()
            try:
                await self.store.apply(chunk)
            except StoreDataError as exc:
                if len(chunk) == 1:
                    self._drop(chunk[0], exc)
                else:
                    half = len(chunk) // 2
                    pending += [chunk[half:], chunk[:half]]
            except StoreError as exc:
                raise _Unwritten([op for c in [chunk, *reversed(pending)] for op in c], exc)

    def _drop(self, op: tuple, exc: StoreError) -> None:
        self.dropped += 1
        what = f"{op[0]} {op[1]!r} {op[2]!r}" if len(op) > 2 else repr(op[:2])
        self.last_dropped = f"{what}: {exc}"[:500]
        log.error("session store: dropped a write it can never take (%s): %s; the other writes of its batch "
                  "went on", what[:200], exc)

    @staticmethod
    def _call(waiters, ok: bool) -> None:
        for fn in waiters:
            try:
                fn(ok)
            except Exception:
                log.exception("after-commit callback failed")

    async def drain(self, timeout: float = 10.0) -> bool:
        """Wait until everything gathered so far is written; False on timeout."""
        self._event.set()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return not self.journal and not self._retry

    async def written(self, timeout: float) -> bool:
        """Wait until everything gathered so far is durable (what is gathered after is not waited
        for: under load the writer is never idle, and ``drain`` would wait for that); False on
        timeout, or when the store failed it (it is retried)."""
        fut = self.loop.create_future()

        def done(ok: bool) -> None:
            if not fut.done():
                fut.set_result(ok)

        self.journal.after_commit(done)          # (it wakes the writer when nothing else would)
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            return False

    async def stop(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None


class _InFlight:
    """A batch the writer took and the store is writing (pipelining)."""

    __slots__ = ("gen", "ops", "waiters", "prepared", "task")

    def __init__(self, gen, ops, waiters, prepared, task):
        self.gen, self.ops, self.waiters, self.prepared, self.task = gen, ops, waiters, prepared, task


class _Unwritten(Exception):
    """The store is unavailable: ``ops`` (in order) are still to be written."""

    def __init__(self, ops: list, error: StoreError):
        super().__init__(str(error))
        self.ops = ops
        self.error = error
