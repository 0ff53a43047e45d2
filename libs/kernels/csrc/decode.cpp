// Decode attention read in place from the paged KV pool (one query token per request).
//
// A work item is one request and a range of its kv heads. It walks the request's
// slots in blocks of kBlock tokens (online softmax, flash-decoding style): the
// scores of every query head of the range for the block, then the block's V rows
// into fp32 accumulators. Each K and V row is read once for all the query heads
// that share its kv head (GQA); a slot's row holds every kv head contiguously, so
// with all heads in one item rows are read whole. Items run in parallel.
//
//   q, out [T, kv_heads * G, D]   token tokens[b] is request b's query (tokens empty: b)
//   k, v   [S, kv_heads, D]       one layer's pool: q's dtype, or bf16 under fp32 q (KV
//                                 kept in half the bytes where the model computes in fp32)
//   table  [R, max_len] int64, rows [B], lens [B] (keys 0 .. lens[b] - 1)
//   window > 0: each query sees only its ``window`` latest keys (its own included), so an
//   item walks keys max(0, lens[b] - window) .. lens[b] - 1 only; 0: every key
#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "decode_avx2.h"
#include "decode_bf16.h"
#include "decode_vec.h"
#include "kernels.h"
#include "vec.h"

namespace {

constexpr int64_t kBlock = 64;

struct DecodeShape {
  int64_t kv_heads, G, D;
  float scale;
};

// While key t is scored: K and V of key t + kFar into L2 and, with ``Near``, K of key
// t + kAhead and V of key t into L1 (read by the block's P . V); ``off`` is the first kv
// head's offset. NOTE: the AVX2 kernel asks for L2 only: on 2 Zen 3 cores the near ones
// cost more than they saved (bf16 pool, 9 query heads over 3: batch 8 with its KV in cache
// 78 -> 62 us, batch 1 from DRAM 18.5 -> 15.7 us, batch 64 from DRAM level)
template <bool Near = true, typename T>
inline void prefetch_rows(const T* k, const T* v, const int64_t* slots, int64_t t, int64_t len, int64_t row,
                          int64_t off, int64_t bytes) {
  if (Near && t + rmk::kAhead < len) rmk::prefetch_bytes(k + slots[t + rmk::kAhead] * row + off, bytes);
  if (t + rmk::kFar < len) {
    rmk::prefetch_l2(k + slots[t + rmk::kFar] * row + off, bytes);
    rmk::prefetch_l2(v + slots[t + rmk::kFar] * row + off, bytes);
  }
  if (Near) rmk::prefetch_bytes(v + slots[t] * row + off, bytes);
}

// The first kFar keys of an item: prefetch_rows runs ahead only within one item, so these
// would start as DRAM misses; asked into L2 while the item before runs (5-10% off a
// 32- or 64-request step's attention on 2 cores, kv rows read cold from DRAM)
template <typename T>
inline void prefetch_head(const T* k, const T* v, const int64_t* slots, int64_t len, int64_t row, int64_t off,
                          int64_t bytes) {
  for (int64_t t = 0; t < std::min(len, rmk::kFar); ++t) {
    rmk::prefetch_l2(k + slots[t] * row + off, bytes);
    rmk::prefetch_l2(v + slots[t] * row + off, bytes);
  }
}

// The online softmax's step for one head over a block of n scores p (scaled by ``scale``):
// p becomes exp(p * scale - m) for the new running max m, the running sum and the D
// accumulators are rescaled to m
inline void softmax_step(float* p, int64_t n, float scale, float& mx, float& sum, float* acc, int64_t D) {
  const float m = std::max(mx, rmk::block_max(p, n, scale));
  const float corr = std::exp(mx - m);  // 0 on the first block
  sum = sum * corr + rmk::block_exp(p, n, scale, m);
  mx = m;
  if (corr != 1.0f) {
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) acc[d] *= corr;
  }
}

