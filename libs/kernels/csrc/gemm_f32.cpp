// fp32 linear layers over bf16 weights, on AVX2 + FMA (CPUs without native bf16 products).
//
// The weights are tiles of libs/kernels/gemm.py 16 output columns wide (``pack(w, 16)``): per
// tile, K/2 rows of 16 column pairs, w[n][2k] in a pair's low half and w[n][2k+1] in its high
// half. A bf16 is the top half of an fp32, so a pair widens to two fp32 lanes with one shift
// (the even element) and one mask (the odd one); x and the output stay fp32.
//
// Reading half the bytes of an fp32 weight is the point: a decode step at a small batch reads
// every weight once and is bound by memory. A micro-kernel owns one tile (16 columns) for
// R <= 4 rows, and the tile is one contiguous stream (K * 32 bytes) that the prefetchers follow.
// On gemm_bf16.cpp's 64-column tiles a 16-column call read 64 bytes of every 256: on 2 Zen 3
// cores a batch-1 step's weights went at 13-16 GB/s, on these at 20-26 (1.4-1.7x; batch 8
// 1.25-1.6x, 16-32 rows 1.1x). Threads split a layer's tiles: 36 of a 576-wide layer.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels.h"
#include "vec.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define RMK_GEMM_F32 1
#endif

namespace {

constexpr int64_t kSlice = 16;   // output columns per tile, and per micro-kernel call
constexpr int kMaxRows = 4;      // rows per call: 4 x 2 accumulators + 4 widened weights + 2 broadcasts
constexpr int64_t kAhead = 128;  // k pairs ahead (8 KB of a tile's stream) that are prefetched
// rows from which a tile is widened once (wide_rows), not per row block. NOTE: 40, not 16: the
// 30 layers' linears on 2 Zen 3 cores, 16 rows 24.1-24.5 ms row blocks against 32.0 widened, 24
// rows 34.4 / 36.4, 32 rows 45.1-47.6 / 47.9; widened ahead from 40 (58.8 / 61.0) and 48 on
constexpr int64_t kWideFrom = 40;
constexpr int64_t kPanelRows = 48;  // rows of x per panel under wide_rows (8 blocks of 6; 110-300 KB of x)

#if defined(RMK_GEMM_F32)
inline __m256i lanes_mask(int64_t left) {  // the first `left` (0..8) lanes set
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::clamp<int64_t>(left, 0, 8))), idx);
}

// one tile row, 16 column pairs, as fp32: the even elements (w[n][2k], a pair's low
// half shifted up) and the odd ones (its high half, masked) of columns 0-7 and 8-15; the row
// kAhead rows on is asked for meanwhile
struct Widened {
  __m256 e0, o0, e1, o1;
};
inline Widened widen_row(const int32_t* wk) {
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  _mm_prefetch(reinterpret_cast<const char*>(wk + kAhead * kSlice), _MM_HINT_T0);
  const __m256i p0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wk));
  const __m256i p1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wk + 8));
  return {_mm256_castsi256_ps(_mm256_slli_epi32(p0, 16)), _mm256_castsi256_ps(_mm256_and_si256(p0, high)),
          _mm256_castsi256_ps(_mm256_slli_epi32(p1, 16)), _mm256_castsi256_ps(_mm256_and_si256(p1, high))};
}

// columns 8j .. 8j+8 of a slice's bias (zeros without one), and of an output row; lanes at or
// past n_valid are neither read nor written
inline __m256 bias_block(const float* bias, int64_t n_valid, int j) {
  return bias ? _mm256_maskload_ps(bias + 8 * j, lanes_mask(n_valid - 8 * j)) : _mm256_setzero_ps();
}
inline void store_block(float* out, int64_t n_valid, int j, __m256 v) {
  _mm256_maskstore_ps(out + 8 * j, lanes_mask(n_valid - 8 * j), v);
}

// out[r, 0..16) = x[r] . tile (+ bias) for R rows; `w` is the tile's first pair, its rows 16
// pairs apart; columns at or past n_valid are neither read from bias nor written.
// With one or two rows the even and odd products go to separate accumulators: a single chain
// of dependent FMAs per column block would wait on the FMA latency at batch 1.
template <int R>
void slice_rows(const float* x, int64_t ldx, const int32_t* w, int64_t K2, float* out, int64_t ldo,
                int64_t n_valid, const float* bias) {
  constexpr int A = R <= 2 ? 2 : 1;
  __m256 acc[R][2][A];
  RMK_UNROLL
  for (int j = 0; j < 2; ++j) {
    const __m256 b = bias_block(bias, n_valid, j);
    RMK_UNROLL
    for (int r = 0; r < R; ++r) {
      acc[r][j][0] = b;
      if constexpr (A == 2) acc[r][j][A - 1] = _mm256_setzero_ps();
    }
  }
  for (int64_t k2 = 0; k2 < K2; ++k2) {
    const auto [e0, o0, e1, o1] = widen_row(w + k2 * kSlice);
    RMK_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m256 xe = _mm256_broadcast_ss(x + r * ldx + 2 * k2);
      const __m256 xo = _mm256_broadcast_ss(x + r * ldx + 2 * k2 + 1);
      acc[r][0][0] = _mm256_fmadd_ps(e0, xe, acc[r][0][0]);
      acc[r][1][0] = _mm256_fmadd_ps(e1, xe, acc[r][1][0]);
      acc[r][0][A - 1] = _mm256_fmadd_ps(o0, xo, acc[r][0][A - 1]);
      acc[r][1][A - 1] = _mm256_fmadd_ps(o1, xo, acc[r][1][A - 1]);
    }
  }
  RMK_UNROLL
  for (int j = 0; j < 2; ++j) {
    RMK_UNROLL
    for (int r = 0; r < R; ++r) {
      if constexpr (A == 2) {
        store_block(out + r * ldo, n_valid, j, _mm256_add_ps(acc[r][j][0], acc[r][j][1]));
      } else {
        store_block(out + r * ldo, n_valid, j, acc[r][j][0]);
      }
    }
  }
}

