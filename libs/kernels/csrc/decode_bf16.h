// The decode kernel's inner loops on AVX512-BF16's dot instruction (vdpbf16ps: two bf16
// products added per fp32 lane), for a bf16 pool with head dim 64 or 128:
//
//   quad4(), scores16(): s[j][t] = q_j . k_t for 16 keys t and the query heads j of a
//                range of kv heads. The K row is used as it lies (bf16 pairs along D,
//                nothing widened); the 16 lane sums of each key are folded by a
//                transpose-add tree, so 16 scores cost ~45 shuffles and adds instead of
//                16 horizontal reductions.
//   pv_pairs():  acc_g += p_g[t] v_t + p_g[t+1] v_{t+1} for key pairs: two V rows are
//                interleaved into bf16 pairs once for all G heads, P is rounded to bf16 (as
//                in the extend kernel and in flash attention). The accumulators come out
//                with D permuted inside each 32-element chunk; unpermute() restores it.
//
// Products are exact in fp32 and summed in fp32, so the scores equal the widening loops'
// up to the order of the additions; P's rounding to bf16 (relative 2^-9) is the only
// new rounding, below the bf16 output's own.
#pragma once

#if defined(__AVX512BF16__)
#include <immintrin.h>

#include <cstdint>

namespace rmk {

inline __m512bh as_pairs(__m512i x) { return __builtin_bit_cast(__m512bh, x); }

// lane j of 128-bit lane L: the sum of 128-bit lane L of a, b, c, d for j = 0, 1, 2, 3
inline __m512 fold4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  const __m512d x = _mm512_castps_pd(ab), y = _mm512_castps_pd(cd);
  return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
}

// lane 4i + j: the whole sum of r_i's lanes of position j (r_i = fold4 of keys 4i .. 4i+3)
inline __m512 fold16(__m512 r0, __m512 r1, __m512 r2, __m512 r3) {
  const __m512 s01 = _mm512_add_ps(_mm512_shuffle_f32x4(r0, r1, 0x88), _mm512_shuffle_f32x4(r0, r1, 0xDD));
  const __m512 s23 = _mm512_add_ps(_mm512_shuffle_f32x4(r2, r3, 0x88), _mm512_shuffle_f32x4(r2, r3, 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(s01, s23, 0x88), _mm512_shuffle_f32x4(s01, s23, 0xDD));
}

// q . k as 16 fp32 lane sums, C = D / 32 vectors of bf16 pairs each
template <int C>
inline __m512 dot_lanes(const __m512bh* q, const uint16_t* k) {
  __m512 a = _mm512_dpbf16_ps(_mm512_setzero_ps(), q[0], as_pairs(_mm512_loadu_si512(k)));
#pragma GCC unroll 4
  for (int c = 1; c < C; ++c) a = _mm512_dpbf16_ps(a, q[c], as_pairs(_mm512_loadu_si512(k + 32 * c)));
  return a;
}

// quads[j * 4] = fold4 of the lane sums of query head j (of Hs = H * G heads, q: [Hs, 32 * C]
// bf16) against 4 keys, for kv heads h0 .. h0 + H - 1: rows[t] + h * 32 * C is key t's row of
// kv head h, so each key's heads are read together (the rows lie whole in the pool)
template <int C, int G>
inline void quad4(const uint16_t* q, int64_t H, const uint16_t* const* rows, int64_t h0, __m512* quads) {
  constexpr int64_t D = 32 * C;
  for (int64_t h = 0; h < H; ++h) {
    const int64_t off = (h0 + h) * D;
    for (int g = 0; g < G; ++g) {
      const int64_t j = h * G + g;
      __m512bh qv[C];
      for (int c = 0; c < C; ++c) qv[c] = as_pairs(_mm512_loadu_si512(q + j * D + 32 * c));
      quads[j * 4] = fold4(dot_lanes<C>(qv, rows[0] + off), dot_lanes<C>(qv, rows[1] + off),
                           dot_lanes<C>(qv, rows[2] + off), dot_lanes<C>(qv, rows[3] + off));
    }
  }
}

// s[j * stride + t] = q_j . k_t for t < 16 and the Hs query heads of quad4 (keys 4i .. 4i+3 at quads[j * 4 + i])
inline void scores16(const __m512* quads, int64_t Hs, float* s, int64_t stride) {
  for (int64_t j = 0; j < Hs; ++j)
    _mm512_storeu_ps(s + j * stride, fold16(quads[j * 4], quads[j * 4 + 1], quads[j * 4 + 2], quads[j * 4 + 3]));
}

// p as bf16 pairs (p[2i], p[2i + 1]) -> pb[i], for n2 pairs (p padded to an even count)
inline void pair_probs(const float* p, int64_t n2, uint32_t* pb) {
  int64_t i = 0;
  for (; i + 16 <= n2; i += 16) {
    const __m512bh h = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(p + 2 * i + 16), _mm512_loadu_ps(p + 2 * i));
    _mm512_storeu_si512(pb + i, reinterpret_cast<const __m512i&>(h));
  }
  for (; i < n2; ++i) {
    const __m128bh h = _mm_cvtneps_pbh(_mm_setr_ps(p[2 * i], p[2 * i + 1], 0.0f, 0.0f));
    pb[i] = static_cast<uint32_t>(_mm_cvtsi128_si32(reinterpret_cast<const __m128i&>(h)));
  }
}

// acc[g][2C vectors] += P_g . V over n2 key pairs (rows[2i], rows[2i + 1], + off: one kv
// head's rows); pb: [G, pstride] bf16 pairs; acc in the permuted order (unpermute)
template <int C, int G>
inline void pv_pairs(float* acc, const uint32_t* pb, int64_t pstride, const uint16_t* const* rows, int64_t off,
                     int64_t n2) {
  __m512 a[G][2 * C];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < 2 * C; ++c) a[g][c] = _mm512_loadu_ps(acc + (g * 2 * C + c) * 16);
  for (int64_t i = 0; i < n2; ++i) {
    const uint16_t* va = rows[2 * i] + off;
    const uint16_t* vb = rows[2 * i + 1] + off;
    __m512bh v[2 * C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      const __m512i x = _mm512_loadu_si512(va + 32 * c), y = _mm512_loadu_si512(vb + 32 * c);
      v[2 * c] = as_pairs(_mm512_unpacklo_epi16(x, y));
      v[2 * c + 1] = as_pairs(_mm512_unpackhi_epi16(x, y));
    }
    for (int g = 0; g < G; ++g) {
      const __m512bh pg = as_pairs(_mm512_set1_epi32(static_cast<int>(pb[g * pstride + i])));
      for (int c = 0; c < 2 * C; ++c) a[g][c] = _mm512_dpbf16_ps(a[g][c], pg, v[c]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < 2 * C; ++c) _mm512_storeu_ps(acc + (g * 2 * C + c) * 16, a[g][c]);
}

// d of accumulator lane: vector 2c (+1 for the high halves), lane 4L + j -> 32c + 8L + 4h + j
inline int64_t permuted_d(int64_t lane_index) {
  const int64_t vec = lane_index / 16, lane = lane_index % 16;
  return 32 * (vec / 2) + 8 * (lane / 4) + 4 * (vec % 2) + lane % 4;
}

// out[d] = acc[permuted index of d] for one head's D accumulators
inline void unpermute(const float* acc, int64_t D, float* out) {
  for (int64_t i = 0; i < D; ++i) out[permuted_d(i)] = acc[i];
}

}  // namespace rmk
#endif
