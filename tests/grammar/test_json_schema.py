"""JSON Schema -> regex: valid instances match (compact and spaced), invalid ones do not, every regex
builds a CharDFA within budget, random walks of the DFA are valid JSON under the schema, errors."""

from __future__ import annotations

import functools
import json
import random
import re
from fractions import Fraction

import numpy as np
import pytest
from interegular.fsm import anything_else

from libs.grammar.json_schema import (
    JSON_OBJECT_DEPTH,
    JSON_OBJECT_REGEX,
    SchemaError,
    schema_to_regex,
)
from libs.grammar.regex_dfa import parse_regex
from libs.grammar.regex_parse import MAX_PATTERN_CHARS


def compact(x) -> str:
    return json.dumps(x, separators=(",", ":"), ensure_ascii=False)


def spaced(x) -> str:
    return json.dumps(x, ensure_ascii=False)  # ", " and ": "


def dfa_accepts(dfa, text: str) -> bool:
    cps = np.array(sorted({ord(c) for c in text}), np.int64)
    cls = dict(zip(cps.tolist(), dfa.classes_of(cps).tolist()))
    s = dfa.start
    for ch in text:
        k = cls[ord(ch)]
        if k >= dfa.table.shape[1] or (s := int(dfa.table[s, k])) < 0:
            return False
    return bool(dfa.accepting[s])


def matches(regex: str, text: str) -> bool:
    """Python's re (ASCII classes, as regex_parse) and the CharDFA must agree."""
    by_re = re.fullmatch(regex, text, re.ASCII) is not None
    assert dfa_accepts(cached_dfa(regex), text) == by_re, text
    return by_re


@functools.cache
def cached_dfa(regex: str):
    return parse_regex(regex)


_POOL = ["é", "中", "😀", "ß", "\u2028", "Ω"]


def random_walk(dfa, rng: random.Random, soft_len: int = 60) -> str:
    """A random string the DFA accepts: free moves up to soft_len chars, then straight to acceptance."""
    chars, dist = _walk_tables(dfa)
    s, out = dfa.start, []
    while True:
        # NOTE: in the order of the classes' first chars, not of their ids: the ids follow set
        # order in the DFA's construction (the hash seed), and the walks must not
        moves = sorted(((k, int(t)) for k, t in enumerate(dfa.table[s]) if t >= 0 and chars.get(k)),
                       key=lambda move: chars[move[0]][0])
        if dfa.accepting[s] and (not moves or len(out) >= soft_len or rng.random() < 0.05):
            return "".join(out)
        if len(out) >= soft_len:
            moves = [(k, t) for k, t in moves if dist[t] < dist[s]]
        k, s = rng.choice(moves)
        out.append(rng.choice(chars[k]))


@functools.cache
def _walk_tables(dfa) -> tuple[dict[int, list[str]], list[float]]:
    """Chars of each class (a few outside the alphabet for its `anything_else`), distance to acceptance."""
    chars: dict[int, list[str]] = {}
    for sym in dfa.alphabet:
        if sym is not anything_else:
            chars.setdefault(dfa.alphabet[sym], []).append(sym)
    other = dfa.alphabet.get(anything_else)
    if other is not None:
        chars.setdefault(other, []).extend(c for c in _POOL if c not in dfa.alphabet)
    return {k: sorted(v) for k, v in chars.items()}, _distance_to_accept(dfa)  # sorted: reproducible walks


def _distance_to_accept(dfa) -> list[float]:
    n = dfa.num_states
    dist = [0.0 if dfa.accepting[i] else float("inf") for i in range(n)]
    changed = True
    while changed:
        changed = False
        for i in range(n):
            best = min((dist[t] + 1 for t in dfa.table[i] if t >= 0), default=float("inf"))
            if best < dist[i]:
                dist[i], changed = best, True
    return dist


# ---- schemas: (schema, valid instances, invalid instances or raw texts, state budget) ----

STR = {"type": "string"}
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email"},
        "role": {"enum": ["admin", "user", "guest"]},
        "active": {"type": "boolean"},
        "score": {"type": "number"},
        "nick": {"type": ["string", "null"]},
        "born": {"type": "string", "format": "date"},
    },
    "required": ["name", "age", "email", "role", "active", "score", "nick", "born"],
    "additionalProperties": False,
}
ANN = {"name": 'Ann "A" \\', "age": 41, "email": "ann.lee+x@mail.example.com", "role": "admin",
       "active": True, "score": -1.5e3, "nick": None, "born": "2024-02-29"}

