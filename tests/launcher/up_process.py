"""`radixmesh up` run as a user runs it, for the launcher's end-to-end tests: the real
command in a subprocess of its own session on free ports, its output in a file, its
children found in /proc; plus a streamed chat client and a /health poller."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import httpx

from radixmesh.natsd import free_port

REPO = Path(__file__).resolve().parents[2]
MODEL = "SmolLM2-135M-Instruct"


def serving(tmp: Path, args: list[str], workers: int) -> Iterator["Up"]:
    """A module fixture's body: `radixmesh up ARGS` serving with ``workers`` workers, stopped
    after the module however it ends."""
    running = Up(tmp, args)
    try:
        running.wait_serving(workers=workers)
        yield running
    finally:
        running.stop()


class Up:
    """A running `radixmesh up ARGS` (plus its ports and log dir); its output (stdout +
    stderr) goes to a file."""

    def __init__(self, tmp: Path, args: list[str]) -> None:
        self.port, self.nats_port = free_port(), free_port()
        self.log_dir = tmp / "logs"
        self.log_dir.mkdir()
        (self.log_dir / "gateway.log").write_text("A LINE OF AN EARLIER RUN\n")
        self.out = tmp / "up.out"
        cmd = [sys.executable, "-m", "radixmesh.cli", "up", *args, "--port", str(self.port),
               "--nats-port", str(self.nats_port), "--log-dir", str(self.log_dir)]
        with open(self.out, "wb") as out:
            # NOTE: a session of its own, as a shell job: Ctrl-C is a SIGINT to its group
            self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def wait_for_output(self, pattern: str, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        while True:
            found = re.search(pattern, self.output())
            if found:
                return found
            assert self.proc.poll() is None, f"radixmesh up exited:\n{self.output()}"
            assert time.monotonic() < deadline, f"no {pattern!r} in:\n{self.output()}"
            time.sleep(0.1)

    def wait_serving(self, workers: int, timeout: float = 600) -> None:
        """Until the launcher says it serves and /health counts ``workers`` workers."""
        self.wait_for_output(r"radixmesh is serving", timeout)
        deadline = time.monotonic() + 120
        while (health := httpx.get(self.url + "/health", timeout=5).json()).get("workers") != workers:
            assert time.monotonic() < deadline, health
            time.sleep(0.25)

    def children(self) -> dict[str, int]:
        """The launcher's child processes by what they are: ``nats-server``, a service
        name, or ``gpu_worker:<worker id>`` (read from /proc, not from the launcher)."""
        found = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
                args = (stat.parent / "cmdline").read_bytes().decode().split("\0")
            except (OSError, IndexError, ValueError):
                continue
            if ppid != self.proc.pid:
                continue
            if "-m" in args and args[args.index("-m") + 1].startswith("services."):
                name = args[args.index("-m") + 1].removeprefix("services.")
                if name == "gpu_worker":
                    name += ":" + args[args.index("--worker-id") + 1]
                found[name] = int(stat.parent.name)
            elif Path(args[0]).name in ("nats-server", "mooncake_master"):
                found[Path(args[0]).name] = int(stat.parent.name)
        return found

    def ctrl_c(self, timeout: float = 60) -> int:
        """What a terminal's Ctrl-C does (SIGINT to the group); the launcher's exit code."""
        os.killpg(self.proc.pid, signal.SIGINT)
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        """Ctrl-C; if the launcher is not gone in 30 s, SIGKILL to it and to its children
        (each in a process group of its own: a SIGKILL to the launcher leaves them running)."""
        if self.proc.poll() is not None:
            return
        children = self.children()
        try:
            self.ctrl_c(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            for pid in children.values():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def gone(pid: int) -> bool:
    """The process has exited (reaped, or a zombie)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@dataclass
class Chat:
    """One streamed chat completion as the client saw it."""

    status: int = 0
    worker: str = ""  # x-radixmesh-worker: where it started
    text: str = ""
    finishes: list[str] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)


async def chat(client: httpx.AsyncClient, question: str, out: Chat | None = None,
               started: asyncio.Event | None = None, max_tokens: int = 32, **extra) -> Chat:
    """Stream a greedy chat completion of ``question`` (``extra``: more body fields)."""
    out = out or Chat()
    body = {"model": MODEL, "messages": [{"role": "user", "content": question}],
            "temperature": 0, "max_tokens": max_tokens, "stream": True, **extra}
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        out.status, out.worker = resp.status_code, resp.headers.get("x-radixmesh-worker", "")
        async for line in resp.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if "error" in event:
                out.errors.append(event["error"])
            for choice in event.get("choices", []):
                out.text += choice["delta"].get("content") or ""
                if out.text and started is not None:
                    started.set()
                if choice.get("finish_reason"):
                    out.finishes.append(choice["finish_reason"])
    return out


async def health_until(client: httpx.AsyncClient, status: str, limit: float) -> dict:
    """Poll /health until its status is ``status`` (200 for ok and degraded)."""
    deadline = time.monotonic() + limit
    while True:
        try:
            resp = await client.get("/health")
        except httpx.TransportError:  # the gateway itself is restarting
            assert time.monotonic() < deadline, f"/health never answered within {limit}s"
            await asyncio.sleep(0.1)
            continue
        body = resp.json()
        if body.get("status") == status:
            assert resp.status_code == (503 if status == "unavailable" else 200), body
            return body
        assert time.monotonic() < deadline, f"/health never {status}: {body}"
        await asyncio.sleep(0.1)
