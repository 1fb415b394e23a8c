// Host entry points of the row engine for any op type (the op concept: kernels/common/
// op_traits.h): raw pointers in, cudaError_t out. The caller has made the device current.
//
// The bindings see the declarations only; a .cu file of src/kernels that includes this header
// under nvcc also gets their definitions (through kernels/common/dispatch.cuh) and instantiates
// them for the op types it defines with ROWNORM_INSTANTIATE_LAUNCH (or _ROWS / _STRIDED / _SUMS
// for one of them). A declared launcher left uninstantiated fails the link (-Wl,--no-undefined).
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/common/args.h"
#include "kernels/common/op_traits.h"
#include "kernels/common/types.cuh"

namespace rownorm {

// Runs `op` on every row of `args` (rows of unit stride).
template <class Op>
cudaError_t LaunchRows(const RowArgsFor<Op>& args, const Op& op, cudaStream_t stream);

// Runs `op` over dim d of contiguous (outer, d, inner) operands (the strided-dim path).
template <class Op>
cudaError_t LaunchStrided(const StridedArgsFor<Op>& args, const Op& op, cudaStream_t stream);

// Ops with column sums (fused parameter gradients, OpTraits<Op>::kColumnSums): the number of
// chunk partials LaunchRowsWithSums writes for `args` (kColumnSums x chunks x n accumulators,
// summed by ParamGradFinalize), or 0 where the fused path does not apply.
template <class Op>
int64_t FusedChunks(const RowArgsFor<Op>& args);
template <class Op>
cudaError_t LaunchRowsWithSums(const RowArgsFor<Op>& args, const Op& op,
                               AccType<typename Op::Elem>* partial, cudaStream_t stream);

}  // namespace rownorm

#if defined(__CUDACC__)
#include "kernels/common/dispatch.cuh"

namespace rownorm {
template <class Op>
cudaError_t LaunchRows(const RowArgsFor<Op>& args, const Op& op, cudaStream_t stream) {
  return LaunchRowOp(args, op, stream);
}
template <class Op>
cudaError_t LaunchStrided(const StridedArgsFor<Op>& args, const Op& op, cudaStream_t stream) {
  return LaunchStridedOp(args, op, stream);
}
template <class Op>
int64_t FusedChunks(const RowArgsFor<Op>& args) {
  return FusedColumnSumChunks<Op>(args);
}
template <class Op>
cudaError_t LaunchRowsWithSums(const RowArgsFor<Op>& args, const Op& op,
                               AccType<typename Op::Elem>* partial, cudaStream_t stream) {
  return LaunchRowSumOp(args, op, partial, stream);
}
}  // namespace rownorm

#define ROWNORM_INSTANTIATE_SUMS(...)                                                  \
  template int64_t FusedChunks<__VA_ARGS__>(const RowArgsFor<__VA_ARGS__>&);           \
  template cudaError_t LaunchRowsWithSums<__VA_ARGS__>(const RowArgsFor<__VA_ARGS__>&, \
                                                       const __VA_ARGS__&,             \
                                                       AccType<__VA_ARGS__::Elem>*, cudaStream_t);
#define ROWNORM_INSTANTIATE_ROWS(...)                                                              \
  template cudaError_t LaunchRows<__VA_ARGS__>(const RowArgsFor<__VA_ARGS__>&, const __VA_ARGS__&, \
                                               cudaStream_t);
#define ROWNORM_INSTANTIATE_STRIDED(...)                                              \
  template cudaError_t LaunchStrided<__VA_ARGS__>(const StridedArgsFor<__VA_ARGS__>&, \
                                                  const __VA_ARGS__&, cudaStream_t);
#define ROWNORM_INSTANTIATE_LAUNCH(...) \
  ROWNORM_INSTANTIATE_ROWS(__VA_ARGS__) ROWNORM_INSTANTIATE_STRIDED(__VA_ARGS__)
#endif
