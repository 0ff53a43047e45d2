"""Incremental detokenization with stop strings, batched across requests (pure, no bus).

Each request keeps two offsets into its output ids (vLLM / SGLang technique)::

    output_ids:  [ ........ emitted ........ | prefix window | read window ]
                                             ^prefix_offset  ^read_offset

Per step the text of ``ids[prefix_offset:]`` minus the text of
``ids[prefix_offset:read_offset]`` is the new text, so the decoded windows stay
a few tokens long whatever the output length, and context-dependent decoders
(SentencePiece's leading space) see the token before the new ones. All windows
of one step are decoded in one ``decode_batch`` call per skip_special_tokens flag.
After text is emitted the decoded window becomes the next prefix window (its text
is known), so a step decodes one window per request; only when that window passed
``MAX_PREFIX`` tokens does the prefix move up to the read offset, and its text is
decoded once more the next step. A byte-level BPE tokenizer (``byte_table.py``) needs
no window: each request keeps the bytes of its tokens not emitted yet, and their lossy
UTF-8 text is the text a window would give (a test runs both paths side by side).

NOTE: text is emitted only when the decoded window does not end in U+FFFD, so a
multi-byte character split across tokens is never emitted half; at finish
everything left is flushed. The concatenation of all emitted text equals
``tokenizer.decode(all_ids, skip_special_tokens=...)`` (without the WordPiece
``clean_up_tokenization_spaces`` pass, which is not incremental), cut before the
first stop string if one matched. One exception: a byte-fallback decoder turns a
whole run of byte tokens into U+FFFD when the run is invalid UTF-8 (e.g. a kept
special token inside a character); text emitted before the run broke stays.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Sequence

from libs.grammar.token_texts import piece_bytes

from .byte_table import byte_table

REPLACEMENT = "\ufffd"
MAX_PREFIX = 4  # tokens in a prefix window kept from the last step before it moves up
_NO_WINDOW = object()  # a state with nothing to decode this step


@dataclass(eq=False)
class DecodeState:
    """Detokenizer state of one request."""

    skip_special_tokens: bool = True
    stop: tuple[str, ...] = ()
    # ids that reach the decoder: special tokens are left out when they are skipped
    output_ids: list[int] = field(default_factory=list)
    num_tokens: int = 0  # every token received, skipped ones included
    prefix_offset: int = 0
    read_offset: int = 0
    # decode(output_ids[prefix_offset:read_offset]); None: recompute next step
    prefix_text: str | None = ""
    # decoded text not emitted yet because it may be the start of a stop string
    held: str = ""
    stopped: bool = False
    # characters of upcoming text the client already has (a resumed request)
    skip: int = 0
    # bytes of tokens not emitted yet (byte-level tokenizers: see Detokenizer._bytes_step)
    pending: bytes = b""


class StepResult(NamedTuple):
    text: str  # new text to emit (possibly empty)
    stopped: bool  # a stop string matched: text ends right before it
    error: str | None = None  # the ids could not be decoded


_STOPPED = StepResult("", True)


class Detokenizer:
    """Turns per-step token ids of many requests into text deltas."""

    def __init__(self, tokenizer: Any, byte_level: bool = True) -> None:
        # NOTE: a `tokenizers.Tokenizer` is used directly when there is one (one
        # Rust call per batch); otherwise the HF tokenizer's batch_decode.
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self._hf = tokenizer
        self._special = frozenset(_special_ids(tokenizer, self._backend))
        self._raw: Any = None  # piece -> bytes, built on first use (False: none)
        # NOTE: byte-level BPE: every token's bytes fixed, so no decode call and no window
        # (``byte_level=False``: always windows, as for every other decoder)
        self._bytes = byte_table(self._backend) if byte_level else None

    def step(
        self,
        states: Sequence[DecodeState],
        new_ids: Sequence[Sequence[int]],
        finish: Sequence[bool],
    ) -> list[StepResult]:
        """Append ``new_ids[i]`` to ``states[i]``; flush everything where ``finish[i]``.

        Returns one StepResult per state. A state that matched a stop string is
        done: later calls return empty text for it.
        """
        if self._bytes is not None:
            return self._bytes_step(states, new_ids, finish)
        fulls = self._decode_windows(states, new_ids, finish)
        out: list[StepResult] = []
        for i, st in enumerate(states):
            if st.stopped:
                out.append(_STOPPED)
                continue
            res = _advance(st, fulls.get(i, _NO_WINDOW), finish[i])
            out.append(_skip(st, res) if st.skip else res)
        return out

    def _bytes_step(
        self, states: Sequence[DecodeState], new_ids: Sequence[Sequence[int]], finish: Sequence[bool],
    ) -> list[StepResult]:
        """:meth:`step` for byte-level tokenizers: the pending bytes' lossy UTF-8 text is
        emitted once it does not end in U+FFFD, as a window's text would be."""
        table, special, out = self._bytes, self._special, []
        for st, ids, fin in zip(states, new_ids, finish):
            if st.stopped:
                out.append(_STOPPED)
                continue
            st.num_tokens += len(ids)
            if st.skip_special_tokens and not special.isdisjoint(ids):
                ids = [t for t in ids if t not in special]
            st.output_ids.extend(ids)
            try:
                buf = st.pending + (table[ids[0]] if len(ids) == 1 else b"".join([table[t] for t in ids]))
            except KeyError:  # NOTE: ids past the vocabulary decode to nothing, as decode leaves them out
                if not all(0 <= t < 2**32 for t in ids):  # not token ids at all: decode raises
                    st.stopped = True
                    out.append(StepResult("", False, "could not decode the generated token ids"))
                    continue
                buf = st.pending + b"".join([table.get(t, b"") for t in ids])
            delta = ""
            if buf:
                text = buf.decode("utf-8", "replace")
                if fin or not text.endswith(REPLACEMENT):
                    delta, buf = text, b""
            st.pending = buf
            res = StepResult(delta, False) if not st.stop and not st.held else _apply_stop(st, delta, fin)
            out.append(_skip(st, res) if st.skip else res)
        return out

    def prime(self, state: DecodeState, output_ids: Sequence[int], emitted_chars: int) -> None:
        """Start ``state`` (fresh) as if ``output_ids`` had been decoded and the
        first ``emitted_chars`` characters of their text emitted: a resumed
        request's stream goes on with no gap and no repeat.

        NOTE: replaying the ids in one step rebuilds the offsets, the held stop
        prefix and any unfinished multi-byte character exactly, because the
        emitted text does not depend on how the ids were split into steps.
        Raises ValueError if the ids cannot be decoded.
        """
        state.skip = emitted_chars
        res = self.step([state], [list(output_ids)], [False])[0]
        if res.error is not None:
            raise ValueError(res.error)
        if res.text:  # decoded but not emitted before the move: emit it next
            state.held = res.text + state.held

    def _decode_windows(
        self, states: Sequence[DecodeState], new_ids: Sequence[Sequence[int]],
        finish: Sequence[bool],
    ) -> dict[int, str | None]:
        """Append the new ids; decode the full window of every state that has work (and
        its prefix window where that is not known: into ``prefix_text``, None if it
        failed). Returns index -> full window text (None: it could not be decoded)."""
        # per skip_special_tokens flag: keys (i: full window of states[i], ~i: its prefix) and windows
        jobs: dict[bool, tuple[list[int], list[list[int]]]] = {True: ([], []), False: ([], [])}
        special = self._special
        for i, st in enumerate(states):
            if st.stopped:
                continue
            ids = new_ids[i]
            st.num_tokens += len(ids)
            if st.skip_special_tokens and not special.isdisjoint(ids):
                # NOTE: skipped tokens decode to nothing; leaving them out keeps a
                # run of them (eos with ignore_eos) from widening the window.
                ids = [t for t in ids if t not in special]
            out_ids = st.output_ids
            out_ids.extend(ids)
            if not ids and not finish[i]:
                continue
            keys, seqs = jobs[st.skip_special_tokens]
            if st.prefix_text is None:
                keys.append(~i)
                seqs.append(out_ids[st.prefix_offset:st.read_offset])
            keys.append(i)
            seqs.append(out_ids[st.prefix_offset:])
        fulls: dict[int, str | None] = {}
        for skip, (keys, seqs) in jobs.items():
            if not keys:
                continue
            for k, text in zip(keys, self._decode_many(seqs, skip)):
                if k >= 0:
                    fulls[k] = text
                else:
                    states[~k].prefix_text = text
        return fulls

    def token_texts(self, ids: Sequence[int]) -> list[str]:
        """The text of each token alone (special tokens kept), in one batch decode."""
        return [t or "" for t in self._decode_many([[i] for i in ids], False)]

    def token_bytes(self, ids: Sequence[int], texts: Sequence[str]) -> list[bytes] | None:
        """The bytes of each token (``texts``: from :meth:`token_texts`); None when every
        text is whole UTF-8 characters (its encoding is its bytes). A token that is part
        of a character decodes to U+FFFD: its bytes come from its vocabulary piece."""
        if not any(REPLACEMENT in t for t in texts):
            return None
        return [(self._piece_bytes(i) or t.encode()) if REPLACEMENT in t else t.encode()
                for i, t in zip(ids, texts)]

    def _piece_bytes(self, token_id: int) -> bytes | None:
        if self._raw is None:
            try:
                self._raw = piece_bytes(self._backend.decoder) if self._backend is not None else False
            except ValueError:  # NOTE: a decoder without a byte form: the texts' bytes stand
                self._raw = False
        piece = self._backend.id_to_token(token_id) if self._raw else None
        return self._raw(piece) if piece is not None else None

    def _decode_many(self, seqs: list[list[int]], skip: bool) -> list[str | None]:
        """Batch decode; on failure decode one by one so one bad sequence costs only itself."""
        try:
            return self._batch(seqs, skip)
        except Exception:  # noqa: BLE001 - e.g. a negative id: isolate it below
            return [self._one(seq, skip) for seq in seqs]

    def _batch(self, seqs: list[list[int]], skip: bool) -> list[str]:
        if self._backend is not None:
            return self._backend.decode_batch(seqs, skip_special_tokens=skip)
        return self._hf.batch_decode(
            seqs, skip_special_tokens=skip, clean_up_tokenization_spaces=False
        )

    def _one(self, seq: list[int], skip: bool) -> str | None:
        try:
            return self._batch([seq], skip)[0]
        except Exception:  # noqa: BLE001 - reported as the request's error
            return None


