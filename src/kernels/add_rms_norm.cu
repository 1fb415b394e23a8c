// Residual-add + RMSNorm launchers (last dim only, so rows only): add_rms_norm's forward body
// and rms_norm's backward body with the third input (the gradient of x + residual); and, for a
// 16-bit x with a float32 residual stream (R = float), both bodies on the mixed problems of
// rms_norm.cuh (the backward with and without the gradient of h, writing d_r in float32 and
// x's gradient in T from the same stores).
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

#define ROWNORM_INSTANTIATE(T, W) ROWNORM_INSTANTIATE_ROWS(AddRmsNormFwdOp<T, float, W, float>)
ROWNORM_FOR_EACH_16BIT_TYPE_AND_WEIGHT(ROWNORM_INSTANTIATE)
#undef ROWNORM_INSTANTIATE

// The backward's weight runs as x's would (rms_norm.cpp): in T or in float32.
#define ROWNORM_INSTANTIATE(T, W)                               \
  ROWNORM_INSTANTIATE_ROWS(RmsNormBwdOp<T, float, W, 3, float>) \
  ROWNORM_INSTANTIATE_SUMS(RmsNormBwdOp<T, float, W, 3, float>) \
  ROWNORM_INSTANTIATE_ROWS(RmsNormBwdOp<T, float, W, 2, float>) \
  ROWNORM_INSTANTIATE_SUMS(RmsNormBwdOp<T, float, W, 2, float>)
ROWNORM_FOR_EACH_16BIT_TYPE_AND_WEIGHT(ROWNORM_INSTANTIATE)
#undef ROWNORM_INSTANTIATE

}  // namespace rownorm
