// Elementwise kernels of Llama-family models for bf16 / fp16 activations, computed in
// fp32 with the rounding points of the torch versions (libs/kernels/ops.py):
//   rmsnorm:  out = w * T(x / rms(x))        (sum of squares in fp32)
//   silu_mul: out = T(silu(gate)) * up       (gate_up = [gate | up] on the last dim)
// One row per work item, rows in parallel.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>

#include "kernels.h"
#include "vec.h"

namespace {

template <typename T>
void rmsnorm_row(const T* x, const T* w, T* out, int64_t H, float eps) {
  float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
  for (int64_t i = 0; i < H; ++i) ss += rmk::to_f(x[i]) * rmk::to_f(x[i]);
  const float r = 1.0f / std::sqrt(ss / static_cast<float>(H) + eps);
  for (int64_t i = 0; i < H; ++i) {
    const T normed = rmk::from_f<T>(rmk::to_f(x[i]) * r);
    out[i] = rmk::from_f<T>(rmk::to_f(w[i]) * rmk::to_f(normed));
  }
}

inline float silu(float g) { return g / (1.0f + std::exp(-g)); }

template <typename T>
void silu_mul_row(const T* gate, const T* up, T* out, int64_t I) {
  for (int64_t i = 0; i < I; ++i) out[i] = rmk::from_f<T>(rmk::to_f(rmk::from_f<T>(silu(rmk::to_f(gate[i])))) * rmk::to_f(up[i]));
}

void check_rows(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), name, " must be a contiguous [T, H] tensor");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf, name, " must be bf16 or fp16");
}

}  // namespace

at::Tensor rmsnorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_rows(x, "x");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(1) && weight.is_contiguous() &&
              weight.scalar_type() == x.scalar_type(), "weight must be [H] of x's dtype");
  auto out = at::empty_like(x);
  const int64_t T_ = x.size(0), H = x.size(1);
  AT_DISPATCH_REDUCED_FLOATING_TYPES(x.scalar_type(), "rmsnorm", [&] {
    const scalar_t *x_p = x.data_ptr<scalar_t>(), *w_p = weight.data_ptr<scalar_t>();
    scalar_t* o_p = out.data_ptr<scalar_t>();
    at::parallel_for(0, T_, 16, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) rmsnorm_row(x_p + t * H, w_p, o_p + t * H, H, static_cast<float>(eps));
    });
  });
  return out;
}

at::Tensor silu_mul(const at::Tensor& gate_up) {
  check_rows(gate_up, "gate_up");
  TORCH_CHECK(gate_up.size(1) % 2 == 0, "gate_up's last dim must be even");
  const int64_t T_ = gate_up.size(0), I = gate_up.size(1) / 2;
  auto out = at::empty({T_, I}, gate_up.options());
  AT_DISPATCH_REDUCED_FLOATING_TYPES(gate_up.scalar_type(), "silu_mul", [&] {
    const scalar_t* g_p = gate_up.data_ptr<scalar_t>();
    scalar_t* o_p = out.data_ptr<scalar_t>();
    at::parallel_for(0, T_, 4, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) silu_mul_row(g_p + t * 2 * I, g_p + t * 2 * I + I, o_p + t * I, I);
    });
  });
  return out;
}