ORDER = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "format": "uuid"},
        "customer": {"type": "object", "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 30},
            "address": {"type": "object", "properties": {
                "street": STR, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["street", "zip"], "additionalProperties": False},
        }, "required": ["name", "address"]},
        "placed": {"type": "string", "format": "date-time"},
    },
    "required": ["id", "customer", "placed"],
}
BO = {"id": "123e4567-e89b-12d3-A456-426614174000",
      "customer": {"name": "Bo", "address": {"street": "1 Main St\nApt \u00e9 \ud83d\ude00", "zip": "12345"}},
      "placed": "2024-05-06T07:08:09.123+02:00"}

CART = {
    "type": "object",
    "properties": {"items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
        "type": "object",
        "properties": {"sku": {"type": "string", "pattern": r"[A-Z]{3}-\d{3}"},
                       "qty": {"type": "integer", "minimum": 1, "maximum": 99}},
        "required": ["sku", "qty"]}}},
    "required": ["items"],
}
ITEM = {"sku": "ABC-123", "qty": 7}

ENUMS = {
    "type": "object",
    "properties": {
        "color": {"type": "string", "enum": ["red", "green", 'dark "blue"']},
        "level": {"enum": [1, 2, 3.5, None, True, "x", [1, 2], {"k": "v"}]},
        "version": {"const": "v1"},
        "mode": {"type": "string", "enum": ["a", 1, "b"]},  # 1 is not a string: dropped
    },
    "required": ["color", "level", "version", "mode"],
}

OPTIONAL = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": STR, "c": {"type": "boolean"}, "d": {"type": "null"}},
    "required": ["c"],
}
ALL_OPTIONAL = {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}}

SHAPE = {
    "type": "object",
    "properties": {
        "shape": {"anyOf": [
            {"type": "object", "properties": {"kind": {"const": "circle"},
                                              "r": {"type": "number", "exclusiveMinimum": 0}},
             "required": ["kind", "r"]},
            {"type": "object", "properties": {"kind": {"const": "rect"}, "w": {"type": "number"},
                                              "h": {"type": "number"}},
             "required": ["kind", "w", "h"]}]},
        "tags": {"oneOf": [{"type": "array", "items": STR, "maxItems": 2}, {"type": "null"}]},
    },
    "required": ["shape", "tags"],
}

REFS = {
    "$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                        "required": ["x", "y"], "additionalProperties": False}},
    "definitions": {"label": {"type": "string", "maxLength": 8}},
    "type": "object",
    "properties": {"a": {"$ref": "#/$defs/point"}, "b": {"$ref": "#/$defs/point", "description": "second"},
                   "name": {"$ref": "#/definitions/label"}},
    "required": ["a", "b", "name"],
}

FORMATS = {
    "type": "object",
    "properties": {"d": {"type": "string", "format": "date"}, "t": {"type": "string", "format": "time"},
                   "dt": {"type": "string", "format": "date-time"}, "e": {"type": "string", "format": "email"},
                   "u": {"type": "string", "format": "uuid"}, "ip": {"type": "string", "format": "ipv4"}},
    "required": ["d", "t", "dt", "e", "u", "ip"],
}
FMT = {"d": "2000-02-29", "t": "23:59:59Z", "dt": "1999-12-31T00:00:00.5-05:30", "e": "a@b.co",
       "u": "00000000-0000-0000-0000-00000000abcd", "ip": "192.168.0.255"}

NULLABLE = {
    "type": "object",
    "properties": {"n": {"type": ["integer", "null"]},
                   "s": {"anyOf": [{"type": "string", "format": "date"}, {"type": "null"}]}},
    "required": ["n", "s"],
}

