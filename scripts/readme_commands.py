"""The commands README.md gives, and what scripts/check_readme.py does with each.

A command is a line of a ```bash block (continuations and quoted newlines joined; a ``#``
line right after it is its expected output), a ```python block, or an inline code span that
starts with a program (``radixmesh ...``, ``.venv/bin/...``, ``docker compose ...``). Each
one is either run by a step of the check (:data:`STEPS`) or listed in :data:`SKIPS` with the
reason; a command that is neither fails the test (tests/docs/test_readme_commands.py).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

# what an inline code span starts with when it is a command (a flag or a name alone is not)
PROGRAMS = ("radixmesh ", ".venv/bin/", "bash ", "docker ", "kubectl ", "curl ", "python ", "NATS_URL=")

# step: the commands it runs, by their first words (after `.venv/bin/` and VAR=value are dropped)
STEPS: dict[str, re.Pattern] = {
    "setup": re.compile(r"^bash scripts/up\.sh$"),
    # a stack from `radixmesh up` with the command's flags (scaling, a local NATS cluster)
    "stack": re.compile(r"^radixmesh up --(workers|nats-cluster)\b"),
    # the multi-host block: a NATS cluster over h1..h3, a stack on it, a worker joining it
    "multi_host": re.compile(r"^radixmesh up --host 0\.0\.0\.0$"),
    "calls": re.compile(r"^(curl http://127\.0\.0\.1:8000/|from openai import)"),
    "trace": re.compile(r"^radixmesh trace last$"),
    "nats_cluster": re.compile(r"^nats-server -n h1 "),
    "join_worker": re.compile(r"^python -m services\.gpu_worker --nats-url "),
    "compose": re.compile(r"^docker compose\b"),
}

SKIPS: dict[str, tuple[re.Pattern, str]] = {
    "variable": (re.compile(r"^$"),
                 "a variable's form alone (NATS_URL=...); the multi_host step runs it with radixmesh up"),
    "test-suite": (re.compile(r"^bash scripts/test\.sh$"),
                   "the whole suite: CI runs exactly this command (.ci/run), this check is one of its tests"),
    "this-check": (re.compile(r"^python scripts/check_readme\.py$"),
                   "this check itself (tests/docs/test_readme_commands.py runs it)"),
    "up-bare": (re.compile(r"^radixmesh up$"),
                "bash scripts/up.sh ends in `exec .venv/bin/radixmesh up \"$@\"`: the setup step runs it"),
    "module-pattern": (re.compile(r"^python -m services\.<name>$"),
                       "a pattern naming the service modules; every stack here runs each of them"),
    "simulate": (re.compile(r"^radixmesh simulate$"),
                 "a subcommand named in a feature line; its command lines are in docs/routing.md "
                 "and tests/simulate/test_cli.py runs them"),
    "kubectl": (re.compile(r"^kubectl apply -k deploy/k8s$"),
                "no Kubernetes cluster or kubectl here; tests/deploy/test_k8s_manifests.py validates "
                "deploy/k8s against Kubernetes' schemas (kubernetes-validate)"),
    "benchmark-module": (re.compile(r"^python -m radixmesh\.benchmarks\.(mesh|bf16_quality)$"),
                         "a benchmark that takes minutes: tests/benchmarks (test_mesh.py, "
                         "test_bf16_quality.py) runs each on a smaller workload"),
    "vllm-bench": (re.compile(r"^radixmesh bench .*--systems radixmesh,vllm:"),
                   "beside a vLLM server on :8100 (docs/benchmarks.md says how to start one); "
                   "scripts/compose_smoke.sh runs a radixmesh bench row in compose and locally"),
}


@dataclass
class Command:
    line: int
    kind: str  # "bash", "python" or "inline"
    text: str  # as written (continuations kept for bash, the whole block for python)
    expect: list[str] = field(default_factory=list)  # the "# ..." lines right after it

    @property
    def key(self) -> str:
        """The command without its comment, `.venv/bin/` and leading VAR=value words."""
        if self.kind == "python":
            return self.text.strip().splitlines()[0]
        words = shlex.split(self.text.replace("\\\n", " "), comments=True)
        while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
            words.pop(0)
        if words and words[0].startswith(".venv/bin/"):
            words[0] = words[0].removeprefix(".venv/bin/")
        return " ".join(words)


def _complete(text: str) -> bool:
    """True where the shell would run ``text`` as it stands (no open quote or continuation)."""
    if text.rstrip().endswith("\\"):
        return False
    try:
        shlex.split(text, comments=True)
    except ValueError:
        return False
    return True


def _bash(block: list[tuple[int, str]]) -> list[Command]:
    out: list[Command] = []
    pending: tuple[int, list[str]] | None = None
    for number, line in block:
        if pending is None and line.lstrip().startswith("#"):
            if out:
                out[-1].expect.append(line.lstrip()[1:].strip())
            continue
        if pending is None:
            if not line.strip():
                continue
            pending = (number, [])
        pending[1].append(line)
        text = "\n".join(pending[1])
        if _complete(text):
            out.append(Command(pending[0], "bash", text))
            pending = None
    if pending is not None:
        raise ValueError(f"README.md:{pending[0]}: an unterminated shell command")
    return out


_FENCE = re.compile(r"^\s*```\s*(\w*)\s*$")
_SPAN = re.compile(r"(`+)((?:(?!\1).)+?)\1", re.S)


def extract(text: str) -> list[Command]:
    """Every command of a README, in order."""
    commands: list[Command] = []
    lang, block = None, []
    paragraph: list[tuple[int, str]] = []

    def inline() -> None:
        if not paragraph:
            return
        joined = "\n".join(line for _, line in paragraph)
        for match in _SPAN.finditer(joined):
            span = " ".join(match.group(2).split())
            if span.startswith(PROGRAMS):
                line = paragraph[0][0] + joined[: match.start()].count("\n")
                commands.append(Command(line, "inline", span))
        paragraph.clear()

    for number, line in enumerate(text.splitlines(), 1):
        fence = _FENCE.match(line)
        if fence and lang is None:
            inline()
            lang, block = fence.group(1) or "text", []
        elif fence:
            if lang in ("bash", "sh", "shell", "console"):
                commands += _bash(block)
            elif lang in ("python", "py"):
                commands.append(Command(block[0][0] if block else number, "python",
                                        "\n".join(line for _, line in block)))
            lang = None
        elif lang is not None:
            block.append((number, line))
        elif line.strip():
            paragraph.append((number, line))
        else:
            inline()
    inline()
    return commands


def classify(command: Command) -> tuple[str, str | None]:
    """(step, None) for a command the check runs, (skip name, reason) for one it does not;
    ("", None) for one that is neither."""
    key = command.key
    for name, pattern in STEPS.items():
        if pattern.search(key):
            return name, None
    for name, (pattern, reason) in SKIPS.items():
        if pattern.search(key):
            return name, reason
    return "", None


def plan(text: str | None = None) -> dict[str, list[Command]]:
    """The README's commands by step (skips under ``skip:<name>``, unknown ones under ``""``)."""
    out: dict[str, list[Command]] = {}
    for command in extract(README.read_text() if text is None else text):
        name, reason = classify(command)
        out.setdefault(f"skip:{name}" if reason else name, []).append(command)
    return out
