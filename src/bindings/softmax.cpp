// Bindings of softmax, log_softmax and their backward ops (which take the forward's output).
#include "kernels/softmax.cuh"
#include "bindings/rowwise.h"

namespace rownorm {
namespace {

Tensor SoftmaxForward(const char* name, const Tensor& x, int64_t dim, bool log) {
  dim = CheckRowwiseInput(name, x, dim);
  const DeviceScope scope(x);
  Tensor y = NewLike(x);
  if (x.numel() == 0) return y;
  const Problem<1> p = MakeProblem<1>({x}, dim);
  DispatchFloating(x.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    RunOp<T>(name, p, {y}, [&](auto acc) {
      using Acc = decltype(acc);
      return SoftmaxFwdOp<T, Acc>{log};
    });
  });
  return y;
}

Tensor SoftmaxBackward(const char* name, const Tensor& grad, const Tensor& y, int64_t dim,
                       bool log) {
  CheckFloating(name, "y", y);
  dim = CheckRowwiseInput(name, y, dim);
  CheckLike(name, "grad", grad, y);
  const DeviceScope scope(y);
  Tensor dx = NewLike(y);
  if (y.numel() == 0) return dx;
  const Problem<2> p = MakeProblem<2>({y, grad}, dim);
  DispatchFloating(y.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    RunOp<T>(name, p, {dx}, [&](auto acc) {
      using Acc = decltype(acc);
      return SoftmaxBwdOp<T, Acc>{log};
    });
  });
  return dx;
}

Tensor Softmax(Tensor x, int64_t dim) { return SoftmaxForward("softmax", x, dim, false); }
Tensor LogSoftmax(Tensor x, int64_t dim) { return SoftmaxForward("log_softmax", x, dim, true); }
Tensor SoftmaxBwd(Tensor grad, Tensor y, int64_t dim) {
  return SoftmaxBackward("softmax_backward", grad, y, dim, false);
}
Tensor LogSoftmaxBwd(Tensor grad, Tensor y, int64_t dim) {
  return SoftmaxBackward("log_softmax_backward", grad, y, dim, true);
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(rownorm, CPU, m) {
  m.impl("softmax", TORCH_BOX(&Softmax));
  m.impl("log_softmax", TORCH_BOX(&LogSoftmax));
  m.impl("softmax_backward", TORCH_BOX(&SoftmaxBwd));
  m.impl("log_softmax_backward", TORCH_BOX(&LogSoftmaxBwd));
}

STABLE_TORCH_LIBRARY_IMPL(rownorm, CUDA, m) {
  m.impl("softmax", TORCH_BOX(&Softmax));
  m.impl("log_softmax", TORCH_BOX(&LogSoftmax));
  m.impl("softmax_backward", TORCH_BOX(&SoftmaxBwd));
  m.impl("log_softmax_backward", TORCH_BOX(&LogSoftmaxBwd));
}

}  // namespace rownorm