def _special_ids(tokenizer: Any, backend: Any) -> list[int]:
    """Ids that ``skip_special_tokens`` drops."""
    if backend is not None:
        return [i for i, t in backend.get_added_tokens_decoder().items() if t.special]
    return list(getattr(tokenizer, "all_special_ids", []))


def _advance(st: DecodeState, full: Any, finish: bool) -> StepResult:
    """Move one state's offsets given its decoded full window; apply stop strings."""
    delta = ""
    if full is not _NO_WINDOW:
        prefix = st.prefix_text
        if prefix is None or full is None:
            st.stopped = True
            return StepResult("", False, "could not decode the generated token ids")
        if len(full) > len(prefix) and (finish or not full.endswith(REPLACEMENT)):
            delta = full[len(prefix):]
            end = len(st.output_ids)
            if end - st.prefix_offset > MAX_PREFIX:
                st.prefix_offset, st.prefix_text = st.read_offset, None
            else:  # NOTE: the window just decoded is the next prefix window, its text known
                st.prefix_text = full
            st.read_offset = end
    if not st.stop and not st.held:
        return StepResult(delta, False)
    return _apply_stop(st, delta, finish)


def _skip(st: DecodeState, res: StepResult) -> StepResult:
    """Drop the start of ``res.text`` that the client already received."""
    if not st.skip or not res.text:
        return res
    cut = min(st.skip, len(res.text))
    st.skip -= cut
    return res._replace(text=res.text[cut:])


