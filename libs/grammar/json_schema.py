"""JSON Schema -> regex for structured outputs (``response_format``); pure standard library.

Every full match of ``schema_to_regex(schema)`` is a JSON text valid under ``schema``; the regex
matches a documented subset of the valid texts, never more (one exception: ``oneOf`` whose branches
overlap, see below). What is not supported raises
:class:`SchemaError` (HTTP 400 material naming the schema path, e.g. ``properties.age: 'multipleOf'
is not supported``); nothing is silently loosened. The regexes use only syntax that means the same
to ``regex_dfa.parse_regex`` and to Python's ``re`` under ``re.ASCII``.

- ``type``: a name or a list (``["string", "null"]``: alternation). Without ``type``: the types whose
  keywords appear (``properties`` -> object, ...), or any JSON value if none do.
- object: ``properties`` in schema order; those not in ``required`` may be skipped. With
  properties no other key is ever generated, whatever ``additionalProperties`` says (a subset).
  Without properties: ``additionalProperties: false`` -> ``{}``; a schema -> any string keys
  mapped to it; absent/true/{} -> a free-form object (FREE_DEPTH).
- array: ``items`` (absent/true/{}: free-form values), ``minItems``, ``maxItems``.
- string: unbounded strings take every JSON escape (``\\uXXXX`` too); with ``minLength``/
  ``maxLength`` (chars, an escape counts one) no ``\\uXXXX``: 2 automaton states per char, not 6.
  ``pattern``: Python-parsable ECMA-like syntax, no flags, lookaround, backrefs, ``^``/``$`` only
  first/last; the value must match it WHOLLY (a subset of JSON Schema's search semantics); ``"``,
  ``\\`` and controls it allows are written as short JSON escapes; see _CATEGORIES for ``\\d \\w \\s``.
  ``format``: date, time, date-time (RFC 3339, offset required, Feb 29 only in leap years), email
  (label lengths unchecked), uuid, ipv4. pattern, format and the lengths do not combine (except
  lengths that a format always meets).
- integer: exact ``minimum``/``maximum``/``exclusiveMinimum``/``exclusiveMaximum`` ranges.
- number: the same bounds; with any bound plain decimals only (no exponent), and a fractional bound
  rounds inward to an integer (``minimum: 0.5`` -> ``>= 1``). Without bounds the JSON grammar, with
  at most 2 exponent digits (no overflow to inf).
- boolean, null; ``enum``/``const`` of any JSON value (values the sibling keywords exclude are
  dropped); ``anyOf``/``oneOf`` as alternation (oneOf is exact only for disjoint branches, e.g. of
  distinct types or consts); ``allOf`` of one schema; ``$ref`` to any ``#/...`` pointer of the
  document (``#/$defs/X``, ``#/definitions/X``). A recursive ref expands MAX_REF_DEPTH times on one
  path, then the recursing branch is cut (optional property dropped, array empty, anyOf branch
  removed; a schema left with no value is a SchemaError). ``true``/``false`` schemas.
- Ignored annotations: title, description, default, examples, $schema, $id, $comment, ...
- Free-form values (JSON_OBJECT_REGEX, FREE_DEPTH) nest a bounded number of containers; their strings
  have no ``\\u`` escapes, their keys and the strings of their innermost level no escapes at all,
  their numbers no exponent: their text grows 4x per level (JSON_OBJECT_REGEX: 3833 chars).

Whitespace: ``whitespace`` (default: one optional space) may follow ``{ [ , :`` and precede
``} ]``, nowhere else. Each position costs one automaton state (``[ \\n]{0,2}``: two; measured on an
8-field schema: 211 vs 228 states); unbounded whitespace is free in states but lets a model loop.
"""

from __future__ import annotations

import re

from .json_parts import (  # NOTE: the package's own pieces, private to it
    _ANNOTATIONS,
    _BCHAR,
    _FORMATS,
    _INT,
    _KNOWN,
    _MAX_CHARS,
    _MAX_NESTING,
    _NUMBER,
    _PLAIN_STRING,
    _STRING,
    _TYPE_KEYS,
    _TYPES,
    FREE_DEPTH,
    JSON_OBJECT_DEPTH,
    MAX_REF_DEPTH,
    WHITESPACE,
    SchemaError,
    _alt,
    _at,
    _bounds,
    _container,
    _count,
    _dumps,
    _fail,
    _free_object,
    _free_value,
    _lit,
    _rep,
    _udecimal,
    _uint_range,
)
from .json_pattern import _pattern

