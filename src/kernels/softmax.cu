// Softmax / log-softmax launchers: the op bodies of softmax.cuh on every tier.
#include "kernels/common/instantiate.cuh"
#include "kernels/launch.h"
#include "kernels/softmax.cuh"

namespace rownorm {

#define ROWNORM_INSTANTIATE(T)                            \
  ROWNORM_INSTANTIATE_LAUNCH(SoftmaxFwdOp<T, AccType<T>>) \
  ROWNORM_INSTANTIATE_LAUNCH(SoftmaxBwdOp<T, AccType<T>>)
ROWNORM_FOR_EACH_FLOAT_TYPE(ROWNORM_INSTANTIATE)
#undef ROWNORM_INSTANTIATE

}  // namespace rownorm
