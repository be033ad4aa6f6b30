"""A topic trie: topic filters in, the filters matching a topic name out.

Each node of a filter holds one ``value`` chosen by the owner (the broker
stores its subscriber table there; the cluster stores node sets). Matching
walks the name's levels once, following the exact level, ``+`` and ``#``
branches, so its cost depends on the depth of the name and the number of
wildcard branches, not on the number of filters.
"""


class _Node:
    __slots__ = ("children", "value", "filter")

    def __init__(self):
        self.children: dict[str, _Node] = {}
        self.value = None
        self.filter: str | None = None


class TopicTrie:
    __slots__ = ("_root", "_count")

    def __init__(self):
        self._root = _Node()
        self._count = 0

    def __len__(self) -> int:
        """Number of filters that hold a value."""
        return self._count

    def get(self, filt: str):
        node = self._root
        for level in filt.split("/"):
            node = node.children.get(level)
            if node is None:
                return None
        return node.value

    def setdefault(self, filt: str, factory):
        """The value stored for ``filt``, creating it with ``factory()`` if absent."""
        node = self._root
        for level in filt.split("/"):
            child = node.children.get(level)
            if child is None:
                child = node.children[level] = _Node()
            node = child
        if node.value is None:
            node.value = factory()
            node.filter = filt
            self._count += 1
        return node.value

    def discard(self, filt: str) -> None:
        """Remove the value of ``filt`` and prune the branch left empty."""
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
            del path[i].children[levels[i]]

    def match(self, name: str) -> list:
        """Values of every filter matching topic name ``name``."""
        out = []
        levels = name.split("/")
        n = len(levels)
        root = self._root
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
        stack = [self._root]
        while stack:
            node = stack.pop()
            if node.value is not None:
                yield node.filter, node.value
            stack.extend(node.children.values())
