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
//   k, v   [S, kv_heads, D]       one layer's pool
//   table  [R, max_len] int64, rows [B], lens [B] (keys 0 .. lens[b] - 1)
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels.h"
#include "decode_vec.h"
#include "vec.h"

namespace {

constexpr int64_t kBlock = 64;

struct DecodeShape {
  int64_t kv_heads, G, D;
  float scale;
};

// One request, kv heads [h0, h1): Hs = (h1 - h0) * G query heads.
template <typename T>
void decode_item(const T* q, const T* k, const T* v, const int64_t* slots, int64_t len,
                 const DecodeShape& s, int64_t h0, int64_t h1, T* out, std::vector<float>& buf) {
  const int64_t G = s.G, D = s.D, Hs = (h1 - h0) * G, row = s.kv_heads * s.D;
  buf.assign(Hs * D * 2 + Hs * kBlock + 2 * Hs, 0.0f);
  float* qf = buf.data();          // [Hs, D] scaled query
  float* acc = qf + Hs * D;         // [Hs, D] unnormalised output
  float* sc = acc + Hs * D;         // [Hs, kBlock] scores, then probabilities
  float* mx = sc + Hs * kBlock;     // [Hs] running max
  float* sum = mx + Hs;             // [Hs] running sum of exp
  rmk::widen(qf, q + h0 * G * D, Hs * D, s.scale);
  std::fill(mx, mx + Hs, std::numeric_limits<float>::lowest());  // NOTE: finite: built with -ffast-math
  const int64_t bytes = (h1 - h0) * D * static_cast<int64_t>(sizeof(T));
  for (int64_t start = 0; start < len; start += kBlock) {
    const int64_t n = std::min(kBlock, len - start);
    const int64_t* sl = slots + start;
    for (int64_t t = 0; t < n; ++t) {
      if (start + t + rmk::kAhead < len) rmk::prefetch_bytes(k + sl[t + rmk::kAhead] * row + h0 * D, bytes);
      rmk::prefetch_bytes(v + sl[t] * row + h0 * D, bytes);  // NOTE: read by this block's P . V
      const T* kr = k + sl[t] * row;
      for (int64_t h = h0; h < h1; ++h)
        rmk::qk_heads(qf + (h - h0) * G * D, kr + h * D, G, D, sc + (h - h0) * G * kBlock + t, kBlock);
    }
    for (int64_t j = 0; j < Hs; ++j) {
      float* p = sc + j * kBlock;
      const float m = std::max(mx[j], rmk::block_max(p, n, 1.0f));
      const float corr = std::exp(mx[j] - m);  // 0 on the first block
      sum[j] = sum[j] * corr + rmk::block_exp(p, n, 1.0f, m);
      mx[j] = m;
      if (corr != 1.0f) {
        float* a = acc + j * D;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) a[d] *= corr;
      }
    }
    for (int64_t h = h0; h < h1; ++h)
      rmk::pv_heads(acc + (h - h0) * G * D, sc + (h - h0) * G * kBlock, kBlock, v + h * D, sl, n, row, D, G);
  }
  for (int64_t j = 0; j < Hs; ++j) rmk::narrow(out + (h0 * G + j) * D, acc + j * D, D, 1.0f / sum[j]);
}

}  // namespace

void paged_decode_into(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& table,
                       const at::Tensor& rows, const at::Tensor& lens, const at::Tensor& tokens, double scale,
                       at::Tensor& out) {
  check_pool_args(q, k, v, table, out);
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
  const DecodeShape shape{kv_heads, Hq / kv_heads, D, static_cast<float>(scale)};
  // NOTE: whole requests per item when there are enough of them (rows read whole), else one kv head each
  const int64_t split = B >= 4 * at::get_num_threads() ? 1 : kv_heads;
  const int64_t per = kv_heads / split;
  const int64_t* table_p = table.data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_decode", [&] {
    const scalar_t* q_p = q.data_ptr<scalar_t>();
    const scalar_t* k_p = k.data_ptr<scalar_t>();
    const scalar_t* v_p = v.data_ptr<scalar_t>();
    scalar_t* o_p = out.data_ptr<scalar_t>();
    at::parallel_for(0, B * split, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> buf;
      for (int64_t item = begin; item < end; ++item) {
        const int64_t b = item / split, h0 = (item % split) * per;
        const int64_t t = direct ? b : tok_p[b];
        decode_item<scalar_t>(q_p + t * Hq * D, k_p, v_p, table_p + rows_p[b] * stride, lens_p[b], shape, h0,
                              h0 + per, o_p + t * Hq * D, buf);
      }
    });
  });
}
