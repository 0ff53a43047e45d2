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

// S[r, 0..16) = Q[r] . kt[:, 0..16) for R rows (Q [R, D], kt [D, kTileK] from its 16-key strip)
template <int R>
void qk_strip(const float* Q, int64_t D, const float* kt, float* S) {
  __m256 acc[R][2];
  RMK_UNROLL
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t d = 0; d < D; ++d) {
    const __m256 k0 = _mm256_loadu_ps(kt + d * kTileK), k1 = _mm256_loadu_ps(kt + d * kTileK + 8);
    RMK_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m256 q = _mm256_broadcast_ss(Q + r * D + d);
      acc[r][0] = _mm256_fmadd_ps(q, k0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(q, k1, acc[r][1]);
    }
  }
  RMK_UNROLL
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(S + r * kTileK, acc[r][0]);
    _mm256_storeu_ps(S + r * kTileK + 8, acc[r][1]);
  }
}

// O[r, 0..16) += sum_t P[r, t] V[t, 0..16) over the block's n keys for R rows (P [R, kTileK],
// V [kTileK, D] and O [R, D] from their 16-column strip)
template <int R>
void pv_strip(const float* P, const float* V, int64_t n, int64_t D, float* O) {
  __m256 acc[R][2];
  RMK_UNROLL
  for (int r = 0; r < R; ++r) acc[r][0] = _mm256_loadu_ps(O + r * D), acc[r][1] = _mm256_loadu_ps(O + r * D + 8);
  for (int64_t t = 0; t < n; ++t) {
    const __m256 v0 = _mm256_loadu_ps(V + t * D), v1 = _mm256_loadu_ps(V + t * D + 8);
    RMK_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m256 p = _mm256_broadcast_ss(P + r * kTileK + t);
      acc[r][0] = _mm256_fmadd_ps(p, v0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(p, v1, acc[r][1]);
    }
  }
  RMK_UNROLL
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(O + r * D, acc[r][0]), _mm256_storeu_ps(O + r * D + 8, acc[r][1]);
}

using QkFn = void (*)(const float*, int64_t, const float*, float*);
using PvFn = void (*)(const float*, const float*, int64_t, int64_t, float*);
constexpr QkFn kQk[kExtendRows + 1] = {nullptr, qk_strip<1>, qk_strip<2>, qk_strip<3>,
                                       qk_strip<4>, qk_strip<5>, qk_strip<6>};
constexpr PvFn kPv[kExtendRows + 1] = {nullptr, pv_strip<1>, pv_strip<2>, pv_strip<3>,
                                       pv_strip<4>, pv_strip<5>, pv_strip<6>};

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
        kQk[std::min<int64_t>(kExtendRows, M - r0)](this->Q.data() + r0 * D, D, kt + t0, this->S + r0 * kTileK + t0);
  }
  void accumulate() {
    const float* vb = this->vblocks[this->block].data();
    const int64_t M = this->M, D = this->D;
    for (int64_t c0 = 0; c0 < D; c0 += 16)
      for (int64_t r0 = 0; r0 < M; r0 += kExtendRows)
        kPv[std::min<int64_t>(kExtendRows, M - r0)](this->S + r0 * kTileK, vb + c0, this->n, D, this->O + r0 * D + c0);
  }
};

}  // namespace rmk

#endif
