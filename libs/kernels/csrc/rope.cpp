// Rotary embedding of q and k in one pass, in place, on the fused QKV projection's rows.
//
//   qkv        [T, W] fp32 / bf16 / fp16, contiguous; the first heads * D columns (the
//              q heads, then the k heads) are rotated, the rest (v) is left alone
//   positions  [T] int64, each < P
//   cos, sin   [P, R/2] fp32: the model's tables (ops.Rotary), looked up here per token;
//              R = D, or less under partial rotary (Phi-3): the first R of each head
//              rotate, the other D - R pass through untouched (HF's apply_rotary_pos_emb)
//
// Half-split (NeoX / HF) rotation with the torch version's rounding points
// (ops.apply_rope over cos/sin already cast to T):
//   x1' = T(T(x1 * c) - T(x2 * s)),  x2' = T(T(x2 * c) + T(x1 * s)),  c = T(cos), s = T(sin)
// so its results are torch's bit for bit in every dtype. Tokens in parallel; for each
// vector of lanes (rows.h) of the half row, c and s are loaded once for all heads.
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>

#include "kernels.h"
#include "rows.h"

namespace {

#if defined(RMK_ROWS_VEC)
namespace rv = rmk::rows;

template <typename T>
void rope_token(T* x, const float* cos, const float* sin, int64_t heads, int64_t D, int64_t half) {
  for (int64_t i = 0; i < half; i += rv::kLanes) {
    const rv::Mask m = rv::tail(half - i);
    const rv::vf c = rv::round_to<T>(rv::load(cos + i, m)), s = rv::round_to<T>(rv::load(sin + i, m));
    for (int64_t h = 0; h < heads; ++h) {
      T* x1p = x + h * D + i;
      T* x2p = x1p + half;
      const rv::vf x1 = rv::load(x1p, m), x2 = rv::load(x2p, m);
      const rv::vf a = rv::round_to<T>(rv::mul(x1, c)), b = rv::round_to<T>(rv::mul(x2, s));
      const rv::vf e = rv::round_to<T>(rv::mul(x2, c)), f = rv::round_to<T>(rv::mul(x1, s));
      rv::store(x1p, rv::sub(a, b), m);
      rv::store(x2p, rv::add(e, f), m);
    }
  }
}
#else
// NOTE: no fused multiply-adds here (where FMA exists, -ffast-math would contract x1 * c - b
// into one rounding): torch rounds each product, and so must this
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
template <typename T>
void rope_token(T* x, const float* cos, const float* sin, int64_t heads, int64_t D, int64_t half) {
  auto r = [](float v) { return rmk::to_f(rmk::from_f<T>(v)); };
  for (int64_t h = 0; h < heads; ++h) {
    T* x1p = x + h * D;
    T* x2p = x1p + half;
    for (int64_t i = 0; i < half; ++i) {
      const float c = r(cos[i]), s = r(sin[i]), x1 = rmk::to_f(x1p[i]), x2 = rmk::to_f(x2p[i]);
      const float a = r(x1 * c), b = r(x2 * s), e = r(x2 * c), f = r(x1 * s);
      x1p[i] = rmk::from_f<T>(a - b);
      x2p[i] = rmk::from_f<T>(e + f);
    }
  }
}
#pragma GCC pop_options
#endif

}  // namespace

void rope_qk_(at::Tensor& qkv, const at::Tensor& positions, const at::Tensor& cos, const at::Tensor& sin,
              int64_t heads, int64_t head_dim) {
  TORCH_CHECK(qkv.dim() == 2 && qkv.is_contiguous(), "qkv must be a contiguous [T, W] tensor");
  TORCH_CHECK(qkv.scalar_type() == at::kFloat || qkv.scalar_type() == at::kBFloat16 || qkv.scalar_type() == at::kHalf,
              "qkv must be fp32, bf16 or fp16");
  TORCH_CHECK(head_dim % 2 == 0 && heads >= 0 && heads * head_dim <= qkv.size(1), "heads * head_dim exceeds qkv's rows");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat && cos.is_contiguous() &&
              sin.is_contiguous() && cos.dim() == 2 && cos.sizes() == sin.sizes() && cos.size(1) >= 1 &&
              2 * cos.size(1) <= head_dim,
              "cos, sin must be contiguous fp32 [P, R / 2], R <= head_dim the rotated width");
  check_index(positions, "positions");
  const int64_t T_ = qkv.size(0), W = qkv.size(1), P = cos.size(0), half = cos.size(1);
  TORCH_CHECK(positions.size(0) == T_, "one position per token");
  const int64_t* pos = positions.data_ptr<int64_t>();
  for (int64_t t = 0; t < T_; ++t) TORCH_CHECK(pos[t] >= 0 && pos[t] < P, "position out of the rotary tables' range");
  const float *cos_p = cos.data_ptr<float>(), *sin_p = sin.data_ptr<float>();
  dispatch_row_types(qkv.scalar_type(), "rope_qk_", [&](auto tag) {
    using scalar_t = decltype(tag);
    scalar_t* x_p = qkv.data_ptr<scalar_t>();
    at::parallel_for(0, T_, 16, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t)
        rope_token(x_p + t * W, cos_p + pos[t] * half, sin_p + pos[t] * half, heads, head_dim, half);
    });
  });
}
