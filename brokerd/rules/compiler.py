"""Rule statements -> closures, compiled once per rule.

A statement is EMQX's rule SQL::

    SELECT payload.temp AS t, clientid, topic, timestamp
    FROM "sensors/+/temp", "$events/client_connected"
    WHERE payload.temp > 30 AND NOT retain

sqlglot parses it (its default dialect); this module walks the tree once and
builds one Python closure per node, so running a rule on a message is calls
of those closures -- no parsing, no tree walking. What the language has:

- fields: ``clientid username topic qos retain payload timestamp
  user_properties peerhost event reason node``; ``payload.a.b`` reads the
  JSON payload (decoded once per message, when a rule reads a field),
  ``payload.list[1]`` an item of an array (from 1), ``user_properties.k`` a
  user property; a field the source lacks, or a path that is not there, is
  NULL. Topic levels: ``nth(2, split(topic, '/'))``.
- literals: numbers, 'strings', TRUE, FALSE, NULL;
- operators: ``= != <> < <= > >=``, ``AND OR NOT``, ``+ - * / %``, ``||``
  (concatenation), ``IN (...)``, ``BETWEEN``, ``LIKE``, ``IS [NOT] NULL``,
  ``CASE WHEN ... THEN ... ELSE ... END``;
- the functions of ``functions.FUNCTIONS``;
- ``SELECT *``; ``AS`` names an output column, and WHERE may use those names;
  an unnamed column is named by its path (``payload.temp`` -> nested
  ``{"payload": {"temp": ...}}``, as EMQX does) or by its text.

NULL: an operator with a NULL operand gives NULL, and NULL is false in WHERE
and under AND/OR/NOT. Comparing a number with a string, or dividing by zero,
is an error: that message fails the rule (``RuleEvalError``).

A malformed statement raises ``RuleSyntaxError`` with its line and column.

This module imports sqlglot; ``engine`` imports it only when a rule is
compiled, so a node without rules does not load it (``errors``).
"""

import operator
import re
from dataclasses import dataclass, field

import sqlglot
from sqlglot import exp

from ..routing.topic import is_valid_filter, matches
from . import textmatch
from .context import FIELDS
from .errors import EVENT_PREFIX, EVENTS, RuleEvalError, RuleSyntaxError
from .functions import (
    CHARGED,
    CHARS_PER_UNIT,
    CHARS_PER_UNIT_DEFAULT,
    FUNCTIONS,
    MAX_INT_BITS,
    MAX_TEXT,
    NULL_AWARE,
    _text,
)


@dataclass(frozen=True, eq=False)
class CompiledRule:
    sql: str
    topics: tuple            # topic filters of FROM
    events: frozenset        # event names of FROM ("client_connected", ...)
    select: object = field(repr=False)       # ctx -> dict
    where: object = field(repr=False)        # ctx -> truthy, or None (no WHERE)

    def matches(self, topic: str) -> bool:
        for f in self.topics:            # noqa: SIM110 (a loop is cheaper than any() over a generator)
            if matches(f, topic):
                return True
        return False

    def run(self, ctx) -> dict | None:
        """The output row, or None when WHERE is not true; raises RuleEvalError."""
        try:
            where = self.where
            if where is not None and not where(ctx):
                return None
            return self.select(ctx)
        except RuleEvalError:
            raise
        except Exception as exc:    # a function's or an operator's error, on this message's values
            raise RuleEvalError(f"{type(exc).__name__}: {exc}") from None


# ----------------------------------------------------------------- positions

def _line_col(sql: str, offset: int) -> tuple[int, int]:
    line = sql.count("\n", 0, offset) + 1
    return line, offset - (sql.rfind("\n", 0, offset) + 1) + 1


def _position(sql: str, node) -> tuple[int | None, int | None]:
    starts = [n.meta["start"] for n in node.walk() if isinstance(n.meta, dict) and "start" in n.meta]
    if not starts:
        return None, None
    return _line_col(sql, min(starts))


