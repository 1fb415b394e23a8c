// L2-normalization launchers: the op bodies of l2_normalize.cuh on the tiers of dispatch.cuh.
#include "kernels/l2_normalize.h"

#include "kernels/common/dispatch.cuh"
#include "kernels/common/instantiate.cuh"
#include "kernels/l2_normalize.cuh"

namespace rownorm {

template <typename T>
cudaError_t L2NormalizeFwd(const RowArgs<T, 1>& args, double eps, cudaStream_t stream) {
  return LaunchRowOp(args, L2NormalizeFwdOp<AccType<T>>{static_cast<AccType<T>>(eps)}, stream);
}

template <typename T>
cudaError_t L2NormalizeFwdColumns(const StridedArgs<T, 1>& args, double eps, cudaStream_t stream) {
  return LaunchStridedOp(args, L2NormalizeFwdOp<AccType<T>>{static_cast<AccType<T>>(eps)}, stream);
}

template <typename T>
cudaError_t L2NormalizeBwd(const RowArgs<T, 2>& args, double eps, cudaStream_t stream) {
  return LaunchRowOp(args, L2NormalizeBwdOp<AccType<T>>{static_cast<AccType<T>>(eps)}, stream);
}

template <typename T>
cudaError_t L2NormalizeBwdColumns(const StridedArgs<T, 2>& args, double eps, cudaStream_t stream) {
  return LaunchStridedOp(args, L2NormalizeBwdOp<AccType<T>>{static_cast<AccType<T>>(eps)}, stream);
}

#define ROWNORM_INSTANTIATE(T)                                                                   \
  template cudaError_t L2NormalizeFwd<T>(const RowArgs<T, 1>&, double, cudaStream_t);            \
  template cudaError_t L2NormalizeFwdColumns<T>(const StridedArgs<T, 1>&, double, cudaStream_t); \
  template cudaError_t L2NormalizeBwd<T>(const RowArgs<T, 2>&, double, cudaStream_t);            \
  template cudaError_t L2NormalizeBwdColumns<T>(const StridedArgs<T, 2>&, double, cudaStream_t);
ROWNORM_FOR_EACH_FLOAT_TYPE(ROWNORM_INSTANTIATE)
#undef ROWNORM_INSTANTIATE

}  // namespace rownorm
