"""How many compute threads each step runs on: the worker's own measurement, not a guess.

On a small CPU the best count depends on the step and on what else runs there. Measured on
2 cores (AMD EPYC, bf16): with another process busy on the second core, two threads ran 4x
slower than one at batch 1 and 2x at batch 64; with the stack's own services beside the
worker, two threads make a 1-row decode step ~1.25x faster than one (15-16 vs 19-21 ms).

``ThreadChooser`` keeps, per step size (tokens in the step, in powers of two), the seconds
per token of the last ``WINDOW`` steps on one thread, on half of them and on all of them;
each step runs on the count whose fastest recent step is fastest, and every
``explore_every``-th step of a size tries the next of the others (sooner while a count has
few steps timed, less often once its tries keep coming out far slower), so a change in the
machine's load moves the choice within a few dozen steps.

Step times are noisy one way only: a step the broker or a service preempted runs slow,
never fast. So each count is judged by the best of its recent steps (spikes do not move it;
a load that slows every step does, within ``WINDOW`` steps of the count in use), and the
choice leaves the count in use only for one faster by more than ``MARGIN``. (Before: a
moving average of every step. In the stack at batch 1 a few slow two-thread steps in a row
sent 10-13% of the steps to one thread, each ~1.3x slower: 57-63 tok/s against 62-73 with
the count fixed at two. A median of five still did it after a burst of slow steps, and
needed three tries of two threads, 96 steps apart, to come back.)

A size seen for the first time starts from the nearest size already measured on every count
(its ratios: the counts' seconds per token, rescaled by this size's first measurement), so a
cold worker's first prefill chunks do not each run once on one thread to find out what the
chunk before them showed; with no such size yet it runs on the largest count, and takes a
neighbour's ratios as soon as one is measured on every count (in a cold stack the first
request's decode steps, cheap to try on one thread, are): before, its next step tried one
thread itself, and the second request's prefill ran 1.6-1.8x slower (TTFT 957 against ~545 ms
for a 290-token prompt, 2 cores).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

EXPLORE_EVERY = 32  # steps of one size between two tries of the other thread count
WINDOW = 5  # recent steps per count; the fastest of them judges it
SURE = 3  # own steps on a count before its tries slow to one per explore_every
FAR = 1.25  # tries this much slower than the count in use, FAR_TRIES in a row: tried 4x less often
FAR_TRIES = 2
MARGIN = 0.05  # how much faster another count must look before the choice moves to it


@dataclass
class _Size:
    """Seconds per token of recent steps of one size, per thread count."""

    recent: dict[int, deque[float]] = field(default_factory=dict)  # counts timed on this size
    prior: dict[int, float] = field(default_factory=dict)  # the nearest size's figures, until timed here
    steps: int = 0
    explored: int = 0  # tries of the other counts so far (they take turns)
    best: int | None = None  # the count in use
    far: int = 0  # tries in a row, of the other counts, far slower than the count in use

    def estimate(self, n: int) -> float | None:
        window = self.recent.get(n)
        return min(window) if window else self.prior.get(n)


class ThreadChooser:
    """``choose(tokens)`` before a step, ``record(tokens, threads, seconds)`` after it."""

    def __init__(self, max_threads: int, explore_every: int = EXPLORE_EVERY, window: int = WINDOW,
                 margin: float = MARGIN) -> None:
        if max_threads < 1:
            raise ValueError(f"max_threads must be >= 1, got {max_threads}")
        self.counts = tuple(sorted({1, max(1, max_threads // 2), max_threads}))
        self.explore_every = explore_every
        self.window = window
        self.margin = margin
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
        untried = [n for n in self.counts if size.estimate(n) is None]
        if untried:
            return untried[-1]
        best = self._best(size)
        if size.steps % self._explore_period(size, best) == 0:
            others = [n for n in self.counts if n != best]
            size.explored += 1
            return others[size.explored % len(others)]
        return best

    def _explore_period(self, size: _Size, best: int) -> int:
        """Steps between tries of the other counts: a quarter of ``explore_every`` while a
        count larger than the one in use has fewer than ``SURE`` steps of its own on this
        size; four times it after ``FAR_TRIES`` tries in a row each more than ``FAR`` times
        slower than the count in use; else ``explore_every``.

        A size's first figures are the least sure (a cold first step, a neighbour's prior
        taken in a slow spell): seen at batch 8, a new size ran its first 30 steps on one
        thread, 1.4x slower, before its first try of two. Only more threads are tried early:
        on a free machine they cost little, while a try of fewer costs the step 1.3-2x, on a
        prefill chunk hundreds of ms of TTFT. A try of a count far slower costs that much:
        1-2% of the steps' time at batch 1 and 8, 10% with another process on the second
        core; slowed tries leave the choice as quick to leave a count that slows (its own
        steps show it) and up to 4 * explore_every steps late to come back to one that got
        faster."""
        if any(len(size.recent.get(n, ())) < SURE for n in self.counts if n > best):
            return max(1, self.explore_every // 4)
        if size.far >= FAR_TRIES:
            return 4 * self.explore_every  # NOTE: the count in use still reacts at once: its own steps show it
        return self.explore_every

    def _best(self, size: _Size) -> int:
        """The fastest count by its best recent step; the one in use unless another beats it by the margin."""
        fastest = min(self.counts, key=size.estimate)
        clear_gain = size.best is None or size.estimate(fastest) < size.estimate(size.best) * (1 - self.margin)
        if fastest != size.best and clear_gain:
            size.best, size.far = fastest, 0  # the far tries counted were against the count left
        return size.best

    def record(self, tokens: int, threads: int, seconds: float) -> None:
        """How long a step of ``tokens`` tokens took on ``threads`` threads."""
        if len(self.counts) == 1 or threads not in self.counts:
            return
        size = self._size(self.size_of(tokens))
        value = seconds / max(1, tokens)
        if not size.recent and threads in size.prior:  # NOTE: the prior keeps its ratios, on this size's scale
            scale = value / size.prior[threads]
            size.prior = {n: v * scale for n, v in size.prior.items()}
        if size.best is not None and threads != size.best:  # a try of another count
            size.far = size.far + 1 if value > FAR * size.estimate(size.best) else 0
        size.recent.setdefault(threads, deque(maxlen=self.window)).append(value)

    def _size(self, key: int) -> _Size:
        """The record of step-size class ``key``; one not yet timed on every count and without a
        prior takes the nearest class measured on every count as its prior, as soon as there is
        one (rescaled to a count it has timed itself): so a cold worker's second prefill chunk
        does not run on one thread to find out what its decode steps have shown meanwhile."""
        size = self._sizes.setdefault(key, _Size())
        if not size.prior and len(size.recent) < len(self.counts):
            known = [k for k, s in self._sizes.items() if len(s.recent) == len(self.counts)]
            if known:
                near = self._sizes[min(known, key=lambda k: (abs(k - key), -k))]
                size.prior = {n: near.estimate(n) for n in self.counts}
                if size.recent:  # NOTE: on this size's scale, by a count timed here
                    n, window = next(iter(size.recent.items()))
                    scale = min(window) / size.prior[n]
                    size.prior = {m: v * scale for m, v in size.prior.items()}
        return size

    def table(self) -> dict[int, dict[int, float]]:
        """Step size class -> thread count -> ms per token, the best of its recent steps
        (or the prior a size started from), for logs."""
        return {k: {n: s.estimate(n) * 1e3 for n in self.counts if s.estimate(n) is not None}
                for k, s in sorted(self._sizes.items())}
