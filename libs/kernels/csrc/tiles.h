// The two matmul-shaped steps of the extend kernel over one work item's tiles:
//   scores():     S [M, kTileK]  = Q [M, D] . K_block^T      (unscaled)
//   accumulate(): O [M, D]      += P [M, kTileK] . V_block     (P written over S)
//
// A key block is packed once per (request, kv head) and per thread, straight from
// the pool's slots, into the layout its product wants; the query tiles of the same
// request and head that follow on this thread reuse it (blocks[i] holds keys
// i * kTileK ...). AmxTiles: bf16, VNNI-packed for oneDNN's brgemm (AMX where the
// CPU has it); DotTiles (dot_tiles.h): the same packing on AVX512-BF16's dot products.
// LoopTiles: fp32 loops the compiler vectorises, for any dtype (the pool's, KT, may differ from the query's).
#pragma once

#include <ATen/native/CPUBlas.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "vec.h"

namespace rmk {

#ifndef RMK_TILE_K
#define RMK_TILE_K 128
#endif
constexpr int64_t kTileK = RMK_TILE_K;

// brgemm may be used where it is usable (set_brgemm: tests turn it off on AMX CPUs, so the
// paths AMX takes over, dot_tiles.h's, run there too)
inline std::atomic<bool>& brgemm_allowed() {
  static std::atomic<bool> allowed{true};
  return allowed;
}

// brgemm in bf16 is usable (oneDNN's ukernel with VNNI packing on this CPU) and allowed
inline bool brgemm_usable() {
  static const bool ok = at::native::cpublas::could_pack(at::kBFloat16);
  return ok && brgemm_allowed().load(std::memory_order_relaxed);
}

// Per-thread working set of one item: Q rows, S/P, O, softmax state, packed blocks.
template <typename QT, typename KT>
struct TileBase {
  int64_t M = 0, D, n = 0, block = 0;
  std::vector<QT> Q;
  std::vector<float> S_, O_, state;
  float *S, *O, *mx, *sum;
  std::vector<std::vector<KT>> kblocks, vblocks;  // packed blocks of the current (request, head)
  int64_t packed = 0;                            // how many blocks are valid
  const int64_t* cached_slots = nullptr;

  TileBase(int64_t Mmax, int64_t D_) : D(D_), Q(Mmax * D_), S_(Mmax * kTileK), O_(Mmax * D_), state(2 * Mmax) {
    S = S_.data(), O = O_.data(), mx = state.data(), sum = mx + Mmax;
  }
  void begin(int64_t M_) {
    M = M_;
    std::fill(O, O + M * D, 0.0f);
    std::fill(mx, mx + M, std::numeric_limits<float>::lowest());
    std::fill(sum, sum + M, 0.0f);
  }
  // The packed block for keys k0 ... (``slots`` is the row's slot list, ``head`` the kv head's
  // base pointers): true when it has to be packed now.
  bool select(const int64_t* row_slots, const void* head, int64_t k0, int64_t n_, int64_t kbytes, int64_t vbytes) {
    n = n_, block = k0 / kTileK;
    if (row_slots != cached_slots || head != cached_head) cached_slots = row_slots, cached_head = head, packed = 0;
    if (block < packed && sizes[block] == n) return false;
    if (static_cast<int64_t>(kblocks.size()) <= block) {
      kblocks.resize(block + 1), vblocks.resize(block + 1), sizes.resize(block + 1);
    }
    kblocks[block].resize(kbytes), vblocks[block].resize(vbytes), sizes[block] = n;
    // NOTE: a window may start past blocks never packed for this (request, head): not valid
    for (int64_t i = packed; i < block; ++i) sizes[i] = -1;
    packed = block + 1;
    return true;
  }

 private:
  const void* cached_head = nullptr;
  std::vector<int64_t> sizes;
};

template <typename T, typename KT = T>
struct LoopTiles : TileBase<float, float> {
  LoopTiles(int64_t Mmax, int64_t D_) : TileBase(Mmax, D_) {}
  void begin(int64_t M_, int64_t) { TileBase::begin(M_); }
  void load_q(int64_t r, const T* src) { widen(Q.data() + r * D, src, D); }
  void release() {}

