// Explicit instantiation of a launcher template for every supported element type.
#pragma once

#include "kernels/common/types.cuh"

#define ROWNORM_FOR_EACH_FLOAT_TYPE(MACRO) \
  MACRO(float)                             \
  MACRO(double)                            \
  MACRO(__half)                            \
  MACRO(__nv_bfloat16)
