// Extend attention (prefill over a cached prefix) read in place from the paged KV pool.
//
// Request b's tokens starts[b] .. starts[b] + extend[b] - 1 sit at positions
// prefix[b] + j and attend causally to keys 0 .. prefix[b] + j, whose slots are
// table[rows[b], :] (the new tokens' K/V are already stored); under a window (> 0) to
// keys max(0, prefix[b] + j + 1 - window) .. prefix[b] + j only: an item's key blocks start
// at its first query's first key (rounded down to a block, so tiles share packed blocks). A work item is one
// request, one kv head and a tile of kTileQ (64) query tokens: its G query heads stacked
// into M = kTileQ * G rows (row r = token r / G, head r % G), so each key block is
// read once for all of them. Flash-attention style: per block of kTileK (128) keys the
// scores S = Q K^T, an online softmax, O += P V, all in fp32. The two products are
// matmul-shaped: bf16 on AMX through oneDNN's brgemm (tiles.h), else on AVX512-BF16's
// dot products (dot_tiles.h), fp32 on AVX2 register-blocked (extend_avx2.h), else fp32 loops.
#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "dot_tiles.h"
#include "extend_avx2.h"
#include "kernels.h"
#include "tiles.h"
#include "vec.h"

namespace {

using rmk::kTileK;
#ifndef RMK_TILE_Q
#define RMK_TILE_Q 64
#endif
constexpr int64_t kTileQ = RMK_TILE_Q;

struct Item {
  int64_t b, head, q0, nq;
};

struct Shape {
  int64_t kv_heads, G, D, Hq, stride;
  float scale;
  int64_t window;  // > 0: the keys a query sees at most; 0: all

  // the first key a query at ``pos`` sees
  int64_t first_key(int64_t pos) const { return window > 0 ? std::max<int64_t>(0, pos + 1 - window) : 0; }
};

// Row r's keys are [first[r], limit[r]) (first null: [0, limit[r])); mask the block [k0, k0 + n)
// and fold in the online softmax: P in place of S, O rescaled, running max / sum updated.
void softmax_block(float* S, float* O, float* mx, float* sum, const int64_t* first, const int64_t* limit, int64_t M,
                   int64_t k0, int64_t n, int64_t D, float scale) {
  for (int64_t r = 0; r < M; ++r) {
    float* s = S + r * kTileK;
    const int64_t valid = std::clamp<int64_t>(limit[r] - k0, 0, n);
    // NOTE: no call per row without a window (a row's work here is ~50 ns: an empty fill showed)
    const int64_t skip = first ? std::clamp<int64_t>(first[r] - k0, 0, valid) : 0;  // keys before the window
    if (skip) std::fill(s, s + skip, 0.0f), s += skip;
    const int64_t seen = valid - skip;
    const float m = seen ? std::max(mx[r], rmk::block_max(s, seen, scale)) : mx[r];
    const float corr = std::exp(mx[r] - m);
    const float add = seen ? rmk::block_exp(s, seen, scale, m) : 0.0f;
    std::fill(s + seen, S + (r + 1) * kTileK, 0.0f);
    sum[r] = sum[r] * corr + add;
    mx[r] = m;
    if (corr == 1.0f) continue;
    float* o = O + r * D;
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) o[d] *= corr;
  }
}

