"""A regex's character DFA: Thompson NFA over interegular's character classes,
subset construction bounded by ``max_states``, Moore minimisation, dead states
pruned (every state kept can reach acceptance)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from interegular.fsm import Alphabet, anything_else
from interegular.patterns import (
    Pattern,
    REFlags,
    _Concatenation,
    _NonCapturing,
    _Repeated,
)

from .regex_parse import _UNSUPPORTED_OPS, RegexError, parse_pattern

# NOTE: next_state costs 2 * vocab_size bytes per state (96 KiB at V=49152): 1024 states is 96 MiB
# for one regex (a third of the default cache) and ~1 s of compile; JSON-ish regexes with a few
# bounded fields need 50-300 states, `.{0,200}` 201.
MAX_STATES = 1024
_MAX_NFA_STATES = 1 << 16
_SUBSET_FACTOR = 2  # determinisation may build this many times max_states before minimising


@dataclass(frozen=True, eq=False)
class CharDFA:
    """A minimal DFA over interegular's character classes; only live states (all reach acceptance)."""

    alphabet: Alphabet  # char -> class id; chars not listed go to the class of `anything_else`
    table: np.ndarray  # [S, C] int32: next state, -1 = dead
    accepting: np.ndarray  # [S] bool
    start: int

    @property
    def num_states(self) -> int:
        return int(self.table.shape[0])

    def classes_of(self, codepoints: np.ndarray) -> np.ndarray:
        """Class id of every code point; a class id == C means "no transition anywhere"."""
        other = self.alphabet.get(anything_else)
        out = np.full(len(codepoints), self.table.shape[1] if other is None else other, np.int64)
        syms = [s for s in self.alphabet if s is not anything_else and len(s) == 1]
        if syms:
            codes = np.fromiter((ord(s) for s in syms), np.int64, len(syms))
            keys = np.fromiter((self.alphabet[s] for s in syms), np.int64, len(syms))
            pos = np.minimum(np.searchsorted(codepoints, codes), max(len(codepoints) - 1, 0))
            hit = (codepoints[pos] == codes) if len(codepoints) else np.zeros(len(codes), bool)
            out[pos[hit]] = keys[hit]
        return out


def parse_regex(pattern: str, max_states: int = MAX_STATES) -> CharDFA:
    """Validate `pattern` and build its character DFA; raises RegexError. Milliseconds for typical regexes."""
    try:
        return _determinise(parse_pattern(pattern), max_states)
    except RecursionError:
        raise RegexError("regex is nested too deeply") from None


class _Nfa:
    """Thompson NFA over class ids: eps[n] lists epsilon targets, moves[n] lists (class ids, target)."""

    def __init__(self, alphabet: Alphabet):
        self.alphabet = alphabet
        self.eps: list[list[int]] = []
        self.moves: list[list[tuple[tuple[int, ...], int]]] = []
        self._leaf_keys: dict = {}

    def new(self) -> int:
        if len(self.eps) >= _MAX_NFA_STATES:
            raise RegexError("regex is too large (its repetitions expand past 65536 automaton states)")
        self.eps.append([])
        self.moves.append([])
        return len(self.eps) - 1

    def build(self, node, flags: REFlags) -> tuple[int, int]:
        """(start, end) of a fragment matching `node`."""
        if isinstance(node, Pattern):
            flags = (flags | node.added_flags) & ~node.removed_flags
            s, e = self.new(), self.new()
            for option in node.options:
                a, b = self.build(option, flags)
                self.eps[s].append(a)
                self.eps[b].append(e)
            return s, e
        if isinstance(node, _Concatenation):
            s = e = self.new()
            for part in node.parts:
                if isinstance(part, _NonCapturing):
                    raise RegexError(_UNSUPPORTED_OPS["ASSERT"])
                a, b = self.build(part, flags)
                self.eps[e].append(a)
                e = b
            return s, e
        if isinstance(node, _Repeated):
            return self._repeat(node, flags)
        s, e = self.new(), self.new()
        keys = self._keys(node, flags)
        if keys is None:
            self.eps[s].append(e)
        elif keys:
            self.moves[s].append((keys, e))
        return s, e

    def _repeat(self, node: _Repeated, flags: REFlags) -> tuple[int, int]:
        copies = max(node.min, node.max if node.max is not None else node.min + 1)
        if 2 * copies + len(self.eps) > _MAX_NFA_STATES:
            raise RegexError(f"repetition count {copies} is too large")
        s = e = self.new()
        for _ in range(node.min):
            a, b = self.build(node.base, flags)
            self.eps[e].append(a)
            e = b
        end = self.new()
        if node.max is None:  # star: enter the loop or leave, from before and after each pass
            a, b = self.build(node.base, flags)
            self.eps[e] += [a, end]
            self.eps[b] += [a, end]
            return s, end
        for _ in range(node.max - node.min):  # NOTE: each optional copy may skip straight to `end`
            a, b = self.build(node.base, flags)
            self.eps[e] += [end, a]
            e = b
        self.eps[e].append(end)
        return s, end

    def _keys(self, leaf, flags: REFlags) -> tuple[int, ...] | None:
        """Class ids a one-char leaf (char group, dot) accepts, by interegular's own semantics; None = epsilon."""
        memo = (leaf, flags)
        if memo not in self._leaf_keys:
            fsm = leaf.to_fsm(self.alphabet, (0, 0), flags)
            if fsm.initial in fsm.finals:
                self._leaf_keys[memo] = None
            else:
                step = fsm.map.get(fsm.initial, {})
                self._leaf_keys[memo] = tuple(sorted(k for k, t in step.items() if t in fsm.finals))
        return self._leaf_keys[memo]

    def closure(self, states: Iterable[int]) -> frozenset[int]:
        seen = set(states)
        todo = list(seen)
        while todo:
            for t in self.eps[todo.pop()]:
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        return frozenset(seen)


