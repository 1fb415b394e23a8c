// CPU reference-grade kernels of L2 normalization (formulas in kernels/l2_normalize.cuh).
//
// Operands are contiguous (outer, d, inner) tensors reduced over d; the kernels process the
// rows [begin, end) of the outer * inner rows (row r = (r / inner, r % inner)) so the caller
// can split the work across threads. Sums are accumulated in double for every dtype.
#pragma once

#include <cstdint>

#include "kernels/common/args.h"

namespace rownorm {

template <typename T>
void L2NormalizeFwdCpu(const StridedArgs<T, 1>& args, double eps, int64_t begin, int64_t end);

// in = {x, dy}
template <typename T>
void L2NormalizeBwdCpu(const StridedArgs<T, 2>& args, double eps, int64_t begin, int64_t end);

}  // namespace rownorm
