"""Retained messages of one namespace: topic name -> message, matched by filter.

Stored in a tree of topic levels so that a wildcard SUBSCRIBE visits only
the branches its filter can match, not every retained message.
"""


class _Level:
    __slots__ = ("children", "msg")

    def __init__(self):
        self.children: dict[str, _Level] = {}
        self.msg = None


class RetainedStore:
    __slots__ = ("_root", "_count", "_sys")

    def __init__(self):
        self._root = _Level()
        self._count = 0
        self._sys = 0            # of them under $SYS/: the broker's own, rewritten every interval

    def __len__(self) -> int:
        return self._count

    @property
    def tenant_count(self) -> int:
        """Retained messages the tenant's clients set: what its ``max_retained``
        quota and its figures count (the broker's ``$SYS/...`` tree is not theirs)."""
        return self._count - self._sys

    def get(self, topic: str):
        node = self._root
        for level in topic.split("/"):
            node = node.children.get(level)
            if node is None:
                return None
        return node.msg

    def set(self, topic: str, msg) -> None:
        """Store ``msg`` as the retained message of ``topic``; ``None`` clears it."""
        if msg is None:
            self.delete(topic)
            return
        node = self._root
        for level in topic.split("/"):
            child = node.children.get(level)
            if child is None:
                child = node.children[level] = _Level()
            node = child
        if node.msg is None:
            self._count += 1
            if topic.startswith("$SYS/"):
                self._sys += 1
        node.msg = msg

    def delete(self, topic: str) -> bool:
        levels = topic.split("/")
        path = [self._root]
        node = self._root
        for level in levels:
            node = node.children.get(level)
            if node is None:
                return False
            path.append(node)
        if node.msg is None:
            return False
        node.msg = None
        self._count -= 1
        if topic.startswith("$SYS/"):
            self._sys -= 1
        for i in range(len(levels) - 1, -1, -1):
            child = path[i + 1]
            if child.msg is not None or child.children:
                break
            del path[i].children[levels[i]]
        return True

    def match(self, filt: str) -> list:
        """Retained messages whose topic matches topic filter ``filt``, in no particular order."""
        return list(self.iter_match(filt))

    def iter_match(self, filt: str):
        """The messages ``match`` returns, one at a time, for a subscriber that takes them as its
        connection can send them (over many event-loop iterations): no list of every match is
        made. The store may change meanwhile: the child names of a level a wildcard spans are
        copied when the walk enters it (names, not messages; the walk holds those of the levels
        it is in) and each child is looked up when its turn comes, so a topic cleared in between
        is skipped, a replaced one gives its newest message and one created in between is not
        visited (the subscription, already in place, gets its message live)."""
        levels = filt.split("/")
        n = len(levels)
        root = self._root
        # frames [node, filter depth, child names being walked (a wildcard level) or None, next one]
        stack = [[root, 0, None, 0]]
        while stack:
            frame = stack[-1]
            node, i, names, k = frame
            if names is None:
                stack.pop()
                if i == n:
                    if node.msg is not None:
                        yield node.msg
                    continue
                level = levels[i]
                if level == "#" or level == "+":
                    if level == "#" and i > 0 and node.msg is not None:
                        yield node.msg
                    if node.children:
                        stack.append([node, i, tuple(node.children), 0])
                else:
                    child = node.children.get(level)
                    if child is not None:
                        stack.append([child, i + 1, None, 0])
                continue
            if k == len(names):
                stack.pop()
                continue
            frame[3] = k + 1
            name = names[k]
            if node is root and name.startswith("$"):
                continue            # a leading wildcard does not match $-topics
            child = node.children.get(name)
            if child is None:
                continue
            if levels[i] == "+":
                stack.append([child, i + 1, None, 0])
            else:                   # "#": the whole subtree
                if child.msg is not None:
                    yield child.msg
                if child.children:
                    stack.append([child, i, tuple(child.children), 0])

    def items(self):
        stack = [("", self._root, True)]
        while stack:
            prefix, node, root = stack.pop()
            for name, child in node.children.items():
                topic = name if root else prefix + "/" + name
                if child.msg is not None:
                    yield topic, child.msg
                stack.append((topic, child, False))
