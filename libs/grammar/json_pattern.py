"""JSON Schema ``pattern`` -> regex over JSON string content: Python's parser
reads the pattern, and each character set is re-emitted as what a JSON string may
hold (``"``, ``\\`` and controls as short escapes)."""

from __future__ import annotations

import re
import re._constants as _c  # NOTE: stdlib; the parser's op codes (was sre_constants)
import re._parser as _p  # NOTE: private but stable (was sre_parse); only parses `pattern`

from .json_parts import _alt, _fail, _lit, _rep

_MAX_CP = 0x10FFFF
_Ranges = list[tuple[int, int]]


def _norm(ranges: _Ranges) -> _Ranges:
    out: _Ranges = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _complement(ranges: _Ranges) -> _Ranges:
    out, nxt = [], 0
    for a, b in _norm(ranges):
        if a > nxt:
            out.append((nxt, a - 1))
        nxt = b + 1
    return out + ([(nxt, _MAX_CP)] if nxt <= _MAX_CP else [])


def _size(ranges: _Ranges) -> int:
    return sum(b - a + 1 for a, b in ranges)


# NOTE: \d \w \s differ between ECMA-262 (the spec), Python and Rust (Unicode) validators. A positive
# class uses each category's `least` set (in every flavour), a negated one excludes its `most` set
# (any flavour's), so every value generated matches under all three: \d \w are ASCII, and \D \W
# (and [^\d], [^\w]) match ASCII chars only.
_NON_ASCII = [(0x80, _MAX_CP)]
_SPACE_LEAST = [(9, 13), (32, 32), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A), (0x2028, 0x2029),
                (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000)]
_SPACE_MOST = _SPACE_LEAST + [(0x1C, 0x1F), (0x85, 0x85), (0xFEFF, 0xFEFF)]
_DIGIT, _WORD = [(0x30, 0x39)], [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]
_CATEGORIES = {  # category -> (least, most)
    _c.CATEGORY_DIGIT: (_DIGIT, _DIGIT + _NON_ASCII),
    _c.CATEGORY_NOT_DIGIT: (_complement(_DIGIT + _NON_ASCII), _complement(_DIGIT)),
    _c.CATEGORY_WORD: (_WORD, _WORD + _NON_ASCII),
    _c.CATEGORY_NOT_WORD: (_complement(_WORD + _NON_ASCII), _complement(_WORD)),
    _c.CATEGORY_SPACE: (_SPACE_LEAST, _SPACE_MOST),
    _c.CATEGORY_NOT_SPACE: (_complement(_SPACE_MOST), _complement(_SPACE_LEAST)),
}
_DOT = _complement([(10, 10), (13, 13), (0x2028, 0x2029)])  # ECMA-262 `.`
_SPECIAL = [(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C)]  # chars a JSON string cannot hold raw
_SHORT = {0x22: '"', 0x5C: "\\\\", 0x08: "b", 0x0C: "f", 0x0A: "n", 0x0D: "r", 0x09: "t"}
_UNSUPPORTED = {"ASSERT": "lookaround", "ASSERT_NOT": "lookaround", "GROUPREF": "a backreference",
                "GROUPREF_EXISTS": "a conditional", "ATOMIC_GROUP": "an atomic group",
                "POSSESSIVE_REPEAT": "a possessive quantifier",
                "AT": "an anchor or word boundary (only ^ first and $ last are allowed)"}


def _pattern(pattern, path: str) -> str:
    """JSON string content whose decoded value fully matches `pattern` (short escapes for " \\ and controls)."""
    if not isinstance(pattern, str):
        raise _fail(path, "must be a string")
    try:
        tree = _p.parse(pattern)
    except re.error as e:
        raise _fail(path, f"invalid regex: {e.msg}") from None
    except RecursionError:
        raise _fail(path, "regex is nested too deeply") from None
    if tree.state.flags & ~re.UNICODE:
        raise _fail(path, "regex flags are not supported")
    items = list(tree.data)
    if items and items[0] in ((_c.AT, _c.AT_BEGINNING), (_c.AT, _c.AT_BEGINNING_STRING)):
        items = items[1:]
    if items and items[-1] in ((_c.AT, _c.AT_END), (_c.AT, _c.AT_END_STRING)):
        items = items[:-1]
    return _emit(items, path)


def _emit(items, path: str) -> str:
    out = []
    for op, av in items:
        if op in (_c.LITERAL, _c.NOT_LITERAL, _c.ANY, _c.IN):
            out.append(_json_char(_charset(op, av, path), path))
        elif op is _c.BRANCH:
            out.append("(?:" + "|".join(_emit(sub, path) for sub in av[1]) + ")")
        elif op is _c.SUBPATTERN:
            if av[1] or av[2]:
                raise _fail(path, "regex flags are not supported")
            out.append(f"(?:{_emit(av[3], path)})")
        elif op in (_c.MAX_REPEAT, _c.MIN_REPEAT):
            lo, hi, sub = av
            if hi != 0:
                out.append(f"(?:{_emit(sub, path)})" + _rep(lo, None if hi is _c.MAXREPEAT else hi))
        else:
            raise _fail(path, f"{_UNSUPPORTED.get(str(op), str(op).lower())} is not supported")
    return "".join(out)


def _charset(op, av, path: str) -> _Ranges:
    if op is _c.LITERAL:
        return [(av, av)]
    if op is _c.NOT_LITERAL:
        return _complement([(av, av)])
    if op is _c.ANY:
        return _DOT
    ranges, negate = [], False
    for item, value in av:
        if item is _c.NEGATE:
            negate = True
        elif item is _c.LITERAL:
            ranges.append((value, value))
        elif item is _c.RANGE:
            ranges.append(value)
        elif item is _c.CATEGORY and value in _CATEGORIES:
            ranges += _CATEGORIES[value][negate]  # NOTE: NEGATE always comes first
        else:
            raise _fail(path, f"{str(value).lower()} is not supported in a character class")
    return _complement(ranges) if negate else _norm(ranges)


def _json_char(chars: _Ranges, path: str) -> str:
    """One char of `chars` as JSON string content: raw if it may be, else its short escape."""
    raw = _complement(_complement(chars) + _SPECIAL)
    escapes = "".join(e for c, e in _SHORT.items() if any(a <= c <= b for a, b in chars))
    parts = ([_class(raw)] if raw else []) + ([f"\\\\[{escapes}]"] if escapes else [])
    if not parts:
        raise _fail(path, "matches a character that JSON strings can only hold as \\u escapes")
    return _alt(parts)


def _class(ranges: _Ranges) -> str:
    """A regex class of `ranges`; negated when that is smaller (regex_parse bounds class sizes)."""
    negate = _size(ranges) > _size(_complement(ranges))
    items = _complement(ranges) if negate else ranges
    if not negate and len(items) == 1 and items[0][0] == items[0][1]:
        return _lit(chr(items[0][0])) if 0x20 <= items[0][0] < 0x7F else _cp(items[0][0])
    body = "".join(_cp(a) if a == b else f"{_cp(a)}-{_cp(b)}" for a, b in items)
    return f"[{'^' if negate else ''}{body}]"


def _cp(c: int) -> str:
    if chr(c).isascii() and chr(c).isalnum():
        return chr(c)
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}" if c < 0x10000 else f"\\U{c:08x}"
