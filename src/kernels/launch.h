// Host entry points of the row engine for any op type (the op concept: kernels/common/
// op_traits.h): raw pointers in, cudaError_t out. The caller has made the device current.
//
// The bindings see the declarations only; a .cu file of src/kernels that includes this header
// under nvcc also gets their definitions (through kernels/common/dispatch.cuh) and instantiates
// them for the op types it defines with ROWNORM_INSTANTIATE_LAUNCH (or _ROWS / _STRIDED / _SUMS
// / _STRIDED_SUMS for one of them). A declared launcher left uninstantiated fails the link
// (-Wl,--no-undefined).
#pragma once

#include <cuda_runtime_api.h>

#include <optional>

#include "kernels/common/args.h"
#include "kernels/common/op_traits.h"
#include "kernels/common/plan.h"
#include "kernels/common/types.cuh"

namespace rownorm {

// The plan of `args` (rows of unit stride) on the current device, for an op given per-column
// parameters of `param_bytes` a column (GivenParamBytes in op_traits.h), and the launch of `op`
// on every row as that plan says.
template <class Op>
cudaError_t PlanRows(const RowArgsFor<Op>& args, int param_bytes, RowPlan* plan);
template <class Op>
cudaError_t LaunchRows(const RowArgsFor<Op>& args, const Op& op, const RowPlan& plan,
                       cudaStream_t stream);

// The strided-dim path over dim d of contiguous (outer, d, inner) operands: the plan of `args`
// on the current device, and the launch of `op` as that plan says.
template <class Op>
cudaError_t PlanStrided(const StridedArgsFor<Op>& args, StridedPlan* plan);
template <class Op>
cudaError_t LaunchStrided(const StridedArgsFor<Op>& args, const Op& op, const StridedPlan& plan,
                          cudaStream_t stream);

// Ops with column sums (fused parameter gradients, OpTraits<Op>::kColumnSums): the fused plan
// of `args`, or nothing where the fused path does not apply; and the launch as that plan says,
// writing kColumnSums x plan.chunks x n accumulators to `partial` (summed by
// ParamGradFinalize).
template <class Op>
cudaError_t PlanRowsWithSums(const RowArgsFor<Op>& args, std::optional<FusedSumPlan>* plan);
template <class Op>
cudaError_t LaunchRowsWithSums(const RowArgsFor<Op>& args, const Op& op, const FusedSumPlan& plan,
                               AccType<typename Op::Elem>* partial, cudaStream_t stream);
// The same on the strided-dim path (plan.h's StridedSumPlan: one partial per tile).
template <class Op>
cudaError_t PlanStridedWithSums(const StridedArgsFor<Op>& args,
                                std::optional<StridedSumPlan>* plan);
template <class Op>
cudaError_t LaunchStridedWithSums(const StridedArgsFor<Op>& args, const Op& op,
                                  const StridedSumPlan& plan, AccType<typename Op::Elem>* partial,
                                  cudaStream_t stream);

}  // namespace rownorm

#if defined(__CUDACC__)
#include "kernels/common/dispatch.cuh"

namespace rownorm {
template <class Op>
cudaError_t PlanRows(const RowArgsFor<Op>& args, int param_bytes, RowPlan* plan) {
  return PlanRowOp<Op>(args, param_bytes, plan);
}
template <class Op>
cudaError_t LaunchRows(const RowArgsFor<Op>& args, const Op& op, const RowPlan& plan,
                       cudaStream_t stream) {
  return LaunchRowOp(WithL2Keep(args, plan), op, plan, stream);
}
template <class Op>
cudaError_t PlanStrided(const StridedArgsFor<Op>& args, StridedPlan* plan) {
  return PlanStridedOnDevice(args, plan);
}
template <class Op>
cudaError_t LaunchStrided(const StridedArgsFor<Op>& args, const Op& op, const StridedPlan& plan,
                          cudaStream_t stream) {
  return LaunchStridedOp(args, op, plan, stream);
}
template <class Op>
cudaError_t PlanRowsWithSums(const RowArgsFor<Op>& args, std::optional<FusedSumPlan>* plan) {
  return PlanRowSumOp<Op>(args, plan);
}
template <class Op>
cudaError_t LaunchRowsWithSums(const RowArgsFor<Op>& args, const Op& op, const FusedSumPlan& plan,
                               AccType<typename Op::Elem>* partial, cudaStream_t stream) {
  return LaunchRowSumOp(args, op, plan, partial, stream);
}
template <class Op>
cudaError_t PlanStridedWithSums(const StridedArgsFor<Op>& args,
                                std::optional<StridedSumPlan>* plan) {
  return PlanStridedSumsOnDevice<Op>(args, plan);
}
template <class Op>
cudaError_t LaunchStridedWithSums(const StridedArgsFor<Op>& args, const Op& op,
                                  const StridedSumPlan& plan, AccType<typename Op::Elem>* partial,
                                  cudaStream_t stream) {
  return LaunchStridedSumOp(args, op, plan, partial, stream);
}
}  // namespace rownorm

#define ROWNORM_INSTANTIATE_SUMS(...)                                                           \
  template cudaError_t PlanRowsWithSums<__VA_ARGS__>(const RowArgsFor<__VA_ARGS__>&,            \
                                                     std::optional<FusedSumPlan>*);             \
  template cudaError_t LaunchRowsWithSums<__VA_ARGS__>(const RowArgsFor<__VA_ARGS__>&,          \
                                                       const __VA_ARGS__&, const FusedSumPlan&, \
                                                       AccType<__VA_ARGS__::Elem>*, cudaStream_t);
#define ROWNORM_INSTANTIATE_STRIDED_SUMS(...)                                               \
  template cudaError_t PlanStridedWithSums<__VA_ARGS__>(const StridedArgsFor<__VA_ARGS__>&, \
                                                        std::optional<StridedSumPlan>*);    \
  template cudaError_t LaunchStridedWithSums<__VA_ARGS__>(                                  \
      const StridedArgsFor<__VA_ARGS__>&, const __VA_ARGS__&, const StridedSumPlan&,        \
      AccType<__VA_ARGS__::Elem>*, cudaStream_t);
#define ROWNORM_INSTANTIATE_ROWS(...)                                                              \
  template cudaError_t PlanRows<__VA_ARGS__>(const RowArgsFor<__VA_ARGS__>&, int, RowPlan*);       \
  template cudaError_t LaunchRows<__VA_ARGS__>(const RowArgsFor<__VA_ARGS__>&, const __VA_ARGS__&, \
                                               const RowPlan&, cudaStream_t);
#define ROWNORM_INSTANTIATE_STRIDED(...)                                                           \
  template cudaError_t PlanStrided<__VA_ARGS__>(const StridedArgsFor<__VA_ARGS__>&, StridedPlan*); \
  template cudaError_t LaunchStrided<__VA_ARGS__>(                                                 \
      const StridedArgsFor<__VA_ARGS__>&, const __VA_ARGS__&, const StridedPlan&, cudaStream_t);
#define ROWNORM_INSTANTIATE_LAUNCH(...) \
  ROWNORM_INSTANTIATE_ROWS(__VA_ARGS__) ROWNORM_INSTANTIATE_STRIDED(__VA_ARGS__)
#endif
