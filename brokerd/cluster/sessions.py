"""A stored session brought into this node from the shared store (a takeover
or an adoption), its routes announced from here."""

from typing import Protocol

from .ports import Clock, ClusterBroker, SessionStore


class RouteChanges(Protocol):
    def route_dirty(self, tenant: str, filt: str) -> None: ...


class SessionLoader:
    def __init__(self, store: SessionStore | None, broker: ClusterBroker, routes: RouteChanges, clock: Clock):
        self.store = store
        self.broker = broker
        self.routes = routes
        self.clock = clock

    async def load(self, tenant: str, cid: str, wills: bool = True, still_ours=None) -> bool:
        """-> whether the session is here now (``wills``: False for a node that
        left gracefully -- its clients' wills are not owed; ``still_ours``: an
        async check, once read, that the client id is still this node's to take:
        False, nothing is loaded)."""
        if self.store is None:
            return False
        rec = await self.store.load_session(tenant, cid)
        if rec is None:
            return False
        if still_ours is not None and not await still_ours():
            return False
        if not wills:
            rec.will = None
        if not self.broker.restore_sessions([rec], self.clock()):
            return False
        filters = self.broker.session_filters(tenant, cid)
        if filters is None:
            return False
        for filt in filters:
            self.routes.route_dirty(tenant, filt)
        return True

    async def stored_will(self, tenant: str, cid: str):
        """The will the stored session still owes (its connection ended without DISCONNECT, its
        delay not over), for a Clean Start that ends the session elsewhere; None if none."""
        if self.store is None:
            return None
        rec = await self.store.load_session(tenant, cid)
        return rec.will if rec is not None else None
