// The Python module: every CPU attention kernel of this folder; the elementwise ones also
// as torch custom ops (torch.ops.radixmesh.*, registered by register_ops()), which
// torch.compile'd graphs can call (their fake kernels: libs/kernels/cpu_library.py).
// The same sources are built once per ISA level (libs/kernels/cpu_ext.py): a process may load
// several of them (the tests do), so nothing here registers itself when the library loads.
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

#include <memory>
#include <string>

#include "kernels.h"

namespace {

// The ISA extensions this build was compiled for (its -m flags), as /proc/cpuinfo names them.
std::string compiled_isa() {
  std::string isa;
  auto add = [&](const char* name) { isa += isa.empty() ? name : std::string(" ") + name; };
#if defined(__AVX2__)
  add("avx2");
#endif
#if defined(__FMA__)
  add("fma");
#endif
#if defined(__F16C__)
  add("f16c");
#endif
#if defined(__AVX512F__)
  add("avx512f");
#endif
#if defined(__AVX512BW__)
  add("avx512bw");
#endif
#if defined(__AVX512VL__)
  add("avx512vl");
#endif
#if defined(__AVX512DQ__)
  add("avx512dq");
#endif
#if defined(__AVX512BF16__)
  add("avx512_bf16");
#endif
#if defined(__AMX_TILE__)
  add("amx_tile");
#endif
  return isa;
}

// NOTE: the schemas mark what each op writes (Tensor(a!)): functionalization then knows
// add_rmsnorm_ overwrites x and h and rope_qk_ qkv, and inductor can run them in place.
// Registered on request, by one module per process (a namespace is defined once): what
// TORCH_LIBRARY would do as the library loads. The registrations live as long as the process.
void register_ops() {
  static std::unique_ptr<torch::Library> def, impl;
  TORCH_CHECK(!def, "the radixmesh ops are registered already");
  def = std::make_unique<torch::Library>(torch::Library::DEF, "radixmesh", std::nullopt, __FILE__, __LINE__);
  def->def("rmsnorm(Tensor x, Tensor weight, float eps) -> Tensor");
  def->def("add_rmsnorm_(Tensor(a!) x, Tensor(b!) h, Tensor weight, float eps) -> ()");
  def->def("silu_mul(Tensor gate_up) -> Tensor");
  def->def("rope_qk_(Tensor(a!) qkv, Tensor positions, Tensor cos, Tensor sin, int heads, int head_dim) -> ()");
  impl = std::make_unique<torch::Library>(torch::Library::IMPL, "radixmesh", c10::DispatchKey::CPU, __FILE__,
                                          __LINE__);
  impl->impl("rmsnorm", &rmsnorm);
  impl->impl("add_rmsnorm_", &add_rmsnorm_);
  impl->impl("silu_mul", &silu_mul);
  impl->impl("rope_qk_", &rope_qk_);
}

}  // namespace

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
  // NOTE: module_local: each level's build binds its own DecodeLayers (pybind11 keeps one
  // registry of C++ types across modules, and the builds share the type's name)
  pybind11::class_<DecodeLayers>(m, "DecodeLayers", pybind11::module_local(),
                                 "a decode step's decoder layers in one call (layer_loop.cpp)")
      .def(pybind11::init<const std::vector<at::Tensor>&, const std::vector<c10::optional<at::Tensor>>&,
                          const std::vector<int64_t>&, const std::vector<at::Tensor>&, const std::vector<at::Tensor>&,
                          int64_t, int64_t, int64_t, double>())
      .def("run", &DecodeLayers::run, "the residual stream after the last layer (x updated in place)", kNoGil);
  m.def("parallel_team", &parallel_team, "threads an at::parallel_for over n items ran on");
  m.def("gemm_bf16", &gemm_bf16_available, "whether linear_bf16 is built (AVX512-BF16)");
  m.def("gemm_f32", &gemm_f32_available, "whether linear_bf16w is built (AVX2 + FMA)");
  m.def("amx_bf16", &amx_bf16_available, "whether bf16 products run on oneDNN's brgemm (AMX)");
  m.def("set_brgemm", &set_brgemm, "allow (default) or forbid oneDNN's brgemm in this build; returns the previous setting");
  m.def("bf16_extend", &bf16_extend_available, "whether bf16 extend products run natively (AMX or AVX512-BF16)");
  m.def("fp32_extend", &fp32_extend_available, "whether fp32 extend products run register-blocked (AVX2, extend_avx2.h)");
  m.def("isa", &compiled_isa, "the ISA extensions this build was compiled for (/proc/cpuinfo's names)");
  m.def("register_ops", &register_ops, "define torch.ops.radixmesh.* on this build's kernels (once per process)");
}
