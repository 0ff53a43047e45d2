// A decode step's decoder layers in one call: the model's eager loop (model.py, hidden())
// for steps whose tokens are all decode tokens and whose attention is the cpu backend's
// decode kernel. Each linear runs on the form its weight was packed in: the tile kernels
// (gemm_f32.cpp under fp32, gemm_bf16.cpp under bf16), oneDNN's packed matmul (the op
// services/gpu_worker/weights.py calls from Python), or a plain at::linear. The same kernels
// run in the same order on the same tensors, so the result is the Python loop's bit for
// bit; what goes is ~9 Python calls a layer (their dispatch and argument checks) and the
// GIL, which the whole call runs without.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/linear.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <string_view>

#include "kernels.h"

namespace {

// oneDNN's matmul over its packed weight: torch's mkldnn::_linear_pointwise, as weights.py calls it
at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, std::string_view,
                            c10::List<std::optional<at::Scalar>>, std::optional<std::string_view>)>();
  return op.call(x, packed, bias, "none", c10::List<std::optional<at::Scalar>>(), std::nullopt);
}

// x @ w.T (+ bias) on w's form: tiles (3-d int32; the kernel of the activations' dtype: 16
// columns under fp32, 64 under bf16), oneDNN's packed layout, or a plain [out, in] weight
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, int64_t n_out, const c10::optional<at::Tensor>& bias) {
  if (w.is_mkldnn()) return onednn_linear(x, w, bias);
  if (w.dim() == 2) return at::linear(x, w, bias);
  return x.scalar_type() == at::kFloat ? linear_bf16w(x, w, n_out, bias) : linear_bf16(x, w, n_out, bias);
}

// checks one linear weight against its form's needs
void check_linear(const at::Tensor& w, at::ScalarType dtype) {
  if (w.is_mkldnn()) return;
  if (w.dim() == 2) {
    TORCH_CHECK(w.scalar_type() == dtype, "DecodeLayers: a plain weight in the activations' dtype");
    return;
  }
  const int64_t width = w.dim() == 3 && w.scalar_type() == at::kInt ? w.size(2) : 0;
  TORCH_CHECK((width == 16 && dtype == at::kFloat) || (width == 64 && dtype == at::kBFloat16),
              "DecodeLayers: a linear must be libs.kernels.gemm tiles for the activations' dtype (16 columns "
              "under fp32, 64 under bf16), oneDNN's packed weight or a plain one");
}

constexpr size_t kWeights = 6, kLinears = 4;  // per layer: the order DecodeLayers' constructor takes

}  // namespace

DecodeLayers::DecodeLayers(const std::vector<at::Tensor>& weights, const std::vector<c10::optional<at::Tensor>>& biases,
                           const std::vector<int64_t>& n_out, const std::vector<at::Tensor>& kpools,
                           const std::vector<at::Tensor>& vpools, int64_t heads, int64_t kv_heads, int64_t head_dim,
                           double eps)
    : heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim), eps_(eps) {
  const size_t L = kpools.size();
  TORCH_CHECK(L > 0 && vpools.size() == L && weights.size() == kWeights * L && biases.size() == kLinears * L &&
                  n_out.size() == kLinears * L,
              "DecodeLayers: per layer 6 weights, 4 biases, 4 output widths, one K and one V pool");
  TORCH_CHECK(heads > 0 && kv_heads > 0 && head_dim > 0 && heads % kv_heads == 0, "DecodeLayers: bad head shape");
  TORCH_CHECK(n_out[0] == (heads + 2 * kv_heads) * head_dim, "DecodeLayers: qkv's width is not the heads'");
  dtype_ = weights[0].scalar_type();  // NOTE: the norms are in the activations' dtype
  TORCH_CHECK(dtype_ == at::kFloat || dtype_ == at::kBFloat16 || dtype_ == at::kHalf,
              "DecodeLayers: fp32, bf16 or fp16 activations");
  for (size_t i = 0; i < L; ++i) {
    const at::Tensor* w = weights.data() + kWeights * i;
    const int64_t* n = n_out.data() + kLinears * i;
    const c10::optional<at::Tensor>* b = biases.data() + kLinears * i;
    for (const at::Tensor* t : {w + 1, w + 2, w + 4, w + 5}) check_linear(*t, dtype_);
    TORCH_CHECK(w[0].scalar_type() == dtype_ && w[3].scalar_type() == dtype_, "DecodeLayers: norms in one dtype");
    TORCH_CHECK(kpools[i].dim() == 3 && kpools[i].size(1) == kv_heads && kpools[i].size(2) == head_dim,
                "DecodeLayers: pools must be [slots, kv_heads, head_dim]");
    layers_.push_back(Layer{w[0], w[1], w[2], w[3], w[4], w[5], b[0], b[1], b[2], b[3], n[0], n[1], n[2], n[3],
                            kpools[i], vpools[i]});
  }
}

at::Tensor DecodeLayers::run(at::Tensor x, const at::Tensor& positions, const at::Tensor& cos, const at::Tensor& sin,
                             const at::Tensor& slots, const at::Tensor& table, const at::Tensor& rows,
                             const at::Tensor& lens, const at::Tensor& tokens, double scale) const {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == dtype_,
              "DecodeLayers.run: x must be contiguous [T, hidden] rows of the linears' activation dtype");
  const int64_t T = x.size(0), D = head_dim_, qw = heads_ * D, kw = kv_heads_ * D;
  at::Tensor h = rmsnorm(x, layers_[0].input_norm, eps_);
  at::Tensor mlp;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& l = layers_[i];
    at::Tensor qkv = linear(h, l.qkv, l.n_qkv, l.qkv_bias);
    rope_qk_(qkv, positions, cos, sin, heads_ + kv_heads_, D);
    at::Tensor kpool = l.k, vpool = l.v;  // NOTE: handles: the kernel writes the pools' storage
    store_kv_(kpool, vpool, slots,
              qkv.narrow(1, qw, kw).view({T, kv_heads_, D}), qkv.narrow(1, qw + kw, kw).view({T, kv_heads_, D}));
    const at::Tensor q = qkv.narrow(1, 0, qw).view({T, heads_, D}).contiguous();
    at::Tensor attn = at::empty_like(q);
    paged_decode_into(q, l.k, l.v, table, rows, lens, tokens, scale, attn);
    at::Tensor o = linear(attn.view({T, qw}), l.o, l.n_o, l.o_bias);
    add_rmsnorm_(x, o, l.post_norm, eps_);  // x += o; o = RMSNorm(x)
    mlp = linear(silu_mul(linear(o, l.gate_up, l.n_gate_up, l.gate_up_bias)), l.down, l.n_down, l.down_bias);
    if (i + 1 < layers_.size()) {
      add_rmsnorm_(x, mlp, layers_[i + 1].input_norm, eps_);  // the next layer's input, as model.py fuses it
      h = mlp;
    }
  }
  return x.add(mlp);  // NOTE: x + mlp, whose operator lives in a header ten times the size
}
