"""What a program appends to its state: text, ``gen``, ``select`` and chat roles.

Parts combine with ``+`` into an :class:`Expr` (``"Q: " + gen("a")``); a state
runs the parts of one ``+=`` in order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

ROLES = ("system", "user", "assistant")


class _Addable:
    def __add__(self, other: "Part | Expr") -> "Expr":
        return Expr(_parts(self) + _parts(other))

    def __radd__(self, other: "Part | Expr") -> "Expr":
        return Expr(_parts(other) + _parts(self))


@dataclass(frozen=True)
class Gen(_Addable):
    """Generate text, store it in ``state[name]`` and append it."""

    name: str
    max_tokens: int = 128
    stop: str | list[str] | None = None
    temperature: float = 0.0
    regex: str | None = None  # the generated text fully matches it (constrained decoding)
    json_schema: dict | None = None  # the generated text is JSON valid under it


@dataclass(frozen=True)
class Select(_Addable):
    """Append the choice the model finds likeliest; store it in ``state[name]``."""

    name: str
    choices: tuple[str, ...]
    normalize: bool = False  # True: mean logprob per token instead of the sum


@dataclass(frozen=True)
class Role(_Addable):
    """A whole chat message: ``user("hi")``, ``assistant(gen("reply"))``."""

    role: str
    body: "Expr"


@dataclass(frozen=True)
class Expr(_Addable):
    parts: tuple


Part = Union[str, Gen, Select, Role]


def _parts(x) -> tuple:
    if isinstance(x, Expr):
        return x.parts
    if isinstance(x, (str, Gen, Select, Role)):
        return (x,)
    raise TypeError(f"cannot append {type(x).__name__} to a program state")


def gen(name: str, max_tokens: int = 128, stop: str | list[str] | None = None,
        temperature: float = 0.0, regex: str | None = None, json_schema: dict | None = None) -> Gen:
    """Generate up to ``max_tokens`` (greedy by default) until ``stop``; with
    ``regex``, only text that fully matches it; with ``json_schema``, only JSON valid
    under it (the server constrains each token)."""
    if max_tokens < 1:
        raise ValueError("gen: max_tokens must be >= 1")
    if regex is not None and not regex:
        raise ValueError("gen: regex must not be empty")
    if regex is not None and json_schema is not None:
        raise ValueError("gen: give regex or json_schema, not both")
    return Gen(name, max_tokens, stop, temperature, regex, json_schema)


def select(name: str, choices: Sequence[str], normalize: bool = False) -> Select:
    """Pick one of ``choices`` by the model's likelihood of it after the state's text:
    the sum of its tokens' logprobs (``normalize``: their mean), one batched request."""
    if not choices or any(not isinstance(c, str) or not c for c in choices):
        raise ValueError("select: choices must be non-empty strings")
    return Select(name, tuple(choices), normalize)


def system(body: "Part | Expr") -> Role:
    return Role("system", Expr(_parts(body)))


def user(body: "Part | Expr") -> Role:
    return Role("user", Expr(_parts(body)))


def assistant(body: "Part | Expr") -> Role:
    return Role("assistant", Expr(_parts(body)))


def as_parts(x) -> tuple:
    return _parts(x)
