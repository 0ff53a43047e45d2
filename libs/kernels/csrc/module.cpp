// The Python module: every CPU attention kernel of this folder; the elementwise ones also
// as torch custom ops (torch.ops.radixmesh.*), which torch.compile'd graphs can call
// (their fake kernels: libs/kernels/cpu_library.py).
#include <torch/extension.h>
#include <torch/library.h>

#include "kernels.h"

// NOTE: the kernels run without the GIL (as torch's own ops do): the worker's event loop
// thread takes in the next step and sends results while a step computes
static const auto kNoGil = pybind11::call_guard<pybind11::gil_scoped_release>();

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode_v1", &paged_decode_v1, "v1 decode attention from the paged KV pool (fp32 output)", kNoGil);
  m.def("paged_decode", &paged_decode_into, "decode attention from the paged KV pool, into out", kNoGil);
  m.def("paged_extend", &paged_extend_into, "causal extend attention over a cached prefix from the pool, into out", kNoGil);
  m.def("rmsnorm", &rmsnorm, "RMSNorm of fp32/bf16/fp16 rows, in fp32", kNoGil);
  m.def("add_rmsnorm_", &add_rmsnorm_, "x += h, then h = RMSNorm(x), in place, in fp32", kNoGil);
  m.def("silu_mul", &silu_mul, "silu(gate) * up of fp32/bf16/fp16 rows, in fp32", kNoGil);
  m.def("store_kv_", &store_kv_, "a step's new K and V rows into one layer's pools at their slots", kNoGil);
  m.def("rope_qk_", &rope_qk_, "rotary embedding of the q and k heads of fused QKV rows, in place", kNoGil);
  m.def("linear_bf16", &linear_bf16, "x @ w.T (+ bias) in bf16 over a weight packed by libs.kernels.gemm", kNoGil);
  m.def("linear_bf16w", &linear_bf16w, "x @ w.T (+ bias) in fp32 over a bf16 weight packed by libs.kernels.gemm", kNoGil);
  pybind11::class_<DecodeLayers>(m, "DecodeLayers", "a decode step's decoder layers in one call (layer_loop.cpp)")
      .def(pybind11::init<const std::vector<at::Tensor>&, const std::vector<c10::optional<at::Tensor>>&,
                          const std::vector<int64_t>&, const std::vector<at::Tensor>&, const std::vector<at::Tensor>&,
                          int64_t, int64_t, int64_t, double>())
      .def("run", &DecodeLayers::run, "the residual stream after the last layer (x updated in place)", kNoGil);
  m.def("parallel_team", &parallel_team, "threads an at::parallel_for over n items ran on");
  m.def("gemm_bf16", &gemm_bf16_available, "whether linear_bf16 is built (AVX512-BF16)");
  m.def("gemm_f32", &gemm_f32_available, "whether linear_bf16w is built (AVX2 + FMA)");
  m.def("amx_bf16", &amx_bf16_available, "whether bf16 products run on oneDNN's brgemm (AMX)");
  m.def("bf16_extend", &bf16_extend_available, "whether bf16 extend products run natively (AMX or AVX512-BF16)");
  m.def("fp32_extend", &fp32_extend_available, "whether fp32 extend products run register-blocked (AVX2, extend_avx2.h)");
}

// NOTE: the schemas mark what each op writes (Tensor(a!)): functionalization then knows
// add_rmsnorm_ overwrites x and h and rope_qk_ qkv, and inductor can run them in place
TORCH_LIBRARY(radixmesh, m) {
  m.def("rmsnorm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("add_rmsnorm_(Tensor(a!) x, Tensor(b!) h, Tensor weight, float eps) -> ()");
  m.def("silu_mul(Tensor gate_up) -> Tensor");
  m.def("rope_qk_(Tensor(a!) qkv, Tensor positions, Tensor cos, Tensor sin, int heads, int head_dim) -> ()");
}

TORCH_LIBRARY_IMPL(radixmesh, CPU, m) {
  m.impl("rmsnorm", &rmsnorm);
  m.impl("add_rmsnorm_", &add_rmsnorm_);
  m.impl("silu_mul", &silu_mul);
  m.impl("rope_qk_", &rope_qk_);
}