// Per-item working memory: [Hs, D] accumulators, [Hs, kBlock] scores, running max and sum
struct ItemBuffers {
  float *acc, *sc, *mx, *sum, *extra;
  ItemBuffers(std::vector<float>& buf, int64_t Hs, int64_t D, int64_t extra_floats) {
    buf.assign(Hs * D + Hs * kBlock + 2 * Hs + extra_floats, 0.0f);
    acc = buf.data(), sc = acc + Hs * D, mx = sc + Hs * kBlock, sum = mx + Hs, extra = sum + Hs;
    std::fill(mx, mx + Hs, std::numeric_limits<float>::lowest());  // NOTE: finite: built with -ffast-math
  }
};

// One request, kv heads [h0, h1): Hs = (h1 - h0) * G query heads, its slots in blocks of
// kBlock keys: ``score(b, start, n)`` fills the block's scores b.sc[j * kBlock + t] from the
// scaled query b.extra [Hs, D], the online softmax runs, ``pv(b, start, n)`` adds the block's
// P . V to b.acc
template <typename T, typename Score, typename PV>
void decode_blocks(const T* q, int64_t len, const DecodeShape& s, int64_t h0, int64_t h1, T* out,
                   std::vector<float>& buf, Score&& score, PV&& pv) {
  const int64_t D = s.D, Hs = (h1 - h0) * s.G;
  ItemBuffers b(buf, Hs, D, Hs * D);
  rmk::widen(b.extra, q + h0 * s.G * D, Hs * D, s.scale);
  for (int64_t start = 0; start < len; start += kBlock) {
    const int64_t n = std::min(kBlock, len - start);
    score(b, start, n);
    for (int64_t j = 0; j < Hs; ++j) softmax_step(b.sc + j * kBlock, n, 1.0f, b.mx[j], b.sum[j], b.acc + j * D, D);
    pv(b, start, n);
  }
  for (int64_t j = 0; j < Hs; ++j) rmk::narrow(out + (h0 * s.G + j) * D, b.acc + j * D, D, 1.0f / b.sum[j]);
}

// decode_blocks with the widening loops (decode_vec.h): any head dim and group; Q the
// query's and output's type, T the pool's
template <typename Q, typename T>
void decode_item(const Q* q, const T* k, const T* v, const int64_t* slots, int64_t len,
                 const DecodeShape& s, int64_t h0, int64_t h1, Q* out, std::vector<float>& buf) {
  const int64_t G = s.G, D = s.D, row = s.kv_heads * s.D;
  const int64_t bytes = (h1 - h0) * D * static_cast<int64_t>(sizeof(T));
  auto score = [&](ItemBuffers& b, int64_t start, int64_t n) {
    for (int64_t t = 0; t < n; ++t) {
      prefetch_rows(k, v, slots, start + t, len, row, h0 * D, bytes);
      const T* kr = k + slots[start + t] * row;
      for (int64_t h = h0; h < h1; ++h)
        rmk::qk_heads(b.extra + (h - h0) * G * D, kr + h * D, G, D, b.sc + (h - h0) * G * kBlock + t, kBlock);
    }
  };
  auto pv = [&](ItemBuffers& b, int64_t start, int64_t n) {
    for (int64_t h = h0; h < h1; ++h)
      rmk::pv_heads(b.acc + (h - h0) * G * D, b.sc + (h - h0) * G * kBlock, kBlock, v + h * D, slots + start, n, row,
                    D, G);
  };
  decode_blocks(q, len, s, h0, h1, out, buf, score, pv);
}