  // K block transposed [D, kTileK] (scores vectorise over keys), V block [kTileK, D]
  void load_kv(const KT* kh, const KT* vh, const int64_t* row_slots, int64_t k0, int64_t n_, int64_t row) {
    if (!select(row_slots, kh, k0, n_, D * kTileK, kTileK * D)) return;
    float* kt = kblocks[block].data();
    float* vb = vblocks[block].data();
    const int64_t* sl = row_slots + k0;
    for (int64_t t = 0; t < n; ++t) {
      const KT* kr = kh + sl[t] * row;
      for (int64_t d = 0; d < D; ++d) kt[d * kTileK + t] = to_f(kr[d]);
      widen(vb + t * D, vh + sl[t] * row, D);
    }
  }
  void scores() {
    const float* kt = kblocks[block].data();
    for (int64_t r = 0; r < M; ++r) {
      float acc[kTileK] = {0.0f};
      const float* q = Q.data() + r * D;
      for (int64_t d = 0; d < D; ++d) {
        const float qd = q[d];
        const float* kd = kt + d * kTileK;
#pragma omp simd
        for (int64_t t = 0; t < kTileK; ++t) acc[t] += qd * kd[t];
      }
      std::memcpy(S + r * kTileK, acc, sizeof(acc));
    }
  }
  void accumulate() {
    const float* vb = vblocks[block].data();
    for (int64_t r = 0; r < M; ++r) pv_row(O + r * D, S + r * kTileK, vb, n, D);
  }
};

// bf16 blocks packed in VNNI pairs, P rounded to bf16: the layout of both native bf16
// paths, AmxTiles (oneDNN's brgemm) and DotTiles (AVX512-BF16, dot_tiles.h)
struct VnniTiles : TileBase<c10::BFloat16, c10::BFloat16> {
  std::vector<c10::BFloat16> P;
  VnniTiles(int64_t Mmax, int64_t D_) : TileBase(Mmax, D_), P(Mmax * kTileK) {}
  void begin(int64_t M_, int64_t) { TileBase::begin(M_); }
  void load_q(int64_t r, const c10::BFloat16* src) { std::memcpy(Q.data() + r * D, src, D * sizeof(c10::BFloat16)); }

  // K^T in VNNI [D/2, kTileK, 2]: each key's (d, d+1) pair, keys side by side; V in VNNI
  // [kTileK/2, D, 2]: rows t and t + 1 interleaved. Keys past n are zero.
  void load_kv(const c10::BFloat16* kh, const c10::BFloat16* vh, const int64_t* row_slots, int64_t k0, int64_t n_,
               int64_t row) {
    if (!select(row_slots, kh, k0, n_, D * kTileK, kTileK * D)) return;
    auto* kv = reinterpret_cast<uint32_t*>(kblocks[block].data());
    auto* vv = reinterpret_cast<uint16_t*>(vblocks[block].data());
    const int64_t* sl = row_slots + k0;
    if (n < kTileK) {
      std::fill(kblocks[block].begin(), kblocks[block].end(), c10::BFloat16(0.0f));
      std::fill(vblocks[block].begin(), vblocks[block].end(), c10::BFloat16(0.0f));
    }
    for (int64_t t = 0; t < n; ++t) {
      const auto* kr = reinterpret_cast<const uint32_t*>(kh + sl[t] * row);
      for (int64_t p = 0; p < D / 2; ++p) kv[p * kTileK + t] = kr[p];
      const auto* vr = reinterpret_cast<const uint16_t*>(vh + sl[t] * row);
      uint16_t* dst = vv + (t / 2) * D * 2 + (t % 2);
      for (int64_t d = 0; d < D; ++d) dst[d * 2] = vr[d];
    }
  }
  void round_p() {
    for (int64_t r = 0; r < M; ++r) narrow(P.data() + r * kTileK, S + r * kTileK, kTileK);
  }
};

struct AmxTiles : VnniTiles {
  using VnniTiles::VnniTiles;
  void release() { at::native::cpublas::brgemm_release(); }
  void scores() {
    at::native::cpublas::brgemm(M, kTileK, D, D, kTileK, kTileK, false, Q.data(), kblocks[block].data(), S);
  }
  void accumulate() {
    round_p();
    at::native::cpublas::brgemm(M, D, kTileK, kTileK, D, D, true, P.data(), vblocks[block].data(), O);
  }
};

}  // namespace rmk
