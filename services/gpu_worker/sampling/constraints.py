"""Regex-constrained rows: mask each step's logits to the tokens that keep the
output a prefix of a full match, and advance every row's automaton by the
token it sampled. Vectorised per step over the rows of each pattern.

A row's automaton is a :class:`~libs.grammar.regex_fsm.TokenFSM` (compiled once
per pattern with this model's vocabulary, ahead of the row when the scheduler
announced it: :mod:`.regex_compiler`). The row may end (one of
its ``end_ids``) only in an accepting state, and must end once no token can
follow (the state is dead: after an end id, or a pattern the vocabulary cannot
spell).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from libs.grammar.regex_fsm import TokenFSM
from libs.protocol.messages import NewRow

from .regex_compiler import Compiler

DEAD = -1
MAX_PATTERNS = 64  # compiled patterns kept on the device beyond those rows use now


class DeviceFSM:
    """A compiled pattern's tables on the model's device."""

    def __init__(self, fsm: TokenFSM | None, device: torch.device) -> None:
        self.fsm = fsm
        if fsm is None:  # NOTE: a pattern this vocabulary cannot spell: dead from the start
            self.next_state = torch.full((1, 1), DEAD, dtype=torch.int32, device=device)
            self.accepting = torch.zeros(1, dtype=torch.bool, device=device)
            self.allowed = torch.zeros(1, 1, dtype=torch.bool, device=device)
            return
        # NOTE: shares the compiled table's memory on a CPU (int16 unless it has many states)
        self.next_state = torch.from_numpy(fsm.next_state).to(device)
        self.accepting = torch.from_numpy(fsm.accepting).to(device)
        self.allowed = self.next_state >= 0  # [S, V] bool: one gather per step masks a batch

    def start(self, replay: list[int]) -> int:
        return DEAD if self.fsm is None else self.fsm.walk(replay)


class Constraints:
    """Per-row automaton state for up to ``max_requests`` rows."""

    def __init__(self, max_requests: int, vocab_size: int,
                 texts: Callable[[], list[str | None]], device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self.compiler = Compiler(texts)  # NOTE: texts: the vocabulary's, built on first use
        self._device_fsms: dict[str, DeviceFSM] = {}
        self.pattern: list[str] = [""] * max_requests
        self.has_pattern = np.zeros(max_requests, dtype=bool)
        self.state = np.zeros(max_requests, dtype=np.int64)
        self.start_len = np.zeros(max_requests, dtype=np.int64)
        self.end_ids: list[np.ndarray] = [np.empty(0, np.int64)] * max_requests

    def set_rows(self, new_rows: list[NewRow]) -> None:
        """Start (or clear) the automaton of every row entering the table."""
        for r in new_rows:
            self.pattern[r.row] = r.regex
            self.has_pattern[r.row] = bool(r.regex)
            if not r.regex:
                continue
            dfsm = self._fsm(r.regex)
            self.state[r.row] = dfsm.start(r.regex_tokens)
            self.start_len[r.row] = r.regex_from
            self.end_ids[r.row] = np.asarray(r.end_ids, dtype=np.int64)

    def prepare(self, patterns: list[str]) -> int:
        """Compile patterns in the background before their rows arrive."""
        return self.compiler.prepare(patterns)

    def constrained(self, rows: np.ndarray) -> np.ndarray:
        """Batch indices of the rows that carry a pattern."""
        return np.flatnonzero(self.has_pattern[rows])

    def mask(self, logits: torch.Tensor, rows: np.ndarray, which: np.ndarray) -> None:
        """Set to -inf (in place) every logit of a batch row in ``which`` that its
        automaton does not allow next."""
        for pattern, idx in self._groups(rows, which):
            dfsm = self._device_fsms[pattern]
            states = self.state[rows[idx]]
            banned = ~self._allowed(dfsm, states, rows[idx], logits.shape[-1])
            if len(idx) == len(rows):  # NOTE: the whole batch: in place, no copy
                logits.masked_fill_(banned, float("-inf"))
            else:
                at = torch.from_numpy(idx).to(logits.device)
                logits[at] = logits[at].masked_fill(banned, float("-inf"))

    def advance(self, rows: np.ndarray, which: np.ndarray, seq_lens: np.ndarray,
                tokens: torch.Tensor) -> None:
        """Feed each constrained row the token it sampled, if that sample is kept
        (the row's length reached where its output starts)."""
        kept = which[seq_lens[which] >= self.start_len[rows[which]]]
        for pattern, idx in self._groups(rows, kept):
            dfsm = self._device_fsms[pattern]
            r = rows[idx]
            states = torch.from_numpy(self.state[r]).to(self.device)
            tok = tokens[torch.from_numpy(idx).to(tokens.device)].to(self.device)
            live = states >= 0
            nxt = dfsm.next_state[states.clamp(min=0), tok.clamp(max=dfsm.next_state.shape[1] - 1)]
            nxt = torch.where(live, nxt.long(), torch.full_like(states, DEAD))
            self.state[r] = nxt.cpu().numpy()

    def _allowed(self, dfsm: DeviceFSM, states: np.ndarray, rows: np.ndarray, vocab: int) -> torch.Tensor:
        """[n, vocab] bool: tokens that keep each row alive, plus its end ids where
        it matches already or nothing else could follow."""
        st = torch.from_numpy(states).to(self.device)
        live = st >= 0
        table = dfsm.allowed[st.clamp(min=0)]  # [n, table vocab]
        if table.shape[1] == vocab:
            allowed = table & live[:, None]
        else:  # NOTE: a dead-from-the-start pattern's 1-column table
            allowed = torch.zeros(len(states), vocab, dtype=torch.bool, device=self.device)
            width = min(vocab, table.shape[1])
            allowed[:, :width] = table[:, :width] & live[:, None]
        may_end = ~allowed.any(dim=1) | (live & dfsm.accepting[st.clamp(min=0)])
        ends = [self.end_ids[r] for r in rows]
        owner = np.repeat(np.arange(len(rows)), [len(e) for e in ends])
        ids = np.concatenate(ends) if ends else np.empty(0, np.int64)
        keep = ids < vocab
        owner_t = torch.from_numpy(owner[keep]).to(self.device)
        ids_t = torch.from_numpy(ids[keep]).to(self.device)
        allowed[owner_t, ids_t] |= may_end[owner_t]
        return allowed

    def _groups(self, rows: np.ndarray, which: np.ndarray):
        """(pattern, batch indices) for the rows of ``which``, one group per pattern."""
        if not len(which):
            return
        patterns = [self.pattern[r] for r in rows[which]]
        for pattern in dict.fromkeys(patterns):
            yield pattern, which[[p == pattern for p in patterns]]

    def _fsm(self, pattern: str) -> DeviceFSM:
        dfsm = self._device_fsms.get(pattern)
        if dfsm is not None:
            return dfsm
        fsm = self.compiler.get(pattern)  # NOTE: None: its rows may only end
        if len(self._device_fsms) >= MAX_PATTERNS:
            in_use = {p for p, on in zip(self.pattern, self.has_pattern) if on}
            for old in [p for p in self._device_fsms if p not in in_use]:
                del self._device_fsms[old]
        dfsm = self._device_fsms[pattern] = DeviceFSM(fsm, self.device)
        return dfsm
