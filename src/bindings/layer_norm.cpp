// Bindings of layer_norm and layer_norm_backward.
#include "kernels/layer_norm.cuh"
#include "bindings/rowwise.h"

namespace rownorm {
namespace {

Tensor LayerNorm(Tensor x, std::optional<Tensor> weight, std::optional<Tensor> bias, int64_t dim,
                 double eps) {
  constexpr const char* kOp = "layer_norm";
  dim = CheckRowwiseInput(kOp, x, dim);
  CheckEps(kOp, eps);
  CheckParam(kOp, "weight", weight, x, dim);
  CheckParam(kOp, "bias", bias, x, dim);
  const DeviceScope scope(x);
  Tensor y = NewLike(x);
  if (x.numel() == 0) return y;
  const ScalarType pt = ParamDtype(x, {weight ? &*weight : nullptr, bias ? &*bias : nullptr});
  const std::optional<Tensor> w = ParamAs(weight, pt);
  const std::optional<Tensor> b = ParamAs(bias, pt);
  const Problem<1> p = MakeProblem<1>({x}, dim);
  DispatchFloating(x.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    DispatchParam<T>(pt, [&](auto wtag) {
      using W = decltype(wtag);
      RunOp<T>(kOp, p, {y}, [&](auto acc) {
        using Acc = decltype(acc);
        return LayerNormFwdOp<T, Acc, W>{static_cast<Acc>(eps), ParamPtr<W>(w), ParamPtr<W>(b)};
      });
    });
  });
  return y;
}

std::tuple<Tensor, Tensor, Tensor> LayerNormBackward(Tensor grad, Tensor x,
                                                     std::optional<Tensor> weight, int64_t dim,
                                                     double eps, bool weight_grad, bool bias_grad) {
  constexpr const char* kOp = "layer_norm_backward";
  dim = CheckRowwiseInput(kOp, x, dim);
  CheckEps(kOp, eps);
  CheckLike(kOp, "grad", grad, x);
  CheckParam(kOp, "weight", weight, x, dim);
  ROWNORM_CHECK(!weight_grad || weight.has_value(), kOp,
                ": weight_grad=True needs the weight, got weight=None");
  const DeviceScope scope(x);
  Tensor dx = NewLike(x);
  const ScalarType pt = ParamDtype(x, {weight ? &*weight : nullptr});
  const std::optional<Tensor> w = ParamAs(weight, pt);
  const Problem<2> p = MakeProblem<2>({x, grad}, dim);
  const std::array<Tensor, 2> grads = RowNormGrads<true>(
      kOp, p, dx, pt, weight_grad, bias_grad, [&](auto tag, auto wtag, auto acc, auto* stats) {
        using T = decltype(tag);
        using W = decltype(wtag);
        using Acc = decltype(acc);
        return LayerNormBwdOp<T, Acc, W>{static_cast<Acc>(eps), ParamPtr<W>(w), stats};
      });
  return {dx, grads[0], grads[1]};
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(rownorm, CPU, m) {
  m.impl("layer_norm", TORCH_BOX(&LayerNorm));
  m.impl("layer_norm_backward", TORCH_BOX(&LayerNormBackward));
}

STABLE_TORCH_LIBRARY_IMPL(rownorm, CUDA, m) {
  m.impl("layer_norm", TORCH_BOX(&LayerNorm));
  m.impl("layer_norm_backward", TORCH_BOX(&LayerNormBackward));
}

}  // namespace rownorm