__all__ = ["FREE_DEPTH", "JSON_OBJECT_DEPTH", "JSON_OBJECT_REGEX", "MAX_REF_DEPTH", "WHITESPACE",
           "SchemaError", "schema_to_regex"]

def schema_to_regex(schema: dict | bool, *, whitespace: str = WHITESPACE) -> str:
    """A regex whose full matches are JSON texts valid under `schema` (module docstring: the subset)."""
    if not isinstance(whitespace, str) or not re.fullmatch(whitespace, ""):
        raise ValueError("whitespace must be a regex that matches the empty string")
    try:
        regex = _Builder(schema, f"(?:{whitespace})" if "|" in whitespace else whitespace).build(schema, "")
    except RecursionError:
        raise SchemaError("schema: nested too deeply") from None
    if regex is None:
        raise SchemaError("schema: no JSON value satisfies it (within the recursion limit)")
    return regex


class _Builder:
    """One schema document: resolves its refs, tracks the refs being expanded on the current path."""

    def __init__(self, root, ws: str):
        self.root, self.ws = root, ws
        self.expanding: list[str] = []

    def build(self, schema, path: str) -> str | None:
        """Regex of `schema` at `path`; None = no value (a cut recursion, `false`)."""
        if path.count(".") > _MAX_NESTING:
            raise _fail(path, "the schema is nested too deeply")
        if schema is True:
            return _free_value(FREE_DEPTH, self.ws)
        if schema is False:
            return None
        if not isinstance(schema, dict):
            raise _fail(path, "a schema must be an object or a boolean")
        unknown = [k for k in schema if k not in _KNOWN]
        if unknown:
            raise _fail(path, f"{unknown[0]!r} is not supported")
        regex = self._dispatch(schema, path)
        if regex is not None and len(regex) > _MAX_CHARS:
            raise _fail(path, f"the schema is too large (its regex passes {_MAX_CHARS} chars)")
        return regex

    def _dispatch(self, schema: dict, path: str) -> str | None:
        if "enum" in schema or "const" in schema:
            return self._enum(schema, path)
        for key in ("$ref", "allOf", "anyOf", "oneOf"):
            if key in schema:
                others = [k for k in schema if k != key and k not in _ANNOTATIONS]
                if others:
                    raise _fail(path, f"{others[0]!r} next to {key!r} is not supported")
                return getattr(self, "_" + key.lstrip("$"))(schema[key], _at(path, key))
        return self._typed(schema, path)

    def _ref(self, ref, path: str) -> str | None:
        if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
            raise _fail(path, f"only local refs ('#/$defs/...') are supported, not {ref!r}")
        if self.expanding.count(ref) >= MAX_REF_DEPTH:
            return None
        if len(self.expanding) > _MAX_NESTING:
            raise _fail(path, "refs are nested too deeply")
        target, where = self.root, []
        for token in ref[2:].split("/") if ref != "#" else []:
            token = token.replace("~1", "/").replace("~0", "~")
            if isinstance(target, list) and token.isdigit() and int(token) < len(target):
                target = target[int(token)]
            elif isinstance(target, dict) and token in target:
                target = target[token]
            else:
                raise _fail(path, f"{ref!r} does not resolve")
            where.append(token)
        self.expanding.append(ref)
        try:
            return self.build(target, ".".join(where))
        finally:
            self.expanding.pop()

    def _allOf(self, schemas, path: str) -> str | None:
        if not isinstance(schemas, list) or len(schemas) != 1:
            raise _fail(path, "only an allOf of exactly one schema is supported")
        return self.build(schemas[0], _at(path, 0))

    def _anyOf(self, schemas, path: str) -> str | None:
        if not isinstance(schemas, list) or not schemas:
            raise _fail(path, "must be a non-empty list of schemas")
        parts = [self.build(s, _at(path, i)) for i, s in enumerate(schemas)]
        parts = [p for p in parts if p is not None]
        return _alt(parts) if parts else None

    _oneOf = _anyOf  # NOTE: alternation; exact when the branches are disjoint

    def _enum(self, schema: dict, path: str) -> str:
        values = schema.get("enum", [])
        if "enum" in schema and (not isinstance(values, list) or not values):
            raise _fail(_at(path, "enum"), "must be a non-empty list")
        if "const" in schema:
            const = self._text(schema["const"], _at(path, "const"))
            values = [schema["const"]] if "enum" not in schema or const in [_dumps(v) for v in values] else []
        by_text = {self._text(v, _at(path, "enum")): v for v in values}
        rest = {k: v for k, v in schema.items() if k not in ("enum", "const") and k not in _ANNOTATIONS}
        if rest and by_text:
            base = self.build(rest, path)
            by_text = {t: v for t, v in by_text.items() if base is not None and re.fullmatch(base, t, re.ASCII)}
        if not by_text:
            raise _fail(path, "no enum/const value satisfies the schema")
        return _alt([self._value(v) for v in by_text.values()])

    def _value(self, value) -> str:
        """One JSON value as a regex, with the whitespace policy inside containers."""
        ws = self.ws
        if isinstance(value, dict):
            items = [f"{_lit(_dumps(k))}:{ws}{self._value(v)}" for k, v in value.items()]
            return rf"\{{{ws}{f',{ws}'.join(items)}{ws}\}}" if items else rf"\{{{ws}\}}"
        if isinstance(value, list):
            items = [self._value(v) for v in value]
            return rf"\[{ws}{f',{ws}'.join(items)}{ws}\]" if items else rf"\[{ws}\]"
        return _lit(_dumps(value))

    @staticmethod
    def _text(value, path: str) -> str:
        try:
            return _dumps(value)
        except (TypeError, ValueError):
            raise _fail(path, "values must be JSON (no NaN or Infinity)") from None

    def _typed(self, schema: dict, path: str) -> str | None:
        types = schema.get("type")
        if types is None:
            types = [t for t in _TYPE_KEYS if _TYPE_KEYS[t] & schema.keys()]
            if not types:
                return _free_value(FREE_DEPTH, self.ws)
        names = [types] if isinstance(types, str) else types
        if not isinstance(names, list) or not names or any(t not in _TYPES for t in names):
            raise _fail(_at(path, "type"), f"must be one of {', '.join(_TYPES)} or a non-empty list of them")
        if "number" in names:  # NOTE: every integer is a number; keep one alternative
            names = [t for t in names if t != "integer"]
        parts = [getattr(self, "_" + t)(schema, path) for t in dict.fromkeys(names)]
        parts = [p for p in parts if p is not None]
        return _alt(parts) if parts else None

    def _object(self, schema: dict, path: str) -> str | None:
        props = schema.get("properties", {})
        required = schema.get("required", [])
        if not isinstance(props, dict):
            raise _fail(_at(path, "properties"), "must be an object")
        if not isinstance(required, list) or not all(isinstance(k, str) for k in required):
            raise _fail(_at(path, "required"), "must be a list of strings")
        missing = [k for k in required if k not in props]
        if missing:
            raise _fail(_at(path, "required"), f"{missing[0]!r} is not in properties")
        if not props:
            return self._map(schema.get("additionalProperties", True), _at(path, "additionalProperties"))
        members = []
        for key, sub in props.items():
            value = self.build(sub, _at(_at(path, "properties"), key))
            if value is None and key in required:
                return None
            if value is not None:
                members.append((_lit(_dumps(key)) + ":" + self.ws + value, key in required))
        return self._members(members)

    def _map(self, extra, path: str) -> str:
        """An object without properties: {} (false), free-form (true/absent/{}), or string keys -> `extra`."""
        ws = self.ws
        if extra is True or extra == {}:
            return _free_object(FREE_DEPTH, ws)
        value = self.build(extra, path)
        if value is None:
            return rf"\{{{ws}\}}"
        return _container("{", "}", f"{_PLAIN_STRING}:{ws}{value}", ws)

    def _members(self, members: list[tuple[str, bool]]) -> str:
        """Members in order, optional ones skippable, comma-separated, in regex text linear in theirs.

        Before the first required member every written one is followed by a comma; after it every
        written one is preceded by one. With none required, D_i (a non-empty subsequence of members
        i..) = ``(?:(?:m_i,)?D_i+1|m_i)``: each member appears twice, not once per earlier member.
        """
        ws = self.ws
        first = next((i for i, (_, req) in enumerate(members) if req), None)
        if first is not None:
            head = "".join(f"(?:{text},{ws})?" for text, _ in members[:first])
            tail = "".join(f",{ws}{text}" if req else f"(?:,{ws}{text})?" for text, req in members[first + 1:])
            return rf"\{{{ws}{head}{members[first][0]}{tail}{ws}\}}"
        if not members:
            return rf"\{{{ws}\}}"
        body = members[-1][0]
        for text, _ in reversed(members[:-1]):
            body = f"(?:(?:{text},{ws})?{body}|{text})"
        return rf"\{{{ws}(?:{body}{ws})?\}}"

    def _array(self, schema: dict, path: str) -> str | None:
        lo = _count(schema, "minItems", path, 0)
        hi = _count(schema, "maxItems", path, None)
        if hi is not None and hi < lo:
            raise _fail(path, "minItems > maxItems")
        items = schema.get("items", True)
        if isinstance(items, list):
            raise _fail(_at(path, "items"), "a list of schemas (tuple) is not supported")
        free = items is True or items == {}
        item = _free_value(FREE_DEPTH - 1, self.ws) if free else self.build(items, _at(path, "items"))
        ws, empty = self.ws, rf"\[{self.ws}\]"
        if item is None or hi == 0:
            return empty if lo == 0 else None
        more = "" if hi == 1 else f"(?:,{ws}{item})" + _rep(max(lo - 1, 0), None if hi is None else hi - 1)
        return rf"\[{ws}{item}{more}{ws}\]" if lo else rf"\[{ws}(?:{item}{more}{ws})?\]"

    def _string(self, schema: dict, path: str) -> str:
        lo = _count(schema, "minLength", path, 0)
        hi = _count(schema, "maxLength", path, None)
        if hi is not None and hi < lo:
            raise _fail(path, "minLength > maxLength")
        fmt, pattern = schema.get("format"), schema.get("pattern")
        if fmt is not None and pattern is not None:
            raise _fail(path, "'format' together with 'pattern' is not supported")
        if fmt is not None:
            if not isinstance(fmt, str) or fmt not in _FORMATS:
                raise _fail(_at(path, "format"), f"{fmt!r} is not supported (supported: {', '.join(_FORMATS)})")
            regex, flo, fhi = _FORMATS[fmt]
            if flo < lo or (hi is not None and (fhi is None or fhi > hi)):
                raise _fail(path, f"minLength/maxLength together with format {fmt!r} is not supported")
            return f'"{regex}"'
        if pattern is not None:
            if lo or hi is not None:
                raise _fail(path, "minLength/maxLength together with 'pattern' is not supported")
            return f'"{_pattern(pattern, _at(path, "pattern"))}"'
        if (lo, hi) == (0, None):
            return _STRING
        return '""' if hi == 0 else f'"{_BCHAR}{_rep(lo, hi)}"'

    def _integer(self, schema: dict, path: str) -> str:
        lo, lo_x, hi, hi_x = _bounds(schema, path)
        if lo is None and hi is None:
            return _INT
        lo = None if lo is None else lo + 1 if lo_x else lo
        hi = None if hi is None else hi - 1 if hi_x else hi
        if lo is not None and hi is not None and lo > hi:
            raise _fail(path, "no integer is within minimum/maximum")
        parts = []
        if hi is None or hi >= 0:
            parts.append(_uint_range(max(lo or 0, 0), hi))
        if lo is None or lo < 0:
            parts.append("-" + _uint_range(1 if hi is None or hi >= 0 else -hi, None if lo is None else -lo))
        return _alt(parts)

    def _number(self, schema: dict, path: str) -> str:
        lo, lo_x, hi, hi_x = _bounds(schema, path)
        if lo is None and hi is None:
            return _NUMBER
        pos = neg = None
        if hi is None or hi > 0 or (hi == 0 and not hi_x):
            pos = _udecimal(*((lo, lo_x) if lo is not None and lo >= 0 else (0, False)), hi, hi_x)
        if lo is None or lo < 0:  # x = -y, y > 0
            neg = _udecimal(*((-hi, hi_x) if hi is not None and hi < 0 else (0, True)),
                            None if lo is None else -lo, lo_x)
        parts = [p for p in (pos, None if neg is None else "-" + neg) if p is not None]
        if not parts:
            raise _fail(path, "no number is within minimum/maximum")
        return _alt(parts)

    def _boolean(self, schema: dict, path: str) -> str:
        return "(?:true|false)"

    def _null(self, schema: dict, path: str) -> str:
        return "null"


JSON_OBJECT_REGEX = _free_object(JSON_OBJECT_DEPTH, WHITESPACE)
