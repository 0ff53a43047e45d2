"""Vet a regex for constrained generation and parse it with interegular.

Python's own parser checks the syntax and names what is not supported; interegular
builds the tree (:func:`parse_pattern`). Supported: Python ``re`` syntax for literals,
``.``, classes, ``\\d \\w \\s`` (and negations), groups (capturing, ``(?:``,
``(?P<n>``), ``| * + ? {m,n}`` (lazy forms match the same strings), inline flags
``(?i)`` / ``(?s)``, escapes ``\\xNN \\uXXXX \\UXXXXXXXX \\N{...}`` and octal;
``^``/``\\A`` as the very first and ``$``/``\\Z`` as the very last token (no-ops under
fullmatch). Not supported (``RegexError``): lookaround, backreferences, conditionals,
atomic groups, possessive quantifiers, anchors or ``\\b \\B`` anywhere else, flags
other than ``i``/``s``, patterns over 16384 chars, classes spanning more than 32768
chars in total.
NOTE: ``\\d \\w \\s`` and their negations are the ASCII classes (as under
``re.ASCII``).
"""

from __future__ import annotations

import re
import re._parser as sre_parse  # NOTE: private but stable (was sre_parse); used only to vet the pattern
import unicodedata
import warnings

import interegular
from interegular.patterns import Pattern

# NOTE: a user's own regex is capped at 4096 chars by the gateway; patterns built from a
# JSON schema may be longer (their automaton size is what MAX_STATES bounds)
MAX_PATTERN_CHARS = 16384
MAX_CLASS_CHARS = 1 << 15  # interegular keeps every char of a class in a set: bound that work

_UNSUPPORTED_OPS = {
    "ASSERT": "lookahead/lookbehind assertions are not supported",
    "ASSERT_NOT": "lookahead/lookbehind assertions are not supported",
    "GROUPREF": "backreferences are not supported",
    "GROUPREF_EXISTS": "conditional groups are not supported",
    "GROUPREF_IGNORE": "backreferences are not supported",
    "ATOMIC_GROUP": "atomic groups are not supported",
    "POSSESSIVE_REPEAT": "possessive quantifiers are not supported",
    "AT": "anchors and word boundaries (^ $ \\A \\Z \\b \\B) are only supported as the first (^, \\A) "
    "or last ($, \\Z) token of the pattern",
}


class RegexError(ValueError):
    """The regex cannot be used to constrain generation; the message is fit for an HTTP 400."""


def parse_pattern(pattern: str) -> Pattern:
    """interegular's tree of ``pattern`` after vetting it; raises RegexError."""
    if not isinstance(pattern, str) or not pattern:
        raise RegexError("regex must be a non-empty string")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise RegexError(f"regex is {len(pattern)} chars long, the limit is {MAX_PATTERN_CHARS}")
    return _parse(pattern)


def _parse(pattern: str) -> Pattern:
    """Python's own parser vets the pattern (syntax, unsupported constructs); interegular builds the tree."""
    with warnings.catch_warnings():  # e.g. FutureWarning "possible nested set"
        warnings.simplefilter("ignore")
        try:
            re.compile(pattern)
            core = _strip_anchors(pattern)
            tree = sre_parse.parse(core)
        except re.error as e:
            raise RegexError(f"invalid regex: {e.msg} at position {e.pos}") from None
    _vet(tree)
    try:
        return interegular.parse_pattern(_plain_escapes(core))
    except (interegular.Unsupported, interegular.InvalidSyntax) as e:
        raise RegexError(f"unsupported regex construct: {e or 'syntax'}") from None
    except (AttributeError, TypeError, ValueError, IndexError, KeyError):  # NOTE: e.g. a (?#comment)
        raise RegexError("unsupported regex construct (interegular cannot parse it)") from None


def _strip_anchors(pattern: str) -> str:
    """Drop a leading ^ / \\A and a trailing unescaped $ / \\Z: both always hold under fullmatch."""
    if pattern.startswith("^"):
        pattern = pattern[1:]
    elif pattern.startswith("\\A"):
        pattern = pattern[2:]
    for tail in ("$", "\\Z"):
        if pattern.endswith(tail):
            head = pattern[: -len(tail)]
            if (len(head) - len(head.rstrip("\\"))) % 2 == 0:  # the tail itself is not escaped
                return head
    return pattern


def _vet(tree) -> None:
    """Reject what interegular would misread or build slowly, with a message that names the construct."""
    chars = 0
    stack = [tree]
    while stack:
        for op, av in stack.pop():
            name = getattr(op, "name", str(op))
            if name in _UNSUPPORTED_OPS:
                raise RegexError(_UNSUPPORTED_OPS[name])
            if name == "IN":
                chars += sum(v[1] - v[0] + 1 for o, v in av if getattr(o, "name", "") == "RANGE")
                continue
            for sub in av if isinstance(av, (tuple, list)) else (av,):
                if isinstance(sub, sre_parse.SubPattern):
                    stack.append(sub)
                elif isinstance(sub, list):  # BRANCH: (None, [SubPattern, ...])
                    stack.extend(s for s in sub if isinstance(s, sre_parse.SubPattern))
    if chars > MAX_CLASS_CHARS:
        raise RegexError(f"character classes span {chars} chars, the limit is {MAX_CLASS_CHARS}")


_UNICODE_ESCAPE = re.compile(r"\\(\\|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|N\{[^}]*\})")


def _plain_escapes(pattern: str) -> str:
    """Rewrite \\uXXXX, \\UXXXXXXXX and \\N{name} (unknown to interegular) as \\xNN or the literal char."""

    def one(m: re.Match) -> str:
        body = m.group(1)
        if body == "\\":
            return m.group(0)
        cp = ord(unicodedata.lookup(body[2:-1])) if body[0] == "N" else int(body[1:], 16)
        return f"\\x{cp:02x}" if cp < 0x80 else chr(cp)

    return _UNICODE_ESCAPE.sub(one, pattern)
