// Parameter-gradient kernels (see param_grad.h): chunk partials, then an in-order finalize.
#include "kernels/common/dispatch.cuh"
#include "kernels/common/instantiate.cuh"
#include "kernels/param_grad.h"

namespace rownorm {
namespace {

constexpr int kTx = 32;  // columns per CTA (lanes of a warp: coalesced when d is innermost)
constexpr int kTy = 8;   // row slices per CTA

// CTA (column tile, chunk c): partial[0][c][d] = Σ dy·x̂ and partial[1][c][d] = Σ dy over the
// chunk's rows. Thread (tx, ty) sums rows ty, ty + kTy, ... of the chunk in order; the kTy
// sums are then added in ty order.
template <typename T, typename Acc>
__global__ void __launch_bounds__(kTx* kTy)
    ParamGradPartialKernel(const ParamGradArgs<T, Acc> a, Acc* partial, int64_t chunks) {
  __shared__ Acc sums[2][kTy][kTx];
  const int64_t rows = a.outer * a.inner;
  const int64_t d = static_cast<int64_t>(blockIdx.x) * kTx + threadIdx.x;
  for (int64_t c = blockIdx.y; c < chunks; c += gridDim.y) {
    Acc w = 0;
    Acc b = 0;
    if (d < a.d) {
      const int64_t end = min(rows, (c + 1) * kParamGradChunkRows);
      for (int64_t j = c * kParamGradChunkRows + threadIdx.y; j < end; j += kTy) {
        const int64_t o = j / a.inner;
        const int64_t i = j - o * a.inner;
        const Acc x = a.dweight != nullptr
                          ? ToAcc(a.x[o * a.x_stride[0] + d * a.x_stride[1] + i * a.x_stride[2]])
                          : Acc(0);
        const Acc g = ToAcc(a.dy[o * a.dy_stride[0] + d * a.dy_stride[1] + i * a.dy_stride[2]]);
        if (a.dweight != nullptr) w += g * (x - a.stats[2 * j]) * a.stats[2 * j + 1];
        b += g;
      }
    }
    sums[0][threadIdx.y][threadIdx.x] = w;
    sums[1][threadIdx.y][threadIdx.x] = b;
    __syncthreads();
    if (threadIdx.y < 2 && d < a.d) {
      Acc s = sums[threadIdx.y][0][threadIdx.x];
#pragma unroll
      for (int y = 1; y < kTy; ++y) s += sums[threadIdx.y][y][threadIdx.x];
      partial[(threadIdx.y * chunks + c) * a.d + d] = s;
    }
    __syncthreads();
  }
}

// The same for rows of unit stride (inner == 1, the last-dim case): each lane owns kV
// consecutive columns, read as one Pack when the rows allow it, so a warp moves 32 x 16 bytes
// of a row per load and the index arithmetic has no division.
template <typename T, typename Acc, int kV>
__global__ void __launch_bounds__(kTx* kTy)
    ParamGradRowsKernel(const ParamGradArgs<T, Acc> a, Acc* partial, int64_t chunks) {
  __shared__ Acc sums[2][kTy][kTx * kV];
  const int64_t rows = a.outer;
  const int64_t d0 = (static_cast<int64_t>(blockIdx.x) * kTx + threadIdx.x) * kV;
  const bool want_w = a.dweight != nullptr;
  for (int64_t c = blockIdx.y; c < chunks; c += gridDim.y) {
    Acc w[kV] = {};
    Acc b[kV] = {};
    if (d0 < a.d) {
      const int64_t end = min(rows, (c + 1) * kParamGradChunkRows);
      for (int64_t j = c * kParamGradChunkRows + threadIdx.y; j < end; j += kTy) {
        Pack<T, kV> g;
        g.Load(a.dy + j * a.dy_stride[0] + d0);
        const Acc mu = want_w ? a.stats[2 * j] : Acc(0);
        const Acc r = want_w ? a.stats[2 * j + 1] : Acc(0);
        Pack<T, kV> x;
        if (want_w) x.Load(a.x + j * a.x_stride[0] + d0);
#pragma unroll
        for (int e = 0; e < kV; ++e) {
          if (want_w) w[e] += g.Get(e) * (x.Get(e) - mu) * r;
          b[e] += g.Get(e);
        }
      }
    }
#pragma unroll
    for (int e = 0; e < kV; ++e) {
      sums[0][threadIdx.y][threadIdx.x * kV + e] = w[e];
      sums[1][threadIdx.y][threadIdx.x * kV + e] = b[e];
    }
    __syncthreads();
    // Thread t of the CTA finalizes tile column t % (kTx * kV) of sum t / (kTx * kV).
    for (int t = threadIdx.y * kTx + threadIdx.x; t < 2 * kTx * kV; t += kTx * kTy) {
      const int which = t / (kTx * kV);
      const int col = t % (kTx * kV);
      const int64_t d = static_cast<int64_t>(blockIdx.x) * kTx * kV + col;
      if (d < a.d) {
        Acc s = sums[which][0][col];
#pragma unroll
        for (int y = 1; y < kTy; ++y) s += sums[which][y][col];
        partial[(which * chunks + c) * a.d + d] = s;
      }
    }
    __syncthreads();
  }
}

// dweight / dbias from the chunk partials: CTA column tile of kTx columns, kTy slices each
// summing every kTy-th chunk in order, then the slices added in order (deterministic; kTy x
// more threads than one thread per column, which matters with thousands of chunks).
template <typename Acc>
__global__ void __launch_bounds__(kTx* kTy)
    ParamGradFinalizeKernel(const Acc* partial, int64_t chunks, int64_t n, Acc* dweight,
                            Acc* dbias) {
  __shared__ Acc sums[2][kTy][kTx];
  const int64_t d = static_cast<int64_t>(blockIdx.x) * kTx + threadIdx.x;
  Acc w = 0;
  Acc b = 0;
  if (d < n) {
    for (int64_t c = threadIdx.y; c < chunks; c += kTy) {
      if (dweight != nullptr) w += partial[c * n + d];
      if (dbias != nullptr) b += partial[(chunks + c) * n + d];
    }
  }
  sums[0][threadIdx.y][threadIdx.x] = w;
  sums[1][threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y < 2 && d < n) {
    Acc* out = threadIdx.y == 0 ? dweight : dbias;
    if (out != nullptr) {
      Acc s = sums[threadIdx.y][0][threadIdx.x];
#pragma unroll
      for (int y = 1; y < kTy; ++y) s += sums[threadIdx.y][y][threadIdx.x];
      out[d] = s;
    }
  }
}

}  // namespace

template <typename T, typename Acc>
cudaError_t ParamGrad(const ParamGradArgs<T, Acc>& a, Acc* partial, cudaStream_t stream) {
  if (a.d == 0) return cudaSuccess;
  const int64_t rows = a.outer * a.inner;
  const int64_t chunks = ParamGradChunks(rows);
  if (chunks == 0) {  // no rows: the gradients are zero
    cudaError_t err = cudaSuccess;
    if (a.dweight != nullptr) err = cudaMemsetAsync(a.dweight, 0, a.d * sizeof(Acc), stream);
    if (err == cudaSuccess && a.dbias != nullptr) {
      err = cudaMemsetAsync(a.dbias, 0, a.d * sizeof(Acc), stream);
    }
    return err;
  }
  const unsigned grid_y = GridFor(std::min<int64_t>(chunks, 65535));
  constexpr int kV = MaxPackWidth(sizeof(T));
  auto aligned = [](const void* p, int64_t stride) {
    return reinterpret_cast<uintptr_t>(p) % 16 == 0 && stride % kV == 0;
  };
  if (a.inner == 1 && a.x_stride[1] == 1 && a.dy_stride[1] == 1 && a.d % kV == 0 &&
      aligned(a.x, a.x_stride[0]) && aligned(a.dy, a.dy_stride[0])) {
    const dim3 grid(GridFor((a.d + kTx * kV - 1) / (kTx * kV)), grid_y);
    ParamGradRowsKernel<T, Acc, kV><<<grid, dim3(kTx, kTy), 0, stream>>>(a, partial, chunks);
  } else if (a.inner == 1 && a.x_stride[1] == 1 && a.dy_stride[1] == 1) {
    const dim3 grid(GridFor((a.d + kTx - 1) / kTx), grid_y);
    ParamGradRowsKernel<T, Acc, 1><<<grid, dim3(kTx, kTy), 0, stream>>>(a, partial, chunks);
  } else {
    const dim3 grid(GridFor((a.d + kTx - 1) / kTx), grid_y);
    ParamGradPartialKernel<T, Acc><<<grid, dim3(kTx, kTy), 0, stream>>>(a, partial, chunks);
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  return ParamGradFinalize<Acc>(partial, chunks, a.d, a.dweight, a.dbias, stream);
}

template <typename Acc>
cudaError_t ParamGradFinalize(const Acc* partial, int64_t chunks, int64_t n, Acc* dweight,
                              Acc* dbias, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  ParamGradFinalizeKernel<Acc><<<GridFor((n + kTx - 1) / kTx), dim3(kTx, kTy), 0, stream>>>(
      partial, chunks, n, dweight, dbias);
  return cudaGetLastError();
}
template cudaError_t ParamGradFinalize<float>(const float*, int64_t, int64_t, float*, float*,
                                              cudaStream_t);
template cudaError_t ParamGradFinalize<double>(const double*, int64_t, int64_t, double*, double*,
                                               cudaStream_t);

#define ROWNORM_INSTANTIATE(T)                                                                    \
  template cudaError_t ParamGrad<T, AccType<T>>(const ParamGradArgs<T, AccType<T>>&, AccType<T>*, \
                                                cudaStream_t);
ROWNORM_FOR_EACH_FLOAT_TYPE(ROWNORM_INSTANTIATE)
#undef ROWNORM_INSTANTIATE

}  // namespace rownorm
