// The first decode kernel (v1), kept as the baseline the benchmarks compare against
// (backend ``cpu_v1``); decode.cpp is its successor.
//
// Decode attention straight from the paged KV pool, for the CPU.
//
// One query token per request attends to the request's slots, read in place
// from the pool: no gathered copy of K/V is ever written. Work is split over
// requests; each keeps its query heads and their scores in thread-local
// buffers, so every K and V row is read once. Built with -ffast-math (see
// cpu_ext.py): the reductions and exp vectorise; inputs are always finite.
//
//   q      [B, kv_heads * G, D]   (query head h uses kv head h / G)
//   k, v   [S, kv_heads, D]       one layer's pool
//   table  [R, max_len] int64    slot of every position of row r
//   rows   [B] int64, lens [B] int64
//   out    [B, kv_heads * G, D]  float32
#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>

#include "kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

template <typename T>
inline float to_float(T x) { return static_cast<float>(x); }

constexpr int64_t kAhead = 8;  // rows prefetched ahead: a scattered slot is a DRAM miss

template <typename T>
inline void prefetch_row(const T* p, int64_t n) {
  const char* c = reinterpret_cast<const char*>(p);
  for (int64_t off = 0; off < n * static_cast<int64_t>(sizeof(T)); off += 64) __builtin_prefetch(c + off);
}

// One request: all its query heads over its slots. A slot's K (and V) row holds
// every kv head ([kv_heads, D], contiguous), so rows are read whole and in the
// pool's own order (runs of page_size consecutive slots).
template <typename T>
void decode_request(const T* q, const T* k, const T* v, const int64_t* slots, int64_t len,
                    int64_t kv_heads, int64_t G, int64_t D, float scale, float* out,
                    std::vector<float>& qf, std::vector<float>& scores) {
  const int64_t Hq = kv_heads * G, row = kv_heads * D;
  qf.resize(Hq * D);
  scores.resize(Hq * len);
  for (int64_t i = 0; i < Hq * D; ++i) qf[i] = to_float(q[i]) * scale;
  for (int64_t l = 0; l < len; ++l) {
    const T* kr = k + slots[l] * row;
    if (l + kAhead < len) prefetch_row(k + slots[l + kAhead] * row, row);
    for (int64_t hq = 0; hq < Hq; ++hq) {
      const float* qh = qf.data() + hq * D;
      const T* kh = kr + (hq / G) * D;
      float s = 0.0f;
#pragma omp simd reduction(+ : s)
      for (int64_t d = 0; d < D; ++d) s += qh[d] * to_float(kh[d]);
      scores[hq * len + l] = s;
    }
  }
  for (int64_t hq = 0; hq < Hq; ++hq) {
    float* sh = scores.data() + hq * len;
    float m = std::numeric_limits<float>::lowest();
    for (int64_t l = 0; l < len; ++l) m = std::max(m, sh[l]);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t l = 0; l < len; ++l) {
      sh[l] = std::exp(sh[l] - m);
      sum += sh[l];
    }
    const float inv = 1.0f / sum;
    for (int64_t l = 0; l < len; ++l) sh[l] *= inv;
  }
  std::fill(out, out + Hq * D, 0.0f);
  for (int64_t l = 0; l < len; ++l) {
    const T* vr = v + slots[l] * row;
    if (l + kAhead < len) prefetch_row(v + slots[l + kAhead] * row, row);
    for (int64_t hq = 0; hq < Hq; ++hq) {
      const float p = scores[hq * len + l];
      const T* vh = vr + (hq / G) * D;
      float* oh = out + hq * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) oh[d] += p * to_float(vh[d]);
    }
  }
}

}  // namespace

at::Tensor paged_decode_v1(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor table, at::Tensor rows,
                           at::Tensor lens, double scale) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "q, k, v must be 3-d");
  TORCH_CHECK(q.is_contiguous() && k.is_contiguous() && v.is_contiguous(), "q, k, v must be contiguous");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type(), "dtype mismatch");
  TORCH_CHECK(table.scalar_type() == at::kLong && rows.scalar_type() == at::kLong &&
              lens.scalar_type() == at::kLong, "table, rows, lens must be int64");
  TORCH_CHECK(table.is_contiguous() && rows.is_contiguous() && lens.is_contiguous(), "indices must be contiguous");
  const int64_t B = q.size(0), Hq = q.size(1), D = q.size(2);
  const int64_t kv_heads = k.size(1);
  TORCH_CHECK(k.size(2) == D && Hq % kv_heads == 0, "head shapes do not match");
  TORCH_CHECK(rows.size(0) == B && lens.size(0) == B, "rows / lens must have one entry per query");
  const int64_t G = Hq / kv_heads;
  auto out = at::empty({B, Hq, D}, q.options().dtype(at::kFloat));
  const int64_t* table_p = table.data_ptr<int64_t>();
  const int64_t* rows_p = rows.data_ptr<int64_t>();
  const int64_t* lens_p = lens.data_ptr<int64_t>();
  const int64_t stride = table.size(1);
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(lens_p[b] >= 1 && lens_p[b] <= stride && rows_p[b] >= 0 && rows_p[b] < table.size(0),
                "row or length out of range");
  float* out_p = out.data_ptr<float>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_decode", [&] {
    const scalar_t* q_p = q.data_ptr<scalar_t>();
    const scalar_t* k_p = k.data_ptr<scalar_t>();
    const scalar_t* v_p = v.data_ptr<scalar_t>();
    at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> qf, scores;
      for (int64_t b = begin; b < end; ++b) {
        decode_request<scalar_t>(q_p + b * Hq * D, k_p, v_p, table_p + rows_p[b] * stride,
                                 lens_p[b], kv_heads, G, D, static_cast<float>(scale),
                                 out_p + b * Hq * D, qf, scores);
      }
    });
  });
  return out;
}
