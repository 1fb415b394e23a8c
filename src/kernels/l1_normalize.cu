// L1 / mean-abs normalization launchers: the op bodies of l1_normalize.cuh on every tier.
#include "kernels/common/instantiate.cuh"
#include "kernels/l1_normalize.cuh"
#include "kernels/launch.h"

namespace rownorm {

#define ROWNORM_INSTANTIATE(T)                                \
  ROWNORM_INSTANTIATE_LAUNCH(L1NormalizeFwdOp<T, AccType<T>>) \
  ROWNORM_INSTANTIATE_LAUNCH(L1NormalizeBwdOp<T, AccType<T>>)
ROWNORM_FOR_EACH_FLOAT_TYPE(ROWNORM_INSTANTIATE)
#undef ROWNORM_INSTANTIATE

}  // namespace rownorm
