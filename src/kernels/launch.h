// Host entry points of the row machinery for any op body: raw pointers in, cudaError_t out.
//
// An op is a functor type (see kernels/common/row.cuh) with `using Elem = T` (the storage
// type) and `kIn`; each .cu file of src/kernels instantiates these two for the op types it
// defines (ROWNORM_INSTANTIATE_LAUNCH). The caller has made the device current.
#pragma once

#include <cuda_runtime_api.h>

#include <optional>

#include "kernels/common/args.h"
#include "kernels/common/plan.h"
#include "kernels/common/types.cuh"

namespace rownorm {

// The plan of `args` (rows of unit stride) on the current device, and the launch of `op` on
// every row as that plan says.
template <class Op>
cudaError_t PlanRows(const RowArgs<typename Op::Elem, Op::kIn>& args, RowPlan* plan);
template <class Op>
cudaError_t LaunchRows(const RowArgs<typename Op::Elem, Op::kIn>& args, const Op& op,
                       const RowPlan& plan, cudaStream_t stream);

// Runs `op` over dim d of contiguous (outer, d, inner) operands (the strided-dim path).
template <class Op>
cudaError_t LaunchColumns(const ColumnArgs<typename Op::Elem, Op::kIn>& args, const Op& op,
                          cudaStream_t stream);

// Ops with column sums (fused parameter gradients, Op::kColumnSums): the fused plan of `args`,
// or nothing where the fused path does not apply; and the launch as that plan says, writing
// Op::kColumnSums x plan.chunks x n accumulators to `partial` (summed by ParamGradFinalize).
template <class Op>
cudaError_t PlanRowsWithSums(const RowArgs<typename Op::Elem, Op::kIn>& args,
                             std::optional<FusedSumPlan>* plan);
template <class Op>
cudaError_t LaunchRowsWithSums(const RowArgs<typename Op::Elem, Op::kIn>& args, const Op& op,
                               const FusedSumPlan& plan, AccType<typename Op::Elem>* partial,
                               cudaStream_t stream);

}  // namespace rownorm

// In a .cu file that includes kernels/common/dispatch.cuh: defines the launchers there and
// ROWNORM_INSTANTIATE_LAUNCH(Op) instantiates both for one op type (_ROWS / _COLUMNS: one).
#if defined(__CUDACC__)
#include "kernels/common/dispatch.cuh"

namespace rownorm {
template <class Op>
cudaError_t PlanRows(const RowArgs<typename Op::Elem, Op::kIn>& args, RowPlan* plan) {
  return PlanRowOp<Op>(args, plan);
}
template <class Op>
cudaError_t LaunchRows(const RowArgs<typename Op::Elem, Op::kIn>& args, const Op& op,
                       const RowPlan& plan, cudaStream_t stream) {
  return LaunchRowOp(args, op, plan, stream);
}
template <class Op>
cudaError_t LaunchColumns(const ColumnArgs<typename Op::Elem, Op::kIn>& args, const Op& op,
                          cudaStream_t stream) {
  return LaunchColumnOp(args, op, stream);
}
template <class Op>
cudaError_t PlanRowsWithSums(const RowArgs<typename Op::Elem, Op::kIn>& args,
                             std::optional<FusedSumPlan>* plan) {
  return PlanRowSumOp<Op>(args, plan);
}
template <class Op>
cudaError_t LaunchRowsWithSums(const RowArgs<typename Op::Elem, Op::kIn>& args, const Op& op,
                               const FusedSumPlan& plan, AccType<typename Op::Elem>* partial,
                               cudaStream_t stream) {
  return LaunchRowSumOp(args, op, plan, partial, stream);
}
}  // namespace rownorm

#define ROWNORM_INSTANTIATE_SUMS(...)                                                     \
  template cudaError_t PlanRowsWithSums<__VA_ARGS__>(                                     \
      const RowArgs<__VA_ARGS__::Elem, __VA_ARGS__::kIn>&, std::optional<FusedSumPlan>*); \
  template cudaError_t LaunchRowsWithSums<__VA_ARGS__>(                                   \
      const RowArgs<__VA_ARGS__::Elem, __VA_ARGS__::kIn>&, const __VA_ARGS__&,            \
      const FusedSumPlan&, AccType<__VA_ARGS__::Elem>*, cudaStream_t);
#define ROWNORM_INSTANTIATE_ROWS(...)                                                             \
  template cudaError_t PlanRows<__VA_ARGS__>(const RowArgs<__VA_ARGS__::Elem, __VA_ARGS__::kIn>&, \
                                             RowPlan*);                                           \
  template cudaError_t LaunchRows<__VA_ARGS__>(                                                   \
      const RowArgs<__VA_ARGS__::Elem, __VA_ARGS__::kIn>&, const __VA_ARGS__&, const RowPlan&,    \
      cudaStream_t);
#define ROWNORM_INSTANTIATE_COLUMNS(...)           \
  template cudaError_t LaunchColumns<__VA_ARGS__>( \
      const ColumnArgs<__VA_ARGS__::Elem, __VA_ARGS__::kIn>&, const __VA_ARGS__&, cudaStream_t);
#define ROWNORM_INSTANTIATE_LAUNCH(...) \
  ROWNORM_INSTANTIATE_ROWS(__VA_ARGS__) ROWNORM_INSTANTIATE_COLUMNS(__VA_ARGS__)
#endif
