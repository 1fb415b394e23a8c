// Residual-add + RMSNorm launchers (last dim only, so rows only): add_rms_norm's forward body
// and rms_norm's backward body with the third input (the gradient of x + residual).
#include "kernels/common/instantiate.cuh"
#include "kernels/launch.h"
#include "kernels/rms_norm.cuh"

namespace rownorm {

#define ROWNORM_INSTANTIATE(T, W)                             \
  ROWNORM_INSTANTIATE_ROWS(AddRmsNormFwdOp<T, AccType<T>, W>) \
  ROWNORM_INSTANTIATE_ROWS(RmsNormBwdOp<T, AccType<T>, W, 3>) \
  ROWNORM_INSTANTIATE_SUMS(RmsNormBwdOp<T, AccType<T>, W, 3>)
ROWNORM_FOR_EACH_FLOAT_TYPE_AND_WEIGHT(ROWNORM_INSTANTIATE)
#undef ROWNORM_INSTANTIATE

}  // namespace rownorm
