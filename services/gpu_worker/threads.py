"""How many compute threads each step runs on: the worker's own measurement, not a guess.

On a small CPU the best count depends on the step and on what else runs there. Measured on
2 cores (AMD EPYC, bf16, `radixmesh bench` with its client on the same machine): two
threads make a 64-row decode step 1.4x faster and a prefill chunk 1.5x, but a 1-row
decode step 1.2x slower (the gateway, scheduler and broker take turns on the second
core, and every op's barrier waits for the thread they displaced); with another process
busy on the second core, two threads ran 4x slower than one at batch 1 and 2x at
batch 64.

``ThreadChooser`` keeps, per step size (tokens in the step, in powers of two), a moving
average of seconds per token on one thread, on half of them and on all of them; each step
runs on the fastest, and every ``explore_every``-th step of a size tries the next of the
others, so a change in the machine's load moves the choice within a few dozen steps.

A size seen for the first time starts from the nearest size already measured on every count
(its ratios: the counts' seconds per token, rescaled by this size's first measurement), so a
cold worker's first prefill chunks do not each run once on one thread to find out what the
chunk before them showed; with no such size yet it tries the counts from the largest down.
"""

from __future__ import annotations

from dataclasses import dataclass, field

EXPLORE_EVERY = 32  # steps of one size between two tries of the other thread count
ALPHA = 0.25  # weight of the newest measurement in the moving averages


@dataclass
class _Size:
    """Seconds per token of recent steps of one size, per thread count."""

    per_token: dict[int, float] = field(default_factory=dict)
    steps: int = 0
    explored: int = 0  # tries of the other counts so far (they take turns)
    own: set[int] = field(default_factory=set)  # counts timed on this size (the rest of per_token: a neighbour's prior)


class ThreadChooser:
    """``choose(tokens)`` before a step, ``record(tokens, threads, seconds)`` after it."""

    def __init__(self, max_threads: int, explore_every: int = EXPLORE_EVERY, alpha: float = ALPHA) -> None:
        if max_threads < 1:
            raise ValueError(f"max_threads must be >= 1, got {max_threads}")
        self.counts = tuple(sorted({1, max(1, max_threads // 2), max_threads}))
        self.explore_every = explore_every
        self.alpha = alpha
        self._sizes: dict[int, _Size] = {}

    @staticmethod
    def size_of(tokens: int) -> int:
        """The step-size class: 1, 2-3, 4-7, 8-15, ... tokens."""
        return max(1, tokens).bit_length()

    def choose(self, tokens: int) -> int:
        """The thread count for a step of ``tokens`` tokens."""
        if len(self.counts) == 1:
            return self.counts[0]
        size = self._size(self.size_of(tokens))
        size.steps += 1
        untried = [n for n in self.counts if n not in size.per_token]
        if untried:
            return untried[-1]
        best = min(self.counts, key=size.per_token.__getitem__)
        if size.steps % self.explore_every == 0:
            others = [n for n in self.counts if n != best]
            size.explored += 1
            return others[size.explored % len(others)]
        return best

    def record(self, tokens: int, threads: int, seconds: float) -> None:
        """How long a step of ``tokens`` tokens took on ``threads`` threads."""
        if len(self.counts) == 1 or threads not in self.counts:
            return
        size = self._size(self.size_of(tokens))
        value = seconds / max(1, tokens)
        if not size.own and threads in size.per_token:  # NOTE: the prior keeps its ratios, on this size's scale
            scale = value / size.per_token[threads]
            size.per_token = {n: v * scale for n, v in size.per_token.items()}
        old = size.per_token.get(threads) if threads in size.own else None
        size.per_token[threads] = value if old is None else old + self.alpha * (value - old)
        size.own.add(threads)

    def _size(self, key: int) -> _Size:
        """The record of step-size class ``key``; a new one copies the nearest class measured
        on every count."""
        size = self._sizes.get(key)
        if size is None:
            known = [k for k, s in self._sizes.items() if len(s.own) == len(self.counts)]
            size = self._sizes[key] = _Size()
            if known:
                size.per_token = dict(self._sizes[min(known, key=lambda k: (abs(k - key), -k))].per_token)
        return size

    def table(self) -> dict[int, dict[int, float]]:
        """Step size class -> thread count -> moving average of ms per token (for logs)."""
        return {k: {n: v * 1e3 for n, v in s.per_token.items()} for k, s in sorted(self._sizes.items())}
