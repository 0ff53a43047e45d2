// Vector helpers for the row-wise kernels (ops.cpp, rope.cpp): 16 lanes of fp32 / bf16
// / fp16 loaded as fp32 under a mask (so any row length works), stored back rounded to
// nearest even, and ``round_to<T>``: a value rounded to T and widened again, which lets
// a kernel keep the rounding points of the torch version it replaces (torch rounds the
// result of every elementwise op to the tensor's dtype).
//
// NOTE: products go through ``mul``, the embedded-rounding form of the multiply: GCC
// would otherwise contract ``a * b - c * d`` into an FMA (the build uses -ffast-math),
// and the fp32 results would no longer be torch's bit for bit.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

#include "vec.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define RMK_ROWS_AVX512 1
#include <immintrin.h>

namespace rmk::rows {

inline __mmask16 tail(int64_t n) { return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1); }

inline __m512 load(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load(const c10::BFloat16* p, __mmask16 m) {
  const __m256i raw = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
inline __m512 load(const c10::Half* p, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }

// fp32 -> bf16 bits, round to nearest even (NaN stays NaN), as c10::BFloat16 does
inline __m256i bf16_bits(__m512 x) {
#if defined(__AVX512BF16__)
  const __m256bh h = _mm512_cvtneps_pbh(x);
  return reinterpret_cast<const __m256i&>(h);
#else
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  return _mm512_cvtepi32_epi16(r);
#endif
}
inline __m256i half_bits(__m512 x) { return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }

inline void store(float* p, __m512 x, __mmask16 m) { _mm512_mask_storeu_ps(p, m, x); }
inline void store(c10::BFloat16* p, __m512 x, __mmask16 m) { _mm256_mask_storeu_epi16(p, m, bf16_bits(x)); }
inline void store(c10::Half* p, __m512 x, __mmask16 m) { _mm256_mask_storeu_epi16(p, m, half_bits(x)); }

template <typename T>
inline __m512 round_to(__m512 x) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bf16_bits(x)), 16));
  } else if constexpr (std::is_same_v<T, c10::Half>) {
    return _mm512_cvtph_ps(half_bits(x));
  } else {
    return x;
  }
}

inline __m512 mul(__m512 a, __m512 b) { return _mm512_mul_round_ps(a, b, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }

// e^x within ~1 ulp over the whole range (inf past ~88.7, 0 below ~-100): Cephes' expf,
// x = n ln2 + r with ln2 split in two (Cody-Waite), so large |x| loses no bits (vec.h's
// exp512 is for a softmax's x <= 0 near 0, and drifts by |x| * 2^-24)
inline __m512 exp_full(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-100.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  for (const float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f})
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

// silu(g) = g / (1 + e^-g). NOTE: the embedded-rounding divide: -ffast-math turns a plain
// vector divide into a reciprocal estimate and a Newton step, less exact, and NaN at g / inf
inline __m512 silu(__m512 g) {
  const __m512 e = exp_full(_mm512_sub_ps(_mm512_setzero_ps(), g));
  return _mm512_div_round_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

}  // namespace rmk::rows
#endif
