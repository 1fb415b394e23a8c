// Gradients of the per-column parameters of rms_norm / layer_norm / add_rms_norm:
//
//   dweight[d] = Σ_j dy[j, d] · (x[j, d] − μ_j) · r_j      dbias[d] = Σ_j dy[j, d]
//
// over the rows j of the problem, with (μ_j, r_j) saved per row by the backward kernel
// (μ = 0 for RMSNorm). Operands are (outer, d, inner) with arbitrary element strides; row
// j = o * inner + i. Deterministic and independent of the batch size: rows are summed in fixed
// chunks of kParamGradChunkRows, in order, into float partials (Acc) that a second kernel adds
// in chunk order; no atomics.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/common/types.cuh"

namespace rownorm {

constexpr int64_t kParamGradChunkRows = 256;

template <typename T, typename Acc>
struct ParamGradArgs {
  const T* x;
  const T* dy;
  int64_t x_stride[3];   // element strides of x over (outer, d, inner)
  int64_t dy_stride[3];  // of dy
  const Acc* stats;      // (outer * inner, 2): (μ, r) per row
  int64_t outer;
  int64_t d;
  int64_t inner;
  Acc* dweight;  // (d,) or nullptr
  Acc* dbias;    // (d,) or nullptr
};

inline int64_t ParamGradChunks(int64_t rows) {
  return (rows + kParamGradChunkRows - 1) / kParamGradChunkRows;
}

// `partial` is scratch of 2 * ParamGradChunks(outer * inner) * d elements.
template <typename T, typename Acc>
cudaError_t ParamGrad(const ParamGradArgs<T, Acc>& args, Acc* partial, cudaStream_t stream);

// dweight[d] = Σ_c partial[c][d], dbias[d] = Σ_c partial[chunks + c][d] (c in order; either
// output may be nullptr): the last step of ParamGrad and of the fused column-sum path.
template <typename Acc>
cudaError_t ParamGradFinalize(const Acc* partial, int64_t chunks, int64_t n, Acc* dweight,
                              Acc* dbias, cudaStream_t stream);

// The CPU version: columns [begin, end) of dweight / dbias, rows summed in order in double.
template <typename T, typename Acc>
void ParamGradCpu(const ParamGradArgs<T, Acc>& a, int64_t begin, int64_t end) {
  for (int64_t d = begin; d < end; ++d) {
    double w = 0;
    double b = 0;
    for (int64_t o = 0; o < a.outer; ++o) {
      for (int64_t i = 0; i < a.inner; ++i) {
        const int64_t j = o * a.inner + i;
        const double g = ToAcc(a.dy[o * a.dy_stride[0] + d * a.dy_stride[1] + i * a.dy_stride[2]]);
        if (a.dweight != nullptr) {
          const double x = ToAcc(a.x[o * a.x_stride[0] + d * a.x_stride[1] + i * a.x_stride[2]]);
          w += g * (x - static_cast<double>(a.stats[2 * j])) *
               static_cast<double>(a.stats[2 * j + 1]);
        }
        b += g;
      }
    }
    if (a.dweight != nullptr) a.dweight[d] = static_cast<Acc>(w);
    if (a.dbias != nullptr) a.dbias[d] = static_cast<Acc>(b);
  }
}

}  // namespace rownorm
