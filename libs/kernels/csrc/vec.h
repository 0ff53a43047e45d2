// Small vector helpers for the attention kernels: rows of fp32 / bf16 / fp16
// read as fp32, dot products and axpy accumulated in fp32.
//
// With AVX-512 (the build uses -march=native) bf16 rows are widened to fp32 in
// registers (a bf16 is the top half of an fp32); without it, and for head dims
// that are not a multiple of 16, plain loops that the compiler vectorises.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

// NOTE: every loop over a micro-kernel's register accumulators unrolled: one left as a loop
// indexes the array at run time, and GCC then keeps it in memory, storing each accumulator
// every step (2x slower, seen in gemm_f32.cpp's disassembly)
#define RMK_UNROLL _Pragma("GCC unroll 8")

namespace rmk {

inline float to_f(float x) { return x; }
inline float to_f(c10::BFloat16 x) { return static_cast<float>(x); }
inline float to_f(c10::Half x) { return static_cast<float>(x); }

template <typename T>
inline T from_f(float x) { return static_cast<T>(x); }

// s = sum_d q[d] * k[d], q already in fp32
template <typename T>
inline float dot_generic(const float* q, const T* k, int64_t D) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t d = 0; d < D; ++d) s += q[d] * to_f(k[d]);
  return s;
}

// acc[d] += p * x[d]
template <typename T>
inline void axpy_generic(float* acc, float p, const T* x, int64_t D) {
#pragma omp simd
  for (int64_t d = 0; d < D; ++d) acc[d] += p * to_f(x[d]);
}

// the element types the vector loads widen to fp32
template <typename T>
constexpr bool kWide = std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16> || std::is_same_v<T, c10::Half>;

#if defined(__AVX2__)
// 8-lane pieces shared by exp256 below and rows.h's AVX2 build
inline float hsum8(__m256 a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// 2^n for integral n in [-126, 127], built in the exponent field
inline __m256 pow2i8(__m256 n) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
#endif

#if defined(__AVX512F__)
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::BFloat16* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
inline __m512 load16(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

template <typename T>
inline float dot(const float* q, const T* k, int64_t D) {
  if constexpr (!kWide<T>) {
    return dot_generic(q, k, D);
  } else {
    if (D % 32 != 0) return dot_generic(q, k, D);
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d += 32) {
      a0 = _mm512_fmadd_ps(_mm512_loadu_ps(q + d), load16(k + d), a0);
      a1 = _mm512_fmadd_ps(_mm512_loadu_ps(q + d + 16), load16(k + d + 16), a1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
  }
}

template <typename T>
inline void axpy(float* acc, float p, const T* x, int64_t D) {
  if constexpr (!kWide<T>) {
    axpy_generic(acc, p, x, D);
  } else {
    if (D % 16 != 0) return axpy_generic(acc, p, x, D);
    const __m512 pv = _mm512_set1_ps(p);
    for (int64_t d = 0; d < D; d += 16)
      _mm512_storeu_ps(acc + d, _mm512_fmadd_ps(pv, load16(x + d), _mm512_loadu_ps(acc + d)));
  }
}
#else
template <typename T>
inline float dot(const float* q, const T* k, int64_t D) { return dot_generic(q, k, D); }
template <typename T>
inline void axpy(float* acc, float p, const T* x, int64_t D) { axpy_generic(acc, p, x, D); }
#endif

// o[d] += sum_t p[t] * V[t * D + d] (V fp32 [n, D]): one row of P . V
inline void pv_row(float* o, const float* p, const float* V, int64_t n, int64_t D) {
#if defined(__AVX512F__)
  if (D % 64 == 0) {
    for (int64_t d = 0; d < D; d += 64) {  // NOTE: 4 accumulators stay in registers over t
      __m512 a0 = _mm512_loadu_ps(o + d), a1 = _mm512_loadu_ps(o + d + 16);
      __m512 a2 = _mm512_loadu_ps(o + d + 32), a3 = _mm512_loadu_ps(o + d + 48);
      for (int64_t t = 0; t < n; ++t) {
        const __m512 pt = _mm512_set1_ps(p[t]);
        const float* v = V + t * D + d;
        a0 = _mm512_fmadd_ps(pt, _mm512_loadu_ps(v), a0);
        a1 = _mm512_fmadd_ps(pt, _mm512_loadu_ps(v + 16), a1);
        a2 = _mm512_fmadd_ps(pt, _mm512_loadu_ps(v + 32), a2);
        a3 = _mm512_fmadd_ps(pt, _mm512_loadu_ps(v + 48), a3);
      }
      _mm512_storeu_ps(o + d, a0), _mm512_storeu_ps(o + d + 16, a1);
      _mm512_storeu_ps(o + d + 32, a2), _mm512_storeu_ps(o + d + 48, a3);
    }
    return;
  }
#endif
  for (int64_t t = 0; t < n; ++t) axpy_generic(o, p[t], V + t * D, D);
}

// dst[d] = to_f(src[d]) * scale
template <typename T>
inline void widen(float* dst, const T* src, int64_t n, float scale = 1.0f) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = to_f(src[i]) * scale;
}

template <typename T>
inline void narrow(T* dst, const float* src, int64_t n, float scale = 1.0f) {
  for (int64_t i = 0; i < n; ++i) dst[i] = from_f<T>(src[i] * scale);
}

template <>
inline void narrow<float>(float* dst, const float* src, int64_t n, float scale) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i] * scale;
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
// fp32 -> bf16 bits, round to nearest even, NaN stays NaN: c10::BFloat16's rounding exactly.
// NOTE: not _mm512_cvtneps_pbh: that instruction flushes denormal inputs to zero (and
// outputs), so its results differ from torch's wherever a value is below 2^-126.
inline __m256i bf16_rne(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  return _mm512_cvtepi32_epi16(r);
}

template <>
inline void narrow<c10::BFloat16>(c10::BFloat16* dst, const float* src, int64_t n, float scale) {
  const __m512 s = _mm512_set1_ps(scale);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = bf16_rne(_mm512_mul_ps(_mm512_loadu_ps(src + i), s));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), h);
  }
  for (; i < n; ++i) dst[i] = c10::BFloat16(src[i] * scale);
}
#endif