TREE = {
    "$defs": {"node": {"type": "object", "properties": {
        "name": STR, "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["name"]}},
    "$ref": "#/$defs/node",
}

RANGES = {
    "type": "object",
    "properties": {"p": {"type": "number", "minimum": 0, "maximum": 1},
                   "t": {"type": "integer", "minimum": -10, "exclusiveMaximum": 10}},
    "required": ["p", "t"],
}

MAP = {"type": "object", "additionalProperties": {"type": "integer"}}
FREE = {"type": "object", "properties": {"meta": {"type": "object"}, "any": {}, "list": {"type": "array"}},
        "required": ["meta", "any", "list"]}

CASES = {
    "flat": (PERSON, [ANN, {**ANN, "nick": "x\u00e9\\u0041", "score": 0, "born": "1999-12-31"},
                      {**ANN, "email": "a@m-a--il.e-x.co"}], [
        {k: v for k, v in ANN.items() if k != "age"},  # missing required
        {**ANN, "age": "41"}, {**ANN, "age": 151}, {**ANN, "age": -1},  # wrong type, out of range
        {**ANN, "extra": 1},  # extra key
        {**ANN, "name": "x" * 21},  # too long
        {**ANN, "born": "2023-02-29"}, {**ANN, "born": "2024-13-01"},  # bad dates
        {**ANN, "email": "ann at example.com"}, {**ANN, "role": "root"}, {**ANN, "active": 1},
        {**ANN, "email": "ann@ma--il.example.com"}, {**ANN, "email": "ann@mail-.example.com"},  # host labels
        '{"name":"a\u0001","age":1}',  # raw control char
    ], 300),
    "nested": (ORDER, [BO], [
        {**BO, "customer": {"name": "Bo"}},
        {**BO, "customer": {"name": "", "address": BO["customer"]["address"]}},
        {**BO, "customer": {"name": "Bo", "address": {"street": "s", "zip": "1234"}}},
        {**BO, "customer": {"name": "Bo", "address": {"street": "s", "zip": "12345", "x": 1}}},
        {**BO, "placed": "2024-05-06T07:08:09"}, {**BO, "id": "123e4567e89b12d3a456426614174000"},
    ], 300),
    "array_of_objects": (CART, [{"items": [ITEM]}, {"items": [ITEM, {"sku": "XYZ-000", "qty": 99}, ITEM]}], [
        {"items": []}, {"items": [ITEM] * 4}, {"items": [{"sku": "ABC-123", "qty": 0}]},
        {"items": [{"sku": "abc-123", "qty": 1}]}, {"items": [{"qty": 1}]}, {"items": ITEM},
        '{"items":[{"sku":"ABC-123","qty":7},]}',
    ], 300),
    "enums": (ENUMS, [
        {"color": "red", "level": 1, "version": "v1", "mode": "a"},
        {"color": 'dark "blue"', "level": None, "version": "v1", "mode": "b"},
        {"color": "green", "level": {"k": "v"}, "version": "v1", "mode": "a"},
        {"color": "green", "level": 3.5, "version": "v1", "mode": "a"},
    ], [
        {"color": "blue", "level": 1, "version": "v1", "mode": "a"},
        {"color": "red", "level": 4, "version": "v1", "mode": "a"},
        {"color": "red", "level": False, "version": "v1", "mode": "a"},
        {"color": "red", "level": 1, "version": "v2", "mode": "a"},
        {"color": "red", "level": 1, "version": "v1", "mode": 1},
    ], 300),
    "optional": (OPTIONAL, [{"c": True}, {"a": 1, "c": False}, {"b": "x", "c": True, "d": None},
                            {"a": -1, "b": "", "c": True, "d": None}, {"c": True, "d": None}], [
        {}, {"a": 1}, {"a": 1, "b": "x"}, {"a": 1, "c": True, "e": 1}, {"a": "1", "c": True},
        '{"a":1,"c":true,}', '{,"c":true}', '{"a":1,,"c":true}', '{"c":true"d":null}',
    ], 300),
    "all_optional": (ALL_OPTIONAL, [{}, {"x": 1}, {"y": 2}, {"x": 1, "y": 2}],
                     ["{,}", '{"x":1,}', '{,"y":2}', '{"x":1"y":2}', {"z": 1}], 300),
    "anyof": (SHAPE, [
        {"shape": {"kind": "circle", "r": 0.5}, "tags": None},
        {"shape": {"kind": "rect", "w": 1, "h": 2e-3}, "tags": ["a", "b"]},
        {"shape": {"kind": "circle", "r": 3}, "tags": []},
    ], [
        {"shape": {"kind": "circle", "w": 1, "h": 2}, "tags": None},
        {"shape": {"kind": "circle", "r": 0}, "tags": None}, {"shape": {"kind": "circle", "r": -1}, "tags": None},
        {"shape": {"kind": "square", "r": 1}, "tags": None}, {"shape": {"kind": "rect", "w": 1}, "tags": None},
        {"shape": {"kind": "circle", "r": 1}, "tags": ["a", "b", "c"]},
    ], 300),
    "ref": (REFS, [{"a": {"x": 1, "y": -2}, "b": {"x": 0, "y": 0}, "name": "12345678"}], [
        {"a": {"x": 1}, "b": {"x": 0, "y": 0}, "name": "n"},
        {"a": {"x": 1, "y": 2, "z": 3}, "b": {"x": 0, "y": 0}, "name": "n"},
        {"a": {"x": 1, "y": 2}, "b": {"x": 0, "y": 0}, "name": "123456789"},
    ], 300),
    "formats": (FORMATS, [FMT, {**FMT, "d": "2400-02-29", "t": "00:00:00.123456789+14:00",
                                "e": "x.y!#$%&'*/=?^_`{|}~-@a-b.c1.org", "u": "ABCDEF01-2345-6789-abcd-ef0123456789",
                                "ip": "0.0.0.0"}], [
        {**FMT, "d": "2100-02-29"}, {**FMT, "d": "2024-04-31"}, {**FMT, "d": "2024-1-05"},
        {**FMT, "t": "24:00:00Z"}, {**FMT, "t": "12:00:00"}, {**FMT, "dt": "1999-12-31 00:00:00Z"},
        {**FMT, "e": "a@b"}, {**FMT, "e": "a b@c.de"}, {**FMT, "e": "@c.de"},
        {**FMT, "u": "00000000-0000-0000-0000-00000000abc"}, {**FMT, "u": "g0000000-0000-0000-0000-000000000000"},
        {**FMT, "ip": "256.1.1.1"}, {**FMT, "ip": "01.1.1.1"}, {**FMT, "ip": "1.1.1"},
    ], 300),
    "nullable": (NULLABLE, [{"n": None, "s": None}, {"n": 5, "s": "2020-01-01"}],
                 [{"n": "5", "s": None}, {"n": None, "s": "2020-01-32"}, {"n": 1.5, "s": None}], 300),
    "recursive": (TREE, [{"name": "a"}, {"name": "a", "children": []},
                         {"name": "a", "children": [{"name": "b", "children": []}, {"name": "c"}]}],
                  [{"name": "a", "children": [{"name": "b", "children": [{"name": "c"}]}]}, {"children": []}], 300),
    "ranges": (RANGES, [{"p": 0, "t": -10}, {"p": 1, "t": 9}, {"p": 0.25, "t": 0}, {"p": 1.0, "t": 5}],
               [{"p": 1.5, "t": 0}, {"p": -0.5, "t": 0}, {"p": 0.5, "t": 10}, {"p": 0.5, "t": -11},
                '{"p":1.01,"t":0}', '{"p":01,"t":0}', '{"p":0,"t":-0}'], 300),
    "map": (MAP, [{}, {"a": 1, "b": -2}], [{"a": "x"}, {"a": 1.5}, [1]], 300),
    "free": (FREE, [{"meta": {}, "any": 1, "list": []}, {"meta": {"a": [1, "x"], "b": {"c": None}},
                                                         "any": {"k": [True]}, "list": [{"a": 1}, [2], "s"]}],
             [{"meta": [], "any": 1, "list": []}, {"meta": {"a": {"b": {"c": 1}}}, "any": 1, "list": []},
              {"meta": {}, "any": 1, "list": {}}], 400),
}


@functools.cache
def regex_of(name: str) -> str:
    return schema_to_regex(CASES[name][0])


def dfa_of(name: str):
    return cached_dfa(regex_of(name))


@pytest.mark.parametrize("name", CASES)
def test_valid_instances_match(name):
    regex = regex_of(name)
    for x in CASES[name][1]:
        for text in (compact(x), spaced(x), json.dumps(x)):  # json.dumps: \uXXXX escapes
            assert matches(regex, text), text


@pytest.mark.parametrize("name", CASES)
def test_invalid_instances_do_not_match(name):
    regex = regex_of(name)
    for x in CASES[name][2]:
        for text in [x] if isinstance(x, str) else [compact(x), spaced(x)]:
            assert not matches(regex, text), text


@pytest.mark.parametrize("name", CASES)
def test_regex_builds_within_budget(name):
    regex, budget = regex_of(name), CASES[name][3]
    dfa = dfa_of(name)
    print(f"{name}: {len(regex)} chars, {dfa.num_states} states")
    assert dfa.num_states <= budget and len(regex) <= MAX_PATTERN_CHARS


@pytest.mark.parametrize("name", CASES)
def test_random_walks_are_valid_under_the_schema(name):
    """What the DFA accepts parses as JSON and validates (formats included) with an independent validator."""
    jsonschema_rs = pytest.importorskip("jsonschema_rs")
    validator = jsonschema_rs.validator_for(CASES[name][0], validate_formats=True)
    dfa, rng = dfa_of(name), random.Random(f"walk-{name}")
    for _ in range(60):
        text = random_walk(dfa, rng)
        assert validator.is_valid(json.loads(text)), text


@pytest.mark.parametrize("required", [(), (0,), (2,), (3,), (1, 2), (0, 1, 2, 3)])
def test_every_subset_of_optional_properties(required):
    """Properties in order: a subset matches iff it holds every required one (separators right)."""
    keys = ["a", "bb", "c", "d"]
    schema = {"type": "object", "properties": {k: {"type": "integer"} for k in keys},
              "required": [keys[i] for i in required]}
    regex = schema_to_regex(schema)
    for mask in range(16):
        x = {k: i for i, k in enumerate(keys) if mask >> i & 1}
        ok = all(keys[i] in x for i in required)
        assert matches(regex, compact(x)) == ok and matches(regex, spaced(x)) == ok, x
        assert not matches(regex, compact(x)[:-1] + ",}") and not matches(regex, "{," + compact(x)[1:])


def test_many_optional_properties_stay_linear():
    schema = {"type": "object", "properties": {f"field_{i}": {"type": "string"} for i in range(20)}}
    regex = schema_to_regex(schema)
    assert len(regex) <= MAX_PATTERN_CHARS and parse_regex(regex).num_states <= 450
    assert matches(regex, '{"field_3":"x","field_19":""}')


def test_whitespace_policy():
    pretty = json.dumps({"a": 1, "b": []}, indent=1)  # newlines + one space of indent
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "array"}}}
    assert not matches(schema_to_regex(schema), pretty)
    assert matches(schema_to_regex(schema, whitespace=r"[ \n]{0,2}"), pretty)
    assert not matches(schema_to_regex(schema), '{"a" :1}')  # no space before ':' or ','
    assert not matches(schema_to_regex(schema), '{"a":  1}')  # at most one space by default
    assert matches(schema_to_regex(schema), '{ "a": 1, "b": [ 1, 2 ] }')
    assert not matches(schema_to_regex(schema), ' {"a":1}')  # nothing around the value


