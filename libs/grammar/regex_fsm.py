"""Regex-constrained generation: a regex compiled to a token-level automaton over one vocabulary.

The generated text must FULLY match the regex (``re.fullmatch``), built token by token:

    pattern --parse_regex--> CharDFA [S, C]   (interegular parses; Thompson NFA + subset construction
                                               here, bounded by ``max_states``; minimised; dead states pruned)
    texts   --Vocab-------->  token chars as code points, sorted by length (built once per vocabulary)
    both    --compile_regex-> TokenFSM: next_state [S, V] (-1 = token not allowed), accepting [S]

A token may follow state s iff walking its text from s never leaves the live states; a request may
end (emit EOS) only in an accepting state. Every state kept is reachable from ``start`` by tokens and
can reach an accepting state by tokens, so a constrained request can always finish.

What syntax is supported: :mod:`.regex_parse`; the character DFA: :mod:`.regex_dfa`;
token texts from a tokenizer: :mod:`.token_texts`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from .regex_dfa import MAX_STATES, CharDFA, _adjacency, _closure, parse_regex
from .regex_parse import RegexError
from .token_texts import token_texts

__all__ = ["MAX_STATES", "RegexCache", "RegexError", "TokenFSM", "Vocab", "compile_regex",
           "parse_regex", "token_texts"]


class Vocab:
    """Token texts encoded once per vocabulary (code points, longest text first); every compile reuses it.

    NOTE: tokens are sorted by text length, longest first, so the tokens still walking at character
    position p are always the first ``alive[p]`` of them. Tokens whose text is None or empty are left
    out and are never allowed.
    """

    def __init__(self, texts: Sequence[str | None]):
        self.size = len(texts)
        ids = np.fromiter((i for i, t in enumerate(texts) if t), np.int64)
        lengths = np.fromiter((len(texts[i]) for i in ids), np.int64, len(ids))
        by_len = np.argsort(-lengths, kind="stable")
        self.order = ids[by_len]  # token ids, longest text first
        self.lengths = lengths[by_len]
        joined = "".join(texts[i] for i in self.order).encode("utf-32-le", "surrogatepass")
        codepoints = np.frombuffer(joined, np.uint32).astype(np.int64)
        self.codepoints, self.flat = np.unique(codepoints, return_inverse=True)  # distinct chars; char ids
        self.starts = np.cumsum(self.lengths) - self.lengths
        longest = int(self.lengths[0]) if len(ids) else 0
        self.alive = np.searchsorted(-self.lengths, -np.arange(longest), side="left")  # tokens longer than p

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.order, self.lengths, self.codepoints, self.flat, self.starts))


@dataclass(frozen=True, eq=False)
class TokenFSM:
    """Token-level automaton of one regex over one vocabulary; every state can still reach acceptance."""

    start: int
    next_state: np.ndarray  # [S, vocab_size] int16 (int32 if S >= 32767): state after the token, -1 = not allowed
    accepting: np.ndarray  # [S] bool: the request may end (EOS) here

    @property
    def num_states(self) -> int:
        return int(self.next_state.shape[0])

    @property
    def nbytes(self) -> int:
        return int(self.next_state.nbytes + self.accepting.nbytes)

    def walk(self, token_ids: Iterable[int], state: int | None = None) -> int:
        """State after feeding `token_ids` from `state` (default: start); -1 once a token is not allowed."""
        s = self.start if state is None else int(state)
        vocab_size = self.next_state.shape[1]
        for t in token_ids:
            if s < 0 or not 0 <= t < vocab_size:
                return -1
            s = int(self.next_state[s, t])
        return s


def compile_regex(pattern: str, texts: Vocab | Sequence[str | None], max_states: int = MAX_STATES) -> TokenFSM:
    """Compile `pattern` against a vocabulary (pass a Vocab to reuse its encoding); raises RegexError."""
    vocab = texts if isinstance(texts, Vocab) else Vocab(texts)
    dfa = parse_regex(pattern, max_states)
    leaf_states, token_leaf = _walk_tokens(dfa, vocab)
    return _token_fsm(dfa, leaf_states, token_leaf)


def _walk_tokens(dfa: CharDFA, vocab: Vocab) -> tuple[np.ndarray, np.ndarray]:
    """Walk every token from every state at once, one character position per step.

    Tokens whose class sequences share a prefix share a trie node, and each node is walked once for
    all states. Returns leaf_states [S, L+1] (the state after each distinct class sequence; S = dead;
    the last column is all dead) and token_leaf [V] (column of each token).
    """
    n_states, n_classes = dfa.table.shape
    width = n_classes + 1  # class n_classes: a char with no transition anywhere
    step = np.full((n_states + 1, width), n_states, np.int32)  # row n_states: the dead sink
    step[:n_states, :n_classes] = np.where(dfa.table >= 0, dfa.table, n_states)
    cls = dfa.classes_of(vocab.codepoints)[vocab.flat]
    token_leaf = np.full(vocab.size, -1, np.int64)
    leaves: list[np.ndarray] = []
    n_leaves = 0
    nodes = np.zeros(len(vocab.order), np.int64)
    states = np.arange(n_states, dtype=np.int32)[:, None]  # [S, nodes]: state at each trie node
    alive = np.append(vocab.alive, 0)
    for p in range(len(vocab.alive)):
        n, m = alive[p], alive[p + 1]
        key = nodes[:n] * width + cls[vocab.starts[:n] + p]
        uniq, nodes = np.unique(key, return_inverse=True)
        states = step[states[:, uniq // width], uniq % width]
        if m < n:  # tokens [m, n) in length order end at this position
            ended, at = np.unique(nodes[m:n], return_inverse=True)
            leaves.append(states[:, ended])
            token_leaf[vocab.order[m:n]] = n_leaves + at
            n_leaves += len(ended)
    leaves.append(np.full((n_states, 1), n_states, np.int32))
    token_leaf[token_leaf < 0] = n_leaves
    return np.concatenate(leaves, axis=1), token_leaf


def _token_fsm(dfa: CharDFA, leaf_states: np.ndarray, token_leaf: np.ndarray) -> TokenFSM:
    """Keep the states reachable by tokens from start that reach acceptance by tokens; renumber."""
    n_states = dfa.num_states
    adj = _adjacency(np.where(leaf_states < n_states, leaf_states, -1))
    seeds = np.zeros(n_states, bool)
    seeds[dfa.start] = True
    keep = _closure(adj, seeds) & _closure(adj.T, dfa.accepting)
    if not keep[dfa.start]:
        raise RegexError("no sequence of this model's tokens matches the regex")
    renum = np.append(np.where(keep, np.cumsum(keep) - 1, -1), -1)  # index n_states (dead) -> -1
    dtype = np.int16 if keep.sum() < np.iinfo(np.int16).max else np.int32
    small = renum[leaf_states[keep]].astype(dtype)
    return TokenFSM(int(renum[dfa.start]), np.ascontiguousarray(small[:, token_leaf]), dfa.accepting[keep].copy())


class RegexCache:
    """LRU of compiled TokenFSMs keyed by pattern, bounded by the total bytes of their tables.

    A table larger than the whole budget is returned but not kept. Safe to call from several threads
    (a pattern compiled twice in a race is harmless).
    """

    def __init__(self, texts: Vocab | Sequence[str | None], max_bytes: int = 256 << 20,
                 max_states: int = MAX_STATES):
        self.vocab = texts if isinstance(texts, Vocab) else Vocab(texts)
        self.max_bytes = max_bytes
        self.max_states = max_states
        self._fsms: OrderedDict[str, TokenFSM] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._fsms)

    def __contains__(self, pattern: str) -> bool:
        return pattern in self._fsms

    @property
    def nbytes(self) -> int:
        return self._bytes

    def get(self, pattern: str) -> TokenFSM:
        """The compiled FSM of `pattern` (compiled on a miss); raises RegexError."""
        with self._lock:
            if (fsm := self._fsms.get(pattern)) is not None:
                self._fsms.move_to_end(pattern)
                return fsm
        fsm = compile_regex(pattern, self.vocab, self.max_states)
        with self._lock:
            if pattern not in self._fsms and fsm.nbytes <= self.max_bytes:
                while self._bytes + fsm.nbytes > self.max_bytes:
                    self._bytes -= self._fsms.popitem(last=False)[1].nbytes
                self._fsms[pattern] = fsm
                self._bytes += fsm.nbytes
        return fsm
