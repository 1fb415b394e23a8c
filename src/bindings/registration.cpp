// The one registration block: every schema of the rownorm namespace. Implementations are
// registered per backend next to each op's binding (l2_normalize.cpp, ...); fakes and autograd
// in python/rownorm/ops.py.
#include <torch/csrc/stable/library.h>

STABLE_TORCH_LIBRARY(rownorm, m) {
  m.def("l2_normalize(Tensor x, int dim=-1, float eps=1e-12) -> Tensor");
  m.def("l2_normalize_backward(Tensor grad, Tensor x, int dim=-1, float eps=1e-12) -> Tensor");
}
