"""Requests this node made to other nodes, until their answer, their deadline
or the loss of the node asked (no I/O, no clock: deadlines come in, ``now``
comes in).

- **ACK** -- a forwarded message that node stores for its sessions (or a
  message held for a session on the move): the publisher is acknowledged
  once every such part answered. ``waiter(ok)`` runs on the ACK, or with
  False at the deadline or when the node is lost.
- **asks** -- a TAKEOVER (answered by RELEASED) and the handoff's HANDOFF and
  SYNC (answered by HOLDING / SYNCED): ``done(answer)``, or ``done(LATE)``
  at the deadline, ``done(LOST)`` when the node is lost; ``ask`` is the
  asyncio side, a coroutine that returns the answer.

An answer counts only from the node it was asked of: request ids are a
counter, easy to guess.
"""

import asyncio
import itertools

ACK_TIMEOUT = 5.0           # how long a publisher waits for another node to store its message
RELEASE, ANSWER = 0, 1      # what answers an ask: RELEASED, or HOLDING / SYNCED
LATE = object()             # an ask's answer when none came by its deadline
LOST = object()             # ... when the node asked was lost (its link, its membership) or this node fenced


class Requests:
    def __init__(self, wake=None):
        self.ids = itertools.count(1)
        self.acks: dict[int, tuple] = {}      # req -> (waiter or None, deadline, node asked)
        self.asks: dict[int, tuple] = {}      # req -> (RELEASE | ANSWER, done, deadline, node asked)
        self.wake = wake                      # wake(deadline) when an ask is made (the caller arms a timer)

    # ---------------------------------------------------------------- ACKs

    def expect_ack(self, req: int, node: str, deadline: float, waiter=None) -> None:
        self.acks[req] = (waiter, deadline, node)

    def wait_for(self, reqs: list, waiter) -> None:
        """Run ``waiter(ok)`` for each ACK of ``reqs`` (or its failure)."""
        acks = self.acks
        for req in reqs:
            entry = acks.get(req)
            if entry is not None:
                acks[req] = (waiter, entry[1], entry[2])

    def resolver(self, req: int):
        """A waiter that completes the request ``req`` (as its ACK would)."""
        def resolve(ok: bool) -> None:
            entry = self.acks.pop(req, None)
            if entry is not None and entry[0] is not None:
                entry[0](ok)
        return resolve

    def acked(self, req: int, node: str | None, ok: bool) -> None:
        entry = self.acks.get(req)
        if entry is not None and entry[2] == node:
            del self.acks[req]
            if entry[0] is not None:
                entry[0](ok)

    # ---------------------------------------------------------------- asks

    def ask(self, kind: int, node: str, deadline: float, done) -> int:
        req = next(self.ids)
        self.asks[req] = (kind, done, deadline, node)
        if self.wake is not None:
            self.wake(deadline)
        return req

    def answered(self, kind: int, req: int, node: str | None, answer) -> None:
        entry = self.asks.get(req)
        if entry is not None and entry[0] == kind and entry[3] == node:
            del self.asks[req]
            entry[1](answer)

    def discard(self, req: int) -> None:
        self.asks.pop(req, None)

    def next_deadline(self) -> float | None:
        """The earliest deadline of an ask (ACKs are looked at by the node's timer round)."""
        return min((e[2] for e in self.asks.values()), default=None)

    # ----------------------------------------------------- failures, time

    def fail(self, node: str | None) -> None:
        """``node`` is lost (None: every node -- this one fenced itself)."""
        for req, (waiter, _, peer) in list(self.acks.items()):
            if node is None or peer == node:
                del self.acks[req]
                if waiter is not None:
                    waiter(False)
        for req, (_, done, _, peer) in list(self.asks.items()):
            if node is None or peer == node:
                del self.asks[req]
                done(LOST)

    def expire(self, now: float) -> None:
        """What was not answered by its deadline fails."""
        for req, (waiter, deadline, _) in list(self.acks.items()):
            if deadline < now:
                del self.acks[req]
                if waiter is not None:
                    waiter(False)
        for req, (_, done, deadline, _) in list(self.asks.items()):
            if deadline <= now:
                del self.asks[req]
                done(LATE)


async def ask(requests: Requests, kind: int, node: str, send, deadline: float):
    """Send a request (``send(req)``) and wait for its answer, LATE or LOST."""
    fut = asyncio.get_running_loop().create_future()

    def done(answer) -> None:
        if not fut.done():
            fut.set_result(answer)

    req = requests.ask(kind, node, deadline, done)
    try:
        send(req)
        return await fut
    finally:
        requests.discard(req)
