// Parameter-gradient kernels (see param_grad.h): chunk partials, then the finalize's tree.
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
        const Acc x = a.weight
                          ? ToAcc(a.x[o * a.x_stride[0] + d * a.x_stride[1] + i * a.x_stride[2]])
                          : Acc(0);
        const Acc g = ToAcc(a.dy[o * a.dy_stride[0] + d * a.dy_stride[1] + i * a.dy_stride[2]]);
        if (a.weight) w += g * (x - a.stats[2 * j]) * a.stats[2 * j + 1];
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
// consecutive columns, read as one Pack, so a warp moves 32 x 16 bytes of a row per load and
// the index arithmetic has no division. kUnaligned: rows that do not start 16-byte aligned
// (odd d), whose packs are read by 4-byte words (LoadPackUnaligned) and the last lane's part
// pack an element at a time. A lane per column (kV = 1) there read 2 bytes a lane and ran at
// 52% of copy on the H100 (bf16, 330 µs for 2^27 elements; benchmarks/results/h100/NOTES.md
// §44).
template <typename T, typename Acc, int kV, bool kUnaligned = false>
__global__ void __launch_bounds__(kTx* kTy)
    ParamGradRowsKernel(const ParamGradArgs<T, Acc> a, Acc* partial, int64_t chunks) {
  __shared__ Acc sums[2][kTy][kTx * kV];
  const int64_t rows = a.outer;
  const int64_t d0 = (static_cast<int64_t>(blockIdx.x) * kTx + threadIdx.x) * kV;
  const bool want_w = a.weight;
  for (int64_t c = blockIdx.y; c < chunks; c += gridDim.y) {
    Acc w[kV] = {};
    Acc b[kV] = {};
    if (d0 < a.d) {
      const int64_t end = min(rows, (c + 1) * kParamGradChunkRows);
      for (int64_t j = c * kParamGradChunkRows + threadIdx.y; j < end; j += kTy) {
        Pack<T, kV> g;
        Pack<T, kV> x;
        const T* dy = a.dy + j * a.dy_stride[0] + d0;
        const T* xr = a.x + j * a.x_stride[0] + d0;
        if constexpr (kUnaligned) {
          if (d0 + kV <= a.d) {
            g = LoadPackUnaligned<T, kV>(dy);
            if (want_w) x = LoadPackUnaligned<T, kV>(xr);
          } else {  // the row's last columns: zeros past its end
#pragma unroll
            for (int e = 0; e < kV; ++e) {
              const bool in = d0 + e < a.d;
              g.Set(e, in ? ToAcc(dy[e]) : Acc(0));
              x.Set(e, in && want_w ? ToAcc(xr[e]) : Acc(0));
            }
          }
        } else {
          g.Load(dy);
          if (want_w) x.Load(xr);
        }
        const Acc mu = want_w ? a.stats[2 * j] : Acc(0);
        const Acc r = want_w ? a.stats[2 * j + 1] : Acc(0);
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

// One level of the finalize's tree, for each requested sum (blockIdx.z): out[z][s][d] =
// Σ in[z][r][d] over the rows r of block s, [s·kFinalizeFan, (s+1)·kFinalizeFan) ∩ [0, rows),
// rounded once to Out (the parameters' type on the last level, Acc on the inner ones). Thread
// (column, y) adds rows first + y, first + y + kFinalizeSubs, ... of the block in order, and the
// column's first thread adds the kFinalizeSubs sums in y order. Interleaved, every thread of a
// column has rows even in a block of 32 (the slice sums' 16-bit rows past 32768 leave 32-64
// partial rows), where contiguous sub-blocks of kFinalizeBatch rows left three of four threads
// idle: 30 µs for the 32 MB of layer_norm bf16 131072's partials on the H100, 14.7 µs
// interleaved with 16-byte loads (benchmarks/results/h100/NOTES.md §35). A thread owns kV
// adjacent columns (a 16-byte load per row where the launcher allows it) and issues its rows'
// loads kLoads at a time, all of a round before its first add. The sums depend on neither kV,
// kLoads nor the launch shape nor the GPU.
template <typename Acc, typename Out>
struct FinalizeLevel {
  const Acc* in[2];  // [rows][n] per sum, nullptr for a sum not requested
  Out* out[2];       // [ceil(rows / kFinalizeFan)][n]
  int64_t rows;
  int64_t n;
};

constexpr int kFinalizeSubs = kFinalizeFan / kFinalizeBatch;
constexpr int kFinalizeCols = 64;  // threads per CTA along the columns (x kFinalizeSubs)

template <typename Acc, typename Out, int kV, int kLoads>
__global__ void __launch_bounds__(kFinalizeCols* kFinalizeSubs)
    ParamGradFinalizeKernel(const FinalizeLevel<Acc, Out> t) {
  static_assert(kFinalizeBatch % kLoads == 0, "whole rounds of loads");
  using P = Pack<Acc, kV>;
  __shared__ P subs[kFinalizeSubs][kFinalizeCols];
  // z counts the requested sums: sum 1 alone runs as z = 0. No dynamic index into the params.
  const bool second = blockIdx.z == 1 || t.in[0] == nullptr;
  const Acc* in = second ? t.in[1] : t.in[0];
  Out* out = second ? t.out[1] : t.out[0];
  const int64_t d = (static_cast<int64_t>(blockIdx.x) * kFinalizeCols + threadIdx.x) * kV;
  const int64_t blocks = (t.rows + kFinalizeFan - 1) / kFinalizeFan;
  const int y = threadIdx.y;
  for (int64_t s = blockIdx.y; s < blocks; s += gridDim.y) {
    const int64_t first = s * kFinalizeFan;
    const int count = static_cast<int>(min(int64_t{kFinalizeFan}, t.rows - first));
    const int mine = count > y ? (count - y + kFinalizeSubs - 1) / kFinalizeSubs : 0;
    Acc sum[kV] = {};
    if (d < t.n && mine > 0) {
      const Acc* p = in + (first + y) * t.n + d;
      // mine <= kFinalizeBatch: at most kFinalizeBatch / kLoads rounds. The offsets are (row ·
      // subs) · t.n: with a 64-bit step held in a register instead, ptxas interleaved the loads
      // with the adds (6 of 64 in flight, 32 registers; 128 this way).
#pragma unroll
      for (int b = 0; b < kFinalizeBatch; b += kLoads) {
        if (b >= mine) break;
        // Every load unconditional (past the thread's last row it re-reads that row), so that
        // all are issued before the first add.
        P v[kLoads];
#pragma unroll
        for (int k = 0; k < kLoads; ++k)
          v[k].Load(p + (min(b + k, mine - 1) * kFinalizeSubs) * t.n);
#pragma unroll
        for (int k = 0; k < kLoads; ++k) {
          if (b + k < mine) {
#pragma unroll
            for (int e = 0; e < kV; ++e) sum[e] += v[k].Get(e);
          }
        }
      }
    }
#pragma unroll
    for (int e = 0; e < kV; ++e) subs[y][threadIdx.x].Set(e, sum[e]);
    __syncthreads();
    if (y == 0 && d < t.n) {
      Acc total[kV];
#pragma unroll
      for (int e = 0; e < kV; ++e) total[e] = subs[0][threadIdx.x].Get(e);
#pragma unroll
      for (int z = 1; z < kFinalizeSubs; ++z) {
        if (z < count) {
#pragma unroll
          for (int e = 0; e < kV; ++e) total[e] += subs[z][threadIdx.x].Get(e);
        }
      }
#pragma unroll
      for (int e = 0; e < kV; ++e) out[s * t.n + d + e] = FromAcc<Out>(total[e]);
    }
    __syncthreads();
  }
}

// A shape of the finalize's kernel: kV columns a thread, kLoads loads in flight a round.
template <typename Acc, typename Out, int kV, int kLoads>
struct FinalizeShape {
  static constexpr auto kKernel = ParamGradFinalizeKernel<Acc, Out, kV, kLoads>;
  static constexpr int kThreads = kFinalizeCols * kFinalizeSubs;

  static dim3 Grid(const FinalizeLevel<Acc, Out>& t, unsigned sums) {
    const int64_t blocks = (t.rows + kFinalizeFan - 1) / kFinalizeFan;
    return dim3(GridFor((t.n + int64_t{kFinalizeCols} * kV - 1) / (kFinalizeCols * kV)),
                GridFor(std::min<int64_t>(blocks, 65535)), sums);
  }

  // The rounds of loads the level waits for one after another: the grid's waves on the CTAs
  // the device holds at once, times the rounds a thread of `mine` rows issues. 0 where none fits.
  static cudaError_t Depth(const FinalizeLevel<Acc, Out>& t, unsigned sums, int64_t mine,
                           int64_t* depth) {
    int resident = 0;
    const cudaError_t err = ResidentCtas<kKernel, 0>(kThreads, &resident);
    const dim3 g = Grid(t, sums);
    const int64_t ctas = int64_t{g.x} * g.y * g.z;
    *depth = resident > 0 ? (ctas + resident - 1) / resident * ((mine + kLoads - 1) / kLoads) : 0;
    return err;
  }

  static void Launch(const FinalizeLevel<Acc, Out>& t, unsigned sums, cudaStream_t stream) {
    kKernel<<<Grid(t, sums), dim3(kFinalizeCols, kFinalizeSubs), 0, stream>>>(t);
  }
};

// One level on the kernel shape whose loads wait the fewest rounds one after another
// (FinalizeShape::Depth), the first listed on a tie: 16-byte loads (whole, aligned column
// groups), then a column a thread with 64, 32 or 16 loads a round. The deep scalar kernel takes
// 128 registers (two CTAs an SM): at layer_norm bf16 32768's 64 partial rows (16 a thread) its
// 1024 CTAs ran in four waves (16.0 µs, 1.05 TB/s, ncu, H200) where the 16-byte kernel's 256
// CTAs take one (6.9 µs); at 8192's 256 rows (64 a thread) it holds them all in flight in one
// wave where the 16-byte kernel's 64 CTAs wait four rounds. H200, fwd+bwd with every gradient,
// 2^27 elements, the finalize's µs against the former rule (16-byte loads where their grid
// held half the device's CTAs): layer_norm bf16 32768 11.3 -> 4.2 (the step 0.976x), 16384
// 6.5 -> 4.4, 1024-4096 7.7-8.3 -> 6.8-7.6, fp32 16384 6.5 -> 4.3, rms_norm bf16 32768 6.5 ->
// 4.5; every other measured shape within 0.7 µs (benchmarks/results/h200/NOTES.md §56). The
// choice changes no bit of the sums.
template <typename Acc, typename Out>
cudaError_t LaunchFinalizeLevel(const FinalizeLevel<Acc, Out>& t, cudaStream_t stream) {
  constexpr int kV = 16 / sizeof(Acc);
  using Wide = FinalizeShape<Acc, Out, kV, kFinalizeBatch / kV>;
  using Deep = FinalizeShape<Acc, Out, 1, kFinalizeBatch>;
  using Half = FinalizeShape<Acc, Out, 1, kFinalizeBatch / 2>;
  using Quarter = FinalizeShape<Acc, Out, 1, kFinalizeBatch / 4>;
  const unsigned sums = (t.in[0] != nullptr) + (t.in[1] != nullptr);
  const int64_t mine =
      (std::min<int64_t>(t.rows, kFinalizeFan) + kFinalizeSubs - 1) / kFinalizeSubs;
  bool wide = t.n % kV == 0;
  for (int z = 0; z < 2; ++z) wide = wide && reinterpret_cast<uintptr_t>(t.in[z]) % 16 == 0;
  int64_t depth[4] = {};
  cudaError_t err = wide ? Wide::Depth(t, sums, mine, &depth[0]) : cudaSuccess;
  if (err == cudaSuccess) err = Deep::Depth(t, sums, mine, &depth[1]);
  if (err == cudaSuccess) err = Half::Depth(t, sums, mine, &depth[2]);
  if (err == cudaSuccess) err = Quarter::Depth(t, sums, mine, &depth[3]);
  if (err != cudaSuccess) return err;
  int pick = -1;
  for (int i = 0; i < 4; ++i) {
    if (depth[i] > 0 && (pick < 0 || depth[i] < depth[pick])) pick = i;
  }
  switch (pick) {
    case 0: Wide::Launch(t, sums, stream); break;
    case 2: Half::Launch(t, sums, stream); break;
    case 3: Quarter::Launch(t, sums, stream); break;
    default: Deep::Launch(t, sums, stream); break;
  }
  return cudaGetLastError();
}

}  // namespace

template <typename T, typename Acc, typename W>
cudaError_t ParamGrad(const ParamGradArgs<T, Acc>& a, ParamGradOut<W> out, Acc* partial,
                      cudaStream_t stream) {
  if (a.d == 0) return cudaSuccess;
  const int64_t rows = a.outer * a.inner;
  const int64_t chunks = ParamGradChunks(rows);
  if (chunks == 0) {  // no rows: the gradients are zero
    cudaError_t err = cudaSuccess;
    if (out.dweight != nullptr) err = cudaMemsetAsync(out.dweight, 0, a.d * sizeof(W), stream);
    if (err == cudaSuccess && out.dbias != nullptr) {
      err = cudaMemsetAsync(out.dbias, 0, a.d * sizeof(W), stream);
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
    if constexpr (Pack<T, kV>::kWords) {  // packs by words (not float64)
      const dim3 grid(GridFor((a.d + kTx * kV - 1) / (kTx * kV)), grid_y);
      ParamGradRowsKernel<T, Acc, kV, true>
          <<<grid, dim3(kTx, kTy), 0, stream>>>(a, partial, chunks);
    } else {
      const dim3 grid(GridFor((a.d + kTx - 1) / kTx), grid_y);
      ParamGradRowsKernel<T, Acc, 1><<<grid, dim3(kTx, kTy), 0, stream>>>(a, partial, chunks);
    }
  } else {
    const dim3 grid(GridFor((a.d + kTx - 1) / kTx), grid_y);
    ParamGradPartialKernel<T, Acc><<<grid, dim3(kTx, kTy), 0, stream>>>(a, partial, chunks);
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  return ParamGradFinalize<Acc, W>(partial, chunks, a.d, out, partial + 2 * chunks * a.d, stream);
}

template <typename Acc, typename W>
cudaError_t ParamGradFinalize(const Acc* partial, int64_t chunks, int64_t n, ParamGradOut<W> out,
                              Acc* scratch, cudaStream_t stream) {
  if (n == 0 || (out.dweight == nullptr && out.dbias == nullptr)) return cudaSuccess;
  const Acc* in[2] = {out.dweight != nullptr ? partial : nullptr,
                      out.dbias != nullptr ? partial + chunks * n : nullptr};
  // The inner levels (Acc, in scratch), while a level leaves more than one row per column.
  int64_t rows = chunks;
  for (int64_t blocks = (rows + kFinalizeFan - 1) / kFinalizeFan; blocks > 1;
       blocks = (rows + kFinalizeFan - 1) / kFinalizeFan) {
    FinalizeLevel<Acc, Acc> t{{in[0], in[1]}, {}, rows, n};
    for (int z = 0; z < 2; ++z) {
      t.out[z] = in[z] != nullptr ? scratch + z * blocks * n : nullptr;
    }
    scratch += 2 * blocks * n;
    const cudaError_t err = LaunchFinalizeLevel(t, stream);
    if (err != cudaSuccess) return err;
    for (int z = 0; z < 2; ++z) in[z] = t.out[z];
    rows = blocks;
  }
  return LaunchFinalizeLevel(
      FinalizeLevel<Acc, W>{{in[0], in[1]}, {out.dweight, out.dbias}, rows, n}, stream);
}

template cudaError_t ParamGradFinalize<float, float>(const float*, int64_t, int64_t,
                                                     ParamGradOut<float>, float*, cudaStream_t);
template cudaError_t ParamGradFinalize<float, __half>(const float*, int64_t, int64_t,
                                                      ParamGradOut<__half>, float*, cudaStream_t);
template cudaError_t ParamGradFinalize<float, __nv_bfloat16>(const float*, int64_t, int64_t,
                                                             ParamGradOut<__nv_bfloat16>, float*,
                                                             cudaStream_t);
template cudaError_t ParamGradFinalize<double, double>(const double*, int64_t, int64_t,
                                                       ParamGradOut<double>, double*, cudaStream_t);

#define ROWNORM_INSTANTIATE(T, W)                                                       \
  template cudaError_t ParamGrad<T, AccType<T>, W>(const ParamGradArgs<T, AccType<T>>&, \
                                                   ParamGradOut<W>, AccType<T>*, cudaStream_t);
ROWNORM_FOR_EACH_FLOAT_TYPE_AND_WEIGHT(ROWNORM_INSTANTIATE)
// The float32 residual stream's two-pass path: float rows, a 16-bit weight's gradient.
ROWNORM_INSTANTIATE(float, __half)
ROWNORM_INSTANTIATE(float, __nv_bfloat16)
#undef ROWNORM_INSTANTIATE

}  // namespace rownorm
