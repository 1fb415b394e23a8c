// Host entry points of the row machinery for any op body: raw pointers in, cudaError_t out.
//
// An op is a functor type (see kernels/common/row.cuh) with `using Elem = T` (the storage
// type) and `kIn`; each .cu file of src/kernels instantiates these two for the op types it
// defines (ROWNORM_INSTANTIATE_LAUNCH). The caller has made the device current.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/common/args.h"
#include "kernels/common/types.cuh"

namespace rownorm {

// Runs `op` on every row of `args` (rows of unit stride).
template <class Op>
cudaError_t LaunchRows(const RowArgs<typename Op::Elem, Op::kIn>& args, const Op& op,
                       cudaStream_t stream);

// Runs `op` over dim d of contiguous (outer, d, inner) operands (the strided-dim path).
template <class Op>
cudaError_t LaunchColumns(const ColumnArgs<typename Op::Elem, Op::kIn>& args, const Op& op,
                          cudaStream_t stream);

// Ops with column sums (fused parameter gradients, Op::kColumnSums): the number of chunk
// partials LaunchRowsWithSums writes for `args` (Op::kColumnSums x chunks x n accumulators,
// summed by ParamGradFinalize), or 0 where the fused path does not apply.
template <class Op>
int64_t FusedChunks(const RowArgs<typename Op::Elem, Op::kIn>& args);
template <class Op>
cudaError_t LaunchRowsWithSums(const RowArgs<typename Op::Elem, Op::kIn>& args, const Op& op,
                               AccType<typename Op::Elem>* partial, cudaStream_t stream);

}  // namespace rownorm

// In a .cu file that includes kernels/common/dispatch.cuh: defines the launchers there and
// ROWNORM_INSTANTIATE_LAUNCH(Op) instantiates both for one op type (_ROWS / _COLUMNS: one).
#if defined(__CUDACC__)
#include "kernels/common/dispatch.cuh"

namespace rownorm {
template <class Op>
cudaError_t LaunchRows(const RowArgs<typename Op::Elem, Op::kIn>& args, const Op& op,
                       cudaStream_t stream) {
  return LaunchRowOp(args, op, stream);
}
template <class Op>
cudaError_t LaunchColumns(const ColumnArgs<typename Op::Elem, Op::kIn>& args, const Op& op,
                          cudaStream_t stream) {
  return LaunchColumnOp(args, op, stream);
}
template <class Op>
int64_t FusedChunks(const RowArgs<typename Op::Elem, Op::kIn>& args) {
  return FusedColumnSumChunks<Op>(args);
}
template <class Op>
cudaError_t LaunchRowsWithSums(const RowArgs<typename Op::Elem, Op::kIn>& args, const Op& op,
                               AccType<typename Op::Elem>* partial, cudaStream_t stream) {
  return LaunchRowSumOp(args, op, partial, stream);
}
}  // namespace rownorm

#define ROWNORM_INSTANTIATE_SUMS(...)                                                             \
  template int64_t FusedChunks<__VA_ARGS__>(const RowArgs<__VA_ARGS__::Elem, __VA_ARGS__::kIn>&); \
  template cudaError_t LaunchRowsWithSums<__VA_ARGS__>(                                           \
      const RowArgs<__VA_ARGS__::Elem, __VA_ARGS__::kIn>&, const __VA_ARGS__&,                    \
      AccType<__VA_ARGS__::Elem>*, cudaStream_t);
#define ROWNORM_INSTANTIATE_ROWS(...)           \
  template cudaError_t LaunchRows<__VA_ARGS__>( \
      const RowArgs<__VA_ARGS__::Elem, __VA_ARGS__::kIn>&, const __VA_ARGS__&, cudaStream_t);
#define ROWNORM_INSTANTIATE_COLUMNS(...)           \
  template cudaError_t LaunchColumns<__VA_ARGS__>( \
      const ColumnArgs<__VA_ARGS__::Elem, __VA_ARGS__::kIn>&, const __VA_ARGS__&, cudaStream_t);
#define ROWNORM_INSTANTIATE_LAUNCH(...) \
  ROWNORM_INSTANTIATE_ROWS(__VA_ARGS__) ROWNORM_INSTANTIATE_COLUMNS(__VA_ARGS__)
#endif
