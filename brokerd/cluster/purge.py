"""One node of a cluster at a time purges the shared store.

Every node runs the purge timer, but on a shared store (HBase) a pass is a
scan of whole tables: N nodes scanning at once is N times the load for the
same deletions. The pass runs only on the node holding the ``purge`` lease
in Redis; the holder renews it while its pass runs and at each of its
passes, so it stays with one node (whose resumable cursor it keeps) until
that node stops renewing -- then, after ``ttl``, another node takes it.
Losing the lease mid-pass (Redis unreachable, a slow renewal) stops the pass
at its next page: two nodes never purge at once for longer than one page.
"""

import asyncio
import logging

log = logging.getLogger("brokerd.store")

LEASE = "purge"


async def purge_under_lease(store, bus, now: float, ttl: float) -> int | None:
    """One purge pass if this node holds (or takes) the lease; -> rows removed,
    or None when another node holds it."""
    try:
        if not await bus.lease(LEASE, ttl):
            return None
    except Exception as exc:              # Redis unreachable: nobody can know who purges; skip
        log.warning("store purge skipped: the purge lease is unavailable: %s", exc)
        return None
    task = asyncio.ensure_future(store.purge(now))
    while True:
        done, _ = await asyncio.wait({task}, timeout=ttl / 3)
        if done:
            return task.result()
        try:
            held = await bus.lease(LEASE, ttl)
        except Exception:
            held = False
        if not held:
            log.warning("store purge: the purge lease was lost; stopping the pass (it resumes later)")
            stop = getattr(store, "stop_purge", None)
            if stop is not None:
                stop()