template <typename T, typename KT, typename Tiles>
void extend_item(const Item& it, const T* q, const KT* k, const KT* v, const int64_t* slots, int64_t prefix,
                 int64_t start, const Shape& s, T* out, Tiles& tiles) {
  const int64_t G = s.G, D = s.D, M = it.nq * G, row = s.kv_heads * D;
  tiles.begin(M, D);
  std::vector<int64_t> first(s.window > 0 ? M : 0), limit(M);
  for (int64_t r = 0; r < M; ++r) {
    const int64_t j = it.q0 + r / G;  // token j of the request
    if (s.window > 0) first[r] = s.first_key(prefix + j);
    limit[r] = prefix + j + 1;
    tiles.load_q(r, q + ((start + j) * s.Hq + it.head * G + r % G) * D);
  }
  const int64_t end = prefix + it.q0 + it.nq;
  const KT* kh = k + it.head * D;
  const KT* vh = v + it.head * D;
  const int64_t* firsts = s.window > 0 ? first.data() : nullptr;
  for (int64_t k0 = s.first_key(prefix + it.q0) / kTileK * kTileK; k0 < end; k0 += kTileK) {
    const int64_t n = std::min(kTileK, end - k0);
    tiles.load_kv(kh, vh, slots, k0, n, row);
    tiles.scores();
    softmax_block(tiles.S, tiles.O, tiles.mx, tiles.sum, firsts, limit.data(), M, k0, n, D, s.scale);
    tiles.accumulate();
  }
  for (int64_t r = 0; r < M; ++r) {
    const int64_t j = it.q0 + r / G;
    rmk::narrow(out + ((start + j) * s.Hq + it.head * G + r % G) * D, tiles.O + r * D, D, 1.0f / tiles.sum[r]);
  }
}

std::vector<Item> plan_items(const int64_t* extend, int64_t B, int64_t kv_heads) {
  std::vector<Item> items;
  // NOTE: a (request, head)'s tiles in a row, so a thread packs its key blocks once (tiles.h)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < kv_heads; ++h)
      for (int64_t q0 = 0; q0 < extend[b]; q0 += kTileQ) items.push_back({b, h, q0, std::min(kTileQ, extend[b] - q0)});
  return items;
}

// Item i's work: its query rows times the keys they read
inline int64_t item_cost(const Item& it, const int64_t* prefix, const Shape& s) {
  const int64_t end = prefix[it.b] + it.q0 + it.nq;
  return it.nq * (end - s.first_key(prefix[it.b] + it.q0) / kTileK * kTileK);
}

// parts + 1 bounds splitting items into contiguous runs of about equal cost (a causal
// prompt's later tiles read more keys: equal item counts left one thread ~15% more work
// at a 512-token prefill); contiguous, so a thread's tiles of a head still follow each other
std::vector<int64_t> balanced_bounds(const std::vector<Item>& items, const int64_t* prefix, const Shape& s,
                                     int64_t parts) {
  const int64_t n = static_cast<int64_t>(items.size());
  std::vector<int64_t> cum(n + 1, 0);
  for (int64_t i = 0; i < n; ++i) cum[i + 1] = cum[i] + item_cost(items[i], prefix, s);
  std::vector<int64_t> bounds(parts + 1, n);
  bounds[0] = 0;
  for (int64_t p = 1; p < parts; ++p) {
    const int64_t target = cum[n] * p / parts;  // the first item whose run ends past the target
    const int64_t i = std::upper_bound(cum.begin(), cum.end(), target) - cum.begin() - 1;
    const bool nearer_next = i < n && cum[i + 1] - target < target - cum[i];
    bounds[p] = std::max(bounds[p - 1], std::min(n, i + (nearer_next ? 1 : 0)));
  }
  return bounds;
}

template <typename T, typename Tiles, typename KT = T>
void run_items(const std::vector<Item>& items, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
               const int64_t* table, const int64_t* rows, const int64_t* prefix, const int64_t* starts,
               const Shape& s, at::Tensor& out) {
  const T* q_p = q.data_ptr<T>();
  const KT* k_p = k.data_ptr<KT>();
  const KT* v_p = v.data_ptr<KT>();
  T* o_p = out.data_ptr<T>();
  const int64_t parts = std::min<int64_t>(at::get_num_threads(), static_cast<int64_t>(items.size()));
  const auto bounds = balanced_bounds(items, prefix, s, parts);
  // NOTE: one part per thread (parallel_for gives each of `parts` threads one index)
  at::parallel_for(0, parts, 1, [&](int64_t begin, int64_t end) {
    Tiles tiles(kTileQ * s.G, s.D);
    for (int64_t i = bounds[begin]; i < bounds[end]; ++i) {
      const Item& it = items[i];
      extend_item<T, KT, Tiles>(it, q_p, k_p, v_p, table + rows[it.b] * s.stride, prefix[it.b], starts[it.b], s, o_p,
                            tiles);
    }
    tiles.release();
  });
}

}  // namespace

