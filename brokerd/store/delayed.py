"""The asyncio side of delayed publish (``brokerd.delayed``): write, claim, publish.

Two tasks on the node's event loop:

- the **writer** takes what publishers sent to ``$delayed/...`` (gathered by
  the broker in a ``DelayedQueue``), writes it to the store in one call per
  batch -- group commit, as ``writer.StoreWriter`` does for sessions -- and
  only then lets the publishers' PUBACK/PUBREC go. A failed write is a
  negative ack (v5 0x83; 3.x: disconnected), never a message acknowledged
  and lost.
- the **releaser** asks the store every ``poll`` seconds for the messages
  that are due (at most ``batch`` a round, from the store's due index; a full
  round is followed by another at once), publishes them through the broker,
  and deletes them once what the publish wrote for persistent sessions is
  durable.

Exactly once, with several nodes on one store: a message is *claimed* before
it is published -- atomically in the store, for ``lease`` seconds, by one
node (``Store.delayed_claim``) -- so no two nodes publish it. A node that
dies between its claim and the delete leaves the message to be claimed again
when the lease ends: published a second time only if the node died in the
few milliseconds between publishing it and the delete (at least once then, as
a QoS 1 redelivery is). Messages survive a restart or a SIGKILL of every
node: they are in the store, and whichever node runs when they are due
publishes them (late by as long as no node ran).

With ``--store memory://`` the messages live in a ``MemoryStore`` of the
node: same code, nothing survives the process.
"""

import asyncio
import contextlib
import logging
import time
import uuid

from ..protocol import properties as P
from ..protocol.packets import Publish
from .base import StoreError
from .records import DelayedMessage, StoredMessage

log = logging.getLogger("brokerd.delayed")

POLL = 0.5            # seconds between two looks for due messages
BATCH = 200           # due messages claimed (and published) per round at most
LEASE = 30.0          # seconds a claim holds a message for its node
COUNT_EVERY = 10.0    # seconds between two reads of every tenant's pending count (the cap, cluster-wide)


