"""``${field}`` templates (a republish topic, payload, user property values).

``${name}`` or ``${a.b}`` is looked up in the rule's output row first (a
dotted name walks nested objects), then in the message's context
(``${clientid}``, ``${topic}``, ``${username}``, ``${qos}``, ...); what is
found nowhere renders as an empty string. Strings render as they are,
``true``/``false`` for booleans, JSON for objects and arrays. Parsed once
(when the rule is loaded), rendered by joining the parts.
"""

import re

from .context import FIELDS
from .functions import _text

_PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*")


class TemplateError(ValueError):
    pass


class Template:
    __slots__ = ("text", "parts", "names", "static")

    def __init__(self, text: str):
        self.text = text
        parts: list = []
        pos = 0
        for m in _PLACEHOLDER.finditer(text):
            name = m.group(1).strip()
            if not _NAME.fullmatch(name):
                raise TemplateError(f"template {text!r}: ${{{m.group(1)}}} is not a field name")
            parts.append(text[pos:m.start()])
            parts.append(tuple(name.split(".")))
            pos = m.end()
        rest = text[pos:]
        if "${" in rest:
            raise TemplateError(f"template {text!r}: ${{ without its closing }}")
        parts.append(rest)
        self.parts = tuple(p for p in parts if p != "")
        self.names = tuple(".".join(p) for p in self.parts if isinstance(p, tuple))
        self.static = None if self.names else text       # no placeholder: the text itself

    def render(self, row: dict, ctx=None, limit: int | None = None) -> str:
        """TemplateError when the text would be longer than ``limit`` characters (checked as the
        parts are added, before the text is built: 200 ``${payload}`` made 200 times the payload)."""
        out = []
        n = 0
        for part in self.parts:
            if part.__class__ is not str:
                value = lookup(part, row, ctx)
                if value is None:
                    continue
                part = _text(value)
            out.append(part)
            if limit is not None:
                n += len(part)
                if n > limit:
                    raise TemplateError(f"template {self.text[:40]!r}: the text is too large (more than {limit} "
                                        "characters)")
        return "".join(out)


def lookup(path: tuple, row: dict, ctx):
    v = row
    for key in path:
        if isinstance(v, dict) and key in v:
            v = v[key]
        else:
            break
    else:
        return v
    if ctx is None or path[0] not in FIELDS:
        return None
    if path[0] == "payload" and len(path) > 1:
        v = ctx.json()
        for key in path[1:]:
            if not isinstance(v, dict):
                return None
            v = v.get(key)
        return v
    v = getattr(ctx, path[0])
    for key in path[1:]:
        if not isinstance(v, dict):
            return None
        v = v.get(key)
    return v