#if defined(__AVX512BF16__)
// One block's scores for decode_item_pairs: the block's K and V row pointers (padded to 16
// with the last key), then sc[j * kBlock + t] = q_j . k_t, 16 keys at a time
template <int C, int G>
void score_block(const uint16_t* q, const uint16_t* K, const uint16_t* V, const int64_t* slots, int64_t start,
                 int64_t len, int64_t row, int64_t h0, int64_t H, const uint16_t** krow, const uint16_t** vrow,
                 float* sc) {
  constexpr int64_t D = 32 * C;
  const int64_t n = std::min(kBlock, len - start), n16 = (n + 15) / 16 * 16, bytes = H * D * 2;
  for (int64_t t = 0; t < n16; ++t) {  // NOTE: the padding's scores are not read
    const int64_t slot = slots[start + std::min(t, n - 1)];
    krow[t] = K + slot * row, vrow[t] = V + slot * row;
  }
  __m512 quads[4 * 4 * 8];
  for (int64_t t0 = 0; t0 < n16; t0 += 16) {
    for (int64_t i = 0; i < 4; ++i) {
      for (int64_t t = start + t0 + 4 * i; t < std::min(len, start + t0 + 4 * i + 4); ++t)
        prefetch_rows(K, V, slots, t, len, row, h0 * D, bytes);
      rmk::quad4<C, G>(q, H, krow + t0 + 4 * i, h0, quads + i);
    }
    rmk::scores16(quads, H * G, sc + t0, kBlock);
  }
}

// decode_item for a bf16 pool with D = 32 * C and G query heads per kv head, on the
// dot-product instruction (decode_bf16.h): the same blocks and online softmax, scores 16
// keys at a time, P . V over key pairs. The query stays unscaled bf16 (the scale is applied
// to the fp32 scores); up to 8 kv heads per item.
template <int C, int G>
void decode_item_pairs(const c10::BFloat16* q, const c10::BFloat16* k, const c10::BFloat16* v, const int64_t* slots,
                       int64_t len, const DecodeShape& s, int64_t h0, int64_t h1, c10::BFloat16* out,
                       std::vector<float>& buf) {
  constexpr int64_t D = 32 * C, kPairs = kBlock / 2;
  const int64_t H = h1 - h0, Hs = H * G, row = s.kv_heads * D;
  ItemBuffers b(buf, Hs, D, Hs * kPairs + D);
  auto* pb = reinterpret_cast<uint32_t*>(b.extra);  // [Hs, kPairs] probabilities as bf16 pairs
  float* tmp = b.extra + Hs * kPairs;               // [D] one head's output, in order
  const auto* qh = reinterpret_cast<const uint16_t*>(q) + h0 * G * D;
  const auto* K = reinterpret_cast<const uint16_t*>(k);
  const auto* V = reinterpret_cast<const uint16_t*>(v);
  const uint16_t* krow[kBlock];
  const uint16_t* vrow[kBlock];
  for (int64_t start = 0; start < len; start += kBlock) {
    const int64_t n = std::min(kBlock, len - start), n2 = (n + 1) / 2;
    score_block<C, G>(qh, K, V, slots, start, len, row, h0, H, krow, vrow, b.sc);
    for (int64_t j = 0; j < Hs; ++j) {
      float* p = b.sc + j * kBlock;
      softmax_step(p, n, s.scale, b.mx[j], b.sum[j], b.acc + j * D, D);
      if (n % 2) p[n] = 0.0f;  // NOTE: the odd last key's partner is the same row, weighted 0
      rmk::pair_probs(p, n2, pb + j * kPairs);
    }
    for (int64_t h = 0; h < H; ++h)
      rmk::pv_pairs<C, G>(b.acc + h * G * D, pb + h * G * kPairs, kPairs, vrow, (h0 + h) * D, n2);
  }
  for (int64_t j = 0; j < Hs; ++j) {
    rmk::unpermute(b.acc + j * D, D, tmp);
    rmk::narrow(out + (h0 * G + j) * D, tmp, D, 1.0f / b.sum[j]);
  }
}
#endif

