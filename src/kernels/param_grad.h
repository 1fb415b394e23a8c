// Gradients of the per-column parameters of rms_norm / layer_norm / add_rms_norm:
//
//   dweight[d] = Σ_j dy[j, d] · (x[j, d] − μ_j) · r_j      dbias[d] = Σ_j dy[j, d]
//
// over the rows j of the problem, with (μ_j, r_j) saved per row by the backward kernel
// (μ = 0 for RMSNorm). Operands are (outer, d, inner) with arbitrary element strides; row
// j = o * inner + i. Deterministic and independent of the batch size: rows are summed in fixed
// chunks of kParamGradChunkRows, in order, into float partials (Acc) that the finalize adds in
// a fixed tree (ParamGradFinalize); no atomics.
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
  bool weight;  // dweight requested
  bool bias;    // dbias requested
};

// Where the finalize writes dweight / dbias, (d,) each (nullptr: not requested), in the type W
// the parameters have (float32 / float64 for the CPU rows, which cast afterwards): the last
// level of the tree rounds its float sums to W, so no cast kernel runs after it.
template <typename W>
struct ParamGradOut {
  W* dweight;
  W* dbias;
};

inline int64_t ParamGradChunks(int64_t rows) {
  return (rows + kParamGradChunkRows - 1) / kParamGradChunkRows;
}

// The finalize's tree: each level adds blocks of kFinalizeFan consecutive rows of partials, as
// kFinalizeFan / kFinalizeBatch interleaved sub-blocks (every kFinalizeFan / kFinalizeBatch-th
// row) each added in order by one thread per column (up to kFinalizeBatch loads in flight),
// their sums then added in order, until one row is left (param_grad.cu). A thread per
// column walking every chunk in turn was latency-bound: 38 µs for the 32 MB of partials of a
// bf16 rms_norm backward at 2^27 elements on the H100, 7% of the step
// (benchmarks/results/h100/NOTES.md §16). One level is one launch: blocks of 256 take the CTA
// tier's 256 or fewer chunks in one (§32), with the sums of the two launches of 64-row blocks.
constexpr int kFinalizeFan = 256;
constexpr int kFinalizeBatch = 64;

// Elements of scratch the finalize needs for `chunks` partial rows of `n` columns: its inner
// levels, two sums each (none when one level suffices).
inline int64_t ParamGradFinalizeScratch(int64_t chunks, int64_t n) {
  int64_t rows = 0;
  for (int64_t r = (chunks + kFinalizeFan - 1) / kFinalizeFan; r > 1;
       r = (r + kFinalizeFan - 1) / kFinalizeFan) {
    rows += r;
  }
  return 2 * rows * n;
}

// Elements of the `partial` scratch of ParamGrad: the chunk partials and the finalize's levels.
inline int64_t ParamGradScratch(int64_t rows, int64_t d) {
  const int64_t chunks = ParamGradChunks(rows);
  return 2 * chunks * d + ParamGradFinalizeScratch(chunks, d);
}

// dweight / dbias of the rows of `args` into `out`; `partial` holds ParamGradScratch elements.
template <typename T, typename Acc, typename W>
cudaError_t ParamGrad(const ParamGradArgs<T, Acc>& args, ParamGradOut<W> out, Acc* partial,
                      cudaStream_t stream);

// dweight[d] = Σ_c partial[c][d], dbias[d] = Σ_c partial[chunks + c][d], the chunks c added in
// the finalize's fixed tree and the sums rounded once to W (either output may be nullptr;
// `scratch` holds ParamGradFinalizeScratch(chunks, n) elements): the last step of ParamGrad and
// of the fused column-sum path.
template <typename Acc, typename W>
cudaError_t ParamGradFinalize(const Acc* partial, int64_t chunks, int64_t n, ParamGradOut<W> out,
                              Acc* scratch, cudaStream_t stream);

// The CPU version: columns [begin, end) of dweight / dbias, rows summed in order in double.
template <typename T, typename Acc>
void ParamGradCpu(const ParamGradArgs<T, Acc>& a, ParamGradOut<Acc> out, int64_t begin,
                  int64_t end) {
  for (int64_t d = begin; d < end; ++d) {
    double w = 0;
    double b = 0;
    for (int64_t o = 0; o < a.outer; ++o) {
      for (int64_t i = 0; i < a.inner; ++i) {
        const int64_t j = o * a.inner + i;
        const double g = ToAcc(a.dy[o * a.dy_stride[0] + d * a.dy_stride[1] + i * a.dy_stride[2]]);
        if (a.weight) {
          const double x = ToAcc(a.x[o * a.x_stride[0] + d * a.x_stride[1] + i * a.x_stride[2]]);
          w += g * (x - static_cast<double>(a.stats[2 * j])) *
               static_cast<double>(a.stats[2 * j + 1]);
        }
        b += g;
      }
    }
    if (out.dweight != nullptr) out.dweight[d] = static_cast<Acc>(w);
    if (out.dbias != nullptr) out.dbias[d] = static_cast<Acc>(b);
  }
}

}  // namespace rownorm
