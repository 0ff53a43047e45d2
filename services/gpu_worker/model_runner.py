"""Execute one ForwardBatch: fill the slot table, run the model, sample. No bus."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from libs.grammar.token_texts import token_texts
from libs.kernels import AttentionMetadata, BackendNotAvailable, KVPool, default_backend, get_backend
from libs.protocol.errors import invalid_request
from libs.protocol.messages import ForwardBatch

from .batch import Limits, LogprobPlan, StepArrays, parse_batch, parse_logprobs
from .kv.copy import KVCopier
from .models.compiled import DEFAULT_SIZES, CompiledStep
from .models.features import UnsupportedModel
from .models.registry import load_model
from .models.precision import DTYPES, resolve_dtype, resolve_kv_dtype
from .sampling.constraints import Constraints
from .sampling.penalties import Penalties
from .sampling.sampler import Sampler, token_logprobs
from .threads import ThreadChooser


@dataclass(frozen=True)
class RunnerConfig:
    model: str  # a local HF directory, already resolved (libs.models.resolve_model at the entry point)
    dtype: str = "auto"  # auto: bfloat16 on CUDA and on CPUs with AMX / AVX512-BF16, else float32
    kv_dtype: str = "auto"  # the KV pool's: auto = bf16 under fp32 over bf16 weights, else dtype (precision.py)
    kv_slots: int = 32768
    max_requests: int = 256
    attention_backend: str = "auto"  # auto: torch on CPU; flashinfer, else triton, on CUDA
    device: str = "cpu"
    max_model_len: int | None = None  # None: the model's max_position_embeddings (capped by kv_slots)
    host_kv_slots: int = 0  # slots of the host KV pool for d2h/h2d copies (0: none)
    compile: bool = False  # the model's pieces between attention calls compiled (compiled.py)
    compile_sizes: tuple[int, ...] = DEFAULT_SIZES  # token-count buckets of the compiled step
    compile_ops: str = "torch"  # the compiled pieces' elementwise ops: torch (inductor's) or cpp (compiled.py)
    pack_weights: bool = True  # bf16 linears on a packed layout (weights.py)
    linear_kernel: str = "auto"  # which: auto, onednn or tiles (weights.linear_kernel)
    # CPU: the most compute threads a step runs on (0: torch's setting, untouched); with
    # adaptive_threads each step runs on 1, half or all of them, whichever was fastest lately
    # for steps of its size (threads.py)
    threads: int = 0
    adaptive_threads: bool = True
    # batch-invariant kernels: a token's logits the same bits whatever step computes it (a
    # prefill chunk or a decode step, any batch, a cached prefix or not): greedy output then
    # survives migration, retraction, PD and cache hits in bf16 too (docs/cpu-kernels.md)
    deterministic: bool = False


@dataclass
class StepOutput:
    """What one step produced: next tokens, and the logprobs the batch asked for
    (``top_ids`` / ``top_logprobs`` flattened [positions, top_k])."""

    next_token_ids: list[int]
    logprobs: list[float] = field(default_factory=list)
    top_ids: list[int] = field(default_factory=list)
    top_logprobs: list[float] = field(default_factory=list)
    top_k: int = 0


class ModelRunner:
    """Owns weights, the KV pool, the row -> slot table and per-row sampling state.

    ``execute(batch)`` is the only entry point; it is synchronous (the service
    runs it in a thread) and not re-entrant.
    """

    def __init__(self, config: RunnerConfig) -> None:
        self.device = torch.device(config.device)
        # NOTE: the config keeps the dtype actually used (announced in WorkerInfo)
        self.dtype_choice = resolve_dtype(config.dtype, self.device)
        self.kv_choice = resolve_kv_dtype(config.kv_dtype, self.dtype_choice)
        self.config = config = replace(config, dtype=self.dtype_choice.name, kv_dtype=self.kv_choice.name)
        self.path = Path(config.model)
        # NOTE: no sequence outgrows the KV pool: a 131k-context model on a small pool gets a
        # slot table (and rope tables) sized by the pool, not by max_position_embeddings
        cap = min(config.max_model_len or config.kv_slots, config.kv_slots)
        if config.deterministic and config.compile:
            raise ValueError("--deterministic runs eager steps: a compiled step's matmuls (inductor's) "
                             "change with its size")
        self.model = load_model(self.path, dtype=DTYPES[config.dtype], device=self.device,
                                pack=config.pack_weights and not config.compile, kernel=config.linear_kernel,
                                bf16_weights=self.dtype_choice.bf16_weights, max_positions=cap,
                                deterministic=config.deterministic)
        mc = self.model.config
        self.max_model_len = min(cap, mc.max_position_embeddings)
        kv_dtype = DTYPES[config.kv_dtype]
        self.kv = KVPool(mc.num_layers, config.kv_slots, mc.num_kv_heads, mc.head_dim, kv_dtype, self.device)
        self.kv_copies = KVCopier(self.kv, config.host_kv_slots)  # host pool, staging buffers
        backend = config.attention_backend
        if backend == "auto":  # NOTE: --deterministic on CUDA: triton, flashinfer has no such mode
            deterministic_gpu = config.deterministic and self.device.type == "cuda"
            backend = "triton" if deterministic_gpu else default_backend(self.device, kv_dtype)
        # NOTE: a family's own softmax scale (Gemma 3's query_pre_attn_scalar), else 1/sqrt(head_dim)
        self.attn = get_backend(backend, self.kv, scale=getattr(self.model, "attention_scale", None),
                                dtype=DTYPES[config.dtype])
        self.attn.set_deterministic(config.deterministic)
        self._set_windows(mc.sliding_windows)
        self.compiled = CompiledStep(self.model, self.attn, config.compile_sizes, config.compile_ops) if config.compile else None
        # NOTE: row r's slots for positions [0, seq_len) sit in table[r, :seq_len]
        self.table = torch.zeros(config.max_requests, self.max_model_len, dtype=torch.int64, device=self.device)
        self.sampler = Sampler(config.max_requests, mc.vocab_size, self.device)
        self.constraints = Constraints(config.max_requests, mc.vocab_size, self._token_texts, self.device)
        self.penalties = Penalties(config.max_requests, mc.vocab_size, self.eos_token_ids, self.device)
        # NOTE: each row's last sampled token and its step: a step sent before the
        # previous one's result reads its input from here (input id -1)
        self.last_tokens = torch.zeros(config.max_requests, dtype=torch.int64, device=self.device)
        self.sampled_step = np.full(config.max_requests, -2, dtype=np.int64)
        self.limits = Limits(config.max_requests, self.max_model_len, config.kv_slots, mc.vocab_size)
        self.thread_chooser = (ThreadChooser(config.threads) if config.adaptive_threads and config.threads > 1
                               and self.device.type == "cpu" else None)

    def _set_windows(self, windows: tuple[int | None, ...]) -> None:
        """The layers' sliding windows, those that bind within max_model_len, on the backend;
        UnsupportedModel where the backend has none (served wrong otherwise past the window)."""
        windows = tuple(w if w and w < self.max_model_len else None for w in windows)
        try:
            self.attn.set_windows(windows)
        except BackendNotAvailable as e:
            w = min(filter(None, windows))
            raise UnsupportedModel(f"{self.path}: sliding_window={w} binds (max_model_len {self.max_model_len}) and "
                                   f"{e}: serve it with --attention-backend torch, or --max-model-len {w}") from e

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    @property
    def eos_token_ids(self) -> list[int]:
        return list(self.model.config.eos_token_ids)

    @torch.inference_mode()
    def execute(self, batch: ForwardBatch) -> list[int]:
        """Next token id of every request, in batch order.

        Raises ServiceError(invalid_request_error, 400) for an inconsistent batch,
        before touching any state.
        """
        return self.run(batch).next_token_ids

    @torch.inference_mode()
    def run(self, batch: ForwardBatch) -> StepOutput:
        """Like :meth:`execute`, plus the logprobs ``batch`` asks for (one
        log_softmax over all wanted positions of the step, no per-token work)."""
        if batch.copies and not batch.rows:  # a copy-only step: no forward, no tokens
            self.kv_copies.run(batch.copies)
            return StepOutput([])
        step = parse_batch(batch, self.limits)
        plan = parse_logprobs(batch, step, self.vocab_size)
        extra = plan.index if plan is not None else None
        tokens = len(step.token_rows)
        threads = self._set_threads(tokens)
        start = time.perf_counter()
        step, logits = self._forward(batch, step, extra)
        b = len(step.rows)
        next_ids = self._sample(logits[:b], step)
        if threads:
            self.thread_chooser.record(tokens, threads, time.perf_counter() - start)
        self.last_tokens[self._h2d(step.rows)] = next_ids
        self.sampled_step[step.rows] = batch.step
        if plan is None or not len(plan):
            return StepOutput(next_ids.tolist())
        return self._logprobs(plan, logits[b:], next_ids)

    def _set_threads(self, tokens: int) -> int:
        """The compute threads for a step of ``tokens`` tokens (threads.py), set for the
        calling thread (OpenMP's count is per thread); 0 without a chooser."""
        if self.thread_chooser is None:
            return 0
        threads = self.thread_chooser.choose(tokens)
        torch.set_num_threads(threads)  # NOTE: ~0.2 us; sets the calling thread's OpenMP count
        return threads

    def _sample(self, logits: torch.Tensor, step: StepArrays) -> torch.Tensor:
        """Next tokens; rows with a regex choose only among the tokens it allows,
        after their penalties, logit_bias and min_tokens (:mod:`.penalties`).
        NOTE: logprobs stay the model's own (computed from unedited logits)."""
        self.penalties.apply(logits, step.rows, step.seq_lens)
        which = self.constraints.constrained(step.rows)
        if len(which):
            self.constraints.mask(logits, step.rows, which)
        next_ids = self.sampler.sample(logits, step.rows, self._h2d(step.seq_lens))
        if len(which):
            self.constraints.advance(step.rows, which, step.seq_lens, next_ids)
        self.penalties.update(step.rows, step.seq_lens, next_ids)
        return next_ids

    def _token_texts(self) -> list[str | None]:
        from transformers import AutoTokenizer

        return token_texts(AutoTokenizer.from_pretrained(self.path), self.vocab_size)

    def _logprobs(self, plan: LogprobPlan, logits: torch.Tensor, next_ids: torch.Tensor) -> StepOutput:
        target = self._h2d(plan.target)
        owner = self._h2d(plan.owner)
        target = torch.where(target < 0, next_ids[owner], target)
        lp, top_ids, top_lp = token_logprobs(logits, target, plan.top_k)
        return StepOutput(next_ids.tolist(), lp.tolist(), top_ids.reshape(-1).tolist(),
                          top_lp.reshape(-1).tolist(), plan.top_k)

    @torch.inference_mode()
    def logits(self, batch: ForwardBatch, at: np.ndarray | None = None) -> torch.Tensor:
        """Run ``batch`` like :meth:`execute` but return the last tokens' logits [B, vocab] (float32),
        then those of the tokens at ``at`` (flat token indices of the step), without sampling."""
        return self._forward(batch, parse_batch(batch, self.limits), at)[1]

    def _forward(self, batch: ForwardBatch, step: StepArrays,
                 extra: np.ndarray | None = None) -> tuple[StepArrays, torch.Tensor]:
        """Logits of each request's last token [B, vocab], then of the tokens at
        ``extra`` (flat token indices), in one LM-head pass."""
        ids = self._input_ids(batch, step)
        self.kv_copies.run(batch.copies)  # NOTE: checked, then run, before any state changes
        self.sampler.set_rows(batch.new_rows)
        self.constraints.set_rows(batch.new_rows)
        self.penalties.set_rows(batch.new_rows)
        self.sampled_step[[r.row for r in batch.new_rows]] = -2
        if len(step.shared_slots):
            self._fill_table(step.shared_rows, step.shared_positions, self._h2d(step.shared_slots))
        slots = self._h2d(step.out_slots)
        self._fill_table(step.token_rows, step.positions, slots)
        meta = AttentionMetadata(
            rows=self._h2d(step.rows),
            prefix_lens=step.prefix_lens,
            extend_lens=step.extend_lens,
            out_slots=slots,
            slot_table=self.table,
        )
        positions = self._h2d(step.positions)
        last = self._h2d(_gather_index(step.last_index, extra))
        if self.compiled is not None:
            return step, self.compiled.forward(ids, positions, last, meta)
        self.attn.prepare(meta)
        return step, self.model.forward(ids, positions, last, self.attn)

    def _input_ids(self, batch: ForwardBatch, step: StepArrays) -> torch.Tensor:
        """The step's token ids on the device, -1s replaced by the rows' last
        sampled tokens; raises 400 unless each such row sampled in the step just
        before (steps sent ahead must arrive in order)."""
        ids = self._h2d(step.input_ids)
        if not len(step.future):
            return ids
        rows = step.token_rows[step.future]
        if not (self.sampled_step[rows] == batch.step - 1).all():
            raise invalid_request(f"step {batch.step}: input id -1 on a row that did not "
                                  f"sample in step {batch.step - 1}")
        index = self._h2d(step.future)
        ids[index] = self.last_tokens[self._h2d(rows)]
        return ids

    def _h2d(self, array: np.ndarray) -> torch.Tensor:
        return to_device(array, self.device)

    def _fill_table(self, rows: np.ndarray, positions: np.ndarray, slots: torch.Tensor) -> None:
        self.table[self._h2d(rows), self._h2d(positions)] = slots


def to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A step's host array on ``device``: as is on the CPU; on CUDA through pinned memory,
    copied without blocking (in stream order with the step's kernels; torch's caching host
    allocator keeps the pinned buffer until the copy is done)."""
    tensor = torch.from_numpy(array)
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def _gather_index(last: np.ndarray, extra: np.ndarray | None) -> np.ndarray:
    return last if extra is None or not len(extra) else np.concatenate([last, extra])
