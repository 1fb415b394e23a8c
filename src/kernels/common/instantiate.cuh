// Explicit instantiation of a launcher template for every supported element type.
#pragma once

#include "kernels/common/types.cuh"

#define ROWNORM_FOR_EACH_FLOAT_TYPE(MACRO) \
  MACRO(float)                             \
  MACRO(double)                            \
  MACRO(__half)                            \
  MACRO(__nv_bfloat16)

// The 16-bit element types with the weight types an op accepts: T itself, or float (alone:
// the float32 residual stream's).
#define ROWNORM_FOR_EACH_16BIT_TYPE_AND_WEIGHT(MACRO) \
  MACRO(__half, __half)                               \
  MACRO(__half, float)                                \
  MACRO(__nv_bfloat16, __nv_bfloat16)                 \
  MACRO(__nv_bfloat16, float)

// Every element type T with the weight types an op accepts: T itself, or float for 16-bit T.
#define ROWNORM_FOR_EACH_FLOAT_TYPE_AND_WEIGHT(MACRO) \
  MACRO(float, float)                                 \
  MACRO(double, double)                               \
  ROWNORM_FOR_EACH_16BIT_TYPE_AND_WEIGHT(MACRO)
