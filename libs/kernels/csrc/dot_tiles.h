// The extend kernel's two products in bf16 with AVX512-BF16's dot instruction, for CPUs
// that have it but no AMX (oneDNN's brgemm takes bf16 only with AMX): vdpbf16ps adds two
// bf16 products per fp32 lane, so the packed layouts are AmxTiles' VNNI pairs (tiles.h):
//   scores():     S [M, kTileK] = Q [M, D] . K^T     lanes: 16 keys, pairs along D
//   accumulate(): O [M, D]     += P [M, kTileK] . V  lanes: 16 of D, pairs along keys
// Register blocks of R query rows x C vectors of 16 lanes, R * C = 16 accumulators.
#pragma once

#if defined(__AVX512BF16__)
#include <immintrin.h>

#include <cstdint>

#include "tiles.h"

namespace rmk {

static_assert(kTileK % 64 == 0, "scores() takes keys 64 at a time");

inline __m512bh bf16_pairs(__m512i x) { return reinterpret_cast<__m512bh&>(x); }

// s[r * kTileK + t] = q_r . k_t for R rows (q: bf16 pairs, half = D / 2 per row) and every key t
template <int R>
inline void qk_rows(const uint32_t* q, int64_t half, const uint32_t* k, float* s) {
  for (int64_t c0 = 0; c0 < kTileK; c0 += 64) {
    __m512 acc[R][4];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
    for (int64_t p = 0; p < half; ++p) {
      const uint32_t* kp = k + p * kTileK + c0;
      __m512bh kv[4];
      for (int c = 0; c < 4; ++c) kv[c] = bf16_pairs(_mm512_loadu_si512(kp + 16 * c));
      for (int r = 0; r < R; ++r) {
        const __m512bh qb = bf16_pairs(_mm512_set1_epi32(static_cast<int>(q[r * half + p])));
        for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], qb, kv[c]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < 4; ++c) _mm512_storeu_ps(s + r * kTileK + c0 + 16 * c, acc[r][c]);
  }
}

// o[r * D + d] += sum over key pairs of P (bf16 pairs, kTileK / 2 per row) . V pairs, R rows
template <int R, int C>
inline void pv_rows_bf16(const uint32_t* p, const uint32_t* v, int64_t pairs, float* o, int64_t D) {
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_loadu_ps(o + r * D + 16 * c);
  for (int64_t t2 = 0; t2 < pairs; ++t2) {
    __m512bh vv[C];
    for (int c = 0; c < C; ++c) vv[c] = bf16_pairs(_mm512_loadu_si512(v + t2 * D + 16 * c));
    for (int r = 0; r < R; ++r) {
      const __m512bh pb = bf16_pairs(_mm512_set1_epi32(static_cast<int>(p[r * (kTileK / 2) + t2])));
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], pb, vv[c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(o + r * D + 16 * c, acc[r][c]);
}

struct DotTiles : VnniTiles {
  using VnniTiles::VnniTiles;
  static bool takes(int64_t D) { return D == 32 || D == 64 || D == 96 || D == 128; }
  void release() {}

  void scores() {
    const auto* q = reinterpret_cast<const uint32_t*>(Q.data());
    const auto* k = reinterpret_cast<const uint32_t*>(kblocks[block].data());
    const int64_t half = D / 2;
    int64_t r = 0;
    for (; r + 4 <= M; r += 4) qk_rows<4>(q + r * half, half, k, S + r * kTileK);
    for (; r < M; ++r) qk_rows<1>(q + r * half, half, k, S + r * kTileK);
  }

  void accumulate() {
    round_p();
    switch (D / 16) {
      case 2: return accumulate_c<2>();
      case 4: return accumulate_c<4>();
      case 6: return accumulate_c<6>();
      default: return accumulate_c<8>();  // NOTE: takes() admits no other D
    }
  }

 private:
  template <int C>
  void accumulate_c() {
    constexpr int R = C <= 2 ? 8 : C <= 4 ? 4 : 2;
    const auto* p = reinterpret_cast<const uint32_t*>(P.data());
    const auto* v = reinterpret_cast<const uint32_t*>(vblocks[block].data());
    const int64_t pairs = (n + 1) / 2;  // NOTE: V rows past n are zero, so is P past each row's keys
    int64_t r = 0;
    for (; r + R <= M; r += R) pv_rows_bf16<R, C>(p + r * (kTileK / 2), v, pairs, O + r * D, D);
    for (; r < M; ++r) pv_rows_bf16<1, C>(p + r * (kTileK / 2), v, pairs, O + r * D, D);
  }
};

}  // namespace rmk
#endif
