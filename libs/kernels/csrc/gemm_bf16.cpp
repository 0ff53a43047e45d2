// bf16 linear layers on AVX512-BF16's dot instruction (vdpbf16ps), for CPUs without AMX.
//
// Weights are packed once (libs/kernels/gemm.py) into tiles of 64 output columns, each a stream of K/2 rows of
// 64 column pairs (uint32: w[n][2k] in the low half, w[n][2k+1] in the high half):
//
//   packed[t][k2][j] = pair(w[64t + j][2 k2], w[64t + j][2 k2 + 1])      j < 64
//
// so one tile is one contiguous run of memory and a thread's tiles one sequential stream.
// A micro-kernel keeps R rows x 4 blocks of 16 outputs in fp32 registers; per k pair it
// loads the tile's 256 bytes once and multiplies them into every row (x's pair broadcast).
// At batch 1 the step reads each weight once at close to the core's memory bandwidth,
// where oneDNN's blocked gemv stays at about half of it; large batches loop over row tiles
// while the weight tile sits in L2.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <vector>
#include <cstdint>
#include <cstring>

#include "kernels.h"
#include "vec.h"

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>
#define RMK_GEMM_BF16 1
#endif

namespace {

constexpr int64_t kTile = 64;      // output columns per packed tile
constexpr int kMaxRows = 6;        // rows per micro-kernel call: 6 x 4 accumulators + 4 weights
constexpr int64_t kPrefetch = 64;  // k pairs ahead (16 KB) that the weight stream is asked for

#if defined(RMK_GEMM_BF16)
inline uint32_t pair_at(const uint16_t* row, int64_t k2) {
  uint32_t v;
  std::memcpy(&v, row + 2 * k2, sizeof(v));  // NOTE: rows may be only 2-byte aligned
  return v;
}

inline __mmask16 columns_mask(int64_t n_valid, int j) {
  const int64_t left = n_valid - 16 * j;
  return left >= 16 ? __mmask16(0xffff) : left <= 0 ? __mmask16(0) : __mmask16((1u << left) - 1);
}

// out[r, n0 .. n0+64) = x[r] . w_tile (+ bias, bf16, read in place), for R rows; columns past
// n_valid are neither read from bias nor written
template <int R>
void tile_rows(const uint16_t* x, int64_t ldx, const __m512i* w, int64_t K2, c10::BFloat16* out, int64_t ldo,
               int64_t n_valid, const uint16_t* bias) {
  __m512 acc[R][4];
  for (int j = 0; j < 4; ++j) {
    __m512 b = _mm512_setzero_ps();
    if (bias) {
      const __m256i raw = _mm256_maskz_loadu_epi16(columns_mask(n_valid, j), bias + 16 * j);
      b = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
    }
    for (int r = 0; r < R; ++r) acc[r][j] = b;
  }
  for (int64_t k2 = 0; k2 < K2; ++k2) {
    const __m512i* wk = w + 4 * k2;
    _mm_prefetch(reinterpret_cast<const char*>(wk + 4 * kPrefetch), _MM_HINT_T1);
    _mm_prefetch(reinterpret_cast<const char*>(wk + 4 * kPrefetch + 1), _MM_HINT_T1);
    _mm_prefetch(reinterpret_cast<const char*>(wk + 4 * kPrefetch + 2), _MM_HINT_T1);
    _mm_prefetch(reinterpret_cast<const char*>(wk + 4 * kPrefetch + 3), _MM_HINT_T1);
    const __m512bh w0 = (__m512bh)_mm512_load_si512(wk), w1 = (__m512bh)_mm512_load_si512(wk + 1);
    const __m512bh w2 = (__m512bh)_mm512_load_si512(wk + 2), w3 = (__m512bh)_mm512_load_si512(wk + 3);
    for (int r = 0; r < R; ++r) {
      const __m512bh xb = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair_at(x + r * ldx, k2)));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], w0, xb);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], w1, xb);
      acc[r][2] = _mm512_dpbf16_ps(acc[r][2], w2, xb);
      acc[r][3] = _mm512_dpbf16_ps(acc[r][3], w3, xb);
    }
  }
  for (int j = 0; j < 4 && 16 * j < n_valid; ++j) {
    const __mmask16 mask = columns_mask(n_valid, j);
    for (int r = 0; r < R; ++r) {
      const __m256i v = rmk::bf16_rne(acc[r][j]);
      _mm256_mask_storeu_epi16(out + r * ldo + 16 * j, mask, v);
    }
  }
}

using TileFn = void (*)(const uint16_t*, int64_t, const __m512i*, int64_t, c10::BFloat16*, int64_t, int64_t,
                        const uint16_t*);
constexpr TileFn kTileFns[kMaxRows + 1] = {nullptr, tile_rows<1>, tile_rows<2>, tile_rows<3>,
                                           tile_rows<4>, tile_rows<5>, tile_rows<6>};
#endif

}  // namespace

int64_t parallel_team(int64_t items) {
  std::vector<std::atomic<int>> seen(at::get_num_threads());
  at::parallel_for(0, items, 1, [&](int64_t, int64_t) {
    const int id = at::get_thread_num();
    if (id < static_cast<int>(seen.size())) seen[id] = 1;
  });
  int64_t n = 0;
  for (const auto& s : seen) n += s.load();
  return n;
}

bool gemm_bf16_available() {
#if defined(RMK_GEMM_BF16)
  return true;
#else
  return false;
#endif
}

at::Tensor linear_bf16(const at::Tensor& x, const at::Tensor& packed, int64_t n_out,
                       const c10::optional<at::Tensor>& bias) {
  const bool has_bias = check_linear_args(x, packed, n_out, bias, at::kBFloat16, "bf16", kTile);
  const int64_t M = x.size(0);
  at::Tensor out = at::empty({M, n_out}, x.options());
#if defined(RMK_GEMM_BF16)
  if (M == 0) return out;
  const int64_t K2 = packed.size(1), T = packed.size(0);
  const uint16_t* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  const __m512i* wp = reinterpret_cast<const __m512i*>(packed.data_ptr<int32_t>());
  const uint16_t* bp = has_bias ? reinterpret_cast<const uint16_t*>(bias->data_ptr<at::BFloat16>()) : nullptr;
  c10::BFloat16* op = out.data_ptr<c10::BFloat16>();
  const int64_t ldx = x.stride(0), m_tiles = (M + kMaxRows - 1) / kMaxRows;
  const int64_t rows_per = (M + m_tiles - 1) / m_tiles;  // NOTE: balanced: 8 rows run as 4 + 4, not 6 + 2
  at::parallel_for(0, T, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const __m512i* wt = wp + t * K2 * 4;
      const int64_t n0 = t * kTile, n_valid = std::min(kTile, n_out - n0);
      for (int64_t m0 = 0; m0 < M; m0 += rows_per) {
        const int64_t rows = std::min(rows_per, M - m0);
        kTileFns[rows](xp + m0 * ldx, ldx, wt, K2, op + m0 * n_out + n0, n_out, n_valid, bp ? bp + n0 : nullptr);
      }
    }
  });
#else
  (void)has_bias;
  TORCH_CHECK(false, "linear_bf16 needs AVX512-BF16");
#endif
  return out;
}
