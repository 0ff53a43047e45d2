"""Start a whole radixmesh stack on this machine: nats-server and every service.

Used by ``radixmesh up`` and by the integration tests. Each service runs as its
own process (``python -m services.<name>``) with its output in ``log_dir``.
Services named in ``StackConfig.supervise`` are restarted when they exit; the
scheduler keeps its instance id across restarts, so it re-adopts its workers
at once (their leases name it). Fault tests use :meth:`LocalStack.kill`,
:meth:`LocalStack.pid`, :meth:`LocalStack.kill_nats` and :meth:`LocalStack.start_nats`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from libs.models import DEFAULT_MODEL, resolve_model

from .natsd import NatsServer, free_port
from .trace import SPANS_FILE, SpanReceiver


class StackError(RuntimeError):
    pass


@dataclass
class StackConfig:
    model: str = DEFAULT_MODEL
    workers: int = 1
    host: str = "127.0.0.1"
    port: int = 8000
    nats_url: str | None = None
    subject_prefix: str = "rm"
    log_dir: Path = Path("logs")
    dtype: str = "auto"  # the worker picks: bfloat16 on CUDA and AMX / AVX512-BF16 CPUs, else float32
    kv_slots: int = 32768
    threads_per_worker: int = 0  # 0: cores / workers
    extra: dict[str, list[str]] = field(default_factory=dict)  # service -> extra flags
    # keep every span in log_dir/spans.jsonl (for `radixmesh trace`), unless the
    # environment already sends them somewhere (OTEL_EXPORTER_OTLP_*ENDPOINT)
    traces: bool = False
    # services (process names) restarted when they exit; a restarted scheduler
    # re-adopts its workers at once (same instance id)
    supervise: tuple[str, ...] = ("scheduler",)
    max_restarts: int = 10  # per process: a crash loop ends in StackError


RESTART_POLL_S = 0.05
WORKER_ANNOUNCE_S = 0.5


@dataclass
class _Proc:
    name: str
    popen: subprocess.Popen
    log: Path
    cmd: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    restarts: int = 0
    restarted_at: float = 0.0  # monotonic time of the last restart


class LocalStack:
    def __init__(self, config: StackConfig, progress: Callable[[str], None] | None = None) -> None:
        self.config = config
        self.progress = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.nats: NatsServer | None = None
        self.procs: list[_Proc] = []
        self.nats_url = config.nats_url or ""
        self.spans: SpanReceiver | None = None
        self._env: dict[str, str] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._supervisor: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.config.port}"

    def start(self, timeout: float = 300.0) -> LocalStack:
        cfg = self.config
        cfg.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            model_dir = resolve_model(cfg.model, log=self.progress)
            if not self.nats_url:
                self.nats = NatsServer(log_file=cfg.log_dir / "nats-server.log").start()
                self.nats_url = self.nats.url
                self.progress(f"nats-server on {self.nats_url}")
            model_arg = str(model_dir) if cfg.model != DEFAULT_MODEL else DEFAULT_MODEL
            self._keep_spans()
            self._spawn_all(model_arg)
            if cfg.supervise:
                self._supervisor = threading.Thread(target=self._supervise, daemon=True,
                                                    name="stack-supervisor")
                self._supervisor.start()
            self._wait_healthy(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _keep_spans(self) -> None:
        from libs.protocol.telemetry import tracing_requested

        if not self.config.traces or tracing_requested():
            return
        self.spans = SpanReceiver(self.config.log_dir / SPANS_FILE).start()
        self._env = {"OTEL_EXPORTER_OTLP_ENDPOINT": self.spans.endpoint,
                     "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                     "OTEL_BSP_SCHEDULE_DELAY": os.environ.get("OTEL_BSP_SCHEDULE_DELAY", "500")}
        self.progress(f"keeping spans in {self.config.log_dir / SPANS_FILE} (radixmesh trace last)")

    def _spawn_all(self, model: str) -> None:
        cfg = self.config
        threads = cfg.threads_per_worker or max(1, (os.cpu_count() or 1) // cfg.workers)
        self._spawn("cache_index", [])
        self._spawn("tokenizer", ["--model", model])
        # NOTE: a fixed instance id: a restarted scheduler re-adopts its workers at once
        self._spawn("scheduler", ["--instance", f"scheduler-{uuid.uuid4().hex[:8]}"])
        for i in range(cfg.workers):
            self._spawn("gpu_worker", [
                "--model", model, "--dtype", cfg.dtype, "--kv-slots", str(cfg.kv_slots),
                "--threads", str(threads), "--worker-id", f"w{i}-{uuid.uuid4().hex[:6]}",
                # a restarted scheduler adopts a worker on its next announce
                "--announce-interval", str(WORKER_ANNOUNCE_S),
            ], log_name=f"gpu_worker-{i}")
        self._spawn("gateway", ["--model", model, "--host", cfg.host, "--port", str(cfg.port)])

    def _spawn(self, service: str, args: list[str], log_name: str | None = None) -> None:
        cfg = self.config
        log = cfg.log_dir / f"{log_name or service}.log"
        env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", **self._env)
        if service != "gpu_worker":
            env["OMP_NUM_THREADS"] = "1"
        cmd = [sys.executable, "-m", f"services.{service}", "--nats-url", self.nats_url,
               "--subject-prefix", cfg.subject_prefix, *args, *cfg.extra.get(service, [])]
        self.procs.append(_Proc(log_name or service, _popen(cmd, env, log), log, cmd, env))

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            self.check_alive()
            status, body = self.health()
            if status == 200:
                self.progress(f"gateway ready at {self.url}")
                return
            summary = body.get("detail") or body.get("error", {}).get("message") or "starting"
            if summary != last:
                self.progress(f"waiting for the stack: {summary}")
                last = summary
            time.sleep(0.5)
        raise StackError(f"stack not healthy after {timeout:.0f}s; logs in {self.config.log_dir}")

    def health(self) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as resp:
                return resp.status, _json(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, _json(err.read())
        except OSError:
            return 0, {}

    def check_alive(self) -> None:
        """Raise StackError if a service exited (a supervised one: past its restarts)."""
        for proc in list(self.procs):
            if proc.name in self.config.supervise and proc.restarts < self.config.max_restarts:
                continue
            code = proc.popen.poll()
            if code is not None:
                tail = proc.log.read_text(errors="replace")[-3000:] if proc.log.exists() else ""
                raise StackError(f"{proc.name} exited with code {code}; log tail:\n{tail}")

    # -- processes, for fault tests and supervision ---------------------------------

    def proc(self, name: str) -> _Proc:
        """The process named ``name`` (a service, or ``gpu_worker-<i>``)."""
        found = [p for p in self.procs if p.name == name]
        if not found:
            raise KeyError(f"no process {name!r}; have {[p.name for p in self.procs]}")
        return found[0]

    def pid(self, name: str) -> int:
        return self.proc(name).popen.pid

    def kill(self, name: str, sig: int = signal.SIGKILL) -> int:
        """Send ``sig`` (default SIGKILL) to a service; returns its pid. A supervised
        one is restarted by the supervisor."""
        pid = self.pid(name)
        os.kill(pid, sig)
        return pid

    def _supervise(self) -> None:
        while not self._stopping.wait(RESTART_POLL_S):
            for proc in list(self.procs):
                if (proc.name in self.config.supervise and proc.popen.poll() is not None
                        and proc.restarts < self.config.max_restarts):
                    self._restart(proc)

    def _restart(self, proc: _Proc) -> None:
        with self._lock:
            if self._stopping.is_set():
                return
            code = proc.popen.returncode
            proc.popen = _popen(proc.cmd, proc.env, proc.log)
            proc.restarts += 1
            proc.restarted_at = time.monotonic()
        self.progress(f"{proc.name} exited with code {code}; restarted "
                      f"(pid {proc.popen.pid}, restart {proc.restarts})")

    def kill_nats(self) -> None:
        """kill -9 the stack's own nats-server (services keep trying to reconnect)."""
        if self.nats is None or self.nats.proc is None:
            raise StackError("this stack does not run its own nats-server")
        self.nats.proc.kill()
        self.nats.proc.wait()

    def start_nats(self) -> None:
        """Start nats-server again on the same port (after :meth:`kill_nats`)."""
        if self.nats is None:
            raise StackError("this stack does not run its own nats-server")
        self.nats.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._supervisor is not None:
            self._supervisor.join(timeout=5)
            self._supervisor = None
        for proc in reversed(self.procs):
            if proc.popen.poll() is None:
                proc.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in reversed(self.procs):
            try:
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait()
        self.procs.clear()
        if self.spans is not None:  # NOTE: after the services, which flush spans at exit
            self.spans.stop()
            self.spans = None
        if self.nats:
            self.nats.stop()
            self.nats = None

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _popen(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    out = open(log, "ab")
    try:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                cwd=Path(__file__).resolve().parent.parent)
    finally:
        out.close()


def _json(data: bytes) -> dict:
    try:
        value = json.loads(data or b"{}")
        return value if isinstance(value, dict) else {}
    except ValueError:
        return {}


def ephemeral_stack_config(log_dir: Path, **overrides) -> StackConfig:
    """A stack on free ports and a private subject prefix (for tests and benchmarks)."""
    base = dict(port=free_port(), subject_prefix="t" + uuid.uuid4().hex[:8], log_dir=log_dir,
                kv_slots=16384)
    base.update(overrides)
    return StackConfig(**base)
