// Bindings of l2_normalize and l2_normalize_backward.
#include "kernels/l2_normalize.cuh"
#include "bindings/rowwise.h"

namespace rownorm {
namespace {

constexpr const char* kFwd = "l2_normalize";
constexpr const char* kBwd = "l2_normalize_backward";

Tensor L2Normalize(Tensor x, int64_t dim, double eps) {
  dim = CheckRowwiseInput(kFwd, x, dim);
  CheckEps(kFwd, eps);
  const DeviceScope scope(x);
  Tensor y = NewLike(x);
  if (x.numel() == 0) return y;
  const Problem<1> p = MakeProblem<1>({x}, dim);
  DispatchFloating(x.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    RunOp<T>(kFwd, p, {y}, [&](auto acc) {
      using Acc = decltype(acc);
      return L2NormalizeFwdOp<T, Acc>{static_cast<Acc>(eps)};
    });
  });
  return y;
}

Tensor L2NormalizeBackward(Tensor grad, Tensor x, int64_t dim, double eps) {
  dim = CheckRowwiseInput(kBwd, x, dim);
  CheckEps(kBwd, eps);
  CheckLike(kBwd, "grad", grad, x);
  const DeviceScope scope(x);
  Tensor dx = NewLike(x);
  if (x.numel() == 0) return dx;
  const Problem<2> p = MakeProblem<2>({x, grad}, dim);
  DispatchFloating(x.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    RunOp<T>(kBwd, p, {dx}, [&](auto acc) {
      using Acc = decltype(acc);
      return L2NormalizeBwdOp<T, Acc>{static_cast<Acc>(eps)};
    });
  });
  return dx;
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(rownorm, CPU, m) {
  m.impl("l2_normalize", TORCH_BOX(&L2Normalize));
  m.impl("l2_normalize_backward", TORCH_BOX(&L2NormalizeBackward));
}

STABLE_TORCH_LIBRARY_IMPL(rownorm, CUDA, m) {
  m.impl("l2_normalize", TORCH_BOX(&L2Normalize));
  m.impl("l2_normalize_backward", TORCH_BOX(&L2NormalizeBackward));
}

}  // namespace rownorm