// max_t s[t] * scale (n >= 1)
inline float max_scaled(const float* s, int64_t n, float scale) {
  float m = s[0] * scale;
  for (int64_t t = 1; t < n; ++t) m = std::max(m, s[t] * scale);
  return m;
}

// s[t] = exp(s[t] * scale - m) for t < n; returns their sum
inline float exp_sum(float* s, int64_t n, float scale, float m) {
  float sum = 0.0f;
  for (int64_t t = 0; t < n; ++t) sum += (s[t] = std::exp(s[t] * scale - m));
  return sum;
}

// 2^f for |f| <= 1/2 by its degree-6 Taylor polynomial (relative error < 2e-7): the
// coefficients, highest degree first
constexpr float kExp2Poly[] = {1.5403530393381608e-4f, 1.3333558146428443e-3f, 9.6181291076284772e-3f,
                               5.5504108664821580e-2f, 2.4022650695910071e-1f, 6.9314718055994531e-1f, 1.0f};

#if defined(__AVX512F__)
// e^x for x <= 0: 2^(x log2 e) = 2^n * 2^f, |f| <= 1/2, 2^f by kExp2Poly, 2^n applied by
// scalef (underflows to 0)
inline __m512 exp512(__m512 x) {
  const __m512 t = _mm512_mul_ps(_mm512_max_ps(x, _mm512_set1_ps(-100.0f)), _mm512_set1_ps(1.4426950408889634f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(kExp2Poly[0]);
  for (int i = 1; i < 7; ++i) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2Poly[i]));
  return _mm512_scalef_ps(p, n);
}

inline float max_scaled_v(const float* s, int64_t n, float scale) {
  __m512 m = _mm512_set1_ps(std::numeric_limits<float>::lowest());
  int64_t t = 0;
  for (; t + 16 <= n; t += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(s + t));
  float r = _mm512_reduce_max_ps(m) * scale;  // NOTE: scale > 0
  for (; t < n; ++t) r = std::max(r, s[t] * scale);
  return r;
}

