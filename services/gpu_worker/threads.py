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
        size = self._sizes.setdefault(self.size_of(tokens), _Size())
        size.steps += 1
        untried = [n for n in self.counts if n not in size.per_token]
        if untried:
            return untried[0]
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
        size = self._sizes.setdefault(self.size_of(tokens), _Size())
        value = seconds / max(1, tokens)
        old = size.per_token.get(threads)
        size.per_token[threads] = value if old is None else old + self.alpha * (value - old)

    def table(self) -> dict[int, dict[int, float]]:
        """Step size class -> thread count -> moving average of ms per token (for logs)."""
        return {k: {n: v * 1e3 for n, v in s.per_token.items()} for k, s in sorted(self._sizes.items())}
