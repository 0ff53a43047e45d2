"""Start a whole radixmesh stack on this machine: nats-server and every service.

Used by ``radixmesh up`` and by the integration tests. Each service runs as its
own process (``python -m services.<name>``) in its own process group, so a
terminal's Ctrl-C reaches only the launcher, which stops them in order: the
services, then the broker. Each process writes ``log_dir/<name>.log`` (a restart
appends to it); at start the previous run's logs and spans move to ``log_dir/previous/``
(:mod:`.run_dir`). A fixed port that is taken stops the start before anything runs
(:mod:`.preflight`).

The processes named in ``StackConfig.supervise`` (by default every service, and
nats-server when the stack started it) are restarted when they exit, after a
backoff (:class:`RestartPolicy`); one more exit than ``max_restarts`` within
``window_s`` is a crash loop, which :meth:`LocalStack.check_alive` reports with
the log tail. A restarted process keeps its command line and so its id: the
scheduler re-adopts its workers at once, a worker rejoins under its id.
``log_dir/stack.json`` names the running processes while the stack is up.
Fault tests use :meth:`LocalStack.kill`, :meth:`LocalStack.pid`,
:meth:`LocalStack.kill_nats` and :meth:`LocalStack.start_nats`.
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

from libs.models import DEFAULT_MODEL, SHIPPED, resolve_model
from libs.transfer.errors import StoreError

from . import store_up
from .nats_cluster import NatsCluster
from .natsd import NatsServer, free_port
from .preflight import fixed_ports, taken_port
from .run_dir import start_run
from .trace import SPANS_FILE, SpanReceiver


class StackError(RuntimeError):
    pass


class StackStopped(StackError):
    """The stack was asked to stop before it became healthy."""


SERVICES = ("cache_index", "tokenizer", "scheduler", "gpu_worker", "gateway")
BROKER = "nats-server"
STATE_FILE = "stack.json"


@dataclass(frozen=True)
class RestartPolicy:
    """When a supervised process that exited is started again."""

    max_restarts: int = 5  # per process within window_s; one more exit is a crash loop
    window_s: float = 60.0
    backoff_s: float = 0.25  # the first restart's delay, doubled per restart in the window
    max_backoff_s: float = 8.0

    def delay(self, recent: int) -> float:
        """The wait before a restart that follows ``recent`` restarts in the window."""
        return min(self.backoff_s * 2 ** recent, self.max_backoff_s)


@dataclass
class StackConfig:
    model: str = DEFAULT_MODEL
    workers: int = 1  # colocated: each prefills and decodes
    prefill_workers: int = 0  # --role prefill: they compute prompts for decode workers
    decode_workers: int = 0  # --role decode
    host: str = "127.0.0.1"
    port: int = 8000
    nats_url: str | None = None  # an existing broker; None: start nats-server
    nats_port: int = 0  # the port of the nats-server the stack starts (0: a free one)
    nats_host: str = "127.0.0.1"  # where that nats-server listens
    nats_cluster: int = 1  # nodes of the NATS cluster the stack starts (1: a single server)
    gateways: int = 1  # gateway processes sharing the port (SO_REUSEPORT); 0: per_cores()
    tokenizers: int = 1  # tokenizer processes (one queue group); 0: per_cores()
    schedulers: int = 0  # scheduler processes (each adopts idle workers); 0: two where there are two workers or more
    index_replicas: int = 1  # cache_index processes: active replicas, routes answered by one
    subject_prefix: str = "rm"
    log_dir: Path = Path("logs")
    dtype: str = "auto"  # the worker picks: bfloat16 on CUDA and AMX / AVX512-BF16 CPUs, else float32
    kv_slots: int = 32768
    # 0: the cores split among the workers; each step then runs on 1, half or all of a
    # worker's threads, whichever the worker measured fastest for steps of its size
    # (gpu_worker/threads.py: on 2 cores two threads win big steps, one wins 1-row decode)
    threads_per_worker: int = 0
    extra: dict[str, list[str]] = field(default_factory=dict)  # service -> extra flags
    env: dict[str, str] = field(default_factory=dict)  # for every service (secrets: not in argv)
    # keep every span in log_dir/spans.jsonl (for `radixmesh trace`), unless the
    # environment already sends them somewhere (OTEL_EXPORTER_OTLP_*ENDPOINT)
    traces: bool = False
    # services restarted when they exit (and "nats-server": the broker the stack started)
    supervise: tuple[str, ...] = (*SERVICES, BROKER, store_up.MOONCAKE)
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    stop_timeout_s: float = 15.0  # SIGTERM to SIGKILL, for all the services together


RESTART_POLL_S = 0.05
WORKER_ANNOUNCE_S = 0.5


@dataclass
class _Proc:
    name: str  # the service, gpu_worker-<i> or nats-server
    service: str
    popen: subprocess.Popen
    log: Path
    spawn: Callable[[], subprocess.Popen]  # starts it again
    cmd: list[str] = field(default_factory=list)
    restarts: int = 0
    restarted_at: float = 0.0  # monotonic time of the last restart
    recent: list[float] = field(default_factory=list)  # restart times within the window
    exit_code: int | None = None  # of the last exit the supervisor saw
    due: float | None = None  # when the pending restart runs
    failed: bool = False  # a crash loop: not restarted again


class LocalStack:
    def __init__(self, config: StackConfig, progress: Callable[[str], None] | None = None) -> None:
        self.config = config
        self.progress = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.nats: NatsServer | None = None
        self.procs: list[_Proc] = []  # the services, in start order
        self.nats_url = config.nats_url or ""
        self.spans: SpanReceiver | None = None
        self._brokers: list[_Proc] = []  # the nats-server nodes this stack started
        self._nodes: list[NatsServer] = []
        self._mooncake: _Proc | None = None  # the mooncake_master (--kv-store mooncake without a master)
        self._store_args: list[str] = []  # the workers' flags for it
        self._env: dict[str, str] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._stop_requested = False  # NOTE: a plain flag: set from signal handlers
        self._supervisor: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.config.port}"

    @property
    def stopping(self) -> bool:
        return self._stop_requested or self._stopping.is_set()

    def request_stop(self) -> None:
        """Ask a starting or running stack to stop (safe in a signal handler): no
        restart happens after it, and :meth:`start` gives up with StackStopped."""
        self._stop_requested = True

    def start(self, timeout: float = 300.0) -> LocalStack:
        cfg = self.config
        # NOTE: before anything starts: a taken port would be a crash loop much later
        if problem := taken_port(fixed_ports(cfg)):
            raise StackError(problem)
        start_run(cfg.log_dir)
        try:
            model_dir = resolve_model(cfg.model, log=self.progress)
            if not self.nats_url:
                self._start_broker()
            model_arg = cfg.model if cfg.model in SHIPPED else str(model_dir)  # NOTE: served by its name
            self._keep_spans()
            self._start_mooncake()
            self._spawn_all(model_arg)
            self._write_state()
            if cfg.supervise:
                self._supervisor = threading.Thread(target=self._supervise, daemon=True,
                                                    name="stack-supervisor")
                self._supervisor.start()
            self._wait_healthy(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_broker(self) -> None:
        cfg = self.config
        n = max(1, cfg.nats_cluster)
        if n > 1:
            ports = [cfg.nats_port + i for i in range(n)] if cfg.nats_port else None
            self._nodes = NatsCluster(n, log_dir=cfg.log_dir, jetstream_dir=cfg.log_dir / "jetstream",
                                      host=cfg.nats_host, ports=ports).start().nodes
        else:
            self._nodes = [NatsServer(port=cfg.nats_port or None, host=cfg.nats_host,
                                      log_file=cfg.log_dir / f"{BROKER}.log",
                                      jetstream_dir=cfg.log_dir / "jetstream").start()]
        self.nats = self._nodes[0]
        self.nats_url = ",".join(node.url for node in self._nodes)
        self._brokers = [_Proc(f"{BROKER}-{node.server_name}" if n > 1 else BROKER, BROKER, node.proc,
                               node.log_file, (lambda node=node: node.start().proc)) for node in self._nodes]
        self.progress(f"nats-server on {self.nats_url}" if n == 1 else
                      f"NATS cluster of {n} nodes on {self.nats_url}")

    def _start_mooncake(self) -> None:
        cfg = self.config
        if not store_up.wants_master(cfg.extra.get("gpu_worker", [])):
            return
        try:
            master = store_up.start_master(cfg.log_dir)
        except (StoreError, RuntimeError, TimeoutError) as exc:  # not installed, or it did not start
            raise StackError(f"--kv-store mooncake: {exc}") from None
        self._mooncake = _Proc(store_up.MOONCAKE, store_up.MOONCAKE, master.proc, master.log_file,
                               lambda: master.start().proc)
        self._store_args = ["--kv-store-url", master.address]
        self.progress(f"mooncake_master on {master.address}")

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
        roles = ["both"] * cfg.workers + ["prefill"] * cfg.prefill_workers + ["decode"] * cfg.decode_workers
        threads = cfg.threads_per_worker or max(1, (os.cpu_count() or 1) // max(1, len(roles)))
        for i in range(max(1, cfg.index_replicas)):
            self._spawn("cache_index", ["--instance", f"cache_index-{i}-{uuid.uuid4().hex[:6]}"],
                        log_name=_nth("cache_index", i))
        for i in range(cfg.tokenizers or per_cores()):
            self._spawn("tokenizer", ["--model", model], log_name=_nth("tokenizer", i))
        for i in range(cfg.schedulers or min(2, len(roles)) or 1):
            # NOTE: a fixed instance id: a restarted scheduler re-adopts its workers at once
            self._spawn("scheduler", ["--instance", f"scheduler-{uuid.uuid4().hex[:8]}"],
                        log_name=_nth("scheduler", i))
        for i, role in enumerate(roles):
            self._spawn("gpu_worker", [
                "--model", model, "--dtype", cfg.dtype, "--kv-slots", str(cfg.kv_slots),
                "--threads", str(threads), "--worker-id", f"{role[0]}{i}-{uuid.uuid4().hex[:6]}",
                # a restarted scheduler adopts a worker on its next announce
                "--announce-interval", str(WORKER_ANNOUNCE_S),
                *(["--role", role] if role != "both" else []), *self._store_args,
            ], log_name=f"gpu_worker-{i}")
        gateways = cfg.gateways or per_cores()
        shared = ["--reuse-port"] if gateways > 1 else []
        for i in range(gateways):
            self._spawn("gateway", ["--model", model, "--host", cfg.host, "--port", str(cfg.port), *shared],
                        log_name=_nth("gateway", i))

    def _spawn(self, service: str, args: list[str], log_name: str | None = None) -> None:
        cfg = self.config
        name = log_name or service
        log = cfg.log_dir / f"{name}.log"
        env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", **self._env,
                   **cfg.env)
        if service != "gpu_worker":
            env["OMP_NUM_THREADS"] = "1"
        cmd = [sys.executable, "-m", f"services.{service}", "--nats-url", self.nats_url,
               "--subject-prefix", cfg.subject_prefix, *args, *cfg.extra.get(service, [])]
        self.procs.append(_Proc(name, service, _popen(cmd, env, log, fresh=True), log,
                                lambda: _popen(cmd, env, log, fresh=False), cmd))

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if self.stopping:
                raise StackStopped("stopped while starting")
            self.check_alive(restarts_ok=True)
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

    def check_alive(self, restarts_ok: bool = False) -> None:
        """Raise StackError if a process is down for good: in a crash loop, or not
        supervised and exited. Unless ``restarts_ok``, any exit counts, restarted or not
        (a test's stack that must not have crashed)."""
        for proc in self._watched():
            code = proc.popen.poll()
            if proc.failed:
                window = self.config.restart.window_s
                raise StackError(f"{proc.name} exited with code {proc.exit_code} after "
                                 f"{len(proc.recent)} restarts within {window:g}s (a crash loop); "
                                 f"log tail:\n{_tail(proc.log)}")
            supervised = proc.service in self.config.supervise
            if code is not None and not supervised:
                raise StackError(f"{proc.name} exited with code {code}; log tail:\n{_tail(proc.log)}")
            if not restarts_ok and (code is not None or proc.restarts):
                raise StackError(f"{proc.name} exited (code {proc.exit_code if code is None else code}, "
                                 f"restarted {proc.restarts} times); log tail:\n{_tail(proc.log)}")

    # -- processes, for fault tests and supervision ---------------------------------

    def proc(self, name: str) -> _Proc:
        """The process named ``name`` (a service, ``gpu_worker-<i>`` or ``nats-server``)."""
        found = [p for p in self._watched() if p.name == name]
        if not found:
            raise KeyError(f"no process {name!r}; have {[p.name for p in self._watched()]}")
        return found[0]

    def pid(self, name: str) -> int:
        return self.proc(name).popen.pid

    def pids(self) -> dict[str, int]:
        """Every process of the stack by name (the services, then the broker it started)."""
        return {p.name: p.popen.pid for p in self._watched()}

    @property
    def nats_nodes(self) -> dict[str, NatsServer]:
        """The nats-server nodes this stack started, by process name."""
        return {proc.name: node for proc, node in zip(self._brokers, self._nodes)}

    def kill(self, name: str, sig: int = signal.SIGKILL) -> int:
        """Send ``sig`` (default SIGKILL) to a service; returns its pid. A supervised
        one is restarted by the supervisor."""
        pid = self.pid(name)
        os.kill(pid, sig)
        return pid

    def _watched(self) -> list[_Proc]:
        return [*self.procs, *self._brokers, *(p for p in (self._mooncake,) if p is not None)]

    def _supervise(self) -> None:
        while not self._stopping.wait(RESTART_POLL_S) and not self.stopping:
            for proc in self._watched():
                if proc.service in self.config.supervise and not proc.failed:
                    self._tend(proc)

    def _tend(self, proc: _Proc) -> None:
        """Notice an exit (schedule its restart, or give up: a crash loop), or restart."""
        now = time.monotonic()
        if proc.due is not None:
            if now >= proc.due:
                self._restart(proc)
            return
        code = proc.popen.poll()
        if code is None:
            return
        policy = self.config.restart
        proc.recent = [t for t in proc.recent if now - t < policy.window_s]
        proc.exit_code = code
        if len(proc.recent) >= policy.max_restarts:
            proc.failed = True
        else:
            proc.due = now + policy.delay(len(proc.recent))

    def _restart(self, proc: _Proc) -> None:
        with self._lock:
            if self.stopping:
                return
            now = time.monotonic()
            try:
                proc.popen = proc.spawn()
            except Exception as exc:  # noqa: BLE001 - e.g. the broker's port is taken: retry later
                proc.recent.append(now)
                proc.due = None if len(proc.recent) >= self.config.restart.max_restarts else \
                    now + self.config.restart.delay(len(proc.recent))
                proc.failed = proc.due is None
                self.progress(f"radixmesh: {proc.name} did not start again: {exc}")
                return
            proc.restarts += 1
            proc.recent.append(now)
            proc.restarted_at, proc.due = now, None
        policy = self.config.restart
        self.progress(f"radixmesh: {proc.name} {_exit_text(proc.exit_code)}; restarted as pid "
                      f"{proc.popen.pid} (restart {len(proc.recent)} of {policy.max_restarts} "
                      f"allowed per {policy.window_s:g}s)")
        self._write_state()

    def _write_state(self) -> None:
        """``log_dir/stack.json``: the launcher's pid, the URLs and every process's pid."""
        delay_ms = float(self._env.get("OTEL_BSP_SCHEDULE_DELAY") or 0)
        state = {"pid": os.getpid(), "url": self.url, "nats_url": self.nats_url,
                 "spans": self.spans is not None, "span_export_delay_s": delay_ms / 1000,
                 "processes": {p.name: p.popen.pid for p in self._watched()}}
        path = self.config.log_dir / STATE_FILE
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(state, indent=1) + "\n")
        tmp.replace(path)

    def kill_nats(self) -> None:
        """kill -9 the stack's own nats-server (services keep trying to reconnect;
        a supervised one is restarted)."""
        if self.nats is None or self.nats.proc is None:
            raise StackError("this stack does not run its own nats-server")
        self.nats.proc.kill()
        self.nats.proc.wait()

    def start_nats(self) -> None:
        """Start nats-server again on the same port (after :meth:`kill_nats`)."""
        if self.nats is None or not self._brokers:
            raise StackError("this stack does not run its own nats-server")
        with self._lock:
            if self.nats.proc is None or self.nats.proc.poll() is not None:
                self._brokers[0].popen = self.nats.start().proc

    def stop(self) -> None:
        """Stop in order: no more restarts, the gateways, then the other services (each group:
        SIGTERM, then SIGKILL after ``stop_timeout_s``), the span receiver, the broker."""
        self._stopping.set()
        with self._lock:  # NOTE: waits out a restart in progress; none starts after this
            pass
        if self._supervisor is not None:
            self._supervisor.join(timeout=5)
            self._supervisor = None
        # NOTE: the gateways first, while everything behind them still runs: their open
        # requests finish (or end with a final event) before the rest stops
        self._terminate([p for p in self.procs if p.service == "gateway"])
        self._terminate([p for p in self.procs if p.service != "gateway"])
        self.procs.clear()
        if self.spans is not None:  # NOTE: after the services, which flush spans at exit
            self.spans.stop()
            self.spans = None
        if self._mooncake is not None:  # NOTE: after the workers, which unmount their segments
            _stop(self._mooncake.popen)
            self._mooncake = None
        for node in self._nodes:
            node.stop()
        self._nodes, self._brokers, self.nats = [], [], None
        (self.config.log_dir / STATE_FILE).unlink(missing_ok=True)

    def _terminate(self, procs: list[_Proc]) -> None:
        """SIGTERM ``procs``, then SIGKILL those still running after ``stop_timeout_s``."""
        for proc in reversed(procs):
            if proc.popen.poll() is None:
                proc.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.config.stop_timeout_s
        for proc in reversed(procs):
            try:
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait()
            if proc.popen.returncode not in (0, None) and proc.due is None and not proc.failed:
                self.progress(f"radixmesh: {proc.name} {_exit_text(proc.popen.returncode)} while stopping")

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _popen(cmd: list[str], env: dict[str, str], log: Path, fresh: bool) -> subprocess.Popen:
    """Start ``cmd`` writing to ``log``: emptied first (``fresh``: this run's first
    start) or appended to after a marker line (a restart)."""
    out = open(log, "wb" if fresh else "ab")
    try:
        if not fresh:
            out.write(f"--- radixmesh: restarted at {time.strftime('%H:%M:%S')} ---\n".encode())
            out.flush()
        # NOTE: its own process group: a terminal's Ctrl-C reaches only the launcher,
        # which stops the services before the broker
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                cwd=Path(__file__).resolve().parent.parent, process_group=0)
    finally:
        out.close()


