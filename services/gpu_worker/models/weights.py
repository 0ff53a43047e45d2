"""Load an HF checkpoint's safetensors into fused per-layer tensors."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open

from libs.kernels import gemm

from .. import memory
from .config import ModelConfig
from .features import UnsupportedModel
from .precision import cpu_flags


@dataclass
class LayerWeights:
    input_norm: torch.Tensor  # [hidden]
    qkv: torch.Tensor  # [(heads + 2 * kv_heads) * head_dim, hidden]
    qkv_bias: torch.Tensor | None
    o_proj: torch.Tensor  # [hidden, heads * head_dim]
    o_bias: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up: torch.Tensor | None = None  # [2 * inter, hidden]: gate rows first (None: a sparse layer's)
    gate_up_bias: torch.Tensor | None = None
    down: torch.Tensor | None = None  # [hidden, inter]
    down_bias: torch.Tensor | None = None
    experts: object | None = None  # a sparse layer's router and experts (moe_layer.Experts), in the dense MLP's place
    q_norm: torch.Tensor | None = None  # [head_dim]: per-head RMSNorm of q before RoPE (Qwen3)
    k_norm: torch.Tensor | None = None
    norms: dict[str, torch.Tensor] = field(default_factory=dict)  # a family's other norms, by name (gemma3.py)


@dataclass
class ModelWeights:
    embed: torch.Tensor  # [vocab, hidden]
    layers: list[LayerWeights]
    final_norm: torch.Tensor
    lm_head: torch.Tensor  # [vocab, hidden]; the embedding itself when tied


class _Reader:
    """Tensors by name across every *.safetensors file of a directory."""

    def __init__(self, path: Path, dtype: torch.dtype, device, ignore: tuple[str, ...] = ()) -> None:
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"{path}: no *.safetensors files")
        self._where: dict[str, Path] = {}
        self.read: set[str] = set()  # NOTE: every name asked for, found or not: the rest is unused
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                self._where.update({name: file for name in f.keys()})
        self._dtype, self._device = dtype, device
        self._ignore = ignore  # NOTE: name prefixes of parts not served (a multimodal wrapper's vision tower)

    def has(self, name: str) -> bool:
        self.read.add(name)
        return name in self._where

    def get(self, name: str) -> torch.Tensor:
        self.read.add(name)
        if name not in self._where:
            raise KeyError(f"checkpoint has no tensor {name}")
        with safe_open(str(self._where[name]), framework="pt") as f:
            return f.get_tensor(name).to(device=self._device, dtype=self._dtype)

    def maybe(self, name: str) -> torch.Tensor | None:
        return self.get(name) if self.has(name) else None

    def unused(self) -> list[str]:
        """Tensors nobody asked for, but for rotary tables older checkpoints saved (recomputed here)."""
        return sorted(n for n in self._where if n not in self.read and not n.endswith("rotary_emb.inv_freq")
                      and not n.startswith(self._ignore))


# the checkpoint's names of each fused tensor's parts, in their order (HF Llama's split ones, or
# Phi-3's already fused qkv_proj / gate_up_proj: q, k, v rows and gate, up rows likewise)
SPLIT_NAMES = {"qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
               "gate_up": ("mlp.gate_proj", "mlp.up_proj")}
FUSED_NAMES = {"qkv": ("self_attn.qkv_proj",), "gate_up": ("mlp.gate_up_proj",)}


# where a causal LM's tensors are: (the text model's prefix, the LM head's name)
CAUSAL_LM = (("model.", "lm_head.weight"),)


def load_weights(path: Path, cfg: ModelConfig, dtype: torch.dtype, device="cpu", qk_norm: bool = False,
                 names: dict[str, tuple[str, ...]] = SPLIT_NAMES, experts=None, layouts=CAUSAL_LM,
                 layer_norms: tuple[str, ...] = (), ignore: tuple[str, ...] = ()) -> ModelWeights:
    """The checkpoint's tensors, fused per layer; ``qk_norm``: the layers' per-head q/k norms too;
    ``names``: the checkpoint's parts of each fused tensor (SPLIT_NAMES or FUSED_NAMES);
    ``experts(reader, layer)``: a layer's mixture-of-experts weights, None where it is dense (moe.py);
    ``layer_norms``: a layer's other norms (``LayerWeights.norms``); ``layouts``: where the text
    model may sit, the first whose embedding the checkpoint holds; ``ignore``: name prefixes of
    parts not served. Raises UnsupportedModel for tensors left unread: weights of a layer this
    model lacks (a Qwen3 checkpoint relabelled Qwen2 would otherwise answer wrongly)."""
    r = _Reader(path, dtype, device, ignore)
    prefix, head_name = next((p, h) for p, h in layouts if r.has(p + "embed_tokens.weight") or (p, h) == layouts[-1])
    embed = r.get(prefix + "embed_tokens.weight")
    layers = [_load_layer(r, f"{prefix}layers.{i}.", qk_norm, names, experts and experts(r, i), layer_norms)
              for i in range(cfg.num_layers)]
    head = r.has(head_name)  # NOTE: read even when tied (HF ignores a tied model's copy)
    tied = cfg.tie_word_embeddings or not head
    lm_head = embed if tied else r.get(head_name)
    weights = ModelWeights(embed, layers, r.get(prefix + "norm.weight"), lm_head)
    if unused := r.unused():
        listed = ", ".join(unused[:4]) + (f", ... ({len(unused)} in all)" if len(unused) > 4 else "")
        raise UnsupportedModel(f"{path}: the checkpoint holds tensors the {cfg.architecture} model does not use, "
                               f"refused rather than served wrong (another architecture's weights?): {listed}")
    return weights


def _load_layer(r: _Reader, p: str, qk_norm: bool, names: dict[str, tuple[str, ...]], experts=None,
                norms: tuple[str, ...] = ()) -> LayerWeights:
    attn = p + "self_attn."
    qkv = [p + n for n in names["qkv"]]
    return LayerWeights(
        input_norm=r.get(p + "input_layernorm.weight"),
        qkv=_cat(r, [n + ".weight" for n in qkv]),
        qkv_bias=_cat(r, [n + ".bias" for n in qkv]),
        o_proj=r.get(attn + "o_proj.weight"),
        o_bias=r.maybe(attn + "o_proj.bias"),
        post_norm=r.get(p + "post_attention_layernorm.weight"),
        q_norm=r.get(attn + "q_norm.weight") if qk_norm else None,
        k_norm=r.get(attn + "k_norm.weight") if qk_norm else None,
        **(_dense_mlp(r, p, names["gate_up"]) if experts is None else {"experts": experts}),
        norms={name: r.get(p + name + ".weight") for name in norms},
    )


def _dense_mlp(r: _Reader, p: str, parts: tuple[str, ...]) -> dict:
    gate_up = [p + n for n in parts]
    return dict(gate_up=_cat(r, [n + ".weight" for n in gate_up]),
                gate_up_bias=_cat(r, [n + ".bias" for n in gate_up]),
                down=r.get(p + "mlp.down_proj.weight"), down_bias=r.maybe(p + "mlp.down_proj.bias"))


def _cat(r: _Reader, names: list[str]) -> torch.Tensor | None:
    """Concatenate along the output dim; None when the first (a bias) is absent."""
    if not r.has(names[0]):
        return None
    if len(names) == 1:  # NOTE: fused in the checkpoint already: no copy
        return r.get(names[0]).contiguous()
    return torch.cat([r.get(name) for name in names], dim=0).contiguous()


# -- packed weights: linears on a layout made for the kernel that runs them ----------------
#
# torch's plain bf16 F.linear on the CPU re-lays the weight out for oneDNN on every call, and
# its plain fp32 one goes to MKL, whose small-batch sgemm streams a weight at a third of the
# memory rate oneDNN's blocked one does (AVX2 EPYC: batch-8 LM head 20-26 ms vs 6.3).
# Two packed forms, chosen once per model (``linear_kernel``):
#   onednn: oneDNN's blocked layout, bf16 or fp32 (where it has AMX, its large-batch bf16
#           matmuls win);
#   tiles:  libs.kernels.gemm, bf16 weights: under bf16 on AVX512-BF16's dot instruction
#           (CPUs without AMX): batch-1 decode at about the cores' memory bandwidth, 1.6-1.9x
#           oneDNN's gemv there, and level with it at prefill sizes; under fp32 on AVX2 (dtype
#           auto's pick there), widened in registers: half the bytes of an fp32 weight read.
#   tiles+onednn: fp32 on AVX2 (auto's pick there where the memory allows): both forms of
#           the same bf16-rounded weights, the tiles for steps of fewer than HYBRID_ROWS rows
#           (decode batches, where reading half the bytes wins), oneDNN's fp32 matmul from
#           there on (prefill chunks, bound by the FMAs: level with the tiles at 96-256 rows,
#           1.07x ahead at 1,024 on 2 Zen 3 cores); the fp32 copy costs 4 bytes a
#           weight more, so auto takes it only while that is under a quarter of the free memory.

LINEARS = ("qkv", "o_proj", "gate_up", "down")
LINEAR_KERNELS = ("auto", "onednn", "tiles", "tiles+onednn")
HYBRID = "tiles+onednn"
FIXED = "tiles-fixed"  # only under --deterministic, on CPUs without AVX512-BF16 (_invariant_kernel)
TRITON_FIXED = "triton-fixed"  # only under --deterministic, on CUDA (libs.kernels.triton_matmul)
# rows from which tiles+onednn runs oneDNN: measured in-model on 2 Zen 3 cores (fp32, 300-token
# contexts) since the tiles are 16 columns wide (one stream per kernel call), tiles ahead at
# batch 16 (1.25x), 32 (1.10x), 48 (1.19x), 64 (1.08-1.12x), level at 96 and on 256-token
# prefill chunks, oneDNN ahead on 1,024-token ones (1.07x)
HYBRID_ROWS = 96


@dataclass(frozen=True)
class PackedWeight:
    packed: torch.Tensor  # opaque oneDNN tensor
    shape: tuple[int, int]  # [out, in] of the plain weight


@dataclass(frozen=True)
class FixedWeight:
    """Tiles run by ``gemm.linear_fixed`` (``tiles-fixed``: a deterministic mode without AVX512-BF16)."""

    tiles: gemm.TiledWeight

    @property
    def shape(self) -> tuple[int, int]:
        return self.tiles.shape


@dataclass(frozen=True)
class InvariantWeight:
    """A plain weight run by ``triton_matmul.linear`` (``triton-fixed``: the deterministic mode on CUDA)."""

    weight: torch.Tensor  # [out, in], contiguous

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.weight.shape)


@dataclass(frozen=True)
class HybridWeight:
    """One weight in two forms (``tiles+onednn``): the tiles below ``HYBRID_ROWS`` rows, oneDNN's from there."""

    tiles: gemm.TiledWeight
    dense: PackedWeight

    @property
    def shape(self) -> tuple[int, int]:
        return self.tiles.shape


