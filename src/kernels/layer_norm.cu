// LayerNorm launchers: the op bodies of layer_norm.cuh on every tier, per (dtype, weight dtype).
#include "kernels/common/instantiate.cuh"
#include "kernels/launch.h"
#include "kernels/layer_norm.cuh"

namespace rownorm {

#define ROWNORM_INSTANTIATE(T, W)                              \
  ROWNORM_INSTANTIATE_LAUNCH(LayerNormFwdOp<T, AccType<T>, W>) \
  ROWNORM_INSTANTIATE_LAUNCH(LayerNormBwdOp<T, AccType<T>, W>) \
  ROWNORM_INSTANTIATE_SUMS(LayerNormBwdOp<T, AccType<T>, W>)   \
  ROWNORM_INSTANTIATE_STRIDED_SUMS(LayerNormBwdOp<T, AccType<T>, W>)
ROWNORM_FOR_EACH_FLOAT_TYPE_AND_WEIGHT(ROWNORM_INSTANTIATE)
#undef ROWNORM_INSTANTIATE

}  // namespace rownorm