def _stop(popen: subprocess.Popen) -> None:
    if popen.poll() is None:
        popen.terminate()
        try:
            popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()


def _tail(log: Path | None, chars: int = 3000) -> str:
    if log is None or not log.exists():
        return ""
    with open(log, "rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - chars))
        return f.read().decode(errors="replace")


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            pass
    return f"exited with code {code}"


def _json(data: bytes) -> dict:
    try:
        value = json.loads(data or b"{}")
        return value if isinstance(value, dict) else {}
    except ValueError:
        return {}


CORES_PER_FRONT_PROCESS = 8


def per_cores(cores: int | None = None) -> int:
    """Gateways (or tokenizers) for a machine of ``cores`` cores: one per 8, 1 to 8.

    NOTE: each costs CPU per streamed token (docs/benchmarks.md, the mesh) that a worker on
    the same cores loses, and one serves far more tokens per second than a small machine's
    workers produce; where cores abound the work splits evenly over several (the kernel
    spreads connections, the queue group encodes)."""
    cores = cores or os.cpu_count() or 1
    return max(1, min(8, cores // CORES_PER_FRONT_PROCESS))


def _nth(service: str, i: int) -> str:
    """The log and process name of a service's i-th process: the first keeps the plain name."""
    return service if i == 0 else f"{service}-{i}"


def ephemeral_stack_config(log_dir: Path, **overrides) -> StackConfig:
    """A stack on free ports and a private subject prefix (for tests and benchmarks)."""
    base = dict(port=free_port(), subject_prefix="t" + uuid.uuid4().hex[:8], log_dir=log_dir,
                kv_slots=16384)
    base.update(overrides)
    return StackConfig(**base)
