"""The cluster's route table (pure): which nodes have subscribers for what.

Every node keeps the whole table, built from the events all nodes append to
the cluster event log (and from a snapshot of it when joining):

- plain routes: (tenant, filter) -> {node: (subscriptions, durable ones)} --
  a node announces a filter when it gets its first local subscriber for it
  and withdraws it with the last, and says how many of those subscriptions
  belong to stored sessions (a message for those needs the node's
  acknowledgement that it is stored before the publisher is acknowledged);
- shared groups: (tenant, group, filter) -> {node: members} -- a message for
  the group goes to one node, which picks one of its members.

A publish on node A matches the table once per message; each other node
with a match gets the message once, whatever the number of its subscribers.

Memory: with workers, every worker holds a route for each filter of every
other worker (100,000 devices, each subscribed to a topic of its own, on 6
workers: 5 remote routes per device on the host). A plain route on a filter
without wildcards is one slot of a flat dict per tenant, filter -> the node's
name (an interned string: one subscription, not durable), or (node, subs,
durable), or {node: (subs, durable)} when several nodes share the filter --
no object per route. Wildcard filters and shared groups are ``_Route``
objects in the tenant's trie.
"""

from sys import intern
from types import MappingProxyType

from ..routing.cache import CacheBudget, TopicCache
from ..routing.trie import TopicTrie

ROUTE_CACHE_BYTES = 32 * 1024 * 1024          # match results cached per tenant (routing/cache.py)
ROUTE_CACHE_NODE_BYTES = 128 * 1024 * 1024    # ... and for all tenants of the node

# the shared groups of a route that has none (most): one read-only mapping, a dict from the first group
_NO_GROUPS = MappingProxyType({})


class _Route:
    __slots__ = ("filter", "nodes", "groups")

    def __init__(self, filt: str = ""):
        self.filter = filt
        self.nodes: dict[str, tuple] = {}           # node -> (subscriptions, durable subscriptions)
        self.groups: dict[str, dict] = _NO_GROUPS   # group -> {node: members}

    def __bool__(self):
        return bool(self.nodes) or bool(self.groups)


def _wild(filt: str) -> bool:
    return "+" in filt or "#" in filt


def _entries(value) -> list:
    """An exact route's value -> [(node, subscriptions, durable subscriptions)]."""
    if value.__class__ is str:
        return [(value, 1, 0)]
    if value.__class__ is tuple:
        return [value]
    return [(node, subs, durable) for node, (subs, durable) in value.items()]


def _one(node: str, subs: int, durable: int):
    """The value of an exact route held by one node (the common case: its name)."""
    return node if subs == 1 and durable == 0 else (node, subs, durable)


def snapshot_group(snap: dict, node: str, tenant: str, group: str, filt: str, members: int) -> None:
    """``node``'s ``members`` of a shared group in the route snapshot ``snap``: their number in "groups"
    (what a node of a version before members' presence reads), and in "groups_offline" too when none of
    them is online (negative in the table; see ``announce.group_event``)."""
    snap["groups"].append([node, tenant, group, filt, abs(members)])
    if members < 0:
        snap.setdefault("groups_offline", []).append([node, tenant, group, filt, -members])