def test_typical_schema_state_counts():
    """5-8 fields of mixed types stay under ~300 states with the default whitespace and two spaces."""
    for ws, budget in ((" ?", 250), (r"[ \n]{0,2}", 300)):
        assert parse_regex(schema_to_regex(PERSON, whitespace=ws)).num_states <= budget


@pytest.mark.parametrize("seed", range(20))
def test_integer_ranges_exact(seed):
    rng = random.Random(seed)
    schema = {"type": "integer"}
    for key in rng.sample(["minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"], rng.randint(1, 3)):
        schema[key] = rng.choice([rng.randint(-1200, 1200), rng.randint(-12, 12), 0,
                                  round(rng.uniform(-50, 50), 1)])
    try:
        regex = re.compile(schema_to_regex(schema), re.ASCII)
    except SchemaError as e:
        assert "no integer" in str(e)
        return
    for n in [*range(-1300, 1300), 10**6, -(10**6)]:
        ok = all(_holds(key, bound, n) for key, bound in schema.items() if key != "type")
        assert (regex.fullmatch(str(n)) is not None) == ok, (schema, n)
    assert not regex.fullmatch("-0") and not regex.fullmatch("01") and not regex.fullmatch("1.0")


def _holds(key: str, bound, x) -> bool:
    x, bound = Fraction(x), Fraction(bound)
    return {"minimum": x >= bound, "exclusiveMinimum": x > bound,
            "maximum": x <= bound, "exclusiveMaximum": x < bound}[key]


