// Bindings of l2_normalize and l2_normalize_backward: checks, layout, device, stream, dtype.
#include "kernels/l2_normalize.h"
#include "bindings/utils.h"
#include "kernels/cpu/l2_normalize_cpu.h"

namespace rownorm {
namespace {

constexpr const char* kFwd = "l2_normalize";
constexpr const char* kBwd = "l2_normalize_backward";

// Output: a new contiguous tensor of x's shape (the fake in ops.py promises exactly this).
Tensor NewOutput(const Tensor& x) { return torch::stable::new_empty(x, x.sizes()); }

Tensor L2NormalizeCpu(Tensor x, int64_t dim, double eps) {
  dim = CheckRowwiseInput(kFwd, x, dim);
  CheckEps(kFwd, eps);
  Tensor y = NewOutput(x);
  if (x.numel() == 0) return y;
  const Tensor xc = Contiguous(x);
  const StridedShape s = StridedShapeOf(xc, dim);
  DispatchFloating(x.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    const StridedArgs<T, 1> args{{ConstPtr<T>(xc)}, MutPtr<T>(y), s.outer, s.d, s.inner};
    ParallelRows(s.outer * s.inner, s.d,
                 [&](int64_t begin, int64_t end) { L2NormalizeFwdCpu<T>(args, eps, begin, end); });
  });
  return y;
}

Tensor L2NormalizeBackwardCpu(Tensor grad, Tensor x, int64_t dim, double eps) {
  dim = CheckRowwiseInput(kBwd, x, dim);
  CheckEps(kBwd, eps);
  CheckLike(kBwd, "grad", grad, x);
  Tensor dx = NewOutput(x);
  if (x.numel() == 0) return dx;
  const Tensor xc = Contiguous(x);
  const Tensor gc = Contiguous(grad);
  const StridedShape s = StridedShapeOf(xc, dim);
  DispatchFloating(x.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    const StridedArgs<T, 2> args{
        {ConstPtr<T>(xc), ConstPtr<T>(gc)}, MutPtr<T>(dx), s.outer, s.d, s.inner};
    ParallelRows(s.outer * s.inner, s.d,
                 [&](int64_t begin, int64_t end) { L2NormalizeBwdCpu<T>(args, eps, begin, end); });
  });
  return dx;
}

// Row-viewable operands (dim innermost, other dims collapsing to one row stride) run on the
// row tiers without a copy; everything else is made contiguous and, when dim is not the
// innermost dim, runs on the strided-dim (column) path.
Tensor L2NormalizeCuda(Tensor x, int64_t dim, double eps) {
  dim = CheckRowwiseInput(kFwd, x, dim);
  CheckEps(kFwd, eps);
  torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
  Tensor y = NewOutput(x);
  if (x.numel() == 0) return y;
  const cudaStream_t stream = CurrentCudaStream(x);
  RowView xv = TryRowView(x, dim);
  const Tensor xc = xv.ok ? x : Contiguous(x);
  if (!xv.ok) xv = TryRowView(xc, dim);
  DispatchFloating(x.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    if (xv.ok) {
      const RowArgs<T, 1> args{
          {ConstPtr<T>(xc)}, {xv.row_stride}, MutPtr<T>(y), xv.n, xv.rows, xv.n};
      CheckLaunch(kFwd, L2NormalizeFwd<T>(args, eps, stream));
    } else {
      const StridedShape s = StridedShapeOf(xc, dim);
      const StridedArgs<T, 1> args{{ConstPtr<T>(xc)}, MutPtr<T>(y), s.outer, s.d, s.inner};
      CheckLaunch(kFwd, L2NormalizeFwdColumns<T>(args, eps, stream));
    }
  });
  return y;
}

Tensor L2NormalizeBackwardCuda(Tensor grad, Tensor x, int64_t dim, double eps) {
  dim = CheckRowwiseInput(kBwd, x, dim);
  CheckEps(kBwd, eps);
  CheckLike(kBwd, "grad", grad, x);
  torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
  Tensor dx = NewOutput(x);
  if (x.numel() == 0) return dx;
  const cudaStream_t stream = CurrentCudaStream(x);
  RowView xv = TryRowView(x, dim);
  RowView gv = TryRowView(grad, dim);
  const Tensor xc = xv.ok ? x : Contiguous(x);
  const Tensor gc = gv.ok ? grad : Contiguous(grad);
  if (!xv.ok) xv = TryRowView(xc, dim);
  if (!gv.ok) gv = TryRowView(gc, dim);
  const bool rows = xv.ok && gv.ok;
  // The column path needs both operands contiguous; keep them alive until the launch.
  const Tensor xcol = rows ? xc : Contiguous(xc);
  const Tensor gcol = rows ? gc : Contiguous(gc);
  DispatchFloating(x.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    if (rows) {
      const RowArgs<T, 2> args{{ConstPtr<T>(xc), ConstPtr<T>(gc)},
                               {xv.row_stride, gv.row_stride},
                               MutPtr<T>(dx),
                               xv.n,
                               xv.rows,
                               xv.n};
      CheckLaunch(kBwd, L2NormalizeBwd<T>(args, eps, stream));
    } else {
      const StridedShape s = StridedShapeOf(xcol, dim);
      const StridedArgs<T, 2> args{
          {ConstPtr<T>(xcol), ConstPtr<T>(gcol)}, MutPtr<T>(dx), s.outer, s.d, s.inner};
      CheckLaunch(kBwd, L2NormalizeBwdColumns<T>(args, eps, stream));
    }
  });
  return dx;
}

Tensor RejectSparse(Tensor, int64_t, double) {
  ROWNORM_CHECK(false, kFwd, ": x must be a dense (strided) tensor, got a sparse tensor");
  return {};
}

Tensor RejectSparseBackward(Tensor, Tensor, int64_t, double) {
  ROWNORM_CHECK(false, kBwd, ": x and grad must be dense (strided) tensors, got a sparse tensor");
  return {};
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(rownorm, CPU, m) {
  m.impl("l2_normalize", TORCH_BOX(&L2NormalizeCpu));
  m.impl("l2_normalize_backward", TORCH_BOX(&L2NormalizeBackwardCpu));
}

STABLE_TORCH_LIBRARY_IMPL(rownorm, CUDA, m) {
  m.impl("l2_normalize", TORCH_BOX(&L2NormalizeCuda));
  m.impl("l2_normalize_backward", TORCH_BOX(&L2NormalizeBackwardCuda));
}

STABLE_TORCH_LIBRARY_IMPL(rownorm, SparseCPU, m) {
  m.impl("l2_normalize", TORCH_BOX(&RejectSparse));
  m.impl("l2_normalize_backward", TORCH_BOX(&RejectSparseBackward));
}

STABLE_TORCH_LIBRARY_IMPL(rownorm, SparseCUDA, m) {
  m.impl("l2_normalize", TORCH_BOX(&RejectSparse));
  m.impl("l2_normalize_backward", TORCH_BOX(&RejectSparseBackward));
}

STABLE_TORCH_LIBRARY_IMPL(rownorm, SparseCsrCPU, m) {
  m.impl("l2_normalize", TORCH_BOX(&RejectSparse));
  m.impl("l2_normalize_backward", TORCH_BOX(&RejectSparseBackward));
}

STABLE_TORCH_LIBRARY_IMPL(rownorm, SparseCsrCUDA, m) {
  m.impl("l2_normalize", TORCH_BOX(&RejectSparse));
  m.impl("l2_normalize_backward", TORCH_BOX(&RejectSparseBackward));
}

}  // namespace rownorm