using SliceFn = void (*)(const float*, int64_t, const int32_t*, int64_t, float*, int64_t, int64_t, const float*);
constexpr SliceFn kSliceFns[kMaxRows + 1] = {nullptr, slice_rows<1>, slice_rows<2>, slice_rows<3>, slice_rows<4>};

// A slice widened once to fp32, [K][16], for batches of many rows: the widening then costs
// once per slice instead of once per row block, and the classic 6 x 16 micro-kernel (12
// accumulators, 2 weight vectors, 1 broadcast) runs over it from L1 / L2.
void widen_slice(const int32_t* w, int64_t K2, float* wide) {
  for (int64_t k2 = 0; k2 < K2; ++k2) {
    const Widened r = widen_row(w + k2 * kSlice);
    float* even = wide + 2 * k2 * kSlice;
    _mm256_storeu_ps(even, r.e0), _mm256_storeu_ps(even + 8, r.e1);
    _mm256_storeu_ps(even + kSlice, r.o0), _mm256_storeu_ps(even + kSlice + 8, r.o1);
  }
}

constexpr int kWideRows = 6;

template <int R>
void wide_rows(const float* x, int64_t ldx, const float* wide, int64_t K, float* out, int64_t ldo,
               int64_t n_valid, const float* bias) {
  __m256 acc[R][2];
  RMK_UNROLL
  for (int j = 0; j < 2; ++j) {
    const __m256 b = bias_block(bias, n_valid, j);
    RMK_UNROLL
    for (int r = 0; r < R; ++r) acc[r][j] = b;
  }
  for (int64_t k = 0; k < K; ++k) {
    const __m256 w0 = _mm256_loadu_ps(wide + k * kSlice), w1 = _mm256_loadu_ps(wide + k * kSlice + 8);
    RMK_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m256 xb = _mm256_broadcast_ss(x + r * ldx + k);
      acc[r][0] = _mm256_fmadd_ps(w0, xb, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(w1, xb, acc[r][1]);
    }
  }
  RMK_UNROLL
  for (int j = 0; j < 2; ++j) {
    RMK_UNROLL
    for (int r = 0; r < R; ++r) store_block(out + r * ldo, n_valid, j, acc[r][j]);
  }
}

using WideFn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, int64_t, const float*);
constexpr WideFn kWideRowFns[kWideRows + 1] = {nullptr, wide_rows<1>, wide_rows<2>, wide_rows<3>,
                                               wide_rows<4>, wide_rows<5>, wide_rows<6>};
#endif

}  // namespace

bool gemm_f32_available() {
#if defined(RMK_GEMM_F32)
  return true;
#else
  return false;
#endif
}

at::Tensor linear_bf16w(const at::Tensor& x, const at::Tensor& packed, int64_t n_out,
                        const c10::optional<at::Tensor>& bias) {
  const bool has_bias = check_linear_args(x, packed, n_out, bias, at::kFloat, "fp32", kSlice);
  const int64_t M = x.size(0);
  at::Tensor out = at::empty({M, n_out}, x.options());
#if defined(RMK_GEMM_F32)
  if (M == 0) return out;
  const int64_t K = x.size(1), K2 = packed.size(1);
  const float* xp = x.data_ptr<float>();
  const int32_t* wp = packed.data_ptr<int32_t>();
  const float* bp = has_bias ? bias->data_ptr<float>() : nullptr;
  float* op = out.data_ptr<float>();
  const int64_t ldx = x.stride(0), slices = (n_out + kSlice - 1) / kSlice;
  const bool wide = M >= kWideFrom;
  const int64_t most = wide ? kWideRows : kMaxRows;
  const int64_t m_blocks = (M + most - 1) / most;
  const int64_t rows_per = wide ? kWideRows : (M + m_blocks - 1) / m_blocks;
  // NOTE: many rows go a panel at a time: the panel's x stays in L2 while the thread's
  // slices are widened and run over it in turn (x read from memory for every slice: 0.74x
  // oneDNN at 256 rows)
  const int64_t panel = wide ? kPanelRows : M;
  at::parallel_for(0, slices, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(wide ? K * kSlice : 0);
    for (int64_t p0 = 0; p0 < M; p0 += panel) {
      const int64_t p1 = std::min(M, p0 + panel);
      for (int64_t s = begin; s < end; ++s) {
        const int64_t n0 = s * kSlice;
        const int32_t* ws = wp + s * K2 * kSlice;
        const int64_t n_valid = std::min(kSlice, n_out - n0);
        const float* bs = bp ? bp + n0 : nullptr;
        if (wide) widen_slice(ws, K2, scratch.data());
        for (int64_t m0 = p0; m0 < p1; m0 += rows_per) {
          const int64_t rows = std::min(rows_per, p1 - m0);
          float* o = op + m0 * n_out + n0;
          if (wide) {
            kWideRowFns[rows](xp + m0 * ldx, ldx, scratch.data(), K, o, n_out, n_valid, bs);
          } else {
            kSliceFns[rows](xp + m0 * ldx, ldx, ws, K2, o, n_out, n_valid, bs);
          }
        }
      }
    }
  });
#else
  (void)has_bias;
  TORCH_CHECK(false, "linear_bf16w needs AVX2 and FMA");
#endif
  return out;
}
