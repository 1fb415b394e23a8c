// Bindings of softmax, log_softmax and their backward ops (which take the forward's output y).
#include "kernels/softmax.cuh"
#include "bindings/rowwise.h"

namespace rownorm {
namespace {

Tensor SoftmaxForward(const char* name, const Tensor& x, int64_t dim, bool log) {
  dim = CheckRowwiseInput(name, "x", x, dim);
  return RunRowOp<SoftmaxFwdOp>(name, {x}, dim, log);
}

Tensor SoftmaxBackward(const char* name, const Tensor& grad, const Tensor& y, int64_t dim,
                       bool log) {
  dim = CheckRowwiseInput(name, "y", y, dim);
  CheckLike(name, "grad", grad, "y", y);
  return RunRowOp<SoftmaxBwdOp>(name, {y, grad}, dim, log);
}

Tensor Softmax(Tensor x, int64_t dim) { return SoftmaxForward("softmax", x, dim, false); }
Tensor LogSoftmax(Tensor x, int64_t dim) { return SoftmaxForward("log_softmax", x, dim, true); }
Tensor SoftmaxBwd(Tensor grad, Tensor y, int64_t dim) {
  return SoftmaxBackward("softmax_backward", grad, y, dim, false);
}
Tensor LogSoftmaxBwd(Tensor grad, Tensor y, int64_t dim) {
  return SoftmaxBackward("log_softmax_backward", grad, y, dim, true);
}

template <class Library>
void Impls(Library& m) {
  m.impl("softmax", TORCH_BOX(&Softmax));
  m.impl("log_softmax", TORCH_BOX(&LogSoftmax));
  m.impl("softmax_backward", TORCH_BOX(&SoftmaxBwd));
  m.impl("log_softmax_backward", TORCH_BOX(&LogSoftmaxBwd));
}

}  // namespace

ROWNORM_IMPL_CPU_AND_CUDA(Impls)

}  // namespace rownorm