class _Compiler:
    def __init__(self, sql: str):
        self.sql = sql
        self.aliases: dict = {}
        self.states = 0          # automaton states of the statement's patterns

    def counted(self, matcher, node) -> None:
        """A statement's patterns hold at most MAX_RULE_STATES automaton states together: each
        pattern within textmatch.MAX_STATES, a 16 KiB statement of 400 of them took 12 s of the
        node's event loop and 1.2 GB to load."""
        self.states += len(matcher.kind)
        if self.states > MAX_RULE_STATES:
            self.error(f"the statement's patterns are too large together (more than {MAX_RULE_STATES} "
                       "automaton states)", node)

    def error(self, message: str, node=None):
        line, col = _position(self.sql, node) if node is not None else (None, None)
        raise RuleSyntaxError(message, line, col)

    # ------------------------------------------------------------- statement

    def statement(self, tree) -> CompiledRule:
        if not isinstance(tree, exp.Select):
            self.error("a rule is one SELECT statement", tree)
        for key in ("group", "having", "order", "limit", "offset", "distinct", "with_", "with", "qualify",
                    "windows", "into", "laterals", "pivots"):
            if tree.args.get(key):
                self.error(f"{key.rstrip('_').upper()} is not supported in a rule", tree.args[key]
                           if isinstance(tree.args[key], exp.Expression) else tree)
        topics, events = self.sources(tree)
        where_node = tree.args.get("where")
        select = self.select_list(tree.expressions)
        where = self.expr(where_node.this) if where_node is not None else None
        return CompiledRule(self.sql, tuple(topics), frozenset(events), select, where)

    def sources(self, tree):
        from_ = tree.args.get("from_") or tree.args.get("from")
        if from_ is None:
            self.error("FROM is missing: name the topic filters or $events/... the rule reads", tree)
        tables = [from_.this] + [j.this for j in tree.args.get("joins") or ()]
        for j in tree.args.get("joins") or ():
            if j.args.get("on") or j.args.get("using") or j.args.get("kind") or j.args.get("side"):
                self.error("JOIN is not supported: list topic filters separated by commas", j)
        topics, events = [], []
        for t in tables:
            if not isinstance(t, exp.Table) or t.args.get("db") or t.args.get("catalog") or t.args.get("alias"):
                self.error('FROM takes topic filters in double quotes: FROM "sensors/+/temp"', t)
            name = t.name
            if name.startswith(EVENT_PREFIX):
                event = name[len(EVENT_PREFIX):]
                if event not in EVENTS:
                    self.error(f"unknown event {name!r}: one of " + ", ".join(EVENT_PREFIX + e for e in EVENTS), t)
                events.append(event)
            elif name.startswith("$"):
                self.error(f"topic filter {name!r}: rules read the tenant's own topics and $events/... only", t)
            elif not is_valid_filter(name):
                self.error(f"{name!r} is not a valid topic filter", t)
            else:
                topics.append(name)
        return topics, events

    def select_list(self, nodes):
        if len(nodes) == 1 and isinstance(nodes[0], exp.Star):
            return lambda ctx: ctx.row()
        columns = []
        for node in nodes:
            if isinstance(node, exp.Star):
                self.error("* cannot be mixed with other columns", node)
            if isinstance(node, exp.Alias):
                fn = _once(self.expr(node.this))
                name = node.alias
                columns.append(((name,), fn))
                self.aliases[name] = fn
            else:
                fn = self.expr(node)
                path = self.path(node)
                columns.append((tuple(path) if path else (node.sql(),), fn))
        flat = all(len(p) == 1 for p, _ in columns)
        if flat:
            pairs = tuple((p[0], fn) for p, fn in columns)
            return lambda ctx: {name: fn(ctx) for name, fn in pairs}

        def select(ctx):
            out: dict = {}
            for path, fn in columns:
                d = out
                for key in path[:-1]:
                    nxt = d.get(key)
                    if not isinstance(nxt, dict):
                        nxt = d[key] = {}
                    d = nxt
                d[path[-1]] = fn(ctx)
            return out

        return select

    # ----------------------------------------------------------- expressions

    def path(self, node) -> list[str] | None:
        """``a.b.c`` (a column or a chain of dots) -> ["a", "b", "c"]; None for anything else."""
        if isinstance(node, exp.Column):
            parts = [p.name for p in node.parts]
            return parts if all(isinstance(p, exp.Identifier) for p in node.parts) else None
        if isinstance(node, exp.Dot):
            head = self.path(node.this)
            if head is None or not isinstance(node.expression, exp.Identifier):
                return None
            return head + [node.expression.name]
        return None

    def expr(self, node):
        method = getattr(self, "e_" + type(node).__name__, None)
        if method is not None:
            return method(node)
        if isinstance(node, exp.Func):
            return self.call(node)
        self.error(f"{type(node).__name__.lower()} is not supported in a rule: {node.sql()}", node)

    def e_Paren(self, node):
        return self.expr(node.this)

    def e_Literal(self, node):
        if node.is_string:
            value = node.this
        else:
            text = node.this
            try:
                value = int(text) if re.fullmatch(r"\d+", text) else float(text)
            except ValueError:
                self.error(f"not a number: {text}", node)
        return lambda ctx: value

    def e_Boolean(self, node):
        value = bool(node.this)
        return lambda ctx: value

    def e_Null(self, node):
        return lambda ctx: None

    def e_Column(self, node):
        path = self.path(node)
        if path is None:
            self.error(f"not a field: {node.sql()}", node)
        return self.field(path, node)

    e_Dot = e_Column

    def field(self, path, node):
        head, rest = path[0], path[1:]
        if head == "payload" and rest:
            keys = tuple(rest)

            def payload_path(ctx):
                v = ctx.json()
                for k in keys:
                    if isinstance(v, dict):
                        v = v.get(k)
                    else:
                        return None
                return v

            return payload_path
        if head == "user_properties" and rest:
            if len(rest) != 1:
                self.error("user_properties.NAME has one level", node)
            key = rest[0]
            return lambda ctx: ctx.user_properties.get(key)
        if rest:
            self.error(f"{head} has no fields: {'.'.join(path)}", node)
        if head in FIELDS:
            return operator.attrgetter(head)
        fn = self.aliases.get(head)
        if fn is not None:
            return fn
        self.error(f"unknown field {head!r}: one of {', '.join(FIELDS)} (or a name given with AS)", node)

    def e_Bracket(self, node):
        base = self.expr(node.this)
        if len(node.expressions) != 1:
            self.error("one index in [...]", node)
        index = self.expr(node.expressions[0])

        def item(ctx):
            v, i = base(ctx), index(ctx)
            if isinstance(v, list) and isinstance(i, int) and not isinstance(i, bool):
                return v[i - 1] if 1 <= i <= len(v) else None
            if isinstance(v, dict) and isinstance(i, str):
                return v.get(i)
            return None

        return item

    # operators: NULL in, NULL out
    def _binary(self, node, op):
        a, b = self.expr(node.this), self.expr(node.expression)

        def binary(ctx):
            x = a(ctx)
            if x is None:
                return None
            y = b(ctx)
            if y is None:
                return None
            return op(x, y)

        return binary

    def e_EQ(self, n): return self._binary(n, operator.eq)            # noqa: E704
    def e_NEQ(self, n): return self._binary(n, operator.ne)           # noqa: E704
    def e_GT(self, n): return self._binary(n, operator.gt)            # noqa: E704
    def e_GTE(self, n): return self._binary(n, operator.ge)           # noqa: E704
    def e_LT(self, n): return self._binary(n, operator.lt)            # noqa: E704
    def e_LTE(self, n): return self._binary(n, operator.le)           # noqa: E704
    def e_Add(self, n): return self._binary(n, _add)                  # noqa: E704
    def e_Sub(self, n): return self._binary(n, _number(operator.sub))  # noqa: E704
    def e_Mul(self, n): return self._binary(n, _mul)                  # noqa: E704
    def e_Div(self, n): return self._binary(n, _number(operator.truediv))  # noqa: E704
    def e_Mod(self, n): return self._binary(n, _number(operator.mod))  # noqa: E704

    def e_DPipe(self, node):
        a, b = self.expr(node.this), self.expr(node.expression)
        return _bounded("||", _charged("||", lambda x, y: _text(x) + _text(y), (a, b), CHARS_PER_UNIT_DEFAULT,
                                       False, both=True))

    def e_Neg(self, node):
        a = self.expr(node.this)

        def neg(ctx):
            x = a(ctx)
            return None if x is None else -_num(x)

        return neg

    def e_And(self, node):
        a, b = self.expr(node.this), self.expr(node.expression)
        return lambda ctx: bool(a(ctx)) and bool(b(ctx))

    def e_Or(self, node):
        a, b = self.expr(node.this), self.expr(node.expression)
        return lambda ctx: bool(a(ctx)) or bool(b(ctx))

    def e_Not(self, node):
        a = self.expr(node.this)

        def not_(ctx):
            x = a(ctx)
            return None if x is None else not x

        return not_

    def e_Is(self, node):
        if not isinstance(node.expression, exp.Null):
            self.error("IS takes NULL (IS NULL, IS NOT NULL)", node)
        a = self.expr(node.this)
        return lambda ctx: a(ctx) is None

    def e_In(self, node):
        if node.args.get("query") or node.args.get("unnest") or node.args.get("field"):
            self.error("IN takes a list of values", node)
        a = self.expr(node.this)
        items = [self.expr(e) for e in node.expressions]

        def in_(ctx):
            x = a(ctx)
            if x is None:
                return None
            return any(x == f(ctx) for f in items)

        return in_

    def e_Between(self, node):
        a, lo, hi = self.expr(node.this), self.expr(node.args["low"]), self.expr(node.args["high"])

        def between(ctx):
            x, low, high = a(ctx), lo(ctx), hi(ctx)
            if x is None or low is None or high is None:
                return None
            return low <= x <= high

        return between

    def e_Like(self, node):
        pattern = node.expression
        if not (isinstance(pattern, exp.Literal) and pattern.is_string):
            self.error("LIKE takes a string literal", pattern)
        try:
            matcher = textmatch.like(pattern.this)
        except textmatch.PatternError as exc:
            self.error(f"LIKE pattern: {exc}", pattern)
        self.counted(matcher, pattern)
        a = self.expr(node.this)
        return _budgeted("LIKE", matcher, a)

    def e_Case(self, node):
        subject = self.expr(node.this) if node.this is not None else None
        branches = [(self.expr(i.this), self.expr(i.args["true"])) for i in node.args.get("ifs") or ()]
        default = self.expr(node.args["default"]) if node.args.get("default") is not None else (lambda ctx: None)

        def case(ctx):
            s = subject(ctx) if subject is not None else None
            for cond, value in branches:
                c = cond(ctx)
                if (c == s and c is not None) if subject is not None else c:
                    return value(ctx)
            return default(ctx)

        return case

    # ------------------------------------------------------------- functions

    def call(self, node):
        name, args = _call_parts(node)
        found = FUNCTIONS.get(name)
        if found is None:
            self.error(f"unknown function {name}()", node)
        fn, least, most, wants_ctx = found
        if len(args) < least or (most is not None and len(args) > most):
            want = str(least) if least == most else f"{least} to {most}" if most is not None else f"{least} or more"
            self.error(f"{name}() takes {want} arguments, not {len(args)}", node)
        compiled = tuple(self.expr(a) for a in args)
        if name == "regex_match":
            return self.regex_match(args, compiled)
        if name == "concat":
            return _bounded_concat(compiled)
        if name in CHARGED:
            call = _charged(f"{name}()", fn, compiled, CHARS_PER_UNIT.get(name, CHARS_PER_UNIT_DEFAULT),
                            name in NULL_AWARE)
        else:
            call = self._call(fn, compiled, name in NULL_AWARE, wants_ctx)
        if name in GROWS:
            return _bounded(f"{name}()", call)
        return call

    @staticmethod
    def _call(fn, compiled: tuple, null_aware: bool, wants_ctx: bool):
        if wants_ctx:
            return lambda ctx: fn(ctx, *[a(ctx) for a in compiled])
        if len(compiled) == 1 and not null_aware:
            a0 = compiled[0]

            def call1(ctx):
                x = a0(ctx)
                return None if x is None else fn(x)

            return call1

        def call(ctx):
            values = [a(ctx) for a in compiled]
            if not null_aware and values and values[0] is None:
                return None
            return fn(*values)

        return call

    def regex_match(self, args, compiled):
        """``regex_match(s, 'pattern')``: the pattern is a string literal, compiled once into an
        automaton that runs in time linear in s (``textmatch``: no backtracking)."""
        pattern = args[1]
        if not (isinstance(pattern, exp.Literal) and pattern.is_string):
            self.error("regex_match() takes its pattern as a string literal", pattern)
        try:
            matcher = textmatch.Matcher(pattern.this)
        except textmatch.PatternError as exc:
            self.error(f"regex_match() pattern {pattern.this[:80]!r}: {exc}", pattern)
        self.counted(matcher, pattern)
        return _budgeted("regex_match()", matcher, compiled[0])


