"""Pieces of the JSON Schema -> regex translation (:mod:`.json_schema`): the
error type, JSON's lexical regexes and string formats, integer ranges as regexes,
and free-form JSON values of bounded depth."""

from __future__ import annotations

import json
import math

WHITESPACE = " ?"
MAX_REF_DEPTH = 2  # a recursive $ref expands this many times on one path before it is cut
FREE_DEPTH = 2  # container levels of a free-form value ({}, true, {"type": "object"/"array"}), itself included
JSON_OBJECT_DEPTH = 3  # JSON_OBJECT_REGEX: the top object plus two more levels of containers
_MAX_CHARS = 1 << 16  # a schema whose regex grows past this is refused (refs reused exponentially)
_MAX_NESTING = 64
MAX_COUNT = 100_000  # lengths and item counts (a regex repetition count must stay small)

_SAFE = r'[^"\\\x00-\x1f]'  # a char a JSON string may hold raw
_ESCAPE = r'\\["\\/bfnrt]'
_BCHAR = f"(?:{_SAFE}|{_ESCAPE})"  # one char of a length-bounded string: no \u escapes
_STRING = f'"(?:{_SAFE}|{_ESCAPE}|\\\\u[0-9a-fA-F]{{4}})*"'
_INT = r"-?(?:0|[1-9]\d*)"
_NUMBER = _INT + r"(?:\.\d+)?(?:[eE][+-]?\d{1,2})?"  # NOTE: 2 exponent digits: no overflow to inf
# Free-form values (JSON_OBJECT_REGEX, {}): no \u escapes, no exponents; keys and the strings of the
# innermost level have no escapes at all. NOTE: regex text (it grows 4x per level), more than
# automaton states, bounds their depth.
_PLAIN_STRING = f'"{_SAFE}*"'
_FREE_SCALAR = f'"{_BCHAR}*"|{_INT}(?:\\.\\d+)?|true|false|null'
_PLAIN_SCALAR = f"{_PLAIN_STRING}|{_INT}(?:\\.\\d+)?|true|false|null"

_DATE = ("[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
         "|02-(?:0[1-9]|1[0-9]|2[0-8]))|(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])"
         "|(?:[02468][048]|[13579][26])00)-02-29")
_HOUR, _MIN = "(?:[01][0-9]|2[0-3])", "[0-5][0-9]"
_TIME = f"{_HOUR}:{_MIN}:{_MIN}(?:\\.[0-9]{{1,9}})?(?:Z|[+-]{_HOUR}:{_MIN})"  # RFC 3339 full-time
_ATOM = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
# a host label: letters, digits, inner hyphens, and not "--" as its 3rd and 4th characters (RFC 5891
# 4.2.3.1 reserves those; validators reject them, so A-labels such as "xn--" are left out as well)
_LABEL = "[A-Za-z0-9](?:[A-Za-z0-9-]?[A-Za-z0-9]|[A-Za-z0-9-]{2}[A-Za-z0-9]|[A-Za-z0-9-](?:[A-Za-z0-9][A-Za-z0-9-]|-[A-Za-z0-9])[A-Za-z0-9-]*[A-Za-z0-9])?"
_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_HEX = "[0-9a-fA-F]"
# format -> (regex of the raw text between the quotes, min length, max length or None)
_FORMATS = {
    "date": (f"(?:{_DATE})", 10, 10),
    "time": (_TIME, 9, 24),
    "date-time": (f"(?:{_DATE})T{_TIME}", 20, 35),
    "email": (f"{_ATOM}(?:\\.{_ATOM})*@{_LABEL}(?:\\.{_LABEL})+", 5, None),  # label lengths unchecked
    "uuid": (f"{_HEX}{{8}}(?:-{_HEX}{{4}}){{3}}-{_HEX}{{12}}", 36, 36),
    "ipv4": (f"(?:{_OCTET}\\.){{3}}{_OCTET}", 7, 15),
}

_ANNOTATIONS = {"title", "description", "default", "examples", "$schema", "$id", "$comment", "$defs",
                "definitions", "deprecated", "readOnly", "writeOnly", "contentEncoding", "contentMediaType"}
