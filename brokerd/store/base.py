"""The store interface every backend implements.

A backend is written as blocking methods (``_open``, ``_apply``, ``_load``,
``_load_session``, ``_purge``, ``_ping``, ``_close``); :class:`Store` runs them
on one dedicated thread so the event loop never waits on disk or network and
the backend needs no locking. ``apply`` takes a batch of journal operations
(see ``brokerd.store.journal``) and makes all of them durable, atomically
where the backend can (SQLite), in order otherwise (HBase).

Failures come in two kinds, and the writer treats them differently:
:class:`StoreError` -- the store is unreachable, locked, out of space, its
connection dropped: the same batch will be taken once it is back, so it is
retried -- and :class:`StoreDataError` -- an operation the store can never
take whatever its state (a value out of the range of its encoding, a type it
cannot bind, a constraint it breaks): retrying it would block every write
behind it forever, so it is isolated and dropped. A backend names the
exceptions of the second kind in ``data_errors``; anything else is the first.
"""

import asyncio
import concurrent.futures
import functools
import struct

from .records import DelayedMessage, SessionRecord, StoredMessage


class StoreError(Exception):
    """The store is unavailable or refused an operation."""


class StoreDataError(StoreError):
    """An operation of the batch can never be written (retrying cannot help)."""


# raised while turning an operation into the backend's values: the same every time
DATA_ERRORS = (struct.error, OverflowError, ValueError, TypeError, KeyError)


