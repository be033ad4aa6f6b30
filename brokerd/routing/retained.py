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
        levels = filt.split("/")
        n = len(levels)
        out = []
        stack = [(self._root, 0)]
        while stack:
            node, i = stack.pop()
            if i == n:
                if node.msg is not None:
                    out.append(node.msg)
                continue
            level = levels[i]
            if level == "#":
                if i > 0 and node.msg is not None:
                    out.append(node.msg)
                sub = [c for name, c in node.children.items() if not (i == 0 and name.startswith("$"))]
                while sub:
                    c = sub.pop()
                    if c.msg is not None:
                        out.append(c.msg)
                    sub.extend(c.children.values())
            elif level == "+":
                for name, child in node.children.items():
                    if i == 0 and name.startswith("$"):
                        continue
                    stack.append((child, i + 1))
            else:
                child = node.children.get(level)
                if child is not None:
                    stack.append((child, i + 1))
        return out

    def items(self):
        stack = [("", self._root, True)]
        while stack:
            prefix, node, root = stack.pop()
            for name, child in node.children.items():
                topic = name if root else prefix + "/" + name
                if child.msg is not None:
                    yield topic, child.msg
                stack.append((topic, child, False))
