"""What a workload is: requests as chat messages that may embed earlier answers.

A request whose messages contain an :class:`Answer` part depends on that
earlier request: the harness sends it only after the parent finished, with the
parent's actual answer in its place (multi-turn follow-ups, combining calls).
A request with ``after`` waits for those requests to finish (ok or not) without
embedding anything (a closed loop: one stream after another). ``arrive_s``
fixes when a request arrives, instead of the load's arrival process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping


@dataclass(frozen=True)
class Answer:
    """Placeholder for the answer text of request ``of``."""

    of: str


Part = str | Answer


@dataclass(frozen=True)
class Message:
    role: str
    parts: tuple[Part, ...]

    @classmethod
    def text(cls, role: str, content: str) -> "Message":
        return cls(role, (content,))


@dataclass(frozen=True)
class RequestSpec:
    """One request of a workload; ``id`` is unique within it."""

    id: str
    kind: str
    messages: tuple[Message, ...]
    max_tokens: int
    after: tuple[str, ...] = ()  # sent once these finished; their answers are not used
    arrive_s: float | None = None  # seconds after the start (None: the load's arrivals)

    @property
    def depends_on(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for msg in self.messages:
            for part in msg.parts:
                if isinstance(part, Answer):
                    seen[part.of] = None
        return tuple(seen)

    def render(self, answers: Mapping[str, str]) -> list[dict[str, str]]:
        """OpenAI-style messages with every Answer replaced by its text."""
        return [{"role": m.role,
                 "content": "".join(p if isinstance(p, str) else answers[p.of] for p in m.parts)}
                for m in self.messages]


@dataclass
class Workload:
    """Requests in dependency order (parents before children) plus description."""

    name: str
    requests: list[RequestSpec]
    params: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)  # measured facts (token counts, sharing)

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for spec in self.requests:
            if spec.id in seen:
                raise ValueError(f"duplicate request id {spec.id!r}")
            missing = [d for d in (*spec.depends_on, *spec.after) if d not in seen]
            if missing:
                raise ValueError(f"{spec.id} depends on {missing}, which do not come before it")
            seen.add(spec.id)

    @property
    def roots(self) -> list[RequestSpec]:
        return [s for s in self.requests if not s.depends_on and not s.after]
