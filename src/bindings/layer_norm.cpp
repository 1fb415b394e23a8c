// Bindings of layer_norm and layer_norm_backward.
#include "kernels/layer_norm.cuh"
#include "bindings/rowwise.h"

namespace rownorm {
namespace {

Tensor LayerNorm(Tensor x, std::optional<Tensor> weight, std::optional<Tensor> bias, int64_t dim,
                 double eps) {
  constexpr const char* kOp = "layer_norm";
  dim = CheckRowwiseInput(kOp, "x", x, dim);
  CheckEps(kOp, eps);
  CheckParam(kOp, "weight", weight, "x", x, dim);
  CheckParam(kOp, "bias", bias, "x", x, dim);
  return RunParamOp<LayerNormFwdOp>(kOp, {x}, dim, {weight, bias}, eps)[0];
}

std::tuple<Tensor, Tensor, Tensor> LayerNormBackward(Tensor grad, Tensor x,
                                                     std::optional<Tensor> weight, int64_t dim,
                                                     double eps, bool weight_grad, bool bias_grad) {
  constexpr const char* kOp = "layer_norm_backward";
  dim = CheckWeightedBackward(kOp, grad, std::nullopt, "x", x, weight, dim, eps, weight_grad);
  const std::array<Tensor, 3> g =
      RunParamGrads<LayerNormBwdOp, true>(kOp, {x, grad}, dim, weight, eps, weight_grad, bias_grad);
  return {g[0], g[1], g[2]};
}

template <class Library>
void Impls(Library& m) {
  m.impl("layer_norm", TORCH_BOX(&LayerNorm));
  m.impl("layer_norm_backward", TORCH_BOX(&LayerNormBackward));
}

}  // namespace

ROWNORM_IMPL_CPU_AND_CUDA(Impls)

}  // namespace rownorm