def _determinise(parsed: Pattern, max_states: int) -> CharDFA:
    alphabet = parsed.get_alphabet(REFlags(0))
    num_classes = max(alphabet.values(), default=0) + 1
    nfa = _Nfa(alphabet)
    start, final = nfa.build(parsed, REFlags(0))
    first = nfa.closure([start])
    ids = {first: 0}
    todo, rows = [first], []
    limit = _SUBSET_FACTOR * max_states
    while todo:
        cur = todo.pop()
        hits: dict[int, set[int]] = {}
        for n in cur:
            for keys, t in nfa.moves[n]:
                for k in keys:
                    hits.setdefault(k, set()).add(t)
        row = np.full(num_classes, -1, np.int32)
        for k, targets in hits.items():
            nxt = nfa.closure(targets)
            if nxt not in ids:
                if len(ids) >= limit:
                    raise RegexError(f"regex is too complex: its automaton exceeds {max_states} states")
                ids[nxt] = len(ids)
                todo.append(nxt)
            row[k] = ids[nxt]
        rows.append((ids[cur], row))
    table = np.empty((len(ids), num_classes), np.int32)
    for i, row in rows:
        table[i] = row
    accepting = np.fromiter((final in s for s in ids), bool, len(ids))
    return _minimise(alphabet, table, accepting, max_states)


def _minimise(alphabet: Alphabet, table: np.ndarray, accepting: np.ndarray, max_states: int) -> CharDFA:
    """Drop states that cannot accept, merge equivalent ones (Moore refinement, vectorised per round)."""
    live = _closure(_adjacency(table).T, accepting)
    if not live[0]:
        raise RegexError("regex matches nothing")
    table = np.where(table >= 0, np.where(live[np.maximum(table, 0)], table, -1), -1)
    block = np.where(live, accepting.astype(np.int64), -1)
    count = len(np.unique(block))
    while True:
        sig = np.concatenate([block[:, None], np.where(table >= 0, block[table], -1)], axis=1)
        new = _row_ids(sig + 1)
        if new.max() + 1 == count:
            break
        block, count = new, int(new.max()) + 1
    _, rep = np.unique(new, return_index=True)  # a representative old state per block
    keep = live[rep]
    renum = np.cumsum(keep) - 1
    rep = rep[keep]
    lookup = np.where(keep, renum, -1)
    small = np.where(table[rep] >= 0, lookup[new[np.maximum(table[rep], 0)]], -1).astype(np.int32)
    if len(rep) > max_states:
        raise RegexError(f"regex is too complex: its automaton has {len(rep)} states, the limit is {max_states}")
    return CharDFA(alphabet, small, accepting[rep], int(lookup[new[0]]))


def _row_ids(rows: np.ndarray) -> np.ndarray:
    """Dense ids of the distinct rows of a non-negative int matrix, with 1-D sorts only (fast)."""
    base = int(rows.max()) + 1
    key = np.zeros(len(rows), np.int64)
    for col in rows.T:
        if int(key.max()) >= (1 << 62) // base:  # NOTE: re-rank before the mixed-radix key overflows
            key = np.unique(key, return_inverse=True)[1].reshape(-1)
        key = key * base + col
    return np.unique(key, return_inverse=True)[1].reshape(-1)


def _adjacency(table: np.ndarray) -> np.ndarray:
    """[S, S] bool: some symbol leads from row state to column state (-1 entries ignored)."""
    n = table.shape[0]
    adj = np.zeros((n, n + 1), bool)
    adj[np.arange(n)[:, None], np.where(table >= 0, table, n)] = True
    return adj[:, :n]


def _closure(adj: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    """States reachable from `seeds` along `adj` (each row is expanded once)."""
    seen = seeds.copy()
    frontier = seeds.copy()
    while frontier.any():
        frontier = adj[frontier].any(axis=0) & ~seen
        seen |= frontier
    return seen
