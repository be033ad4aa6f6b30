"""A topic trie: topic filters in, the filters matching a topic name out.

Each node of a filter holds one ``value`` chosen by the owner (the broker
stores its subscriber table there; the cluster stores node sets). Matching
walks the name's levels once, following the exact level, ``+`` and ``#``
branches, so its cost depends on the depth of the name and the number of
wildcard branches, not on the number of filters.

Only wildcard filters are in the tree. A filter without ``+`` or ``#`` matches
one topic name, itself: those are kept in a plain dict and matched with one
lookup (as EMQX keeps exact topics out of its trie). Memory per filter is
what 100,000 devices each subscribed to a topic of their own cost: a dict
slot instead of a node, a dict and a string per level.
"""

from sys import intern
from types import MappingProxyType

# the children of a node that has none: shared, read-only; a node gets a dict of its own with its first child
_LEAF = MappingProxyType({})


class _Node:
    __slots__ = ("children", "value", "filter")

    def __init__(self):
        self.children: dict[str, _Node] = _LEAF
        self.value = None
        self.filter: str | None = None


def _exact(filt: str) -> bool:
    return "+" not in filt and "#" not in filt


class TopicTrie:
    __slots__ = ("_root", "_count", "_exact")

    def __init__(self):
        self._root = _Node()
        self._count = 0
        self._exact: dict = {}          # filter without wildcards -> value

    def __len__(self) -> int:
        """Number of filters that hold a value."""
        return self._count

    def get(self, filt: str):
        if _exact(filt):
            return self._exact.get(filt)
        node = self._root
        for level in filt.split("/"):
            node = node.children.get(level)
            if node is None:
                return None
        return node.value

    def setdefault(self, filt: str, factory):
        """The value stored for ``filt``, creating it with ``factory()`` if absent."""
        if _exact(filt):
            value = self._exact.get(filt)
            if value is None:
                value = self._exact[filt] = factory()
                self._count += 1
            return value
        node = self._root
        for level in filt.split("/"):
            children = node.children
            child = children.get(level)
            if child is None:
                if children is _LEAF:
                    children = node.children = {}
                # levels repeat across filters ("+", "devices", "cmd"): one string each
                child = children[intern(level)] = _Node()
            node = child
        if node.value is None:
            node.value = factory()
            node.filter = filt
            self._count += 1
        return node.value

    def discard(self, filt: str) -> None:
        """Remove the value of ``filt`` and prune the branch left empty."""
        if _exact(filt):
            if self._exact.pop(filt, None) is not None:
                self._count -= 1
            return
        path = [self._root]
        levels = filt.split("/")
        node = self._root
        for level in levels:
            node = node.children.get(level)
            if node is None:
                return
            path.append(node)
        if node.value is None:
            return
        node.value = None
        node.filter = None
        self._count -= 1
        for i in range(len(levels) - 1, -1, -1):
            child = path[i + 1]
            if child.value is not None or child.children:
                break
            parent = path[i]
            del parent.children[levels[i]]
            if not parent.children:
                parent.children = _LEAF

    def match(self, name: str) -> list:
        """Values of every filter matching topic name ``name``."""
        value = self._exact.get(name)
        out = [] if value is None else [value]
        root = self._root
        if not root.children:
            return out
        levels = name.split("/")
        n = len(levels)
        dollar = name.startswith("$")
        # (node, depth) pairs still to explore
        stack = [(root, 0)]
        while stack:
            node, depth = stack.pop()
            children = node.children
            if not children:
                continue
            hash_node = children.get("#")
            if hash_node is not None and hash_node.value is not None and not (dollar and depth == 0):
                out.append(hash_node.value)
            if depth == n:
                continue
            nxt = children.get(levels[depth])
            if nxt is not None:
                if depth + 1 == n:
                    if nxt.value is not None:
                        out.append(nxt.value)
                    # "a/#" also matches "a"
                    h = nxt.children.get("#")
                    if h is not None and h.value is not None:
                        out.append(h.value)
                else:
                    stack.append((nxt, depth + 1))
            if not (dollar and depth == 0):
                plus = children.get("+")
                if plus is not None:
                    if depth + 1 == n:
                        if plus.value is not None:
                            out.append(plus.value)
                        h = plus.children.get("#")
                        if h is not None and h.value is not None:
                            out.append(h.value)
                    else:
                        stack.append((plus, depth + 1))
        return out

    def items(self):
        """(filter, value) for every stored filter."""
        yield from list(self._exact.items())
        stack = [self._root]
        while stack:
            node = stack.pop()
            if node.value is not None:
                yield node.filter, node.value
            stack.extend(node.children.values())
