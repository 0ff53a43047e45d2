"""Fault injection for tests of the delivery guarantees: drop chosen messages on receipt.

``RADIXMESH_FAULT_DROP="<subject glob>@<n>[:<n>...][,...]"`` makes a process's bus drop the
n-th message (counted from 1) it receives on subjects matching the glob, as a broker node
dying mid-delivery would: e.g. ``rm.tokenizer.detok.*@5:9`` loses the 5th and 9th token
batches a tokenizer gets. Unset (the default), subscriptions carry no check at all.
"""

from __future__ import annotations

import fnmatch
import logging
import os
from dataclasses import dataclass, field

ENV = "RADIXMESH_FAULT_DROP"
log = logging.getLogger("radixmesh.faults")


@dataclass
class DropRule:
    pattern: str
    nth: frozenset[int]
    seen: int = field(default=0)

    def drops(self, subject: str) -> bool:
        if not fnmatch.fnmatchcase(subject, self.pattern):
            return False
        self.seen += 1
        return self.seen in self.nth


def parse(spec: str) -> list[DropRule]:
    rules = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        pattern, sep, counts = part.rpartition("@")
        try:
            nth = frozenset(int(n) for n in counts.split(":"))
        except ValueError:
            nth = frozenset()
        if not sep or not pattern or not nth or min(nth) < 1:
            raise ValueError(f"{ENV}: want <subject glob>@<n>[:<n>...], got {part!r}")
        rules.append(DropRule(pattern, nth))
    return rules


def from_env() -> list[DropRule]:
    return parse(os.environ.get(ENV, ""))


def should_drop(rules: list[DropRule], subject: str) -> bool:
    """True for a message the rules drop (logged, so a test's log shows each one)."""
    if any(rule.drops(subject) for rule in rules):
        log.warning("fault injection: dropped a message on %s", subject)
        return True
    return False
