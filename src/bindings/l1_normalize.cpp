// Bindings of l1_normalize and l1_normalize_backward.
#include "kernels/l1_normalize.cuh"
#include "bindings/rowwise.h"

namespace rownorm {
namespace {

constexpr const char* kFwd = "l1_normalize";
constexpr const char* kBwd = "l1_normalize_backward";

Tensor L1Normalize(Tensor x, int64_t dim, double eps, bool mean) {
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
      return L1NormalizeFwdOp<T, Acc>{static_cast<Acc>(eps), mean};
    });
  });
  return y;
}

Tensor L1NormalizeBackward(Tensor grad, Tensor x, int64_t dim, double eps, bool mean) {
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
      return L1NormalizeBwdOp<T, Acc>{static_cast<Acc>(eps), mean};
    });
  });
  return dx;
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(rownorm, CPU, m) {
  m.impl("l1_normalize", TORCH_BOX(&L1Normalize));
  m.impl("l1_normalize_backward", TORCH_BOX(&L1NormalizeBackward));
}

STABLE_TORCH_LIBRARY_IMPL(rownorm, CUDA, m) {
  m.impl("l1_normalize", TORCH_BOX(&L1Normalize));
  m.impl("l1_normalize_backward", TORCH_BOX(&L1NormalizeBackward));
}

}  // namespace rownorm
