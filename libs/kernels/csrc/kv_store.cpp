// A step's new K and V rows written into one layer's paged pool at their slots, rounded to
// the pool's dtype as torch's casts round (nearest even): one call for both, where the pool's
// Python store ran a cast and an index_copy_ for each (four torch ops: 26 against 1.5 us a
// layer at batch 1 on 2 Zen 3 cores, 0.7 ms of a 30-layer step).
//
//   kpool, vpool [S, H, D]  one layer's pools (fp32 / bf16 / fp16, contiguous, one dtype)
//   slots [T] int64         where token t's rows go (each in [0, S))
//   k, v [T, H, D]          fp32 / bf16 / fp16; each token's H * D values contiguous (rows
//                           may be strided: views into the fused QKV projection)
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>

#include <cstring>

#include "kernels.h"
#include "rows.h"

namespace {

// dst[0, n) = src[0, n) in dst's type
template <typename S, typename D>
void copy_row(D* dst, const S* src, int64_t n) {
  if constexpr (std::is_same_v<S, D>) {
    std::memcpy(static_cast<void*>(dst), static_cast<const void*>(src), n * sizeof(D));
  } else {
#if defined(RMK_ROWS_VEC)
    namespace rv = rmk::rows;
    for (int64_t i = 0; i < n; i += rv::kLanes) {
      const rv::Mask m = rv::tail(n - i);
      rv::store(dst + i, rv::load(src + i, m), m);
    }
#else
    for (int64_t i = 0; i < n; ++i) dst[i] = rmk::from_f<D>(rmk::to_f(src[i]));
#endif
  }
}

void check_rows(const at::Tensor& x, const at::Tensor& pool, const char* name) {
  TORCH_CHECK(x.dim() == 3 && x.size(1) == pool.size(1) && x.size(2) == pool.size(2), name,
              " must be [T, kv_heads, head_dim] of the pool's heads");
  TORCH_CHECK(x.stride(2) == 1 && x.stride(1) == x.size(2), name, ": each token's heads must be contiguous");
}

}  // namespace

void store_kv_(at::Tensor& kpool, at::Tensor& vpool, const at::Tensor& slots, const at::Tensor& k,
               const at::Tensor& v) {
  TORCH_CHECK(kpool.dim() == 3 && kpool.sizes() == vpool.sizes() && kpool.is_contiguous() && vpool.is_contiguous(),
              "kpool, vpool: contiguous [S, kv_heads, head_dim] of one shape");
  TORCH_CHECK(kpool.scalar_type() == vpool.scalar_type() && k.scalar_type() == v.scalar_type(),
              "the pools share a dtype, and k and v one");
  check_index(slots, "slots");
  check_rows(k, kpool, "k");
  check_rows(v, kpool, "v");
  const int64_t T = slots.size(0), S = kpool.size(0), n = kpool.size(1) * kpool.size(2);
  TORCH_CHECK(k.size(0) == T && v.size(0) == T, "one slot per token");
  const int64_t* sl = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t) TORCH_CHECK(sl[t] >= 0 && sl[t] < S, "slot ", sl[t], " outside the pool of ", S);
  dispatch_row_types(k.scalar_type(), "store_kv_", [&](auto s) {
    using Src = decltype(s);
    dispatch_row_types(kpool.scalar_type(), "store_kv_", [&](auto d) {
      using Dst = decltype(d);
      const Src *kp = k.data_ptr<Src>(), *vp = v.data_ptr<Src>();
      Dst *kd = kpool.data_ptr<Dst>(), *vd = vpool.data_ptr<Dst>();
      const int64_t ks = k.stride(0), vs = v.stride(0);
      // NOTE: a decode step's few rows run inline: waking the team costs more than they do
      at::parallel_for(0, T, std::max<int64_t>(1, 65536 / n), [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
          copy_row(kd + sl[t] * n, kp + t * ks, n);
          copy_row(vd + sl[t] * n, vp + t * vs, n);
        }
      });
    });
  });
}