@pytest.mark.parametrize("seed", range(20))
def test_number_ranges_sound_and_complete_for_integer_bounds(seed):
    rng = random.Random(seed)
    schema = {"type": "number"}
    for key in rng.sample(["minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"], rng.randint(1, 2)):
        schema[key] = rng.choice([rng.randint(-30, 30), 0, round(rng.uniform(-30, 30), 2)])
    try:
        regex = re.compile(schema_to_regex(schema), re.ASCII)
    except SchemaError as e:
        assert "no number" in str(e)
        return
    integral = all(float(b).is_integer() for k, b in schema.items() if k != "type")
    candidates = [f"{i}{f}" for i in range(-40, 41) for f in ("", ".0", ".5", ".05", ".999", ".000")]
    for text in candidates + ["-0.5", "-0.0", "1e3", "0.5E-2"]:
        valid = all(_holds(k, b, Fraction(json.loads(text))) for k, b in schema.items() if k != "type")
        if regex.fullmatch(text):
            assert valid, (schema, text)  # sound always
        elif integral and valid and not text.startswith("-0") and "e" not in text.lower():
            raise AssertionError((schema, text))  # complete for integer bounds (plain decimals)


PATTERNS = [
    (r"^\d{3}-[A-Z]{2}$", ["123-AB"], ["12-AB", "123-ab"]),
    (r'a"b\\c.', ['a"b\\cx', 'a"b\\c"', 'a"b\\c\t'], ['a"b\\c\n', "ab\\cx"]),
    (r"[^x]+", ["y", 'q"\\\n'], ["x", ""]),
    (r"(ab|cd)*e?", ["", "abcde", "e"], ["abe e", "ac"]),
    (r"\w+@\s", ["a_1@ ", "Z@\u3000"], ["é@ ", "a@"]),
    (r"[\u4e00-\u9fff]{1,4}", ["中文"], ["中文中文中", "a"]),
    (r"\S.*", ["x y", "é"], [" x", "\u00a0x", "\ufeffx"]),
    (r"\D+|[^\w]", ["ab", "-"], ["1", "١", "é"]),  # negated \d \w: ASCII only (Unicode-digit validators)
]