#if defined(RMK_DECODE_AVX2)
// decode_blocks on AVX2 (decode_avx2.h) for D = 8 * C and G query heads per kv head: scores
// four keys at a time (a block's last four padded with its last key: those scores land past
// n, unread), P . V with each V row widened once for the G heads
template <typename Q, typename T, int C, int G>
void decode_item_avx2(const Q* q, const T* k, const T* v, const int64_t* slots, int64_t len, const DecodeShape& s,
                      int64_t h0, int64_t h1, Q* out, std::vector<float>& buf) {
  constexpr int64_t D = 8 * C;
  constexpr int GQ = G <= 3 ? G : G / 2;  // query heads per qk4 (its registers hold three)
  const int64_t Hs = (h1 - h0) * G, row = s.kv_heads * D, bytes = (h1 - h0) * D * static_cast<int64_t>(sizeof(T));
  auto score = [&](ItemBuffers& b, int64_t start, int64_t n) {
    const int64_t* sl = slots + start;
    for (int64_t t = 0; t < n; t += 4) {
      const T* kr[4];
      for (int64_t i = 0; i < 4; ++i) {
        if (t + i < n) prefetch_rows<false>(k, v, slots, start + t + i, len, row, h0 * D, bytes);
        kr[i] = k + sl[std::min(t + i, n - 1)] * row;
      }
      for (int64_t j = 0; j < Hs; j += GQ)  // NOTE: query heads j .. j + GQ - 1 share kv head h0 + j / G
        rmk::qk4<C, GQ>(b.extra + j * D, kr, (h0 + j / G) * D, b.sc + j * kBlock + t, kBlock);
    }
  };
  auto pv = [&](ItemBuffers& b, int64_t start, int64_t n) {
    for (int64_t h = h0; h < h1; ++h)
      rmk::pv8<C, G>(b.acc + (h - h0) * G * D, b.sc + (h - h0) * G * kBlock, kBlock, v + h * D, slots + start, n, row);
  };
  decode_blocks(q, len, s, h0, h1, out, buf, score, pv);
}
#endif

// A decode_item for these dtypes and shape: the dot-product one for bf16 q and pool where the
// CPU has it and the shape is instantiated, the AVX2 one on CPUs without AVX-512, else the
// widening loops
template <typename Q, typename T>
auto pick_item(const DecodeShape& s) {
  using Item = void (*)(const Q*, const T*, const T*, const int64_t*, int64_t, const DecodeShape&, int64_t, int64_t,
                        Q*, std::vector<float>&);
#if defined(__AVX512BF16__)
  if constexpr (std::is_same_v<Q, c10::BFloat16> && std::is_same_v<T, c10::BFloat16>) {
    if (s.kv_heads <= 8) {
      if (s.D == 64 && s.G == 1) return Item{decode_item_pairs<2, 1>};
      if (s.D == 64 && s.G == 2) return Item{decode_item_pairs<2, 2>};
      if (s.D == 64 && s.G == 3) return Item{decode_item_pairs<2, 3>};
      if (s.D == 64 && s.G == 4) return Item{decode_item_pairs<2, 4>};
      if (s.D == 128 && s.G == 1) return Item{decode_item_pairs<4, 1>};
      if (s.D == 128 && s.G == 2) return Item{decode_item_pairs<4, 2>};
    }
  }
#endif
#if defined(RMK_DECODE_AVX2)
  if constexpr (rmk::kWide<T>) {
    if (s.D == 64 && s.G == 1) return Item{decode_item_avx2<Q, T, 8, 1>};
    if (s.D == 64 && s.G == 2) return Item{decode_item_avx2<Q, T, 8, 2>};
    if (s.D == 64 && s.G == 3) return Item{decode_item_avx2<Q, T, 8, 3>};
    if (s.D == 64 && s.G == 4) return Item{decode_item_avx2<Q, T, 8, 4>};
    if (s.D == 128 && s.G == 1) return Item{decode_item_avx2<Q, T, 16, 1>};
    if (s.D == 128 && s.G == 2) return Item{decode_item_avx2<Q, T, 16, 2>};
    if (s.D == 128 && s.G == 4) return Item{decode_item_avx2<Q, T, 16, 4>};
  }
#endif
  return Item{decode_item<Q, T>};
}