bool amx_bf16_available() { return rmk::brgemm_usable(); }

bool set_brgemm(bool allowed) { return rmk::brgemm_allowed().exchange(allowed); }

bool bf16_extend_available() {
#if defined(__AVX512BF16__)
  return true;
#else
  return rmk::brgemm_usable();
#endif
}

bool fp32_extend_available() {
#if defined(RMK_EXTEND_AVX2)
  return true;
#else
  return false;
#endif
}

void paged_extend_into(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& table,
                       const at::Tensor& rows, const at::Tensor& prefix, const at::Tensor& extend,
                       const at::Tensor& starts, double scale, at::Tensor& out, bool allow_brgemm,
                       int64_t window) {
  check_pool_args(q, k, v, table, out, /*bf16_pool_under_fp32=*/fp32_extend_available());
  TORCH_CHECK(window >= 0, "window must be >= 0 (0: every key)");
  for (const auto* t : {&rows, &prefix, &extend, &starts}) check_index(*t, "rows, prefix, extend, starts");
  const int64_t B = rows.size(0);
  TORCH_CHECK(prefix.size(0) == B && extend.size(0) == B && starts.size(0) == B, "one entry per request");
  const int64_t *rows_p = rows.data_ptr<int64_t>(), *pre_p = prefix.data_ptr<int64_t>();
  const int64_t *ext_p = extend.data_ptr<int64_t>(), *st_p = starts.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(rows_p[b] >= 0 && rows_p[b] < table.size(0) && pre_p[b] >= 0 && ext_p[b] >= 1 &&
                pre_p[b] + ext_p[b] <= table.size(1) && st_p[b] >= 0 && st_p[b] + ext_p[b] <= q.size(0),
                "request ", b, ": row, lengths or start out of range");
  const int64_t kv_heads = k.size(1);
  const Shape s{kv_heads, q.size(1) / kv_heads, q.size(2), q.size(1), table.size(1), static_cast<float>(scale),
                window};
  const auto items = plan_items(ext_p, B, kv_heads);
  const int64_t* table_p = table.data_ptr<int64_t>();
  const bool bf16 = q.scalar_type() == at::kBFloat16 && s.D % 32 == 0 && allow_brgemm;
  if (bf16 && rmk::brgemm_usable()) {
    run_items<at::BFloat16, rmk::AmxTiles>(items, q, k, v, table_p, rows_p, pre_p, st_p, s, out);
    return;
  }
#if defined(__AVX512BF16__)
  if (bf16 && rmk::DotTiles::takes(s.D)) {
    run_items<at::BFloat16, rmk::DotTiles>(items, q, k, v, table_p, rows_p, pre_p, st_p, s, out);
    return;
  }
#endif
#if defined(RMK_EXTEND_AVX2)
  if (k.scalar_type() != q.scalar_type()) {  // check_pool_args: fp32 q over a bf16 pool
    if (rmk::Avx2Tiles<float>::takes(s.D)) {
      run_items<float, rmk::Avx2Tiles<float, c10::BFloat16>, c10::BFloat16>(items, q, k, v, table_p, rows_p, pre_p,
                                                                            st_p, s, out);
    } else {
      run_items<float, rmk::LoopTiles<float, c10::BFloat16>, c10::BFloat16>(items, q, k, v, table_p, rows_p, pre_p,
                                                                            st_p, s, out);
    }
    return;
  }
  if (q.scalar_type() == at::kFloat && rmk::Avx2Tiles<float>::takes(s.D)) {
    run_items<float, rmk::Avx2Tiles<float>>(items, q, k, v, table_p, rows_p, pre_p, st_p, s, out);
    return;
  }
#endif
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_extend", [&] {
    run_items<scalar_t, rmk::LoopTiles<scalar_t>>(items, q, k, v, table_p, rows_p, pre_p, st_p, s, out);
  });
}