_TYPE_KEYS = {
    "object": {"properties", "required", "additionalProperties"},
    "array": {"items", "minItems", "maxItems"},
    "string": {"minLength", "maxLength", "pattern", "format"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
}
_TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")
_KNOWN = _ANNOTATIONS | {"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref"}.union(*_TYPE_KEYS.values())


class SchemaError(ValueError):
    """The schema is outside the supported subset or invalid; the message (fit for an HTTP 400) names its path."""


def _at(path: str, key) -> str:
    return f"{path}.{key}" if path else str(key)


def _fail(path: str, message: str) -> SchemaError:
    return SchemaError(f"{path or 'schema'}: {message}")


def _alt(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"


def _rep(lo: int, hi: int | None) -> str:
    """Quantifier for lo..hi repetitions (hi None: unbounded); "" for exactly one."""
    if hi is None:
        return {0: "*", 1: "+"}.get(lo, f"{{{lo},}}")
    return "" if lo == hi == 1 else "?" if (lo, hi) == (0, 1) else f"{{{lo}}}" if lo == hi else f"{{{lo},{hi}}}"


def _lit(text: str) -> str:
    """`text` as a regex literal."""
    return "".join("\\" + c if c in ".^$*+?{}[]\\|()" else f"\\x{ord(c):02x}" if ord(c) < 0x20 else c
                   for c in text)


def _dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _count(schema: dict, key: str, path: str, default: int | None) -> int | None:
    if key not in schema:
        return default
    value = schema[key]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _fail(_at(path, key), "must be a non-negative integer")
    if value > MAX_COUNT:
        raise _fail(_at(path, key), f"must be at most {MAX_COUNT}")
    return value


def _bounds(schema: dict, path: str) -> tuple[int | None, bool, int | None, bool]:
    """(lo, lo exclusive, hi, hi exclusive) as integers: the tightest of the four keywords; a
    fractional bound rounds inward and becomes inclusive (a subset of the numbers allowed)."""
    lo = hi = None
    lo_x = hi_x = False
    for key, upper, excl in (("minimum", False, False), ("exclusiveMinimum", False, True),
                             ("maximum", True, False), ("exclusiveMaximum", True, True)):
        if key not in schema:
            continue
        v = schema[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise _fail(_at(path, key), "must be a number")
        if abs(v) >= 1e18:
            raise _fail(_at(path, key), "bounds beyond 1e18 are not supported")
        b, x = (int(v), excl) if v == int(v) else (math.floor(v) if upper else math.ceil(v), False)
        if upper and (hi is None or b < hi or (b == hi and x)):
            hi, hi_x = b, x
        elif not upper and (lo is None or b > lo or (b == lo and x)):
            lo, lo_x = b, x
    return lo, lo_x, hi, hi_x


def _digits(n: int) -> str:
    return "" if n == 0 else "[0-9]" if n == 1 else f"[0-9]{{{n}}}"


def _between(lo: str, hi: str) -> str:
    """Digit strings s of the same length as lo and hi with lo <= s <= hi."""
    if lo == hi:
        return lo
    if lo[0] == hi[0]:
        return lo[0] + _between(lo[1:], hi[1:])
    n = len(lo) - 1
    lo_full, hi_full = lo[1:] == "0" * n, hi[1:] == "9" * n
    a, b = int(lo[0]) + (not lo_full), int(hi[0]) - (not hi_full)
    parts = [] if lo_full else [lo[0] + _between(lo[1:], "9" * n)]
    if a <= b:
        parts.append((str(a) if a == b else f"[{a}-{b}]") + _digits(n))
    if not hi_full:
        parts.append(hi[0] + _between("0" * n, hi[1:]))
    return _alt(parts)


def _uint_range(lo: int, hi: int | None) -> str:
    """Integers lo..hi (hi None: unbounded) written without sign or leading zeros; 0 <= lo <= hi."""
    first = len(str(lo))
    parts = []
    for n in range(first, first + 1 if hi is None else len(str(hi)) + 1):
        a = max(lo, 10 ** (n - 1) if n > 1 else 0)
        b = 10**n - 1 if hi is None else min(hi, 10**n - 1)
        if a <= b:
            parts.append(_between(str(a), str(b)))
    if hi is None:
        parts.append(f"[1-9][0-9]{{{first},}}")
    return _alt(parts)


def _udecimal(lo: int, lo_x: bool, hi: int | None, hi_x: bool) -> str | None:
    """Plain decimals y >= 0 (no exponent) with lo < y or lo <= y (lo_x), and y < hi or y <= hi; None if none."""
    if hi is not None and (hi < lo or (hi == lo and (lo_x or hi_x))):
        return None
    if hi == lo:
        return f"{lo}(?:\\.0+)?"
    parts = [f"{lo}\\.[0-9]*[1-9][0-9]*"] if lo_x else []  # integer part lo: the fraction must be > 0
    first, last = lo + lo_x, None if hi is None else hi - 1
    if last is None or first <= last:
        parts.append(_uint_range(first, last) + r"(?:\.[0-9]+)?")
    if hi is not None and not hi_x:
        parts.append(f"{hi}(?:\\.0+)?")
    return _alt(parts) if parts else None


def _container(open_: str, close: str, member: str, ws: str) -> str:
    return rf"\{open_}{ws}(?:{member}(?:,{ws}{member})*{ws})?\{close}"


def _free_value(depth: int, ws: str) -> str:
    """Any JSON value with at most `depth` levels of containers (strings at the innermost level have
    no escapes, see _PLAIN_STRING; the regex text grows 4x per level)."""
    value = _PLAIN_SCALAR
    for _ in range(depth):
        inner = f"(?:{value})"
        value = f"{_FREE_SCALAR}|{_container('{', '}', f'{_PLAIN_STRING}:{ws}{inner}', ws)}|" + \
            _container("[", "]", inner, ws)
    return f"(?:{value})"


def _free_object(depth: int, ws: str) -> str:
    """Any JSON object with at most `depth` levels of containers, itself included."""
    return _container("{", "}", f"{_PLAIN_STRING}:{ws}{_free_value(depth - 1, ws)}", ws)