class DelayedRunner:
    def __init__(self, store, queue, broker, loop: asyncio.AbstractEventLoop, owner: str, *, wall=time.time,
                 poll: float = POLL, batch: int = BATCH, lease: float = LEASE):
        self.store = store
        self.queue = queue
        self.broker = broker
        self.loop = loop
        self.owner = f"{owner}/{uuid.uuid4().hex[:12]}"     # this process: a restarted node is another holder
        self.wall = wall
        self.poll = poll
        self.batch = batch
        self.lease = lease
        self._event = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._tasks: list[asyncio.Task] = []
        self._stopping = asyncio.Event()
        self._undeleted: list[DelayedMessage] = []      # published, delete not yet written
        self._last_ns = 0                               # the time part of the last id made (_new_id)
        self.written = 0
        self.published = 0
        queue.wake = self._wake

    def _wake(self) -> None:
        self._event.set()
        self._idle.clear()

    def start(self) -> None:
        self._tasks = [self.loop.create_task(self._write_loop(), name="delayed-writer"),
                       self.loop.create_task(self._release_loop(), name="delayed-releaser")]
        if self.queue.pending:
            self._wake()

    async def stop(self, timeout: float = 5.0) -> None:
        """The round being released is finished first (published and deleted): a
        message published and not deleted would be published again after the lease."""
        self._stopping.set()
        if self._tasks:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._tasks[1]), timeout)
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except asyncio.CancelledError:
                pass
        self._tasks = []

    async def drain(self, timeout: float = 10.0) -> bool:
        """Wait until what publishers sent so far is written; False on timeout."""
        self._event.set()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return not self.queue.pending

    # ------------------------------------------------------------- writer

    async def _write_loop(self) -> None:
        queue = self.queue
        while True:
            await self._event.wait()
            self._event.clear()
            taken = queue.drain()
            if not taken:
                await self._purge()
                self._idle.set()
                continue
            items = [DelayedMessage(self._new_id(), tenant, due,
                                    StoredMessage(m.topic, m.payload, m.qos, m.retain, m.properties), publisher)
                     for tenant, due, m, _, publisher in taken]
            try:
                await self.store.delayed_add(items)
                ok = True
                if not queue.healthy:
                    log.warning("delayed messages: the store takes them again")
                queue.healthy = True
                self.written += len(items)
            except StoreError as exc:
                ok = False
                if queue.healthy:
                    log.error("delayed messages: the store refused them (%s); their publishers get negative "
                              "acknowledgements (QoS 0 ones are lost)", exc)
                queue.healthy = False
                for tenant, *_ in taken:
                    queue.gone(tenant)
            for _, _, _, ack, _ in taken:
                if ack is not None:
                    try:
                        ack(ok)
                    except Exception:
                        log.exception("delayed messages: acknowledging failed")
            await self._purge()
            if queue.pending:
                self._event.set()
            else:
                self._idle.set()

    def _new_id(self) -> str:
        """A unique id that sorts after every id this process made before (and, the wall clock
        permitting, before any made after a restart): the store claims messages due at the same time
        in the order of their ids, and the loop's clock is millisecond-grained -- messages taken within
        one millisecond share their due time, and random ids released them shuffled."""
        ns = self._last_ns = max(time.time_ns(), self._last_ns + 1)
        return f"{ns:016x}{uuid.uuid4().hex[:16]}"

    async def _purge(self) -> None:
        """Delete the messages of tenants deleted meanwhile (``DelayedQueue.forget``), after
        what was taken before is written. A store that fails leaves them to the check at
        their release (a tenant that does not exist then gets nothing)."""
        queue = self.queue
        while queue.purge:
            tenant = queue.purge.pop(0)
            try:
                n = await self.store.delayed_purge(tenant)
            except StoreError as exc:
                log.error("delayed messages of the deleted tenant %r not deleted (%s)", tenant, exc)
                continue
            if n:
                log.info("delayed messages: %d of the deleted tenant %r deleted", n, tenant)

    # ----------------------------------------------------------- releaser

    async def _release_loop(self) -> None:
        counted = -COUNT_EVERY
        while not self._stopping.is_set():
            now = self.loop.time()
            try:
                if now - counted >= COUNT_EVERY:
                    self.queue.refresh(await self.store.delayed_counts())
                    counted = now
                full = await self.release_due()
            except StoreError as exc:
                log.warning("delayed messages: store unavailable (%s); retrying", exc)
                full = False
            except Exception:
                log.exception("delayed messages: releasing failed")
                full = False
            if not full:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), self.poll)

    async def release_due(self) -> bool:
        """One round: delete what was published, claim what is due, publish it;
        -> whether the round was full (more may be due)."""
        if self._undeleted:
            await self.store.delayed_done(self._undeleted)
            self._undeleted = []
        claimed = await self.store.delayed_claim(self.wall(), self.owner, self.lease, self.batch)
        if not claimed:
            return False
        broker = self.broker
        now = self.loop.time()
        for m in claimed:
            broker.release_delayed(m.tenant, _publish(m.msg, now), now, m.publisher)
            self.queue.gone(m.tenant)
        self.published += len(claimed)
        journal = broker.journal
        if journal is not None and journal:
            # what the publish queued for persistent sessions is durable before the delete
            done = self.loop.create_future()
            journal.after_commit(lambda ok: done.done() or done.set_result(ok))
            await done
        self._undeleted = claimed
        await self.store.delayed_done(claimed)
        self._undeleted = []
        return len(claimed) >= self.batch


def _publish(m: StoredMessage, now: float) -> Publish:
    msg = Publish(m.topic, m.payload, m.qos, m.retain, False, 0, m.properties)
    expiry = m.properties.get(P.MESSAGE_EXPIRY_INTERVAL) if m.properties else None
    if expiry is not None:
        msg.expiry_at = now + expiry
    return msg
