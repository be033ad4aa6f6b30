"""Regular expressions and LIKE patterns matched in time linear in the text.

Python's ``re`` backtracks: ``(a+)+b``, ``(a|aa)*b`` or ``LIKE '%a%a%a%b'``
take exponential or high-polynomial time on a text that almost matches, and
``re`` holds the GIL without a timeout -- one device's payload would stop the
node (every tenant's clients) for minutes. A rule's pattern is compiled here
instead, once, into an automaton (Thompson's construction over what
``re``'s own parser reads), run as a DFA built lazily while matching (as RE2
does): one cached step per character of the text, whatever the pattern.

What it takes: literals, ``.``, classes (``[a-z]``, ``[^0-9]``, ``\\d \\w \\s``
and their negations), groups, ``|``, the repeats ``* + ? {m,n}`` (greedy or
lazy: for "does it match" the same), ``^`` and ``$`` (``\\A``, ``\\Z``). What it
refuses (``PatternError``): back-references, look-arounds, ``\\b``, atomic
groups and possessive repeats, inline flags, and patterns of more than
MAX_STATES states once their counted repeats are written out.

Linear, but a DFA step not yet cached walks every live state of the pattern,
and a pattern such as ``a[ab]{4000}c`` on random ``a``/``b`` text makes a new
DFA state of ~4,000 live states at every character (about 1 ms each: 17
minutes for a 1 MiB payload, and 100 KiB of cache a step). So ``match`` takes
a budget of states it may walk building steps -- and reading the text costs
one state every CHARS_PER_STATE characters, as even a cached step costs ~70 ns
-- (``TooCostly`` past it: the caller shares one budget among the patterns and
functions of every rule a message runs, and the rule fails for that message),
and the cached DFA states of a pattern hold at most MAX_HELD states together
(past it the cache starts again). An ordinary pattern (a few dozen states)
caches its steps and spends little more than its reading.
"""

import re
import re._constants as sre
import re._parser as sre_parse

MAX_PATTERN = 1024          # characters of a pattern
MAX_STATES = 4096           # automaton states, counted repeats written out
MAX_CACHED = 65536          # DFA steps kept per pattern before the cache starts again
MAX_WORK = 1 << 19          # live states a match may walk building DFA steps, by default (~0.3 s of a core)
# reading a character from the cache costs ~70 ns, walking a state ~0.5 us: eight characters make one state
# (one pattern read over a 1 MiB payload 100 times was 7 s of the event loop); charged CHUNK at a time
CHARS_PER_STATE = 8
CHUNK = 4096
MAX_HELD = 1 << 18          # states the cached DFA states of one pattern hold together (~8 MiB)

_CHAR, _SPLIT, _BOL, _EOL, _EOS, _MATCH = range(6)


class PatternError(ValueError):
    pass


TOO_MUCH = "too much work for this message (what its rules' patterns and functions may spend on one message)"


class TooCostly(RuntimeError):
    """This text would make the pattern walk more states than its budget."""


def _category(name):
    c = sre
    table = {
        c.CATEGORY_DIGIT: str.isdecimal,
        c.CATEGORY_NOT_DIGIT: lambda ch: not ch.isdecimal(),
        c.CATEGORY_SPACE: str.isspace,
        c.CATEGORY_NOT_SPACE: lambda ch: not ch.isspace(),
        c.CATEGORY_WORD: lambda ch: ch.isalnum() or ch == "_",
        c.CATEGORY_NOT_WORD: lambda ch: not (ch.isalnum() or ch == "_"),
    }
    fn = table.get(name)
    if fn is None:
        raise PatternError(f"{name} is not supported")
    return fn


def _class(items):
    negate = False
    tests = []
    chars = set()
    for op, av in items:
        if op is sre.NEGATE:
            negate = True
        elif op is sre.LITERAL:
            chars.add(chr(av))
        elif op is sre.RANGE:
            lo, hi = av
            tests.append(lambda ch, lo=lo, hi=hi: lo <= ord(ch) <= hi)
        elif op is sre.CATEGORY:
            tests.append(_category(av))
        else:
            raise PatternError(f"{op} in a character class is not supported")
    frozen = frozenset(chars)

    def pred(ch):
        hit = ch in frozen or any(t(ch) for t in tests)
        return hit is not negate

    return pred


