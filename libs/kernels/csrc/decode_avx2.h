// The decode kernel's inner loops on AVX2 + FMA (CPUs without AVX-512), for head dims
// D = 8 * C and G query heads per kv head: scores of four keys at a time (no horizontal
// sum per key: four keys' accumulators fold into one vector of four scores), and P . V
// with each V row read once for the G heads, accumulators in registers over a block.
//
// Before these, an AVX2 CPU ran the plain loops (decode_vec.h). Against them, on 2 Zen 3
// cores, fp32, 320-token contexts: 1.4-1.9x where the step's KV is in cache (batch 1: 1.6
// against 2.8 ms for 30 layers); where it comes from DRAM (batch 32, 64) both go at the
// pace of the scattered rows' reads, ~12 GB/s.
#pragma once

#include "rows.h"

#if defined(RMK_ROWS_AVX2)
#define RMK_DECODE_AVX2 1

namespace rmk {

// [sum a[0], sum a[1], sum a[2], sum a[3]]
inline __m128 hsum4(const __m256* a) {
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// out[g * stride + i] = q_g . K(kr[i] + off) for i < 4 and G heads (q [G, D] fp32): 4 x G
// accumulators, G query chunks and a key chunk in registers (G <= 3)
template <int C, int G, typename T>
inline void qk4(const float* q, const T* const* kr, int64_t off, float* out, int64_t stride) {
  static_assert(G <= 3, "more heads than the registers hold: split them");
  __m256 a[G][4];
  RMK_UNROLL
  for (int g = 0; g < G; ++g)
    RMK_UNROLL
    for (int i = 0; i < 4; ++i) a[g][i] = _mm256_setzero_ps();
  for (int c = 0; c < C; ++c) {
    __m256 qv[G];
    RMK_UNROLL
    for (int g = 0; g < G; ++g) qv[g] = _mm256_loadu_ps(q + g * 8 * C + 8 * c);
    RMK_UNROLL
    for (int i = 0; i < 4; ++i) {
      const __m256 kv = rows::load8(kr[i] + off + 8 * c);
      RMK_UNROLL
      for (int g = 0; g < G; ++g) a[g][i] = _mm256_fmadd_ps(qv[g], kv, a[g][i]);
    }
  }
  RMK_UNROLL
  for (int g = 0; g < G; ++g) _mm_storeu_ps(out + g * stride, hsum4(a[g]));
}

// acc[g * D ...] += sum_t p[g * pstride + t] * V(slot t) for the G heads of one kv head
// (``base``: the head's offset in the pool), NC chunks of 8 per pass: the G x NC
// accumulators, the G probabilities and one chunk of the row fit the 16 registers (one
// more and GCC keeps an accumulator on the stack: a store and a load per key, a fifth of
// the kernel's time); the block's rows stay in L1 between passes
template <int C, int G, typename T>
inline void pv8(float* acc, const float* p, int64_t pstride, const T* base, const int64_t* slots, int64_t n,
                int64_t row) {
  constexpr int NC = G * 4 + G + 1 <= 16 ? 4 : 2;
  static_assert(C % NC == 0, "head dim: whole passes");
  for (int c0 = 0; c0 < C; c0 += NC) {
    __m256 a[G][NC];
    RMK_UNROLL
    for (int g = 0; g < G; ++g)
      RMK_UNROLL
      for (int c = 0; c < NC; ++c) a[g][c] = _mm256_loadu_ps(acc + g * 8 * C + 8 * (c0 + c));
    for (int64_t t = 0; t < n; ++t) {
      const T* vr = base + slots[t] * row + 8 * c0;
      __m256 pt[G];
      RMK_UNROLL
      for (int g = 0; g < G; ++g) pt[g] = _mm256_set1_ps(p[g * pstride + t]);
      RMK_UNROLL
      for (int c = 0; c < NC; ++c) {
        const __m256 x = rows::load8(vr + 8 * c);
        RMK_UNROLL
        for (int g = 0; g < G; ++g) a[g][c] = _mm256_fmadd_ps(pt[g], x, a[g][c]);
      }
    }
    RMK_UNROLL
    for (int g = 0; g < G; ++g)
      RMK_UNROLL
      for (int c = 0; c < NC; ++c) _mm256_storeu_ps(acc + g * 8 * C + 8 * (c0 + c), a[g][c]);
  }
}

}  // namespace rmk

#endif
