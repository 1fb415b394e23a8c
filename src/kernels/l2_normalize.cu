// L2-normalization launchers: the op bodies of l2_normalize.cuh on every tier.
#include "kernels/common/instantiate.cuh"
#include "kernels/l2_normalize.cuh"
#include "kernels/launch.h"

namespace rownorm {

#define ROWNORM_INSTANTIATE(T)                                \
  ROWNORM_INSTANTIATE_LAUNCH(L2NormalizeFwdOp<T, AccType<T>>) \
  ROWNORM_INSTANTIATE_LAUNCH(L2NormalizeBwdOp<T, AccType<T>>)
ROWNORM_FOR_EACH_FLOAT_TYPE(ROWNORM_INSTANTIATE)
#undef ROWNORM_INSTANTIATE

}  // namespace rownorm
