// The attention kernels' entry points (bound in module.cpp) and their argument checks.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

// v1: the first decode kernel (fp32 output), kept as the benchmarks' baseline
at::Tensor paged_decode_v1(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor table, at::Tensor rows,
                           at::Tensor lens, double scale);

void paged_decode_into(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& table,
                       const at::Tensor& rows, const at::Tensor& lens, const at::Tensor& tokens, double scale,
                       at::Tensor& out, int64_t window = 0);

void paged_extend_into(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& table,
                       const at::Tensor& rows, const at::Tensor& prefix, const at::Tensor& extend,
                       const at::Tensor& starts, double scale, at::Tensor& out, bool allow_brgemm,
                       int64_t window = 0);

bool amx_bf16_available();
bool set_brgemm(bool allowed);  // returns the previous setting
bool bf16_extend_available();
bool fp32_extend_available();

// ops.cpp, rope.cpp: elementwise kernels for fp32 / bf16 / fp16 activations
at::Tensor rmsnorm(const at::Tensor& x, const at::Tensor& weight, double eps);
void add_rmsnorm_(at::Tensor& x, at::Tensor& h, const at::Tensor& weight, double eps);
at::Tensor silu_mul(const at::Tensor& gate_up);
void rope_qk_(at::Tensor& qkv, const at::Tensor& positions, const at::Tensor& cos, const at::Tensor& sin,
              int64_t heads, int64_t head_dim);

// kv_store.cpp: a step's new K and V rows into one layer's pools at their slots, in the pools' dtype
void store_kv_(at::Tensor& kpool, at::Tensor& vpool, const at::Tensor& slots, const at::Tensor& k,
               const at::Tensor& v);

// f(scalar_t{}) for fp32 / bf16 / fp16 (the row kernels' types; AT_DISPATCH's sets add fp64)
template <typename F>
inline void dispatch_row_types(at::ScalarType type, const char* name, F&& f) {
  switch (type) {
    case at::kFloat: return f(float{});
    case at::kBFloat16: return f(c10::BFloat16{});
    case at::kHalf: return f(c10::Half{});
    default: TORCH_CHECK(false, name, ": fp32, bf16 or fp16 only");
  }
}

inline void check_index(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kLong && t.is_contiguous() && t.dim() == 1, name, " must be contiguous 1-d int64");
}

// bf16_pool_under_fp32: the kernel also takes fp32 q and out over a bf16 pool
inline void check_pool_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& table,
                            const at::Tensor& out, bool bf16_pool_under_fp32 = false) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3 && out.sizes() == q.sizes(), "q, out [T, H, D]; k, v [S, Hkv, D]");
  TORCH_CHECK(q.is_contiguous() && k.is_contiguous() && v.is_contiguous() && out.is_contiguous(),
              "q, k, v, out must be contiguous");
  const bool mixed = bf16_pool_under_fp32 && q.scalar_type() == at::kFloat && k.scalar_type() == at::kBFloat16;
  TORCH_CHECK((mixed || q.scalar_type() == k.scalar_type()) && k.scalar_type() == v.scalar_type() &&
                  out.scalar_type() == q.scalar_type(),
              bf16_pool_under_fp32 ? "q, k, v, out must share a dtype (or fp32 q and out over a bf16 pool)"
                                   : "q, k, v, out must share a dtype");
  TORCH_CHECK(k.sizes() == v.sizes() && k.size(2) == q.size(2) && q.size(1) % k.size(1) == 0, "head shapes do not match");
  TORCH_CHECK(table.scalar_type() == at::kLong && table.is_contiguous() && table.dim() == 2, "table must be 2-d int64");
}

// gemm_bf16.cpp: bf16 linear over weights packed by libs/kernels/gemm.py (AVX512-BF16)
bool gemm_bf16_available();
// how many of torch's threads a parallel_for over ``items`` ran on (the build's OpenMP check)
int64_t parallel_team(int64_t items);
at::Tensor linear_bf16(const at::Tensor& x, const at::Tensor& packed, int64_t n_out,
                       const c10::optional<at::Tensor>& bias);

// the linears' shared argument checks: x [M, K] rows of `type`, `packed` the [tiles, K/2,
// kTileColumns] int32 pairs of libs/kernels/gemm.py (64 columns a tile for the bf16 kernel, 16
// for the fp32 one) for n_out columns, bias (if any) n_out values of `type`; returns whether
// there is a bias
inline bool check_linear_args(const at::Tensor& x, const at::Tensor& packed, int64_t n_out,
                              const c10::optional<at::Tensor>& bias, at::ScalarType type, const char* type_name,
                              int64_t kTileColumns) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == type && x.stride(1) == 1, "x must be [M, K] ", type_name, " rows");
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == at::kInt && packed.is_contiguous() &&
                  packed.size(2) == kTileColumns, "packed must be [tiles, K/2, ", kTileColumns,
              "] int32 pairs (libs.kernels.gemm.pack)");
  const int64_t K = x.size(1), T = packed.size(0);
  TORCH_CHECK(K % 2 == 0 && packed.size(1) == K / 2, "x's width must be the weight's (an even number)");
  TORCH_CHECK(n_out > (T - 1) * kTileColumns && n_out <= T * kTileColumns, "n_out does not match the packed weight");
  const bool has_bias = bias.has_value() && bias->defined();
  TORCH_CHECK(!has_bias || (bias->numel() == n_out && bias->scalar_type() == type && bias->is_contiguous()),
              "bias must be n_out contiguous ", type_name, " values");
  return has_bias;
}

// gemm_f32.cpp: fp32 linear over the same packed bf16 weights (AVX2 + FMA)
bool gemm_f32_available();
at::Tensor linear_bf16w(const at::Tensor& x, const at::Tensor& packed, int64_t n_out,
                        const c10::optional<at::Tensor>& bias);

// layer_loop.cpp: a decode step's decoder layers in one call, over the kernels above (the
// linears, RoPE, the KV store, decode attention, the fused residual add + RMSNorm, SiLU-mul).
// Built once per model, pool and linear form: per layer the weights [input_norm, qkv, o_proj,
// post_norm, gate_up, down] (each linear as libs.kernels.gemm tiles, oneDNN's packed weight
// or a plain [out, in] one), their four biases (or None) and output widths, and the layer's
// K and V pools.
class DecodeLayers {
 public:
  DecodeLayers(const std::vector<at::Tensor>& weights, const std::vector<c10::optional<at::Tensor>>& biases,
               const std::vector<int64_t>& n_out, const std::vector<at::Tensor>& kpools,
               const std::vector<at::Tensor>& vpools, int64_t heads, int64_t kv_heads, int64_t head_dim, double eps);
  // x [T, hidden] (the embeddings; the residual stream, updated in place) -> the stream after
  // the last layer; the step's slots and decode arguments as paged_decode_into takes them
  at::Tensor run(at::Tensor x, const at::Tensor& positions, const at::Tensor& cos, const at::Tensor& sin,
                 const at::Tensor& slots, const at::Tensor& table, const at::Tensor& rows, const at::Tensor& lens,
                 const at::Tensor& tokens, double scale) const;

 private:
  struct Layer {
    at::Tensor input_norm, qkv, o, post_norm, gate_up, down;
    c10::optional<at::Tensor> qkv_bias, o_bias, gate_up_bias, down_bias;
    int64_t n_qkv, n_o, n_gate_up, n_down;
    at::Tensor k, v;
  };
  std::vector<Layer> layers_;
  int64_t heads_, kv_heads_, head_dim_;
  double eps_;
  at::ScalarType dtype_;
};
