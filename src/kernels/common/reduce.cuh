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

#include "kernels/common/mbarrier.cuh"
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
// kSlotBytes: a slot's size (a kernel whose values are smaller may take less shared memory).
template <int kThreads, int kSlotBytes = kReduceSlotBytes>
struct BlockReduceStorage {
  static constexpr int kWarps = kThreads / kWarpSize;
  alignas(16) unsigned char bytes[2][kWarps][kSlotBytes];
};

// All-reduce over a 1-D block of kThreads threads (a multiple of 32); `parity` is the
// caller's per-block buffer selector, identical in every thread, flipped by each call.
template <int kThreads, int kSlotBytes, typename Op, typename V>
ROWNORM_DEVICE V BlockAllReduce(V v, Op op, BlockReduceStorage<kThreads, kSlotBytes>& storage,
                                int& parity) {
  static_assert(kThreads % kWarpSize == 0, "block size must be a multiple of 32");
  static_assert(sizeof(V) <= kSlotBytes, "reduction value must fit a slot");
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

// Shared memory of a cluster all-reduce: the block's storage, and for each of two alternating
// sets a slot per CTA of the cluster, which the CTAs' partials are pushed into, and the barrier
// that completes when all of them have landed.
template <int kThreads, int kCluster, int kSlotBytes = kReduceSlotBytes>
struct ClusterReduceStorage {
  BlockReduceStorage<kThreads, kSlotBytes> block;
  alignas(16) unsigned char slots[2][kCluster][kSlotBytes];
  uint64_t landed[2];
};

// The kCluster values a ClusterReducer::Merge hands its `combine`, from the slots they landed
// in: part(c), CTA c's value; Mine(), the value of CTA l % kCluster for lane l, so that each
// group of kCluster lanes holds them all; Reduce(x, op), x combined over such a group by a
// butterfly, the same bits in every lane for an op whose result does not depend on its
// operands' order (a sum, a max), and in every CTA, which all hold the same parts.
template <int kCluster, typename V, int kSlotBytes = kReduceSlotBytes>
struct SliceParts {
  const unsigned char (&slots)[kCluster][kSlotBytes];
  ROWNORM_DEVICE const V& operator()(int c) const { return *reinterpret_cast<const V*>(slots[c]); }
  ROWNORM_DEVICE const V& Mine() const { return (*this)(static_cast<int>(threadIdx.x % kCluster)); }
  template <typename Op, typename X>
  ROWNORM_DEVICE static X Reduce(X x, Op op) {
    return WarpAllReduce<kCluster>(x, op);
  }
};

// All-reduces over a thread-block cluster of kCluster CTAs of kThreads threads (sm_90+), one
// object per thread, made by every thread of every CTA at the kernel's start. Each CTA reduces
// its block, pushes its partial into slot `rank` of every CTA (st.async into distributed shared
// memory, which completes on the receiver's barrier: no cluster barrier), waits until all
// kCluster partials have landed in its own slots and combines them in rank order, so all CTAs
// obtain bitwise the same result. The cluster barrier (cluster.sync()) that this replaces
// orders all of a thread's memory operations (SASS: MEMBAR.ALL.GPU): each all-reduce waited
// for the CTA's stores of the previous row to reach memory, 35-47% of the cluster kernels'
// stall cycles (ncu, H100, benchmarks/results/h100/NOTES.md §27).
//
// AllReduce is BlockReduce, then Merge; an op body may also run several BlockReduces before
// one Merge (the slice statistics of layer_norm.cuh and softmax.cuh). Set p is reused two merges
// later: a CTA pushes into a peer's set p for merge k + 2 only after it has all partials of k + 1,
// the peer's among them, which the peer pushed after a block barrier that followed its threads'
// reads of the set of k. A CTA leaves the kernel
// after its last wait, once nothing more can land in its shared memory (Finish()).
template <int kThreads, int kCluster, int kSlotBytes = kReduceSlotBytes>
class ClusterReducer {
 public:
  using Storage = ClusterReduceStorage<kThreads, kCluster, kSlotBytes>;

  ROWNORM_DEVICE explicit ClusterReducer(Storage& storage) : storage_(storage) {
    if (threadIdx.x == 0) {
      InitBarrier(&storage.landed[0]);
      InitBarrier(&storage.landed[1]);
    }
    ClusterArriveRelaxed();  // the barriers initialized: the peers may push (first AllReduce)
  }

  template <typename Op, typename V>
  ROWNORM_DEVICE V AllReduce(V v, Op op) {
    return Merge(BlockReduce(v, op), [op](auto part) {
      V r = part(0);
#pragma unroll 4
      for (int c = 1; c < kCluster; ++c) r = op(r, part(c));
      return r;
    });
  }

  // The first level of AllReduce: v over this CTA's threads only.
  template <typename Op, typename V>
  ROWNORM_DEVICE V BlockReduce(V v, Op op) {
    return BlockAllReduce<kThreads>(v, op, storage_.block, block_parity_);
  }

  // The second level: each CTA's value v (the same in all of its threads: a BlockReduce's
  // result) pushed to every CTA; returns combine(parts) (SliceParts: every CTA's value) in every
  // thread of every CTA. `combine` must compute from the parts alone, in an order that does not
  // depend on the CTA, for all CTAs to obtain the same bits. v must come from a BlockReduce
  // called after the previous Merge: its barrier is what orders this CTA's reads of a set
  // before its next push (see the class comment).
  template <typename V, class Combine>
  ROWNORM_DEVICE auto Merge(const V& v, Combine combine) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    static_assert(sizeof(V) <= kSlotBytes, "reduction value must fit a slot");
    if (!joined_) {
      ClusterWait();  // every CTA's barriers are initialized
      joined_ = true;
    }
    const int p = set_;
    uint64_t* landed = &storage_.landed[p];
    if (threadIdx.x == 0) ExpectBytes(landed, kCluster * sizeof(V));
    if (threadIdx.x < kCluster) {  // thread q pushes the CTA's partial to CTA q
      const unsigned rank = cooperative_groups::this_cluster().block_rank();
      StoreToPeer(reinterpret_cast<V*>(storage_.slots[p][rank]), v, landed, threadIdx.x);
    }
    WaitBarrier(landed, (phases_ >> p) & 1u);
    phases_ ^= 1u << p;
    set_ ^= 1;
    return combine(SliceParts<kCluster, V, kSlotBytes>{storage_.slots[p]});
#else
    __trap();  // cluster kernels are only launched on sm_90+ (checked on the host)
    return combine(SliceParts<kCluster, V, kSlotBytes>{storage_.slots[0]});
#endif
  }

  // At the kernel's end: a CTA that never reduced still waits for the cluster barrier it
  // arrived at (every CTA of the cluster passes it once).
  ROWNORM_DEVICE void Finish() {
    if (!joined_) ClusterWait();
    joined_ = true;
  }

 private:
  Storage& storage_;
  int block_parity_ = 0;
  int set_ = 0;
  unsigned phases_ = 0;  // bit p: the parity of set p's barrier's next phase
  bool joined_ = false;  // passed the cluster barrier of the barriers' initialization
};

#endif  // __CUDACC__

}  // namespace rownorm