@pytest.mark.parametrize("pattern,good,bad", PATTERNS)
def test_pattern_is_embedded_as_json_string_content(pattern, good, bad):
    regex = schema_to_regex({"type": "string", "pattern": pattern})
    for value in good:
        assert matches(regex, json.dumps(value, ensure_ascii=False)), value
    for value in bad:
        assert not matches(regex, json.dumps(value, ensure_ascii=False)), value
    rng, dfa = random.Random(pattern), cached_dfa(regex)
    for _ in range(50):  # whatever the DFA accepts decodes to a value that fully matches the pattern
        value = json.loads(random_walk(dfa, rng, soft_len=12))
        assert re.fullmatch(pattern, value), value


ERRORS = [
    ({"type": "object", "properties": {"age": {"type": "integer", "multipleOf": 2}}},
     "properties.age: 'multipleOf' is not supported"),
    ({"type": "array", "items": STR, "uniqueItems": True}, "schema: 'uniqueItems' is not supported"),
    ({"not": {"type": "null"}}, "'not' is not supported"),
    ({"type": "object", "patternProperties": {"a": STR}}, "'patternProperties' is not supported"),
    ({"type": "array", "prefixItems": [STR]}, "'prefixItems' is not supported"),
    ({"type": "array", "items": [STR]}, "items: a list of schemas"),
    ({"type": "object", "properties": {"c": {"type": "string", "pattern": "(?=a)b"}}},
     "properties.c.pattern: lookaround is not supported"),
    ({"type": "string", "pattern": r"(a)\1"}, "pattern: a backreference is not supported"),
    ({"type": "string", "pattern": "a$b"}, "pattern: an anchor"),
    ({"type": "string", "pattern": "(?i)abc"}, "pattern: regex flags are not supported"),
    ({"type": "string", "pattern": "[a-"}, "pattern: invalid regex"),
    ({"type": "string", "pattern": "\x01"}, "only hold as \\u escapes"),
    ({"type": "string", "pattern": "a", "maxLength": 3}, "together with 'pattern'"),
    ({"type": "string", "format": "uri"}, "format: 'uri' is not supported"),
    ({"type": "string", "format": "email", "maxLength": 50}, "together with format 'email'"),
    ({"type": "string", "format": "date", "pattern": "x"}, "'format' together with 'pattern'"),
    ({"$ref": "https://example.com/s.json"}, "only local refs"),
    ({"$ref": "#/$defs/missing"}, "'#/$defs/missing' does not resolve"),
    ({"$defs": {"p": STR}, "$ref": "#/$defs/p", "maxLength": 3}, "'maxLength' next to '$ref'"),
    ({"anyOf": [STR], "type": "string"}, "'type' next to 'anyOf'"),
    ({"allOf": [STR, {"maxLength": 2}]}, "allOf: only an allOf of exactly one schema"),
    ({"anyOf": []}, "anyOf: must be a non-empty list"),
    ({"type": "object", "properties": {"a": STR}, "required": ["b"]}, "required: 'b' is not in properties"),
    ({"type": "strin"}, "type: must be one of"),
    ({"type": "array", "minItems": 3, "maxItems": 2}, "minItems > maxItems"),
    ({"type": "array", "minItems": -1}, "minItems: must be a non-negative integer"),
    ({"type": "string", "minLength": 3, "maxLength": 2}, "minLength > maxLength"),
    ({"type": "integer", "minimum": 5, "maximum": 4}, "no integer is within"),
    ({"type": "integer", "exclusiveMinimum": 1, "exclusiveMaximum": 2}, "no integer is within"),
    ({"type": "number", "exclusiveMinimum": 1, "maximum": 1}, "no number is within"),
    ({"type": "number", "minimum": True}, "minimum: must be a number"),
    ({"type": "number", "maximum": 1e30}, "bounds beyond 1e18"),
    ({"enum": []}, "enum: must be a non-empty list"),
    ({"type": "string", "enum": [1, 2]}, "no enum/const value satisfies"),
    ({"enum": ["a"], "const": "b"}, "no enum/const value satisfies"),
    ({"const": float("nan")}, "const: values must be JSON"),
    ({"type": "object", "properties": {"a": 5}}, "properties.a: a schema must be an object or a boolean"),
    ({"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}, "required": ["next"]}},
      "$ref": "#/$defs/n"}, "no JSON value satisfies it"),
    ({"$defs": {"n": {"type": "object", "properties": {"x": {"$ref": "#/$defs/n/properties/y"}}}},
      "$ref": "#/$defs/n"}, "$defs.n.properties.x"),
]


