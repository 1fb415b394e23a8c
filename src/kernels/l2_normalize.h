// Host entry points of the L2-normalization kernels (CUDA). Raw pointers in, cudaError_t out.
// T is float, double, __half or __nv_bfloat16; the caller has made the device current.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/common/args.h"
#include "kernels/common/types.cuh"

namespace rownorm {

// y = l2_normalize(x) row-wise: in = {x}.
template <typename T>
cudaError_t L2NormalizeFwd(const RowArgs<T, 1>& args, double eps, cudaStream_t stream);
template <typename T>
cudaError_t L2NormalizeFwdColumns(const StridedArgs<T, 1>& args, double eps, cudaStream_t stream);

// dx from x and dy row-wise: in = {x, dy}.
template <typename T>
cudaError_t L2NormalizeBwd(const RowArgs<T, 2>& args, double eps, cudaStream_t stream);
template <typename T>
cudaError_t L2NormalizeBwdColumns(const StridedArgs<T, 2>& args, double eps, cudaStream_t stream);

}  // namespace rownorm