# sqlglot turns well-known function names into typed nodes: their names and arguments here
_TYPED = {
    exp.Lower: ("lower", ("this",)), exp.Upper: ("upper", ("this",)), exp.Length: ("length", ("this",)),
    exp.Abs: ("abs", ("this",)), exp.Ceil: ("ceil", ("this",)), exp.Floor: ("floor", ("this",)),
    exp.Sqrt: ("sqrt", ("this",)), exp.Ln: ("ln", ("this",)), exp.MD5: ("md5", ("this",)),
    exp.SHA: ("sha", ("this",)), exp.Base64Encode: ("base64_encode", ("this",)),
    exp.Concat: ("concat", ("expressions",)), exp.Substring: ("substr", ("this", "start", "length")),
    exp.Split: ("split", ("this", "expression")), exp.Replace: ("replace", ("this", "expression", "replacement")),
    exp.Round: ("round", ("this", "decimals")), exp.Pow: ("power", ("this", "expression")),
    exp.Coalesce: ("coalesce", ("this", "expressions")),
}


def _call_parts(node) -> tuple[str, list]:
    if isinstance(node, exp.Anonymous):
        return node.name.lower(), list(node.expressions)
    if isinstance(node, exp.Trim):
        position = (node.args.get("position") or "").upper()
        return {"LEADING": "ltrim", "TRAILING": "rtrim"}.get(position, "trim"), [node.this]
    if isinstance(node, exp.Log):
        if node.args.get("expression") is None:
            return "ln", [node.this]
        return "log", [node.this, node.expression]
    spec = _TYPED.get(type(node))
    if spec is None:
        return node.sql_name().lower(), []
    name, keys = spec
    args = []
    for key in keys:
        value = node.args.get(key)
        if isinstance(value, list):
            args.extend(value)
        elif value is not None:
            args.append(value)
    return name, args