class ClusterRoutes:
    def __init__(self, node: str):
        self.node = node                             # this node: its own entries are kept elsewhere
        self.exact: dict[str, dict] = {}             # tenant -> plain routes on filters without wildcards
        self.tries: dict[str, TopicTrie] = {}        # tenant -> wildcard plain routes and shared groups
        # every tenant of ``exact`` and ``tries`` (and some that had routes there since the last
        # clear): a tenant not in it has no route on another node -- one set, read per message
        self.tenants: set[str] = set()
        self.caches: dict[str, TopicCache] = {}      # tenant -> topic -> (plain targets, group targets)
        self.cache_budget = CacheBudget(ROUTE_CACHE_NODE_BYTES)
        self.rr: dict[tuple, int] = {}               # round robin over nodes of a shared group

    def clear(self) -> None:
        """Empty, as new (a fenced node rejoining reloads the table; the
        parts of the cluster share this one object)."""
        self.exact = {}
        self.tries = {}
        self.tenants.clear()                         # (the same set: the forwarder and the node read it)
        self.caches = {}
        self.cache_budget = CacheBudget(ROUTE_CACHE_NODE_BYTES)
        self.rr = {}

    def _trie(self, tenant: str) -> TopicTrie:
        trie = self.tries.get(tenant)
        if trie is None:
            trie = self.tries[tenant] = TopicTrie()
            self.tenants.add(tenant)
        return trie

    # -------------------------------------------------------------- updates

    def set_route(self, node: str, tenant: str, filt: str, subs: int, durable: int) -> None:
        """Node ``node`` has ``subs`` subscriptions on ``filt`` (0: none any more)."""
        if node == self.node:
            return
        if not _wild(filt):
            self._set_exact(node, tenant, filt, subs, durable)
            self._clear_caches()
            return
        trie = self._trie(tenant)
        if subs > 0:
            route = trie.setdefault(filt, lambda: _Route(filt))
            # a node's name is a key of every route it announces: one string for all of them
            route.nodes[intern(node)] = (subs, durable)
        else:
            route = trie.get(filt)
            if route is None:
                return
            route.nodes.pop(node, None)
            if not route:
                trie.discard(filt)
        self._clear_caches()

    def _set_exact(self, node: str, tenant: str, filt: str, subs: int, durable: int) -> None:
        table = self.exact.get(tenant)
        if table is None:
            if subs <= 0:
                return
            table = self.exact[tenant] = {}
            self.tenants.add(tenant)
        cur = table.get(filt)
        if subs > 0:
            node = intern(node)
            if cur is None:
                table[filt] = _one(node, subs, durable)
            elif cur.__class__ is dict:
                cur[node] = (subs, durable)
            else:
                (other, osubs, odurable), = _entries(cur)
                if other == node:
                    table[filt] = _one(node, subs, durable)
                else:
                    table[filt] = {other: (osubs, odurable), node: (subs, durable)}
            return
        if cur is None:
            return
        if cur.__class__ is dict:
            cur.pop(node, None)
            if len(cur) == 1:
                (other, (osubs, odurable)), = cur.items()
                table[filt] = _one(other, osubs, odurable)
            elif not cur:
                del table[filt]
        elif _entries(cur)[0][0] == node:
            del table[filt]
        if not table:
            del self.exact[tenant]

    def set_group(self, node: str, tenant: str, group: str, filt: str, members: int) -> None:
        """``members``: the node's members of the group; negative when none of them is connected."""
        if node == self.node:
            return
        trie = self._trie(tenant)
        if members:
            route = trie.setdefault(filt, lambda: _Route(filt))
            if route.groups is _NO_GROUPS:
                route.groups = {}
            route.groups.setdefault(group, {})[intern(node)] = members
        else:
            route = trie.get(filt)
            if route is None:
                return
            nodes = route.groups.get(group)
            if nodes is not None:
                nodes.pop(node, None)
                if not nodes:
                    del route.groups[group]
            if not route:
                trie.discard(filt)
        self._clear_caches()

    def drop_node(self, node: str, keep_durable: bool = False) -> bool:
        """A node left or died: forget everything it announced (but, with ``keep_durable``,
        its routes to persistent sessions and its shared groups' members -- some may be
        stored sessions: the table does not say). -> whether any was kept."""
        kept = False
        for tenant, table in list(self.exact.items()):
            for filt, value in list(table.items()):
                for other, _, durable in _entries(value):
                    if other == node:
                        self._set_exact(node, tenant, filt, durable if keep_durable else 0, durable)
                        kept = kept or (keep_durable and durable > 0)
        for trie in self.tries.values():
            for filt, route in list(trie.items()):
                counts = route.nodes.pop(node, None)
                if keep_durable and counts is not None and counts[1] > 0:
                    route.nodes[node] = (counts[1], counts[1])
                    kept = True
                for group in list(route.groups):
                    if keep_durable and node in route.groups[group]:
                        kept = True
                        continue
                    route.groups[group].pop(node, None)
                    if not route.groups[group]:
                        del route.groups[group]
                if not route:
                    trie.discard(filt)
        self._clear_caches()
        return kept

    # ---------------------------------------------------------------- reads

    def _clear_caches(self) -> None:
        for cache in self.caches.values():
            cache.clear()

    def match(self, tenant: str, topic: str) -> tuple[dict, list]:
        """-> ({node: needs durable ack}, [(group, filter, {node: members})]); cached
        per tenant, bounded in bytes like the node's own route cache."""
        cache = self.caches.get(tenant)
        if cache is None:
            cache = self.caches[tenant] = TopicCache(ROUTE_CACHE_BYTES, self.cache_budget)
        found = cache.get(topic)
        if found is not None:
            return found
        nodes: dict[str, bool] = {}
        groups = []
        table = self.exact.get(tenant)
        if table is not None:
            value = table.get(topic)
            if value is not None:
                for node, _, durable in _entries(value):
                    nodes[node] = durable > 0
        trie = self.tries.get(tenant)
        if trie is not None:
            for route in trie.match(topic):
                for node, (_, durable) in route.nodes.items():
                    nodes[node] = nodes.get(node, False) or durable > 0
                for group, members in route.groups.items():
                    groups.append((group, route.filter, members))
        result = (nodes, groups)
        cache.put(topic, result, 200 + 64 * len(nodes) + 96 * len(groups))
        return result

    def pick_group_node(self, tenant: str, group: str, filt: str, members: dict, local: int,
                        local_online: bool | None = None) -> str | None:
        """Round robin over the nodes with members of a shared group (this node
        counts when it has ``local`` members) -- those with a member online
        (``members`` positive; ``local_online`` here, None: as ``local``) if there
        are any: a node whose members are all offline stored sessions would hold
        its turns' messages until one came back, the group's online members idle;
        None: this node."""
        online_here = bool(local) if local_online is None else local_online
        nodes = sorted(n for n, m in members.items() if m > 0)
        if online_here:
            nodes.append(None)
        if not nodes:                       # no member online anywhere: the offline ones take their turns
            nodes = sorted(members)
            if local:
                nodes.append(None)
        if not nodes:
            return None
        key = (tenant, group, filt)
        i = self.rr.get(key, 0)
        self.rr[key] = i + 1
        return nodes[i % len(nodes)]

    def snapshot(self) -> dict:
        """Every node's announcements (for the route snapshot in the store)."""
        out: dict = {"routes": [], "groups": []}
        for tenant, table in self.exact.items():
            for filt, value in table.items():
                for node, subs, durable in _entries(value):
                    out["routes"].append([node, tenant, filt, subs, durable])
        for tenant, trie in self.tries.items():
            for filt, route in trie.items():
                for node, (subs, durable) in route.nodes.items():
                    out["routes"].append([node, tenant, filt, subs, durable])
                for group, nodes in route.groups.items():
                    for node, members in nodes.items():
                        snapshot_group(out, node, tenant, group, filt, members)
        return out

    def load(self, snap: dict, exclude: set) -> None:
        for node, tenant, filt, subs, durable in snap.get("routes", ()):
            if node not in exclude:
                self.set_route(node, tenant, filt, subs, durable)
        for node, tenant, group, filt, members in snap.get("groups", ()):
            if node not in exclude:
                self.set_group(node, tenant, group, filt, members)
        for node, tenant, group, filt, members in snap.get("groups_offline", ()):
            if node not in exclude:
                self.set_group(node, tenant, group, filt, -members)

    def nodes(self) -> set:
        out = set()
        for table in self.exact.values():
            for value in table.values():
                out.update(node for node, _, _ in _entries(value))
        for trie in self.tries.values():
            for _, route in trie.items():
                out.update(route.nodes)
                for nodes in route.groups.values():
                    out.update(nodes)
        return out
