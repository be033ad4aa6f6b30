"""The functions a rule may call (EMQX's names where EMQX has them).

``FUNCTIONS``: name -> (callable, least arguments, most arguments or None,
whether it takes the message context first). Every function of one or more
arguments returns NULL when its first argument is NULL (``coalesce``,
``concat`` and ``is_null`` excepted). A function that fails (``int('x')``,
``sqrt(-1)``) makes the rule fail for that message: counted, never raised
into the broker.

Time functions read no clock: "now" is the time the message arrived
(``timestamp``), which the node passes in.
"""

import base64
import datetime
import hashlib
import json
import math

_UNITS = {"second": 1, "millisecond": 1000, "microsecond": 1_000_000}
# what one function may make, so that no message's rule holds the node's event loop for long or
# grows its memory without bound: text that replace() lengthens, an integer's bits, round()'s digits
MAX_TEXT = 1 << 20
MAX_INT_BITS = 16384            # ~4,900 decimal digits: more than Python turns into text (4,300)
MAX_ROUND_DIGITS = 400
# what the functions of the rules a message runs spend of its work budget (Context.work, shared with the
# patterns: textmatch): one unit for so many characters of their texts (arguments and result) -- a
# statement may call them hundreds of times on a 1 MiB payload (100 split()s: seconds of the event loop)
CHARS_PER_UNIT = {"split": 8, "json_decode": 32}
CHARS_PER_UNIT_DEFAULT = 256          # the text functions that run at C speed (lower, md5, replace, ...)
CHARGED = {"lower", "upper", "trim", "ltrim", "rtrim", "strlen", "length", "substr", "split", "replace", "concat",
           "str", "int", "float", "md5", "sha", "sha256", "base64_encode", "base64_decode", "json_encode",
           "json_decode"}


def _text(v) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, (bytes, bytearray)):
        return v.decode("utf-8", "replace")
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (dict, list)):
        return json.dumps(v, separators=(",", ":"), allow_nan=False)
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e16:
        return repr(v)
    return str(v)


def _bytes(v) -> bytes:
    return v if isinstance(v, (bytes, bytearray)) else _text(v).encode("utf-8")


def _substr(s, start, length=None):
    s = _text(s)
    return s[start:] if length is None else s[start:start + length]


def _split(s, sep="/"):
    return [part for part in _text(s).split(sep) if part] if sep == "/" else _text(s).split(sep)


def _nth(n, seq):
    if not isinstance(seq, list) or not 1 <= n <= len(seq):
        return None
    return seq[n - 1]


def _int(v):
    if isinstance(v, str):
        v = v.strip()
        return int(float(v)) if any(c in v for c in ".eE") else int(v)
    return int(v)


def _round(x, n=0):
    if isinstance(n, int) and abs(n) > MAX_ROUND_DIGITS:
        raise ValueError(f"round(): at most {MAX_ROUND_DIGITS} digits either side of the point")
    r = round(x, n)
    return int(r) if n == 0 else r


def _rfc3339(ts, unit="millisecond"):
    seconds = ts / _UNITS[unit]
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat(timespec="milliseconds")


def _now_timestamp(ctx, unit="millisecond"):
    ms = ctx.timestamp
    return ms * _UNITS[unit] // 1000


def _now_rfc3339(ctx, unit="millisecond"):
    return _rfc3339(ctx.timestamp)


def _regex_match(s, pattern):
    # compiled by the compiler from its literal pattern (rules.textmatch: linear time, no backtracking)
    raise NotImplementedError("regex_match is compiled by the rule compiler")


def _log(base, x):
    return math.log(x, base)


def _not_json(name):
    raise ValueError(f"{name} is not JSON")


# RFC 8259's JSON: Python's json reads NaN, Infinity and -Infinity as numbers, which no JSON has
decode_json = json.JSONDecoder(parse_constant=_not_json).decode


def _json_decode(s):
    return decode_json(_text(s))


def _json_encode(v):
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _replace(s, old, new):
    s, old, new = _text(s), _text(old), _text(new)
    if len(new) > len(old):
        grown = len(s) + (s.count(old) if old else len(s) + 1) * (len(new) - len(old))
        if grown > max(len(s), MAX_TEXT):
            raise ValueError(f"replace(): the result is too large ({grown} characters)")
    return s.replace(old, new)


def _power(x, y):
    if (isinstance(x, int) and isinstance(y, int) and y > 0 and abs(x) > 1
            and (abs(x).bit_length() - 1) * y > MAX_INT_BITS):
        raise ValueError(f"power(): the result is too large (more than {MAX_INT_BITS} bits)")
    return x ** y


def _coalesce(*values):
    for v in values:
        if v is not None:
            return v
    return None


def _concat(*values):
    return "".join(_text(v) for v in values if v is not None)


