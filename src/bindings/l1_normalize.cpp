// Bindings of l1_normalize and l1_normalize_backward.
#include "kernels/l1_normalize.cuh"
#include "bindings/rowwise.h"

namespace rownorm {
namespace {

constexpr const char* kFwd = "l1_normalize";
constexpr const char* kBwd = "l1_normalize_backward";

Tensor L1Normalize(Tensor x, int64_t dim, double eps, bool mean) {
  dim = CheckRowwiseInput(kFwd, "x", x, dim);
  CheckEps(kFwd, eps);
  return RunRowOp<L1NormalizeFwdOp>(kFwd, {x}, dim, eps, mean);
}

Tensor L1NormalizeBackward(Tensor grad, Tensor x, int64_t dim, double eps, bool mean) {
  dim = CheckRowwiseInput(kBwd, "x", x, dim);
  CheckEps(kBwd, eps);
  CheckLike(kBwd, "grad", grad, "x", x);
  return RunRowOp<L1NormalizeBwdOp>(kBwd, {x, grad}, dim, eps, mean);
}

template <class Library>
void Impls(Library& m) {
  m.impl("l1_normalize", TORCH_BOX(&L1Normalize));
  m.impl("l1_normalize_backward", TORCH_BOX(&L1NormalizeBackward));
}

}  // namespace

ROWNORM_IMPL_CPU_AND_CUDA(Impls)

}  // namespace rownorm