@pytest.mark.parametrize("schema,message", ERRORS)
def test_schema_errors(schema, message):
    with pytest.raises(SchemaError) as info:
        schema_to_regex(schema)
    assert message in str(info.value)
    assert isinstance(info.value, ValueError)


def test_exponential_refs_are_refused():
    defs = {"d0": STR}
    for i in range(1, 20):
        defs[f"d{i}"] = {"type": "array", "items": {"anyOf": [{"$ref": f"#/$defs/d{i - 1}"}] * 2}}
    with pytest.raises(SchemaError, match="too large"):
        schema_to_regex({"$defs": defs, "$ref": "#/$defs/d19"})


def test_annotations_are_ignored_and_booleans_are_schemas():
    plain = schema_to_regex({"type": "object", "properties": {"a": STR}, "required": ["a"]})
    annotated = schema_to_regex({"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "T",
                                 "description": "d", "type": "object", "examples": [{"a": "x"}],
                                 "properties": {"a": {**STR, "default": "x", "title": "A"}}, "required": ["a"]})
    assert annotated == plain
    assert schema_to_regex({"type": "object", "properties": {"a": False, "b": STR}}) == \
        schema_to_regex({"type": "object", "properties": {"b": STR}})
    assert matches(schema_to_regex(True), "[1]") and not matches(schema_to_regex(True), "[1")
    with pytest.raises(SchemaError):
        schema_to_regex(False)


def test_types_inferred_from_keywords():
    regex = schema_to_regex({"properties": {"a": {"maxLength": 2}}, "required": ["a"]})
    assert matches(regex, '{"a":"xy"}') and not matches(regex, '{"a":"xyz"}') and not matches(regex, '"s"')
    regex = schema_to_regex({"type": ["integer", "number"], "minimum": 0})
    assert matches(regex, "1.5") and matches(regex, "2") and not matches(regex, "-1")


