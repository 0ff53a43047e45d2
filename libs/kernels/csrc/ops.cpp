// Elementwise kernels of Llama-family models for fp32 / bf16 / fp16 rows, computed in
// fp32 with the rounding points of the torch versions (libs/kernels/ops.py):
//   rmsnorm:      out = w * T(x / rms(x))               (sum of squares in fp32)
//   add_rmsnorm_: x = T(x + h); h = w * T(x / rms(x))   (in place: the residual stream
//                 and the branch output it absorbs; one pass over each row)
//   silu_mul:     out = T(silu(gate)) * up               (gate_up = [gate | up] on the last dim)
// One row per work item, rows in parallel; AVX-512 or AVX2 where the build has it
// (rows.h), plain loops elsewhere.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/Parallel.h>

#include <cmath>

#include "kernels.h"
#include "rows.h"

namespace {

template <typename T>
inline T round_t(float x) { return rmk::from_f<T>(x); }

#if defined(RMK_ROWS_VEC)
namespace rv = rmk::rows;
constexpr int64_t L = rv::kLanes;

// out = w * T(x * r)
template <typename T>
void scale_row(const T* x, const T* w, T* out, int64_t H, float r) {
  const rv::vf rs = rv::set1(r);
  for (int64_t i = 0; i < H; i += L) {
    const rv::Mask m = rv::tail(H - i);
    const rv::vf normed = rv::round_to<T>(rv::mul(rv::load(x + i, m), rs));
    rv::store(out + i, rv::mul(rv::load(w + i, m), normed), m);
  }
}

template <typename T>
float sum_squares(const T* x, int64_t H) {
  rv::vf acc = rv::zero();
  for (int64_t i = 0; i < H; i += L) {
    const rv::vf v = rv::load(x + i, rv::tail(H - i));
    acc = rv::fmadd(v, v, acc);
  }
  return rv::hsum(acc);
}

// x = T(x + h), returns the sum of squares of the new x
template <typename T>
float add_into(T* x, const T* h, int64_t H) {
  rv::vf acc = rv::zero();
  for (int64_t i = 0; i < H; i += L) {
    const rv::Mask m = rv::tail(H - i);
    const rv::vf s = rv::round_to<T>(rv::add(rv::load(x + i, m), rv::load(h + i, m)));
    rv::store(x + i, s, m);
    acc = rv::fmadd(s, s, acc);
  }
  return rv::hsum(acc);
}

template <typename T>
void silu_mul_row(const T* gate, const T* up, T* out, int64_t I) {
  for (int64_t i = 0; i < I; i += L) {
    const rv::Mask m = rv::tail(I - i);
    const rv::vf s = rv::round_to<T>(rv::silu(rv::load(gate + i, m)));
    rv::store(out + i, rv::mul(s, rv::load(up + i, m)), m);
  }
}
#else
template <typename T>
void scale_row(const T* x, const T* w, T* out, int64_t H, float r) {
  for (int64_t i = 0; i < H; ++i) out[i] = round_t<T>(rmk::to_f(w[i]) * rmk::to_f(round_t<T>(rmk::to_f(x[i]) * r)));
}

template <typename T>
float sum_squares(const T* x, int64_t H) {
  float ss = 0.0f;
  for (int64_t i = 0; i < H; ++i) ss += rmk::to_f(x[i]) * rmk::to_f(x[i]);
  return ss;
}

template <typename T>
float add_into(T* x, const T* h, int64_t H) {
  for (int64_t i = 0; i < H; ++i) x[i] = round_t<T>(rmk::to_f(x[i]) + rmk::to_f(h[i]));
  return sum_squares(x, H);
}

template <typename T>
void silu_mul_row(const T* gate, const T* up, T* out, int64_t I) {
  for (int64_t i = 0; i < I; ++i) {
    const float g = rmk::to_f(gate[i]);
    // NOTE: e^-g clamped finite: -ffast-math's vector divide is a reciprocal estimate and a
    // Newton step, NaN at g / inf (g < -88); the clamp changes no float result (g / 1.6e38)
    const float e = std::exp(std::min(-g, 88.0f));
    out[i] = round_t<T>(rmk::to_f(round_t<T>(g / (1.0f + e))) * rmk::to_f(up[i]));
  }
}
#endif

// NOTE: in double: -ffast-math would make a float 1 / sqrt an estimate and a Newton step
inline float inv_rms(float ss, int64_t H, float eps) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(ss / static_cast<float>(H) + eps)));
}

void check_rows(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), name, " must be a contiguous [T, H] tensor");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf,
              name, " must be fp32, bf16 or fp16");
}

void check_weight(const at::Tensor& weight, const at::Tensor& x) {
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(1) && weight.is_contiguous() &&
              weight.scalar_type() == x.scalar_type(), "weight must be [H] of x's dtype");
}

}  // namespace

at::Tensor rmsnorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_rows(x, "x");
  check_weight(weight, x);
  auto out = at::empty_like(x);
  const int64_t T_ = x.size(0), H = x.size(1);
  dispatch_row_types(x.scalar_type(), "rmsnorm", [&](auto tag) {
    using scalar_t = decltype(tag);
    const scalar_t *x_p = x.data_ptr<scalar_t>(), *w_p = weight.data_ptr<scalar_t>();
    scalar_t* o_p = out.data_ptr<scalar_t>();
    at::parallel_for(0, T_, 16, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const scalar_t* row = x_p + t * H;
        scale_row(row, w_p, o_p + t * H, H, inv_rms(sum_squares(row, H), H, static_cast<float>(eps)));
      }
    });
  });
  return out;
}

void add_rmsnorm_(at::Tensor& x, at::Tensor& h, const at::Tensor& weight, double eps) {
  check_rows(x, "x");
  check_rows(h, "h");
  check_weight(weight, x);
  TORCH_CHECK(h.sizes() == x.sizes() && h.scalar_type() == x.scalar_type(), "h must be x's shape and dtype");
  TORCH_CHECK(x.data_ptr() != h.data_ptr(), "x and h must be different tensors");
  const int64_t T_ = x.size(0), H = x.size(1);
  dispatch_row_types(x.scalar_type(), "add_rmsnorm_", [&](auto tag) {
    using scalar_t = decltype(tag);
    scalar_t *x_p = x.data_ptr<scalar_t>(), *h_p = h.data_ptr<scalar_t>();
    const scalar_t* w_p = weight.data_ptr<scalar_t>();
    at::parallel_for(0, T_, 16, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        scalar_t *xr = x_p + t * H, *hr = h_p + t * H;
        scale_row(xr, w_p, hr, H, inv_rms(add_into(xr, hr, H), H, static_cast<float>(eps)));
      }
    });
  });
}

at::Tensor silu_mul(const at::Tensor& gate_up) {
  check_rows(gate_up, "gate_up");
  TORCH_CHECK(gate_up.size(1) % 2 == 0, "gate_up's last dim must be even");
  const int64_t T_ = gate_up.size(0), I = gate_up.size(1) / 2;
  auto out = at::empty({T_, I}, gate_up.options());
  dispatch_row_types(gate_up.scalar_type(), "silu_mul", [&](auto tag) {
    using scalar_t = decltype(tag);
    const scalar_t* g_p = gate_up.data_ptr<scalar_t>();
    scalar_t* o_p = out.data_ptr<scalar_t>();
    at::parallel_for(0, T_, 4, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) silu_mul_row(g_p + t * 2 * I, g_p + t * 2 * I + I, o_p + t * I, I);
    });
  });
  return out;
}
