// Bindings of layer_norm, layer_norm_with_stats (the forward autograd runs: it also saves the
// per-row (μ, r)) and layer_norm_backward (which reads them).
#include "kernels/layer_norm.cuh"
#include "bindings/rowwise.h"

namespace rownorm {
namespace {

// The forward's checks, in the order of every op's; returns dim wrapped.
int64_t CheckLayerNorm(const char* op, const Tensor& x, const std::optional<Tensor>& weight,
                       const std::optional<Tensor>& bias, int64_t dim, double eps) {
  dim = CheckRowwiseInput(op, "x", x, dim);
  CheckEps(op, eps);
  CheckParam(op, "weight", weight, "x", x, dim);
  CheckParam(op, "bias", bias, "x", x, dim);
  return dim;
}

Tensor LayerNorm(Tensor x, std::optional<Tensor> weight, std::optional<Tensor> bias, int64_t dim,
                 double eps) {
  constexpr const char* kOp = "layer_norm";
  dim = CheckLayerNorm(kOp, x, weight, bias, dim, eps);
  return RunParamOp<LayerNormFwdOp>(kOp, {x}, dim, {weight, bias}, eps, RowStatsOut{nullptr})[0];
}

std::tuple<Tensor, Tensor> LayerNormWithStats(Tensor x, std::optional<Tensor> weight,
                                              std::optional<Tensor> bias, int64_t dim, double eps) {
  constexpr const char* kOp = "layer_norm_with_stats";
  dim = CheckLayerNorm(kOp, x, weight, bias, dim, eps);
  const Tensor stats = NewRowStats(x, dim);
  const Tensor y =
      RunParamOp<LayerNormFwdOp>(kOp, {x}, dim, {weight, bias}, eps, RowStatsOut{&stats})[0];
  return {y, stats};
}

std::tuple<Tensor, Tensor, Tensor> LayerNormBackward(Tensor grad, Tensor x, Tensor stats,
                                                     std::optional<Tensor> weight, int64_t dim,
                                                     bool weight_grad, bool bias_grad) {
  constexpr const char* kOp = "layer_norm_backward";
  dim = CheckRowwiseInput(kOp, "x", x, dim);
  CheckLike(kOp, "grad", grad, "x", x);
  const Tensor saved = RowStatsOf(kOp, "stats", stats, "x", x, dim);
  CheckParam(kOp, "weight", weight, "x", x, dim);
  CheckWeightGrad(kOp, weight, weight_grad);
  const DeviceScope scope(x);
  Tensor dx = NewLike(x);
  const ScalarType pt = ParamDtype(x, {weight});
  const std::optional<Tensor> w = ParamAs(weight, pt);
  const Problem<2> p = MakeProblem<2>({x, grad}, dim);
  // With a weight, dbias comes back in the weight's dtype too (the autograd formula passes
  // the weight in float32 where the bias is float32 and the weight 16-bit); without one, the
  // bias's dtype is not known here: float32.
  const std::array<Tensor, 2> g = RowNormGrads<true>(
      kOp, p, {dx}, pt, ParamGradDtype(x, pt, weight.has_value()), weight_grad, bias_grad,
      [&](auto tag, auto wtag, auto acc, auto*) {
        using Acc = decltype(acc);
        using W = decltype(wtag);
        // The fused path is instantiated with Acc = float for every T but runs on CUDA only,
        // where the statistics are float32 for every T but double.
        return LayerNormBwdOp<decltype(tag), Acc, W>{ParamPtr<W>(w),
                                                     static_cast<const Acc*>(saved.data_ptr())};
      },
      saved);
  return {dx, g[0], g[1]};
}

template <class Library>
void Impls(Library& m) {
  m.impl("layer_norm", TORCH_BOX(&LayerNorm));
  m.impl("layer_norm_with_stats", TORCH_BOX(&LayerNormWithStats));
  m.impl("layer_norm_backward", TORCH_BOX(&LayerNormBackward));
}

}  // namespace

ROWNORM_IMPL_CPU_AND_CUDA(Impls)

}  // namespace rownorm
