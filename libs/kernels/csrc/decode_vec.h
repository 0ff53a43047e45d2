// The decode kernel's inner loops, register-blocked for head dims 64 and 128 with
// AVX-512 (a K or V row widened to fp32 once, accumulators kept in registers over
// a block of tokens); plain loops for other head dims and CPUs.
#pragma once

#include <cstdint>

#include "vec.h"

namespace rmk {

// out[g * stride] = q[g] . kr for the G query heads (q [G, D] fp32) of one kv head's K row
template <typename T>
inline void qk_heads_generic(const float* q, const T* kr, int64_t G, int64_t D, float* out, int64_t stride) {
  for (int64_t g = 0; g < G; ++g) out[g * stride] = dot(q + g * D, kr, D);
}

// acc[d] += sum_t p[t] * V(slot t)[d]; ``base`` is the kv head's offset in the pool
template <typename T>
inline void pv_rows_generic(float* acc, const float* p, const T* base, const int64_t* slots, int64_t n, int64_t row,
                            int64_t D) {
  for (int64_t t = 0; t < n; ++t) axpy(acc, p[t], base + slots[t] * row, D);
}

#if defined(__AVX512F__)
template <int D, typename T>
inline void qk_heads_d(const float* q, const T* kr, int64_t G, float* out, int64_t stride) {
  constexpr int C = D / 16;
  __m512 kx[C];
#pragma GCC unroll 8
  for (int c = 0; c < C; ++c) kx[c] = load16(kr + 16 * c);
  for (int64_t g = 0; g < G; ++g) {
    const float* qg = q + g * D;
    __m512 a = _mm512_mul_ps(_mm512_loadu_ps(qg), kx[0]);
#pragma GCC unroll 8
    for (int c = 1; c < C; ++c) a = _mm512_fmadd_ps(_mm512_loadu_ps(qg + 16 * c), kx[c], a);
    out[g * stride] = _mm512_reduce_add_ps(a);
  }
}

template <int D, typename T>
inline void pv_rows_d(float* acc, const float* p, const T* base, const int64_t* slots, int64_t n, int64_t row) {
  constexpr int C = D / 16;
  __m512 a[C];
#pragma GCC unroll 8
  for (int c = 0; c < C; ++c) a[c] = _mm512_loadu_ps(acc + 16 * c);
  for (int64_t t = 0; t < n; ++t) {
    const __m512 pt = _mm512_set1_ps(p[t]);
    const T* vr = base + slots[t] * row;
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) a[c] = _mm512_fmadd_ps(pt, load16(vr + 16 * c), a[c]);
  }
#pragma GCC unroll 8
  for (int c = 0; c < C; ++c) _mm512_storeu_ps(acc + 16 * c, a[c]);
}

// acc[g * D ...] += sum_t p[g * pstride + t] * V(slot t) for the G query heads of one kv
// head: each V row widened once for all of them (G x D/16 accumulators in registers)
template <int C, int G, typename T>
inline void pv_heads_d(float* acc, const float* p, int64_t pstride, const T* base, const int64_t* slots, int64_t n,
                       int64_t row) {
  __m512 a[G][C];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c) a[g][c] = _mm512_loadu_ps(acc + (g * C + c) * 16);
  for (int64_t t = 0; t < n; ++t) {
    const T* vr = base + slots[t] * row;
    __m512 vv[C];
    for (int c = 0; c < C; ++c) vv[c] = load16(vr + 16 * c);
    for (int g = 0; g < G; ++g) {
      const __m512 pt = _mm512_set1_ps(p[g * pstride + t]);
      for (int c = 0; c < C; ++c) a[g][c] = _mm512_fmadd_ps(pt, vv[c], a[g][c]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(acc + (g * C + c) * 16, a[g][c]);
}
#endif

template <typename T>
inline void qk_heads(const float* q, const T* kr, int64_t G, int64_t D, float* out, int64_t stride) {
#if defined(__AVX512F__)
  if constexpr (kWide<T>) {
    if (D == 64) return qk_heads_d<64>(q, kr, G, out, stride);
    if (D == 128) return qk_heads_d<128>(q, kr, G, out, stride);
  }
#endif
  qk_heads_generic(q, kr, G, D, out, stride);
}

template <typename T>
inline void pv_rows(float* acc, const float* p, const T* base, const int64_t* slots, int64_t n, int64_t row,
                    int64_t D) {
#if defined(__AVX512F__)
  if constexpr (kWide<T>) {
    if (D == 64) return pv_rows_d<64>(acc, p, base, slots, n, row);
    if (D == 128) return pv_rows_d<128>(acc, p, base, slots, n, row);
  }
#endif
  pv_rows_generic(acc, p, base, slots, n, row, D);
}

// pv_rows for the G query heads of one kv head (p and acc: head g at g * pstride, g * D)
template <typename T>
inline void pv_heads(float* acc, const float* p, int64_t pstride, const T* base, const int64_t* slots, int64_t n,
                     int64_t row, int64_t D, int64_t G) {
#if defined(__AVX512F__)
  if constexpr (kWide<T>) {
    if (D == 64 && G == 2) return pv_heads_d<4, 2>(acc, p, pstride, base, slots, n, row);
    if (D == 64 && G == 3) return pv_heads_d<4, 3>(acc, p, pstride, base, slots, n, row);
    if (D == 64 && G == 4) return pv_heads_d<4, 4>(acc, p, pstride, base, slots, n, row);
    if (D == 128 && G == 2) return pv_heads_d<8, 2>(acc, p, pstride, base, slots, n, row);
  }
#endif
  for (int64_t g = 0; g < G; ++g) pv_rows(acc + g * D, p + g * pstride, base, slots, n, row, D);
}

}  // namespace rmk
