"""What the rules' actions hold between the publish path and their I/O: the webhook
sender's requests and the telemetry writer's rows, queued per tenant.

Queuing is O(1) with no I/O and no await (it runs inside the publish path). The
queues are bounded in bytes per tenant and for the node; when a bound would be
passed the OLDEST item is dropped -- the tenant's own, or for the node's bound the
oldest of the tenant holding the most bytes, so one busy tenant cannot push out
the others' -- counted in its rule's ``dropped`` and ``failed`` (the console's
*rule actions dropped* alarm reads them) and logged as a warning at most every
ALARM_EVERY seconds per node.
"""

import time
from collections import deque

ALARM_EVERY = 10.0


class Job:
    __slots__ = ("item", "state", "tenant")

    def __init__(self, tenant, item, state):
        self.tenant, self.item, self.state = tenant, item, state


class TenantBuffers:
    WHAT = "buffer"         # the buffer's name in the rules' errors and the warning: "webhook", "telemetry"
    ITEMS = "items"         # what it holds, for the warning: "requests", "rows"

    def __init__(self, node_bytes: int, tenant_bytes: int, log, wall=time.time):
        self.node_bytes, self.tenant_bytes = node_bytes, tenant_bytes
        self.log = log
        self.wall = wall
        self.queues: dict[str, deque] = {}         # tenant -> its jobs, oldest first
        self.queued: dict[str, int] = {}           # tenant -> bytes
        self.total = 0                             # bytes queued on the node
        self.dropped = 0
        self._last_alarm = -ALARM_EVERY

    def _queue(self, tenant: str, item, state) -> bool:
        """Queue ``item`` (it has a ``size``) after dropping what the bounds need; False: dropped itself."""
        size = item.size
        if size > self.tenant_bytes or size > self.node_bytes:
            self._drop(Job(tenant, item, state), f"larger than the {self.WHAT} buffer")
            return False
        while self.queued.get(tenant, 0) + size > self.tenant_bytes:
            self._drop(self._pop(tenant), f"the tenant's {self.WHAT} buffer was full (oldest dropped)")
        while self.total + size > self.node_bytes:
            biggest = max(self.queued, key=self.queued.__getitem__)
            self._drop(self._pop(biggest), f"the node's {self.WHAT} buffer was full (oldest dropped)")
        q = self.queues.get(tenant)
        if q is None:
            q = self.queues[tenant] = deque()
            self.queued[tenant] = 0
        q.append(Job(tenant, item, state))
        self.queued[tenant] += size
        self.total += size
        return True

    def _pop(self, tenant: str) -> Job:
        q = self.queues[tenant]
        job = q.popleft()
        self.queued[tenant] -= job.item.size
        self.total -= job.item.size
        if not q:
            del self.queues[tenant]
            del self.queued[tenant]
        return job

    def _drop(self, job: Job, why: str) -> None:
        self.dropped += 1
        job.state.dropped += 1
        job.state.fail(f"dropped: {why}", self.wall())
        now = time.monotonic()
        if now - self._last_alarm >= ALARM_EVERY:
            self._last_alarm = now
            self.log.warning("%s buffer full: dropping the oldest %s (tenant %s; %d dropped on this node so far; "
                             "%d bytes queued)", self.WHAT, self.ITEMS, job.tenant, self.dropped, self.total)
