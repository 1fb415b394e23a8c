// Bindings of l2_normalize and l2_normalize_backward.
#include "kernels/l2_normalize.cuh"
#include "bindings/rowwise.h"

namespace rownorm {
namespace {

constexpr const char* kFwd = "l2_normalize";
constexpr const char* kBwd = "l2_normalize_backward";

Tensor L2Normalize(Tensor x, int64_t dim, double eps) {
  dim = CheckRowwiseInput(kFwd, "x", x, dim);
  CheckEps(kFwd, eps);
  return RunRowOp<L2NormalizeFwdOp>(kFwd, {x}, dim, eps);
}

Tensor L2NormalizeBackward(Tensor grad, Tensor x, int64_t dim, double eps) {
  dim = CheckRowwiseInput(kBwd, "x", x, dim);
  CheckEps(kBwd, eps);
  CheckLike(kBwd, "grad", grad, "x", x);
  return RunRowOp<L2NormalizeBwdOp>(kBwd, {x, grad}, dim, eps);
}

template <class Library>
void Impls(Library& m) {
  m.impl("l2_normalize", TORCH_BOX(&L2Normalize));
  m.impl("l2_normalize_backward", TORCH_BOX(&L2NormalizeBackward));
}

}  // namespace

ROWNORM_IMPL_CPU_AND_CUDA(Impls)

}  // namespace rownorm
