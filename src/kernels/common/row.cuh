// The row engine every rownorm op runs on, in three layers:
//
//   row_views.cuh     teams, row geometry, CachedRow / StreamingRow (the row tiers)
//   strided_views.cuh StridedRow / StridedTile / StridedLane (reduction over a non-last dim)
//   tier_kernels.cuh  the __global__ kernels that run an op body on those views
//
// The op concept (what an op body may use) is in op_traits.h, the row interface shared with the
// CPU rows in row_ops.h, the tier table in plan.h and the launches in dispatch.cuh.
#pragma once

#include "kernels/common/op_traits.h"
#include "kernels/common/row_ops.h"
#include "kernels/common/row_views.cuh"
#include "kernels/common/strided_views.cuh"
#include "kernels/common/tier_kernels.cuh"