# functions whose text can be some times longer than their argument: chained (an alias of the one
# before, or nested) they grew a 64-byte payload past memory -- 60 base64_encode() are 1.34^60 times it
GROWS = {"base64_encode", "json_encode", "upper", "lower", "concat"}


MAX_RULE_STATES = 2 * textmatch.MAX_STATES


def _budgeted(name: str, matcher, a):
    """``matcher`` on ``a``'s text, within what the message's patterns may still walk (``ctx.work``:
    one budget for every pattern of every rule the message runs -- a budget per pattern let a
    16 KiB statement of 400 patterns hold the event loop 400 times as long)."""
    match = matcher.match

    def matched(ctx):
        x = a(ctx)
        if x is None:
            return None
        try:
            found = match(x if x.__class__ is str else _text(x), ctx.work)
        except textmatch.TooCostly as exc:
            ctx.work = 0
            raise RuleEvalError(f"{name}: {exc}") from None
        ctx.work -= matcher.spent
        return found

    return matched


def _spend(ctx, units: int, name: str) -> None:
    left = ctx.work - units
    if left < 0:
        ctx.work = 0
        raise RuleEvalError(f"{name}: {textmatch.TOO_MUCH}")
    ctx.work = left


def _charged(name: str, fn, compiled: tuple, per_unit: int, null_aware: bool, both: bool = False):
    """``fn`` of the compiled arguments, spending a unit of the message's work budget (``ctx.work``)
    for every ``per_unit`` characters of its texts -- arguments, then a text result. NULL in: NULL out (the
    first argument; every one with ``both``), unless ``null_aware``."""

    if len(compiled) == 1 and not null_aware:
        a0 = compiled[0]

        def charged1(ctx):                 # (the common case, written out: no list, no loop)
            x = a0(ctx)
            if x is None:
                return None
            if (x.__class__ is str or isinstance(x, (bytes, bytearray, list, dict))) and len(x) >= per_unit:
                _spend(ctx, len(x) // per_unit, name)
            out = fn(x)
            if out.__class__ is str and len(out) >= per_unit:
                _spend(ctx, len(out) // per_unit, name)
            return out

        return charged1

    def charged(ctx):
        values = [a(ctx) for a in compiled]
        if not null_aware and (None in values if both else values[0] is None):
            return None
        n = 0
        for v in values:
            if isinstance(v, (str, bytes, bytearray, list, dict)):
                n += len(v)
        if n >= per_unit:
            _spend(ctx, n // per_unit, name)
        out = fn(*values)
        if out.__class__ is str and len(out) >= per_unit:
            _spend(ctx, len(out) // per_unit, name)
        return out

    return charged


def _bounded(name: str, fn):
    """``fn``'s text at most MAX_TEXT longer than twice the message's payload."""

    def bounded(ctx):
        v = fn(ctx)
        if isinstance(v, str) and len(v) > MAX_TEXT:
            raw = ctx.raw
            if len(v) > MAX_TEXT + 2 * (len(raw) if raw is not None else 0):
                raise RuleEvalError(f"{name}: the result is too large ({len(v)} characters)")
        return v

    return bounded


def _bounded_concat(compiled: tuple):
    """``concat(...)`` whose length is checked before the text is built (as
    ``_bounded``'s): one call naming a 256 KiB payload 2,000 times built
    500 MiB before the check refused it."""

    def concat(ctx):
        parts, n = [], 0
        for a in compiled:
            v = a(ctx)
            if v is None:
                continue
            parts.append(v := _text(v))
            n += len(v)
            if n > MAX_TEXT:
                raw = ctx.raw
                if n > MAX_TEXT + 2 * (len(raw) if raw is not None else 0):
                    raise RuleEvalError(f"concat(): the result is too large (more than {n} characters)")
        if n >= CHARS_PER_UNIT_DEFAULT:
            _spend(ctx, 2 * n // CHARS_PER_UNIT_DEFAULT, "concat()")
        return "".join(parts)

    return concat


def _once(fn):
    """An alias's value, computed once per message however often the rule
    names it (each naming computed it again: 40 aliases each naming the one
    before twice made 2^40 evaluations of one message)."""

    def once(ctx):
        memo = ctx.memo
        if memo is None:
            memo = ctx.memo = {}
        elif once in memo:
            return memo[once]
        v = memo[once] = fn(ctx)
        return v

    return once


def _num(x):
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise RuleEvalError(f"not a number: {x!r}")
    return x


def _number(op):
    return lambda x, y: op(_num(x), _num(y))


def _add(x, y):
    return _num(x) + _num(y)


def _mul(x, y):
    x, y = _num(x), _num(y)
    if type(x) is int and type(y) is int and x.bit_length() + y.bit_length() > MAX_INT_BITS:
        # as power(): aliases squaring the one before made a number of a billion bits
        raise RuleEvalError(f"multiplication: the result is too large (more than {MAX_INT_BITS} bits)")
    return x * y


def _plain(description: str) -> str:
    """sqlglot's message without its Python class names."""
    if description.startswith("Required keyword"):
        return "incomplete expression"
    return re.sub(r"<class '[\w.]*\.(\w+)'>", r"\1", description)


def _open_quote(sql: str) -> int | None:
    """Where a quote that is never closed opens (doubled quotes escape themselves)."""
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if c in "'\"":
            j = i + 1
            while True:
                j = sql.find(c, j)
                if j < 0:
                    return i
                if sql[j + 1:j + 2] == c:
                    j += 2
                    continue
                break
            i = j + 1
        else:
            i += 1
    return None


def compile_rule(sql: str) -> CompiledRule:
    """Parse and compile one statement; raises RuleSyntaxError."""
    if not isinstance(sql, str) or not sql.strip():
        raise RuleSyntaxError("the statement is empty")
    try:
        trees = sqlglot.parse(sql)
    except sqlglot.errors.ParseError as exc:
        first = exc.errors[0] if exc.errors else {}
        line, col = first.get("line"), first.get("col")
        highlight = first.get("highlight") or ""
        if col is not None and highlight and "\n" not in highlight:
            col = max(1, col - len(highlight) + 1)
        desc = _plain(first.get("description") or str(exc))
        near = f" near {highlight!r}" if highlight else ""
        raise RuleSyntaxError(f"{desc}{near}", line, col) from None
    except sqlglot.errors.TokenError:
        offset = _open_quote(sql)
        if offset is not None:
            raise RuleSyntaxError(f"unterminated {sql[offset]}...{sql[offset]}", *_line_col(sql, offset)) from None
        raise RuleSyntaxError("cannot read the statement (a stray character)") from None
    except RecursionError:
        raise RuleSyntaxError(_TOO_DEEP) from None
    trees = [t for t in trees if t is not None]
    if len(trees) != 1:
        raise RuleSyntaxError("a rule is exactly one SELECT statement")
    try:
        return _Compiler(sql).statement(trees[0])
    except RecursionError:
        raise RuleSyntaxError(_TOO_DEEP) from None


_TOO_DEEP = "expressions nested too deeply (use AS to name a part)"