class Store:
    durable = True
    scheme = ""
    remote = False          # a network service: worth waiting for at start-up
    pipeline = 1            # write batches the writer may have in flight at once (see ``apply``)
    data_errors: tuple = DATA_ERRORS    # what StoreDataError stands for (see the module docstring)

    def __init__(self, url: str):
        self.url = url
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._aside: concurrent.futures.ThreadPoolExecutor | None = None

    def __repr__(self):
        return f"<{type(self).__name__} {self.url}>"

    # ------------------------------------------------------------ async API

    async def _run(self, fn, *args):
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"store-{self.scheme}")
        return await self._run_in(self._executor, fn, *args)

    async def _run_aside(self, fn, *args):
        """``fn`` on a second thread of the store's, beside the writes (a remote
        backend's long maintenance work, on its own connection: HBase's purge)."""
        if self._aside is None:
            self._aside = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"store-{self.scheme}-aside")
        return await self._run_in(self._aside, fn, *args)

    async def _run_in(self, executor, fn, *args):
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(executor, functools.partial(fn, *args))
        except StoreError:
            raise
        except self.data_errors as exc:
            raise StoreDataError(f"{type(exc).__name__}: {exc}") from exc
        except Exception as exc:  # backend-specific failures become StoreError
            raise StoreError(f"{type(exc).__name__}: {exc}") from exc

    async def _read(self, fn, *args):
        """A read, tried a second time if the first fails: a pooled connection to a
        server that restarted fails once and is replaced (happybase drops a connection
        on a Thrift or socket error). Reads only -- a write batch is never replayed."""
        try:
            return await self._run(fn, *args)
        except StoreError:
            return await self._run(fn, *args)

    async def open(self) -> None:
        await self._run(self._open)

    async def close(self) -> None:
        if self._aside is not None:
            aside, self._aside = self._aside, None
            await asyncio.get_running_loop().run_in_executor(None, aside.shutdown)
        if self._executor is not None:
            try:
                await self._run(self._close)
            finally:
                self._executor.shutdown(wait=True)
                self._executor = None

    async def apply(self, ops: list, prepared=None) -> None:
        """Make ``ops`` durable. A backend with ``pipeline`` > 1 takes the next
        batch while this one is in flight: it resolves the future ``prepared``
        once the next may be prepared, keeps batches applied in the order of
        their calls where they touch the same rows, and fails a batch whose
        predecessor it depends on failed (the writer then writes both again,
        in order)."""
        if ops:
            await self._run(self._apply, ops)

    async def load(self) -> tuple[list[SessionRecord], list[tuple[str, str, StoredMessage]]]:
        """Every session (with subscriptions, queue, packet ids) and every retained message."""
        return await self._read(self._load)

    async def load_retained(self) -> list[tuple[str, str, StoredMessage]]:
        """Every retained message (a cluster node loads sessions on demand)."""
        return await self._read(self._load_retained)

    async def load_session(self, tenant: str, client_id: str) -> SessionRecord | None:
        return await self._read(self._load_session, tenant, client_id)

    async def session_keys(self, after: tuple[str, str] | None, limit: int) -> list[tuple[str, str]]:
        """Up to ``limit`` stored sessions' keys (tenant, client id), in ascending order, those
        after ``after`` (None: from the first) -- no subscriptions, queues or packet ids: a walk
        over every session a page at a time (``after`` the last key of the page before) holds one
        page, whatever the store holds. A session made or deleted during the walk may or may not
        be listed; every other is listed once."""
        if limit <= 0:
            return []
        return await self._read(self._session_keys, after, limit)

    async def purge(self, now: float) -> int:
        """Delete sessions and messages whose expiry (wall clock) has passed; -> rows removed."""
        return await self._run(self._purge, now)

    async def ping(self) -> None:
        await self._run(self._ping)

    async def get_meta(self, key: str) -> bytes | None:
        """A small named value kept for the cluster (its route snapshot)."""
        return await self._read(self._get_meta, key)

    async def put_meta(self, key: str, value: bytes) -> None:
        await self._run(self._put_meta, key, value)

    # ---------------------------------------------------- delayed messages
    # ``$delayed/{seconds}/{topic}`` (brokerd.delayed). Nodes sharing the store
    # take due messages with ``delayed_claim``: a message is handed to one
    # claimer at a time, for ``lease`` seconds; the claimer publishes it and
    # deletes it (``delayed_done``). A claimer that dies before the delete
    # leaves the message to whoever claims it after the lease.

    async def delayed_add(self, items: list[DelayedMessage]) -> None:
        """Store delayed messages (one transaction where the backend has them)."""
        if items:
            await self._run(self._delayed_add, items)

    async def delayed_claim(self, now: float, owner: str, lease: float, limit: int) -> list[DelayedMessage]:
        """Up to ``limit`` messages due at ``now`` (wall clock) that nobody holds
        (or whose holder's lease ran out), earliest first (those due at the same time in the
        order of their ids: a node's ids sort in the order it took them), now held by ``owner``
        until ``now + lease``: two claimers never get the same message in one lease."""
        return await self._run(self._delayed_claim, now, owner, now + lease, limit)

    async def delayed_done(self, items: list[DelayedMessage]) -> None:
        """Published: delete them (as ``delayed_claim`` returned them)."""
        if items:
            await self._run(self._delayed_done, items)

    async def delayed_purge(self, tenant: str) -> int:
        """Delete every delayed message of ``tenant`` (deleted); -> how many."""
        return await self._run(self._delayed_purge, tenant)

    async def delayed_counts(self) -> dict[str, int]:
        """Pending delayed messages per tenant (tenants with none are left out)."""
        return await self._read(self._delayed_counts)

    # ------------------------------------------------- backend (blocking)

    def _open(self) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        pass

    def _apply(self, ops: list) -> None:
        raise NotImplementedError

    def _load(self):
        raise NotImplementedError

    def _load_session(self, tenant, client_id):
        raise NotImplementedError

    def _load_retained(self):
        return self._load()[1]

    def _session_keys(self, after, limit):
        raise NotImplementedError

    def _purge(self, now: float) -> int:
        raise NotImplementedError

    def _ping(self) -> None:
        pass

    def _get_meta(self, key):
        raise NotImplementedError

    def _delayed_add(self, items):
        raise NotImplementedError

    def _delayed_claim(self, now, owner, until, limit):
        raise NotImplementedError

    def _delayed_done(self, items):
        raise NotImplementedError

    def _delayed_purge(self, tenant):
        raise NotImplementedError

    def _delayed_counts(self):
        raise NotImplementedError

    def _put_meta(self, key, value):
        raise NotImplementedError


def session_expired(rec: SessionRecord, now: float) -> bool:
    return (rec.disconnected_at is not None and rec.expiry_interval != 0xFFFFFFFF
            and rec.disconnected_at + rec.expiry_interval <= now)