struct DecodeArgs {
  const int64_t *table, *rows, *lens, *tokens;  // tokens: null where request b's query is token b
  int64_t B, Hq, stride, window;
  DecodeShape shape;

  // request b's first key: a window starts its slots (and shortens its length) there
  int64_t first_key(int64_t b) const { return window > 0 ? std::max<int64_t>(0, lens[b] - window) : 0; }
};

// Items (a request and a range of its kv heads) in parallel, the next item's first keys
// prefetched while one runs
template <typename Q, typename T>
void run_items(const Q* q, const T* k, const T* v, Q* out, const DecodeArgs& a) {
  const int64_t kv_heads = a.shape.kv_heads, D = a.shape.D;
  // NOTE: whole requests per item when there are enough of them (rows read whole), else one kv head each
  const int64_t split = a.B >= 4 * at::get_num_threads() ? 1 : kv_heads;
  const int64_t per = kv_heads / split, bytes = per * D * static_cast<int64_t>(sizeof(T));
  const auto item_fn = pick_item<Q, T>(a.shape);
  at::parallel_for(0, a.B * split, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> buf;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / split, h0 = (item % split) * per;
      const int64_t t = a.tokens ? a.tokens[b] : b;
      if (item + 1 < end) {
        const int64_t nb = (item + 1) / split, nh0 = ((item + 1) % split) * per, nlo = a.first_key(nb);
        prefetch_head(k, v, a.table + a.rows[nb] * a.stride + nlo, a.lens[nb] - nlo, kv_heads * D, nh0 * D, bytes);
      }
      const int64_t lo = a.first_key(b);  // NOTE: the items see a shorter row of slots, nothing else changes
      item_fn(q + t * a.Hq * D, k, v, a.table + a.rows[b] * a.stride + lo, a.lens[b] - lo, a.shape, h0, h0 + per,
              out + t * a.Hq * D, buf);
    }
  });
}

}  // namespace

void paged_decode_into(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& table,
                       const at::Tensor& rows, const at::Tensor& lens, const at::Tensor& tokens, double scale,
                       at::Tensor& out, int64_t window) {
  check_pool_args(q, k, v, table, out, /*bf16_pool_under_fp32=*/true);
  TORCH_CHECK(window >= 0, "window must be >= 0 (0: every key)");
  check_index(rows, "rows");
  check_index(lens, "lens");
  check_index(tokens, "tokens");
  const int64_t B = rows.size(0), Hq = q.size(1), D = q.size(2), kv_heads = k.size(1);
  const bool direct = tokens.numel() == 0;
  TORCH_CHECK(lens.size(0) == B && (direct ? q.size(0) == B : tokens.size(0) == B), "one query per request");
  const int64_t* rows_p = rows.data_ptr<int64_t>();
  const int64_t* lens_p = lens.data_ptr<int64_t>();
  const int64_t* tok_p = direct ? nullptr : tokens.data_ptr<int64_t>();
  const int64_t stride = table.size(1);
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(lens_p[b] >= 1 && lens_p[b] <= stride && rows_p[b] >= 0 && rows_p[b] < table.size(0),
                "row or length out of range");
    TORCH_CHECK(direct || (tok_p[b] >= 0 && tok_p[b] < q.size(0)), "token index out of range");
  }
  const DecodeArgs args{table.data_ptr<int64_t>(), rows_p, lens_p, tok_p, B, Hq, stride, window,
                        DecodeShape{kv_heads, Hq / kv_heads, D, static_cast<float>(scale)}};
  if (k.scalar_type() != q.scalar_type()) {  // check_pool_args: fp32 q over a bf16 pool
    run_items(q.data_ptr<float>(), k.data_ptr<c10::BFloat16>(), v.data_ptr<c10::BFloat16>(), out.data_ptr<float>(),
              args);
    return;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_decode", [&] {
    run_items(q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), args);
  });
}