class _Builder:
    def __init__(self, dotall: bool):
        self.dotall = dotall
        self.kind: list = []
        self.arg: list = []
        self.out: list = []

    def new(self, kind, arg=None, out=()) -> int:
        if len(self.kind) >= MAX_STATES:
            raise PatternError(f"the pattern is too large (more than {MAX_STATES} states)")
        self.kind.append(kind)
        self.arg.append(arg)
        self.out.append(list(out))
        return len(self.kind) - 1

    def seq(self, items, nxt: int) -> int:
        for op, av in reversed(list(items)):
            nxt = self.item(op, av, nxt)
        return nxt

    def item(self, op, av, nxt: int) -> int:
        if op is sre.LITERAL:
            c = chr(av)
            return self.new(_CHAR, lambda ch: ch == c, (nxt,))
        if op is sre.NOT_LITERAL:
            c = chr(av)
            return self.new(_CHAR, lambda ch: ch != c, (nxt,))
        if op is sre.ANY:
            return self.new(_CHAR, (lambda ch: True) if self.dotall else (lambda ch: ch != "\n"), (nxt,))
        if op is sre.IN:
            return self.new(_CHAR, _class(av), (nxt,))
        if op is sre.SUBPATTERN:
            _group, add_flags, del_flags, body = av
            if add_flags or del_flags:
                raise PatternError("inline flags are not supported")
            return self.seq(body, nxt)
        if op is sre.BRANCH:
            starts = [self.seq(alt, nxt) for alt in av[1]]
            return self.new(_SPLIT, None, starts)
        if op is sre.MAX_REPEAT or op is sre.MIN_REPEAT:
            least, most, body = av
            if most == sre.MAXREPEAT:
                loop = self.new(_SPLIT, None, ())
                self.out[loop] = [self.seq(body, loop), nxt]
                tail = loop
            else:
                tail = nxt
                for _ in range(most - least):
                    tail = self.new(_SPLIT, None, (self.seq(body, tail), tail))
            for _ in range(least):
                tail = self.seq(body, tail)
            return tail
        if op is sre.AT:
            if av in (sre.AT_BEGINNING, sre.AT_BEGINNING_STRING):
                return self.new(_BOL, None, (nxt,))
            if av is sre.AT_END:
                return self.new(_EOL, None, (nxt,))
            if av is sre.AT_END_STRING:
                return self.new(_EOS, None, (nxt,))
        raise PatternError(f"{str(av if op is sre.AT else op).lower()} is not supported in a rule's pattern")


class _DState:
    __slots__ = ("states", "accept", "accept_end", "accept_eol", "steps")

    def __init__(self, states: frozenset, accept: bool, accept_end: bool, accept_eol: bool):
        self.states, self.accept, self.accept_end, self.accept_eol = states, accept, accept_end, accept_eol
        self.steps: dict = {}