def _apply_stop(st: DecodeState, delta: str, finish: bool) -> StepResult:
    """Emit ``held + delta`` except a tail that could begin a stop string."""
    buf = st.held + delta if st.held else delta
    if not st.stop or not buf:
        st.held = ""
        return StepResult(buf, False)
    cut = find_stop(buf, st.stop)
    if cut >= 0:
        st.held, st.stopped = "", True
        return StepResult(buf[:cut], True)
    keep = 0 if finish else partial_stop_len(buf, st.stop)
    st.held = buf[len(buf) - keep:] if keep else ""
    return StepResult(buf[:len(buf) - keep], False)


def find_stop(text: str, stop: Sequence[str]) -> int:
    """Index of the earliest stop string occurrence in ``text``, or -1."""
    found = [i for i in (text.find(s) for s in stop) if i >= 0]
    return min(found) if found else -1


def partial_stop_len(text: str, stop: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
    best, last = 0, text[-1:]
    if not last:
        return 0
    for s in stop:
        # NOTE: a candidate prefix s[:k] must end with text's last character.
        i = s.find(last, best, len(s) - 1)
        while i >= 0:
            if len(text) > i and text.endswith(s[:i + 1]):
                best = i + 1
            i = s.find(last, i + 1, len(s) - 1)
    return best
