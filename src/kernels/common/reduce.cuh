// All-reductions layered warp -> block -> cluster, generic over the combining operator.
//
// Every primitive returns the reduced value to EVERY participating thread, so a kernel body
// reads like its maths (`ss = row.Reduce(SumOp{}, x²)`, then `y = x * rsqrt(ss)`).
// The value type V is a float, a double or an Array<float|double, K> (several statistics in
// one pass, sharing one barrier); sizeof(V) <= kReduceSlotBytes.
// Results are deterministic: partials are always combined in the same order.
#pragma once

#include <cfloat>
#include <type_traits>

#if defined(__CUDACC__)
#include <cooperative_groups.h>
#endif

#include "kernels/common/types.cuh"

namespace rownorm {

constexpr int kWarpSize = 32;

// Bytes of one shared-memory slot of a reduction value: up to four doubles (LayerNorm's
// backward reduces three statistics at once).
constexpr int kReduceSlotBytes = 32;

template <typename T, int K>
ROWNORM_HOST_DEVICE Array<T, K> operator+(const Array<T, K>& a, const Array<T, K>& b) {
  Array<T, K> r;
#pragma unroll
  for (int i = 0; i < K; ++i) r[i] = a[i] + b[i];
  return r;
}

template <typename V>
struct Filler {
  template <typename S>
  ROWNORM_HOST_DEVICE static V Fill(S s) {
    return static_cast<V>(s);
  }
};
template <typename T, int K>
struct Filler<Array<T, K>> {
  template <typename S>
  ROWNORM_HOST_DEVICE static Array<T, K> Fill(S s) {
    Array<T, K> r;
#pragma unroll
    for (int i = 0; i < K; ++i) r[i] = static_cast<T>(s);
    return r;
  }
};

struct SumOp {
  template <typename V>
  ROWNORM_HOST_DEVICE V operator()(const V& a, const V& b) const {
    return a + b;
  }
  template <typename V>
  ROWNORM_HOST_DEVICE static V Identity() {
    return Filler<V>::Fill(0);
  }
};

struct MaxOp {
  template <typename V>
  ROWNORM_HOST_DEVICE V operator()(const V& a, const V& b) const {
    return Max(a, b);
  }
  template <typename V>
  ROWNORM_HOST_DEVICE static V Identity() {
    return Filler<V>::Fill(-INFINITY);
  }
};

#if defined(__CUDACC__)

ROWNORM_DEVICE float ShflXor(float v, int mask, int width) {
  return __shfl_xor_sync(0xffffffffu, v, mask, width);
}
ROWNORM_DEVICE double ShflXor(double v, int mask, int width) {
  return __shfl_xor_sync(0xffffffffu, v, mask, width);
}
template <typename T, int K>
ROWNORM_DEVICE Array<T, K> ShflXor(Array<T, K> a, int mask, int width) {
#pragma unroll
  for (int i = 0; i < K; ++i) a[i] = ShflXor(a[i], mask, width);
  return a;
}

// Butterfly all-reduce among aligned groups of kWidth lanes (kWidth a power of two <= 32).
// All 32 lanes of the warp must call it (the shuffles use the full mask).
template <int kWidth, typename Op, typename V>
ROWNORM_DEVICE V WarpAllReduce(V v, Op op) {
  static_assert(kWidth >= 1 && kWidth <= kWarpSize && (kWidth & (kWidth - 1)) == 0,
                "group width must be a power of two <= 32");
#pragma unroll
  for (int mask = kWidth / 2; mask > 0; mask /= 2) v = op(v, ShflXor(v, mask, kWidth));
  return v;
}

// Shared memory of a block all-reduce: one slot per warp, double-buffered so that
// consecutive reductions need a single __syncthreads each (the barrier of call k+1 orders
// call k's reads before call k+2's writes to the same buffer).
template <int kThreads>
struct BlockReduceStorage {
  static constexpr int kWarps = kThreads / kWarpSize;
  alignas(16) unsigned char bytes[2][kWarps][kReduceSlotBytes];
};

// All-reduce over a 1-D block of kThreads threads (a multiple of 32); `parity` is the
// caller's per-block buffer selector, identical in every thread, flipped by each call.
template <int kThreads, typename Op, typename V>
ROWNORM_DEVICE V BlockAllReduce(V v, Op op, BlockReduceStorage<kThreads>& storage, int& parity) {
  static_assert(kThreads % kWarpSize == 0, "block size must be a multiple of 32");
  static_assert(sizeof(V) <= kReduceSlotBytes, "reduction value must fit a slot");
  v = WarpAllReduce<kWarpSize>(v, op);
  if constexpr (kThreads > kWarpSize) {
    constexpr int kWarps = kThreads / kWarpSize;
    const int lane = threadIdx.x % kWarpSize;
    const int warp = threadIdx.x / kWarpSize;
    if (lane == 0) *reinterpret_cast<V*>(storage.bytes[parity][warp]) = v;
    __syncthreads();
    v = *reinterpret_cast<const V*>(storage.bytes[parity][0]);
#pragma unroll
    for (int w = 1; w < kWarps; ++w)
      v = op(v, *reinterpret_cast<const V*>(storage.bytes[parity][w]));
    parity ^= 1;
  }
  return v;
}

// Shared memory of a cluster all-reduce: the block's storage plus one double-buffered slot
// that the other CTAs of the cluster read through distributed shared memory.
template <int kThreads>
struct ClusterReduceStorage {
  BlockReduceStorage<kThreads> block;
  alignas(16) unsigned char slot[2][kReduceSlotBytes];
};

// All-reduce over a thread-block cluster of kCluster CTAs of kThreads threads (sm_90+).
// Every CTA reads the kCluster block partials in rank order, so all CTAs obtain bitwise the
// same result. The kernel must end with a cluster barrier so that no CTA exits while another
// still reads its shared memory.
template <int kThreads, int kCluster, typename Op, typename V>
ROWNORM_DEVICE V ClusterAllReduce(V v, Op op, ClusterReduceStorage<kThreads>& storage,
                                  int& block_parity, int& cluster_parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  v = BlockAllReduce<kThreads>(v, op, storage.block, block_parity);
  cg::cluster_group cluster = cg::this_cluster();
  V* slot = reinterpret_cast<V*>(storage.slot[cluster_parity]);
  if (threadIdx.x == 0) *slot = v;
  cluster.sync();
  v = *cluster.map_shared_rank(slot, 0);
  // Four peers' partials in flight at a time (the same order, so the same bits): unrolled in
  // full, the 16-CTA kernels held all 16 loads, LayerNorm's forward took 160 registers (one CTA
  // per SM) and its backward 248, and bf16 rows of 262144 ran at 26% of copy on the H100; at
  // four, 80 and 131 registers and 0.44x / 0.78x the time (benchmarks/results/h100/NOTES.md
  // §18).
#pragma unroll 4
  for (int c = 1; c < kCluster; ++c) v = op(v, *cluster.map_shared_rank(slot, c));
  cluster_parity ^= 1;
  return v;
#else
  __trap();  // cluster kernels are only launched on sm_90+ (checked on the host)
  return v;
#endif
}

#endif  // __CUDACC__

}  // namespace rownorm
