// RMSNorm launchers: the op bodies of rms_norm.cuh on every tier, per (dtype, weight dtype).
#include "kernels/common/instantiate.cuh"
#include "kernels/launch.h"
#include "kernels/rms_norm.cuh"

namespace rownorm {

#define ROWNORM_INSTANTIATE(T, W)                               \
  ROWNORM_INSTANTIATE_LAUNCH(RmsNormFwdOp<T, AccType<T>, W>)    \
  ROWNORM_INSTANTIATE_LAUNCH(RmsNormBwdOp<T, AccType<T>, W, 2>) \
  ROWNORM_INSTANTIATE_SUMS(RmsNormBwdOp<T, AccType<T>, W, 2>)   \
  ROWNORM_INSTANTIATE_STRIDED_SUMS(RmsNormBwdOp<T, AccType<T>, W, 2>)
ROWNORM_FOR_EACH_FLOAT_TYPE_AND_WEIGHT(ROWNORM_INSTANTIATE)
#undef ROWNORM_INSTANTIATE

}  // namespace rownorm