def test_pydantic_models_round_trip():
    pydantic = pytest.importorskip("pydantic")
    import datetime
    import enum
    import uuid

    class Color(enum.Enum):
        RED = "red"
        BLUE = "blue"

    class Address(pydantic.BaseModel):
        street: str
        city: str = pydantic.Field(max_length=12)

    class User(pydantic.BaseModel):
        id: uuid.UUID
        name: str
        age: int = pydantic.Field(ge=0, le=130)
        color: Color
        addresses: list[Address]
        created: datetime.datetime
        note: str | None = None

    regex = schema_to_regex(User.model_json_schema())
    user = User(id=uuid.uuid4(), name='Al "x"', age=30, color=Color.BLUE, note=None,
                addresses=[Address(street="Main\n1", city="Paris")],
                created=datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC))
    assert matches(regex, user.model_dump_json())
    assert not matches(regex, user.model_dump_json().replace('"Paris"', '"Paris-Paris-Paris"'))
    assert parse_regex(regex).num_states <= 300


# ---- JSON_OBJECT_REGEX ----


def test_json_object_regex_builds():
    dfa = parse_regex(JSON_OBJECT_REGEX)
    print(f"JSON_OBJECT_REGEX: {len(JSON_OBJECT_REGEX)} chars, {dfa.num_states} states")
    assert dfa.num_states <= 1024 and len(JSON_OBJECT_REGEX) <= MAX_PATTERN_CHARS


def test_json_object_regex_walks_are_json_objects():
    dfa, rng = cached_dfa(JSON_OBJECT_REGEX), random.Random(7)
    depths, allowed = set(), set(range(1, JSON_OBJECT_DEPTH + 1))
    # The DFA's state numbering follows string hashing, so the walks differ per PYTHONHASHSEED:
    # ~1 walk in 75 reaches the deepest level; walking until every depth is seen (at most 3,000)
    # misses one with odds below 1e-15 whatever the seed.
    for n in range(3000):
        text = random_walk(dfa, rng, soft_len=rng.choice([5, 20, 80]))
        value = json.loads(text)
        assert isinstance(value, dict), text
        depths.add(_depth(value))
        if n >= 300 and depths >= allowed:
            break
    assert depths == allowed  # the walks reach every allowed depth, and none deeper


def _depth(x) -> int:
    children = x.values() if isinstance(x, dict) else x if isinstance(x, list) else []
    return (1 + max(map(_depth, children), default=0)) if isinstance(x, (dict, list)) else 0


def _random_json(rng: random.Random, depth: int):
    """A value of at most `depth` container levels; strings of the innermost level without escapes."""
    plain = "abc xyz_é中😀-:{}[],"
    kind = rng.randrange(7 if depth else 5)
    if kind == 0:
        return "".join(rng.choice(plain + ('"\\\n\t/' if depth else "")) for _ in range(rng.randrange(6)))
    if kind == 1:
        return rng.choice([0, -3, 12345, rng.uniform(-1e3, 1e3)])
    if kind in (2, 3, 4):
        return [True, False, None][kind - 2]
    keys = ["".join(rng.choice(plain) for _ in range(rng.randrange(4))) for _ in range(rng.randrange(4))]
    if kind == 5:
        return {k: _random_json(rng, depth - 1) for k in keys}
    return [_random_json(rng, depth - 1) for _ in keys]


def test_random_json_objects_match():
    rng = random.Random(3)
    for _ in range(200):
        depth = rng.randint(1, JSON_OBJECT_DEPTH)
        keys = [f"k{i}" for i in range(rng.randrange(4))]
        value = {k: _random_json(rng, depth - 1) for k in keys}
        for text in (compact(value), spaced(value)):
            assert re.fullmatch(JSON_OBJECT_REGEX, text, re.ASCII), text
    deep = {"a": {"b": {"c": {"d": 1}}}}
    for text in (compact(deep), "[]", '"x"', "1", '{"a":1,}', "{'a':1}", '{"a":NaN}', '{"a":1e5}'):
        assert not matches(JSON_OBJECT_REGEX, text), text
    assert matches(JSON_OBJECT_REGEX, compact({"a": {"b": ["c", 1.5, False]}, "c": [{}, ["d"]], "e": "\\n"}))
    assert not matches(JSON_OBJECT_REGEX, compact({"a": {"b": ["c\\n"]}}))  # innermost strings: no escapes
