// The extend kernel's two products on AVX2 + FMA (CPUs without AVX-512), over LoopTiles'
// fp32 blocks: S = Q K^T and O += P V register-blocked like a GEMM's micro-kernel, R <= 6
// rows by 16 columns: 12 accumulators, two vectors of the block and one broadcast of a row
// (LoopTiles' loops keep a row's 128 scores in the 16 registers and reload the block per
// row: one FMA per load, slower than torch's SDPA, which extend rows went to instead).
#pragma once

#include "tiles.h"

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#include <immintrin.h>
#define RMK_EXTEND_AVX2 1

namespace rmk {

constexpr int kExtendRows = 6;

// C[r, 0..16) (+)= sum_k A[r, k] B[k, 0..16) for R rows, both products' shape: scores
// S = Q . K^T (A = Q [R, D], B = the block's K^T strip [D, kTileK], C = S: set) and
// O += P . V (A = P [R, kTileK], B = V's strip [n, D], C = O: added to)
template <int R, bool kAdd>
void strip16(const float* A, int64_t lda, const float* B, int64_t ldb, int64_t K, float* C, int64_t ldc) {
  __m256 acc[R][2];
  RMK_UNROLL
  for (int r = 0; r < R; ++r) {
    acc[r][0] = kAdd ? _mm256_loadu_ps(C + r * ldc) : _mm256_setzero_ps();
    acc[r][1] = kAdd ? _mm256_loadu_ps(C + r * ldc + 8) : _mm256_setzero_ps();
  }
  for (int64_t k = 0; k < K; ++k) {
    const __m256 b0 = _mm256_loadu_ps(B + k * ldb), b1 = _mm256_loadu_ps(B + k * ldb + 8);
    RMK_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m256 a = _mm256_broadcast_ss(A + r * lda + k);
      acc[r][0] = _mm256_fmadd_ps(a, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(a, b1, acc[r][1]);
    }
  }
  RMK_UNROLL
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(C + r * ldc, acc[r][0]), _mm256_storeu_ps(C + r * ldc + 8, acc[r][1]);
}

using StripFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t);
template <bool kAdd>
constexpr StripFn kStrips[kExtendRows + 1] = {nullptr, strip16<1, kAdd>, strip16<2, kAdd>, strip16<3, kAdd>,
                                              strip16<4, kAdd>, strip16<5, kAdd>, strip16<6, kAdd>};

// LoopTiles with the products above (fp32 queries, a pool of KT); head dims of whole 16-column strips
template <typename T, typename KT = T>
struct Avx2Tiles : LoopTiles<T, KT> {
  using LoopTiles<T, KT>::LoopTiles;
  static bool takes(int64_t D) { return D % 16 == 0; }

  // the block's keys only, in strips of 16 (scores past n are masked by softmax_block unread)
  void scores() {
    const float* kt = this->kblocks[this->block].data();
    const int64_t M = this->M, D = this->D;
    for (int64_t t0 = 0; t0 < this->n; t0 += 16)
      for (int64_t r0 = 0; r0 < M; r0 += kExtendRows)
        kStrips<false>[std::min<int64_t>(kExtendRows, M - r0)](this->Q.data() + r0 * D, D, kt + t0, kTileK, D,
                                                               this->S + r0 * kTileK + t0, kTileK);
  }
  void accumulate() {
    const float* vb = this->vblocks[this->block].data();
    const int64_t M = this->M, D = this->D;
    for (int64_t c0 = 0; c0 < D; c0 += 16)
      for (int64_t r0 = 0; r0 < M; r0 += kExtendRows)
        kStrips<true>[std::min<int64_t>(kExtendRows, M - r0)](this->S + r0 * kTileK, kTileK, vb + c0, D, this->n,
                                                              this->O + r0 * D + c0, D);
  }
};

}  // namespace rmk

#endif