def _float(v):
    return float(v.strip()) if isinstance(v, str) else float(v)


FUNCTIONS = {
    # strings
    "lower": (lambda s: _text(s).lower(), 1, 1, False),
    "upper": (lambda s: _text(s).upper(), 1, 1, False),
    "trim": (lambda s: _text(s).strip(), 1, 1, False),
    "ltrim": (lambda s: _text(s).lstrip(), 1, 1, False),
    "rtrim": (lambda s: _text(s).rstrip(), 1, 1, False),
    "strlen": (lambda s: len(_text(s)), 1, 1, False),
    "length": (lambda s: len(s) if isinstance(s, (list, dict)) else len(_text(s)), 1, 1, False),
    "substr": (_substr, 2, 3, False),
    "split": (_split, 2, 2, False),
    "nth": (_nth, 2, 2, False),
    "replace": (_replace, 3, 3, False),
    "regex_match": (_regex_match, 2, 2, False),
    "concat": (_concat, 1, None, False),
    "str": (_text, 1, 1, False),
    "int": (_int, 1, 1, False),
    "float": (_float, 1, 1, False),
    "coalesce": (_coalesce, 1, None, False),
    "is_null": (lambda v: v is None, 1, 1, False),
    # math
    "abs": (abs, 1, 1, False),
    "ceil": (lambda x: math.ceil(x), 1, 1, False),
    "floor": (lambda x: math.floor(x), 1, 1, False),
    "round": (_round, 1, 2, False),
    "sqrt": (math.sqrt, 1, 1, False),
    "power": (_power, 2, 2, False),
    "ln": (math.log, 1, 1, False),
    "log": (_log, 2, 2, False),
    "log10": (math.log10, 1, 1, False),
    # time (no clock: "now" is the message's timestamp)
    "now_timestamp": (_now_timestamp, 0, 1, True),
    "now_rfc3339": (_now_rfc3339, 0, 0, True),
    "unix_ts_to_rfc3339": (_rfc3339, 1, 2, False),
    # hashing and encodings
    "md5": (lambda v: hashlib.md5(_bytes(v)).hexdigest(), 1, 1, False),
    "sha": (lambda v: hashlib.sha1(_bytes(v)).hexdigest(), 1, 1, False),
    "sha256": (lambda v: hashlib.sha256(_bytes(v)).hexdigest(), 1, 1, False),
    "base64_encode": (lambda v: base64.b64encode(_bytes(v)).decode("ascii"), 1, 1, False),
    "base64_decode": (lambda v: base64.b64decode(_bytes(v), validate=True).decode("utf-8", "replace"), 1, 1, False),
    "json_encode": (_json_encode, 1, 1, False),
    "json_decode": (_json_decode, 1, 1, False),
}

# functions that do something with NULL (the rest return NULL for a NULL first argument)
NULL_AWARE = {"coalesce", "concat", "is_null", "now_timestamp", "now_rfc3339"}

# what each does, for the documentation (README) and error messages
DOCS = {
    "lower": "lower(s)", "upper": "upper(s)", "trim": "trim(s)", "ltrim": "ltrim(s)", "rtrim": "rtrim(s)",
    "strlen": "strlen(s): characters", "length": "length(x): characters of a string, items of an array or object",
    "substr": "substr(s, start[, len]): start counts from 0", "split": "split(s, sep): a '/' split drops empty parts",
    "nth": "nth(n, array): the n-th item, from 1; NULL beyond the end", "replace": "replace(s, old, new)",
    "regex_match": "regex_match(s, re): true when re (a string literal) matches anywhere in s", "concat": "concat(a, b, ...)",
    "str": "str(x)", "int": "int(x)", "float": "float(x)", "coalesce": "coalesce(a, b, ...): the first not NULL",
    "is_null": "is_null(x)", "abs": "abs(x)", "ceil": "ceil(x)", "floor": "floor(x)",
    "round": "round(x[, digits])", "sqrt": "sqrt(x)", "power": "power(x, y)", "ln": "ln(x)",
    "log": "log(base, x)", "log10": "log10(x)",
    "now_timestamp": "now_timestamp(['second'|'millisecond'|'microsecond']): when the message arrived",
    "now_rfc3339": "now_rfc3339(): when the message arrived, RFC 3339 UTC",
    "unix_ts_to_rfc3339": "unix_ts_to_rfc3339(ts[, unit]): unit 'millisecond' by default",
    "md5": "md5(x): hex", "sha": "sha(x): SHA-1 hex", "sha256": "sha256(x): hex",
    "base64_encode": "base64_encode(x)", "base64_decode": "base64_decode(s)",
    "json_encode": "json_encode(x): compact JSON text", "json_decode": "json_decode(s)",
}