class Matcher:
    """``match(text)``: the pattern matches somewhere in the text (``re.search``), or
    with ``whole``, matches all of it (``re.fullmatch``)."""

    def __init__(self, pattern: str, dotall: bool = False, whole: bool = False):
        if len(pattern) > MAX_PATTERN:
            raise PatternError(f"the pattern is longer than {MAX_PATTERN} characters")
        try:
            parsed = sre_parse.parse(pattern)
        except sre.error as exc:
            raise PatternError(str(exc)) from None
        if parsed.state.flags & ~(sre.SRE_FLAG_UNICODE):
            raise PatternError("inline flags are not supported")
        b = _Builder(dotall)
        accept = b.new(_MATCH)
        self.start = b.seq(parsed, accept)
        self.kind, self.arg, self.out = b.kind, b.arg, b.out
        self.pattern = pattern
        self.search = not whole
        self._work = 0                    # states the current (or last) match walked building steps
        self._limit = MAX_WORK            # ... and may walk
        self._reset()

    def _reset(self) -> None:
        self._cache: dict = {}
        self._steps = 0
        self._held = 0
        self._first = self._state(self._closure((self.start,), True))
        self._later = self._closure((self.start,), False)       # what a search adds at every position

    def _closure(self, seeds, at_start: bool) -> frozenset:
        kind, out = self.kind, self.out
        seen = set()
        stack = list(seeds)
        while stack:
            s = stack.pop()
            if s in seen:
                continue
            seen.add(s)
            k = kind[s]
            if k == _SPLIT or (k == _BOL and at_start):
                stack.extend(out[s])
        return frozenset(seen)

    def _passes_end(self, states: frozenset, eos: bool) -> bool:
        """MATCH reached from ``states`` at the end of the text (``eos``) or before its final newline."""
        kind, out = self.kind, self.out
        seen = set()
        stack = list(states)
        while stack:
            s = stack.pop()
            if s in seen:
                continue
            seen.add(s)
            k = kind[s]
            if k == _MATCH:
                return True
            if k in (_SPLIT, _EOL) or (k == _EOS and eos):
                stack.extend(out[s])
        return False

    def _state(self, states: frozenset) -> _DState:
        d = self._cache.get(states)
        if d is None:
            self._held += len(states)
            accept = any(self.kind[s] == _MATCH for s in states)
            d = self._cache[states] = _DState(states, accept, self._passes_end(states, True),
                                              self._passes_end(states, False))
        return d

    def _step(self, d: _DState, ch: str) -> _DState:
        kind, arg, out = self.kind, self.arg, self.out
        work = self._work + len(d.states)
        if work > self._limit:
            self._work = work
            raise TooCostly(TOO_MUCH)
        seeds = [out[s][0] for s in d.states if kind[s] == _CHAR and arg[s](ch)]
        states = self._closure(seeds, False)
        if self.search:
            states |= self._later
        self._work = work + len(states)
        self._steps += 1
        if self._steps >= MAX_CACHED or self._held + len(states) > MAX_HELD:
            # a text of many different characters, or of many large states: start again (bounded memory)
            self._reset()
            return self._state(states)
        n = self._state(states)
        d.steps[ch] = n
        return n

    def _run(self, text: str):
        """The DFA state after ``text``; True: a search found a match on the way; None: dead.
        Reading costs one unit of the budget for every CHARS_PER_STATE characters, charged a chunk
        at a time as they come."""
        search = self.search
        d = self._first
        size = len(text)
        if size <= CHUNK:                  # (the common case: one chunk, no slicing)
            self._work += size // CHARS_PER_STATE + 1
            if self._work > self._limit:
                raise TooCostly(TOO_MUCH)
            for ch in text:
                if search and d.accept:
                    return True
                n = d.steps.get(ch)
                d = n if n is not None else self._step(d, ch)
                if not d.states:
                    return None
            return d
        for start in range(0, size, CHUNK):
            self._work += (min(CHUNK, size - start) // CHARS_PER_STATE) + 1
            if self._work > self._limit:
                raise TooCostly(TOO_MUCH)
            for ch in text[start:start + CHUNK]:
                if search and d.accept:
                    return True
                n = d.steps.get(ch)
                d = n if n is not None else self._step(d, ch)
                if not d.states:
                    return None
        return d

    @property
    def spent(self) -> int:
        """What the last ``match`` spent of its budget: the states it walked building steps, and
        one for every CHARS_PER_STATE characters it read."""
        return self._work

    def match(self, text: str, budget: int = MAX_WORK) -> bool:
        """Raises TooCostly when reading this text would spend more than ``budget`` (``spent``)."""
        self._work = 0
        self._limit = budget
        if self.search and text.endswith("\n"):     # $ matches before a final newline too
            d = self._run(text[:-1])
            if d is True or d.accept or d.accept_eol:
                return True
            n = d.steps.get("\n")
            d = n if n is not None else self._step(d, "\n")
        else:
            d = self._run(text)
            if d is True:
                return True
            if d is None:
                return False
        return d.accept or d.accept_end


def like(pattern: str) -> Matcher:
    """A LIKE pattern (``%``: any text, ``_``: one character) as a Matcher of whole texts."""
    return Matcher("".join(".*" if c == "%" else "." if c == "_" else re.escape(c) for c in pattern), dotall=True,
                   whole=True)
