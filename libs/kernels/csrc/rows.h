// Vector helpers for the row-wise kernels (ops.cpp, rope.cpp): ``kLanes`` lanes of fp32 /
// bf16 / fp16 loaded as fp32 under a tail mask (so any row length works), stored back
// rounded to nearest even, and ``round_to<T>``: a value rounded to T and widened again,
// which lets a kernel keep the rounding points of the torch version it replaces (torch
// rounds the result of every elementwise op to the tensor's dtype). One API, two
// builds: AVX-512 (16 lanes, masked loads) and AVX2 + FMA + F16C (8 lanes; a partial
// tail goes through a small buffer). RMK_ROWS_VEC says one of them is there.
//
// NOTE: products go through ``mul``, which the compiler may not fuse: GCC would
// otherwise contract ``a * b - c * d`` into an FMA (the build uses -ffast-math), and the
// fp32 results would no longer be torch's bit for bit. AVX-512 has the embedded-rounding
// multiply for that; AVX2 a register barrier after the multiply.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>

#include "vec.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define RMK_ROWS_AVX512 1
#define RMK_ROWS_VEC 1
#include <immintrin.h>

namespace rmk::rows {

constexpr int64_t kLanes = 16;
using vf = __m512;
using Mask = __mmask16;

inline __mmask16 tail(int64_t n) { return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1); }

inline __m512 load(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load(const c10::BFloat16* p, __mmask16 m) {
  const __m256i raw = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
inline __m512 load(const c10::Half* p, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }

// fp32 -> bf16 bits, round to nearest even (NaN stays NaN), as c10::BFloat16 does
inline __m256i bf16_bits(__m512 x) { return rmk::bf16_rne(x); }
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
inline __m512 add(__m512 a, __m512 b) { return _mm512_add_ps(a, b); }
inline __m512 sub(__m512 a, __m512 b) { return _mm512_sub_ps(a, b); }
inline __m512 fmadd(__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); }
inline __m512 zero() { return _mm512_setzero_ps(); }
inline __m512 set1(float x) { return _mm512_set1_ps(x); }
inline float hsum(__m512 x) { return _mm512_reduce_add_ps(x); }

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

#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define RMK_ROWS_AVX2 1
#define RMK_ROWS_VEC 1
#include <immintrin.h>

namespace rmk::rows {

constexpr int64_t kLanes = 8;
using vf = __m256;
using Mask = int;  // the lanes in use: 8, or fewer at a row's tail

inline Mask tail(int64_t n) { return n >= 8 ? 8 : static_cast<int>(n); }

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::BFloat16* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}
inline __m256 load8(const c10::Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

// a partial tail: copied into a zeroed buffer first (AVX2 has no 16-bit masked load)
template <typename T>
inline __m256 load(const T* p, Mask m) {
  if (m == 8) return load8(p);
  T buf[8];
  std::memset(static_cast<void*>(buf), 0, sizeof buf);
  std::memcpy(static_cast<void*>(buf), p, sizeof(T) * m);
  return load8(buf);
}

// fp32 -> bf16 bits, round to nearest even (NaN stays NaN), as c10::BFloat16 does
inline __m128i bf16_bits(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));  // NOTE: values < 2^16
}
inline __m128i half_bits(__m256 x) { return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }

inline void store8(float* p, __m256 x) { _mm256_storeu_ps(p, x); }
inline void store8(c10::BFloat16* p, __m256 x) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), bf16_bits(x)); }
inline void store8(c10::Half* p, __m256 x) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), half_bits(x)); }

template <typename T>
inline void store(T* p, __m256 x, Mask m) {
  if (m == 8) return store8(p, x);
  T buf[8];
  store8(buf, x);
  std::memcpy(static_cast<void*>(p), buf, sizeof(T) * m);
}

template <typename T>
inline __m256 round_to(__m256 x) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bf16_bits(x)), 16));
  } else if constexpr (std::is_same_v<T, c10::Half>) {
    return _mm256_cvtph_ps(half_bits(x));
  } else {
    return x;
  }
}

// NOTE: the empty asm hides the product from GCC, so it is never contracted into an FMA
inline __m256 mul(__m256 a, __m256 b) {
  __m256 r = _mm256_mul_ps(a, b);
  asm("" : "+x"(r));
  return r;
}
inline __m256 add(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
inline __m256 sub(__m256 a, __m256 b) { return _mm256_sub_ps(a, b); }
inline __m256 fmadd(__m256 a, __m256 b, __m256 c) { return _mm256_fmadd_ps(a, b, c); }
inline __m256 zero() { return _mm256_setzero_ps(); }
inline __m256 set1(float x) { return _mm256_set1_ps(x); }
inline float hsum(__m256 x) { return hsum8(x); }

// the AVX-512 exp_full's Cephes expf; 2^n applied as 2^h * 2^(n-h), h = floor(n / 2),
// both in range for |x| <= 100, so the result over- and underflows as scalef's does
inline __m256 exp_full(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, set1(-100.0f)), set1(100.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, set1(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, set1(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, set1(-2.12194440e-4f), r);
  __m256 p = set1(1.9875691500e-4f);
  for (const float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f})
    p = _mm256_fmadd_ps(p, r, set1(c));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, set1(1.0f)));
  const __m256 h = _mm256_floor_ps(_mm256_mul_ps(n, set1(0.5f)));
  return _mm256_mul_ps(_mm256_mul_ps(p, pow2i8(h)), pow2i8(_mm256_sub_ps(n, h)));
}

// silu(g) = g / (1 + e^-g). NOTE: the divide in asm: under -ffast-math GCC turns a vector
// divide into a reciprocal estimate and a Newton step (less exact, NaN at g / inf)
inline __m256 silu(__m256 g) {
  const __m256 d = _mm256_add_ps(set1(1.0f), exp_full(_mm256_sub_ps(_mm256_setzero_ps(), g)));
  __m256 r;
  asm("vdivps %2, %1, %0" : "=x"(r) : "x"(g), "x"(d));
  return r;
}

}  // namespace rmk::rows
#endif
