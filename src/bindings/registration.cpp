// The one registration block: every schema of the rownorm namespace. Implementations are
// registered per backend next to each op's binding (l2_normalize.cpp, ...); fakes and autograd
// in python/rownorm/ops.py.
//
// Backward ops take what the forward saved (x, or the output y for softmax / log_softmax) and
// recompute the per-row statistics in the same pass that reads the gradient; layer_norm's
// reads the (mean, rstd) its forward saved (layer_norm_with_stats). Parameter
// gradients have shape (N,), or (0,) when not requested, and the dtype the parameters run in
// (the weight's; float32 for a 16-bit x with a float32 weight; layer_norm's dbias without a
// weight: float32, float64 for float64 x), written by the kernels as they finish the sums; the
// autograd formula casts where the parameter's dtype differs.
#include <torch/csrc/stable/library.h>

STABLE_TORCH_LIBRARY(rownorm, m) {
  m.def("l2_normalize(Tensor x, int dim=-1, float eps=1e-12) -> Tensor");
  m.def("l2_normalize_backward(Tensor grad, Tensor x, int dim=-1, float eps=1e-12) -> Tensor");
  m.def("l1_normalize(Tensor x, int dim=-1, float eps=1e-12, bool mean=False) -> Tensor");
  m.def(
      "l1_normalize_backward(Tensor grad, Tensor x, int dim=-1, float eps=1e-12, "
      "bool mean=False) -> Tensor");
  m.def(
      "rms_norm(Tensor x, Tensor? weight=None, int dim=-1, float? eps=None, "
      "float weight_offset=0., str casting_mode=\"once\") -> Tensor");
  m.def(
      "rms_norm_backward(Tensor grad, Tensor x, Tensor? weight, int dim, float eps, "
      "bool weight_grad, float weight_offset=0.) -> (Tensor, Tensor)");
  m.def(
      "layer_norm(Tensor x, Tensor? weight=None, Tensor? bias=None, int dim=-1, "
      "float eps=1e-05) -> Tensor");
  // The forward autograd runs: y and the per-row (mean, rstd), shaped like x with 2 along dim,
  // which the backward reads instead of reducing the row twice more.
  m.def(
      "layer_norm_with_stats(Tensor x, Tensor? weight=None, Tensor? bias=None, int dim=-1, "
      "float eps=1e-05) -> (Tensor y, Tensor stats)");
  m.def(
      "layer_norm_backward(Tensor grad, Tensor x, Tensor stats, Tensor? weight, int dim, "
      "bool weight_grad, bool bias_grad) -> (Tensor, Tensor, Tensor)");
  m.def("softmax(Tensor x, int dim=-1) -> Tensor");
  m.def("softmax_backward(Tensor grad, Tensor y, int dim=-1) -> Tensor");
  m.def("log_softmax(Tensor x, int dim=-1) -> Tensor");
  m.def("log_softmax_backward(Tensor grad, Tensor y, int dim=-1) -> Tensor");
  m.def(
      "add_rms_norm(Tensor x, Tensor residual, Tensor? weight=None, float? eps=None, "
      "float weight_offset=0., str casting_mode=\"once\") -> (Tensor, Tensor)");
  m.def(
      "add_rms_norm_backward(Tensor grad, Tensor? grad_residual, Tensor r, Tensor? weight, "
      "float eps, bool weight_grad, float weight_offset=0.) -> (Tensor, Tensor)");
  // The float32 residual stream's backward (grad 16-bit, r and grad_residual float32), what
  // autograd runs there: add_rms_norm_backward's d_r and dweight, and x's gradient, d_r in
  // grad's dtype, written by the same pass: (d_r, d_x, dweight).
  m.def(
      "add_rms_norm_stream_backward(Tensor grad, Tensor? grad_residual, Tensor r, "
      "Tensor? weight, float eps, bool weight_grad, float weight_offset=0.) "
      "-> (Tensor, Tensor, Tensor)");
  // Diagnostics (explain.cpp): the plan a call of `op` on x gets, and the tier table alone.
  m.def(
      "plan_info(Tensor x, str op, int dim=-1, bool backward=False, bool param_grads=False) "
      "-> str");
  m.def(
      "plan_row_tier(int n, int elem_size, bool clusters=True, bool wide=True, "
      "int cluster_packs=8, int wide_cluster_packs=0) -> str");
}