def can_pack(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether oneDNN takes packed weights of ``dtype`` here (fp32 on any CPU it runs on; bf16
    where it computes bf16)."""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    return dtype == torch.float32 or (dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def linear_kernel(name: str, dtype: torch.dtype, device: torch.device, flags: frozenset[str] | None = None,
                  bf16_weights: bool = False, fp32_copy_fits: bool = True, deterministic: bool = False) -> str:
    """The packed form the linear weights take here: ``onednn``, ``tiles`` or ``tiles+onednn``
    (``auto``: tiles for bf16 on CPUs with AVX512-BF16 and no AMX; for fp32 with
    ``bf16_weights`` (dtype auto on AVX2), where the kernels are built, tiles+onednn, or tiles
    alone where the fp32 copy would not fit (``fp32_copy_fits``); oneDNN's blocked layout
    otherwise); ``plain`` where neither packs. Tiles under fp32 round the weights to bf16 (and
    tiles+onednn's oneDNN copy with them): outputs are no longer fp32's. Raises ValueError for
    an unknown name or a kernel this machine lacks."""
    if name not in LINEAR_KERNELS:
        raise ValueError(f"linear kernel {name!r} not one of {', '.join(LINEAR_KERNELS)}")
    if deterministic:
        return _invariant_kernel(name, dtype, device, bf16_weights)
    if name == HYBRID and dtype != torch.float32:
        raise ValueError("linear kernel 'tiles+onednn' runs fp32 activations (dtype float32 or auto on AVX2)")
    if not can_pack(dtype, device):
        return "plain"
    if name == "auto":
        flags = cpu_flags() if flags is None else flags
        native = "avx512_bf16" in flags and "amx_bf16" not in flags
        if dtype == torch.bfloat16 and native and gemm.available():
            return "tiles"
        if dtype == torch.float32 and bf16_weights and gemm.f32_available():
            return HYBRID if fp32_copy_fits else "tiles"
        return "onednn"
    if name == "tiles" and dtype == torch.bfloat16 and not gemm.available():
        raise ValueError("linear kernel 'tiles' runs bf16 activations on CPUs with AVX512-BF16, where the C++ kernels build")
    if name in ("tiles", HYBRID) and dtype == torch.float32 and not gemm.f32_available():
        raise ValueError(f"linear kernel {name!r} runs fp32 activations on CPUs with AVX2 and FMA, where the C++ kernels build")
    return name


def _invariant_kernel(name: str, dtype: torch.dtype, device: torch.device, bf16_weights: bool) -> str:
    """The linears' form under a deterministic mode: one whose every output row is the same bits
    whatever the step's row count. NOTE: the bf16 tiles are (gemm_bf16.cpp: each row's K
    reduction is one chain of dot instructions in k order, whichever micro-kernel height runs
    it); oneDNN is not (its kernels, and their K blocking, change with M: a bf16 row computed
    alone and in a 500-row chunk differ in the last bit), nor is the AVX2 fp32 kernel as it
    runs (two accumulator chains up to two rows, one above): ``tiles-fixed`` pads its batches.
    On CUDA, ``triton-fixed``: one Triton tile configuration whatever M (cuBLAS picks its kernel
    and split-K by M), in any float dtype (fp32 on a GPU is no more invariant than bf16)."""
    if device.type == "cuda":
        if name != "auto":
            raise ValueError(f"--deterministic on CUDA runs the linears on the invariant Triton matmul: "
                             f"linear kernel {name!r} is a CPU kernel")
        return TRITON_FIXED
    if name not in ("auto", "tiles"):
        raise ValueError(f"--deterministic runs the linears on the tiles: linear kernel {name!r} "
                         "is not batch-invariant")
    if device.type == "cpu" and dtype == torch.bfloat16 and gemm.available():
        return "tiles"
    if device.type == "cpu" and (dtype == torch.bfloat16 or bf16_weights) and gemm.f32_available():
        return FIXED  # NOTE: AVX2: the fp32 kernel, its batches padded (gemm.linear_fixed)
    if device.type != "cpu":
        raise ValueError(f"--deterministic runs on a CPU or CUDA, not {device.type}")
    if dtype != torch.bfloat16 and not bf16_weights:
        raise ValueError(f"--deterministic on a CPU runs bf16 linear weights (--dtype bfloat16, or auto on AVX2): "
                         f"the CPU kernels have no batch-invariant form for {dtype} weights")
    raise ValueError("--deterministic on a CPU runs the C++ linear kernels (AVX2 and FMA at least), "
                     "which this CPU lacks or which did not build")


def pack(w: torch.Tensor, kernel: str = "onednn") -> PackedWeight | gemm.TiledWeight | HybridWeight:
    """``w`` in ``kernel``'s form; the tiles take column pairs, so an odd-width weight goes to oneDNN."""
    if kernel == FIXED:
        return FixedWeight(gemm.pack(w, gemm.F32_TILE))  # NOTE: every weight: no oneDNN fallback here
    if kernel == TRITON_FIXED:
        return InvariantWeight(w.contiguous())
    if kernel in ("tiles", HYBRID) and w.shape[1] % 2 == 0:
        tiles = gemm.pack(w, gemm.tile_for(w.dtype))
        if kernel == "tiles":
            return tiles
        return HybridWeight(tiles, _onednn(w.to(torch.bfloat16).to(w.dtype)))  # NOTE: the tiles' values
    return _onednn(w)


def _onednn(w: torch.Tensor) -> PackedWeight:
    return PackedWeight(torch.ops.mkldnn._reorder_linear_weight(w.contiguous()), tuple(w.shape))


def fp32_copy_fits(w: ModelWeights, share: float = 0.25, available: int | None = None) -> bool:
    """Whether an fp32 copy of the linear weights (tiles+onednn's second form) takes under
    ``share`` of the memory still free (``available``, default: memory.available_bytes: the
    kernel's figure capped by a container's limit; True where nothing says)."""
    free = memory.available_bytes() if available is None else available
    if free is None:
        return True
    weights = [t for layer in w.layers for name in LINEARS if (t := getattr(layer, name)) is not None] + [w.lm_head]
    experts = [e for layer in w.layers if (e := getattr(layer, "experts", None)) is not None]  # moe.py
    weights += [t for e in experts for t in (e.gate_up, e.down)]
    return sum(math.prod(t.shape) for t in weights) * 4 <= share * free  # NOTE: plain or packed alike


def pack_weights(w: ModelWeights, kernel: str = "onednn") -> None:
    """Replace every linear weight by its packed form (the LM head gets its own copy:
    the embedding it is tied to stays plain for the lookup)."""
    for layer in w.layers:
        for name in LINEARS:
            if getattr(layer, name) is not None:  # NOTE: a sparse layer's experts pack themselves (moe.py)
                setattr(layer, name, pack(getattr(layer, name), kernel))
    w.lm_head = pack(w.lm_head, kernel)


def linear(x: torch.Tensor, w: torch.Tensor | PackedWeight | gemm.TiledWeight | HybridWeight | FixedWeight
           | InvariantWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` over a plain or a packed weight."""
    if isinstance(w, InvariantWeight):
        from libs.kernels import triton_matmul  # NOTE: lazily: CPU workers never import Triton

        return triton_matmul.linear(x, w.weight, bias)
    if isinstance(w, HybridWeight):
        w = w.dense if x.shape[0] >= HYBRID_ROWS else w.tiles
    if isinstance(w, FixedWeight):
        return gemm.linear_fixed(x, w.tiles, bias)
    if isinstance(w, gemm.TiledWeight):
        return gemm.linear(x, w, bias)
    if isinstance(w, PackedWeight):
        return torch.ops.mkldnn._linear_pointwise(x, w.packed, bias, "none", [], "")
    return F.linear(x, w, bias)