inline float exp_sum_v(float* s, int64_t n, float scale, float m) {
  const __m512 sc = _mm512_set1_ps(scale), mv = _mm512_set1_ps(m);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t t = 0; t < n; t += 16) {
    const __mmask16 k = n - t >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - t)) - 1);
    const __m512 e = exp512(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(k, s + t), sc, mv));
    _mm512_mask_storeu_ps(s + t, k, e);
    acc = _mm512_mask_add_ps(acc, k, acc, e);
  }
  return _mm512_reduce_add_ps(acc);
}
#define RMK_MAX_SCALED max_scaled_v
#define RMK_EXP_SUM exp_sum_v
#elif defined(__AVX2__) && defined(__FMA__)
// exp256: exp512 on 8 lanes; without scalef, 2^n goes into the exponent bits,
// so x is clamped at -87 (n >= -126: e^-87 ~ 1.6e-38 where exp512 gives 0, nothing a
// softmax's sum >= 1 can see)
inline __m256 exp256(__m256 x) {
  const __m256 t = _mm256_mul_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(1.4426950408889634f));
  const __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(t, n);
  __m256 p = _mm256_set1_ps(kExp2Poly[0]);
  for (int i = 1; i < 7; ++i) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExp2Poly[i]));
  return _mm256_mul_ps(p, pow2i8(n));
}

inline float max_scaled_v(const float* s, int64_t n, float scale) {
  __m256 m = _mm256_set1_ps(std::numeric_limits<float>::lowest());
  int64_t t = 0;
  for (; t + 8 <= n; t += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(s + t));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  float r = std::max(_mm_cvtss_f32(h), _mm_cvtss_f32(_mm_movehdup_ps(h))) * scale;  // NOTE: scale > 0
  for (; t < n; ++t) r = std::max(r, s[t] * scale);
  return r;
}

inline float exp_sum_v(float* s, int64_t n, float scale, float m) {
  const __m256 sc = _mm256_set1_ps(scale), mv = _mm256_set1_ps(m);
  __m256 acc = _mm256_setzero_ps();
  int64_t t = 0;
  for (; t + 8 <= n; t += 8) {
    const __m256 e = exp256(_mm256_fmsub_ps(_mm256_loadu_ps(s + t), sc, mv));
    _mm256_storeu_ps(s + t, e);
    acc = _mm256_add_ps(acc, e);
  }
  return hsum8(acc) + exp_sum(s + t, n - t, scale, m);
}
#define RMK_MAX_SCALED max_scaled_v
#define RMK_EXP_SUM exp_sum_v
#else
#define RMK_MAX_SCALED max_scaled
#define RMK_EXP_SUM exp_sum
#endif

// the softmax pieces the kernels call: vectorised where the CPU allows
inline float block_max(const float* s, int64_t n, float scale) { return RMK_MAX_SCALED(s, n, scale); }
inline float block_exp(float* s, int64_t n, float scale, float m) { return RMK_EXP_SUM(s, n, scale, m); }

constexpr int64_t kAhead = 8;  // rows prefetched ahead: a scattered slot is a DRAM miss

// One prefetch per 64-byte line of [p, p + bytes): into L1 (prefetcht0) or into L2
// (prefetcht1). Inline asm on x86: GCC's vectoriser drops __builtin_prefetch from the
// loops it vectorises (and a loop of prefetches alone is one), which left the decode
// kernel with none at all.
#if defined(__x86_64__)
#define RMK_PREFETCH_L1(c) asm volatile("prefetcht0 %0" : : "m"(*(c)))
#define RMK_PREFETCH_L2(c) asm volatile("prefetcht1 %0" : : "m"(*(c)))
#else
#define RMK_PREFETCH_L1(c) __builtin_prefetch((c), 0, 3)
#define RMK_PREFETCH_L2(c) __builtin_prefetch((c), 0, 2)
#endif

inline void prefetch_bytes(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t off = 0; off < bytes; off += 64) RMK_PREFETCH_L1(c + off);
}

// Rows this far ahead are asked into L2 (K and V alike), the near ones above into L1:
// more misses in flight than L1's fill buffers allow, which is what a walk over
// scattered slots is bound by.
constexpr int64_t kFar = 32;

inline void prefetch_l2(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t off = 0; off < bytes; off += 64) RMK_PREFETCH_L2(c + off);
}

}  // namespace rmk
