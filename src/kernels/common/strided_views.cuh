// Row views of the strided-dim path: a reduction over dim d of contiguous (outer, d, inner)
// operands with inner > 1 (for example the channels of NCHW). A "row" is then fixed
// (outer o, inner i) running over d, with stride `inner` between its elements: threads walk the
// contiguous inner dim (coalesced) and a kTx x kTy CTA splits d among its kTy thread rows.
//
//   StridedRow              thread (tx, ty) owns column i = tile + tx and elements d = ty,
//                           ty + kTy, ...; with kCache > 0 it keeps those (at most kCache) in
//                           registers, else it streams them.
//   StridedTile/StridedLane a thread owns kLanes adjacent columns, read and written as
//                           packs (inner a multiple of kLanes, every operand pack-aligned,
//                           checked on the host); the op body runs once per lane. The CTA
//                           layout splits d among a CTA's kTy thread rows, the warp layout
//                           among 1, 2 or 4 lanes of a warp (see StridedTile).
// The kTy partials of a column are combined through shared memory (StridedAllReduce; a tile's
// lanes all at once, StridedLaneStorage), in the warp layout by shuffles.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/common/args.h"
#include "kernels/common/pack.cuh"
#include "kernels/common/reduce.cuh"
#include "kernels/common/row_ops.h"

namespace rownorm {

#if defined(__CUDACC__)

// A column's kTy partials in shared memory: thread (tx, ty)'s value at [ty][tx] of an array of
// its type V, so that a warp's accesses are sizeof(V) apart, free of bank conflicts. (Slots of
// 32 bytes put a warp's 4-byte accesses eight banks apart: ncu on the channel seed's kernel,
// H200, 7.4-way conflicts on its shared loads; benchmarks/results/h200/NOTES.md §47.)
template <int kTx, int kTy>
struct StridedReduceStorage {
  alignas(16) unsigned char bytes[2][kTy * kTx * kReduceSlotBytes];
};
// The warp layout's (below): its columns reduce by shuffles, in no shared memory.
struct NoStridedStorage {
  static constexpr int kCalls = 0;
};

// The CTA layout's all-reduces of a tile's kLanes lanes, made in rounds (RunLanes): lane l's
// partial at slots[l][ty][tx] (a warp's accesses a value apart: no bank conflicts), then the
// column's kTy partials of every lane combined at once into results[call][l][tx]. Values of up
// to two Acc (the op bodies' reductions) in op bodies of up to kCalls all-reduces. No double
// buffer: a round writes its partials after the barrier that ended the last combine's reads of
// them, and results[call] is written once a tile, after a barrier that follows the last tile's
// reads of it.
template <int kTx, int kTy, int kLanes, typename Acc>
struct StridedLaneStorage {
  static_assert(kLanes <= kTy, "a thread row combines one lane");
  static constexpr int kSlotBytes = 2 * sizeof(Acc);
  static constexpr int kCalls = 2;

  // Thread (tx, ty)'s partial of `lane`.
  template <typename V>
  ROWNORM_DEVICE void Leave(int lane, V v) {
    Slots<V>()[lane][threadIdx.y][threadIdx.x] = v;
  }
  // Every thread of the CTA, after a barrier that follows the partials' writes: thread row l
  // combines lane l's kTy partials of column tx, in ty order, into all-reduce `call`'s results.
  template <typename V, typename Op>
  ROWNORM_DEVICE void Combine(int call, Op op) {
    auto* slots = Slots<V>();
    const unsigned l = threadIdx.y;
    if (l < kLanes) {
      V v = slots[l][0][threadIdx.x];
#pragma unroll
      for (int y = 1; y < kTy; ++y) v = op(v, slots[l][y][threadIdx.x]);
      Results<V>()[call][l][threadIdx.x] = v;
    }
    __syncthreads();
  }
  template <typename V>
  ROWNORM_DEVICE V Result(int call, int lane) {
    return Results<V>()[call][lane][threadIdx.x];
  }

 private:
  template <typename V>
  using LaneSlots = V[kTy][kTx];
  template <typename V>
  using CallResults = V[kLanes][kTx];
  template <typename V>
  ROWNORM_DEVICE LaneSlots<V>* Slots() {  // [kLanes][kTy][kTx]
    static_assert(sizeof(V) <= kSlotBytes, "reduction value must fit a slot");
    return reinterpret_cast<LaneSlots<V>*>(slots);
  }
  template <typename V>
  ROWNORM_DEVICE CallResults<V>* Results() {  // [kCalls][kLanes][kTx]
    return reinterpret_cast<CallResults<V>*>(results);
  }
  alignas(16) unsigned char slots[kLanes * kTy * kTx * kSlotBytes];
  alignas(16) unsigned char results[kCalls * kLanes * kTx * kSlotBytes];
};

// All-reduce of thread (tx, ty)'s value over ty, returned to the kTy threads of column tx.
// `parity` selects the double-buffered storage (one __syncthreads per call, as BlockAllReduce);
// it lives in the kernel so that it carries over from one row to the next.
template <int kTx, int kTy, typename Op, typename V>
ROWNORM_DEVICE V StridedAllReduce(V acc, Op op, StridedReduceStorage<kTx, kTy>& storage,
                                  int& parity) {
  static_assert(sizeof(V) <= kReduceSlotBytes, "reduction value must fit a slot");
  auto* slots = reinterpret_cast<V(*)[kTx]>(storage.bytes[parity]);  // [kTy][kTx]
  slots[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  acc = slots[0][threadIdx.x];
#pragma unroll
  for (int y = 1; y < kTy; ++y) acc = op(acc, slots[y][threadIdx.x]);
  parity ^= 1;
  return acc;
}

// Σ over the lanes l ^ m (m = kOffset, kOffset / 2, ..., kStop) of a warp of each of kN
// values, reduce-scattered: while more than one value is left, a step keeps half of them (the
// upper half in the lane whose kOffset bit is set) and adds its partner's copy of that half; the
// last value is then summed whole over the remaining offsets. Returns the lane's one value: with
// kN = 8 from kOffset = 16, value (lane / 4) % 8. The same adds in the same order every time.
template <int kN, int kOffset, int kStop, typename Acc>
ROWNORM_DEVICE Acc WarpScatterSum(const Acc (&v)[kN]) {
  if constexpr (kN == 1) {
    Acc s = v[0];
#pragma unroll
    for (int m = kOffset; m >= kStop && m > 0; m /= 2) s += __shfl_xor_sync(0xffffffffu, s, m);
    return s;
  } else {
    static_assert(kOffset >= kStop && kOffset > 0, "too few lanes to leave one value a lane");
    constexpr int kHalf = kN / 2;
    const bool upper = (threadIdx.x & kOffset) != 0;
    Acc h[kHalf];
#pragma unroll
    for (int e = 0; e < kHalf; ++e) {
      const Acc keep = upper ? v[kHalf + e] : v[e];
      const Acc give = upper ? v[e] : v[kHalf + e];
      h[e] = keep + __shfl_xor_sync(0xffffffffu, give, kOffset);
    }
    return WarpScatterSum<kHalf, kOffset / 2, kStop>(h);
  }
}

// What the op body of a fused strided backward is handed as its column sums (op_traits.h's
// kColumnSums): their count only; the tile holds them (StridedLane::AddColumns).
template <int K>
struct StridedColumnSums {
  static constexpr int kCount = K;
};

// Row (o, i) of a StridedArgs problem, shared by both views: its operands' first elements and
// its number among the outer * inner rows. Columns past `inner` (the last tile's idle threads)
// are invalid and point at column 0 so that no address leaves the tensors.
template <class Args>
struct StridedOperands {
  using TIn = typename Args::InElem;
  using TOut = typename Args::OutElem;
  static constexpr int kIn = Args::kNumIn;
  static constexpr int kOut = Args::kNumOut;

  ROWNORM_DEVICE StridedOperands(const Args& a, int64_t o, int64_t i)
      : d(a.d), inner(a.inner), index(o * a.inner + i), valid(i < a.inner) {
    const int64_t base = o * a.d * a.inner + (valid ? i : 0);
#pragma unroll
    for (int k = 0; k < kIn; ++k) in[k] = a.in[k] + base;
#pragma unroll
    for (int j = 0; j < kOut; ++j) out[j] = a.out[j] + base;
  }

  int64_t d;
  int64_t inner;
  int64_t index;
  bool valid;
  const TIn* in[kIn];
  TOut* out[kOut];
};

template <class Args, int kTx, int kTy, int kCache>
class StridedRow
    : public RowOps<StridedRow<Args, kTx, kTy, kCache>, AccType<typename Args::InElem>> {
 public:
  using TIn = typename Args::InElem;
  using TOut = typename Args::OutElem;
  using Acc = AccType<TIn>;
  static constexpr int kIn = Args::kNumIn;
  static constexpr int kOut = Args::kNumOut;
  static constexpr bool kCached = kCache > 0;

  ROWNORM_DEVICE StridedRow(StridedReduceStorage<kTx, kTy>& storage, int& parity, const Args& a,
                            int64_t o, int64_t i)
      : storage_(storage), parity_(parity), at_(a, o, i) {
    if constexpr (kCache > 0) {
#pragma unroll
      for (int c = 0; c < kCache; ++c) {
        const int64_t d = threadIdx.y + c * kTy;
        if (at_.valid && d < at_.d) {
#pragma unroll
          for (int k = 0; k < kIn; ++k) cache_[k][c] = at_.in[k][d * at_.inner];
        }
      }
    }
  }

  // The row's number among the outer * inner rows, and whether this thread writes its
  // per-row results (each column is one thread's; ty == 0 holds it).
  ROWNORM_DEVICE int64_t Size() const { return at_.d; }
  ROWNORM_DEVICE int64_t Index() const { return at_.index; }
  ROWNORM_DEVICE bool Valid() const { return at_.valid; }
  ROWNORM_DEVICE bool Leader() const { return at_.valid && threadIdx.y == 0; }
  ROWNORM_DEVICE Acc First() const { return ToAcc(at_.in[0][0]); }

  // Primitives of RowOps.
  template <typename Op, typename V>
  ROWNORM_DEVICE V AllReduce(V acc, Op op) {
    return StridedAllReduce(acc, op, storage_, parity_);
  }
  // A thread's elements are summed in two levels of blocks, 16 elements, then 16 such blocks,
  // each folded into the next level, so that rounding grows with 16 + 16 + m / 256 terms for
  // m elements rather than m. That matters for streamed rows (d / kTy elements a thread: 512 of
  // a row of 4097, where one serial chain put an fp32 l1 column of equal values 2.7e-6 off;
  // the float32 emulation in NOTES.md §13 keeps columns to 65537 under 1e-6); cached rows
  // (at most kCache < 16 elements) sum as one chain, as RowOps' would. Counters rather than
  // nested loops: the nested loops' bounds made ptxas spill.
  template <typename Op, typename F>
  ROWNORM_DEVICE ReduceValue<F, Acc> ReduceLocal(Op op, F f) const {
    using V = ReduceValue<F, Acc>;
    constexpr int kBlock = 16;
    V acc = Op::template Identity<V>();
    V group = acc, block = acc;
    int in_block = 0, in_group = 0;
    ForEachValue([&](const Acc* x, int64_t d) {
      block = op(block, f(x, d));
      if (++in_block == kBlock) {
        group = op(group, block);
        block = Op::template Identity<V>();
        in_block = 0;
        if (++in_group == kBlock) {
          acc = op(acc, group);
          group = Op::template Identity<V>();
          in_group = 0;
        }
      }
    });
    return op(acc, op(group, block));
  }
  template <int J, typename F>
  ROWNORM_DEVICE void StoreTo(F f) {
    static_assert(J >= 0 && J < kOut, "the op has no such output");
    ForEachValue([&](const Acc* x, int64_t d) {
      at_.out[J][d * at_.inner] = FromAcc<TOut>(static_cast<AccType<TOut>>(f(x, d)));
    });
  }
  template <typename G>
  ROWNORM_DEVICE void ForEachValue(G g) const {
    if (!at_.valid) return;
    Acc x[kIn];
    if constexpr (kCache > 0) {
#pragma unroll
      for (int c = 0; c < kCache; ++c) {
        const int64_t d = threadIdx.y + c * kTy;
        if (d < at_.d) {
#pragma unroll
          for (int k = 0; k < kIn; ++k) x[k] = ToAcc(cache_[k][c]);
          g(static_cast<const Acc*>(x), d);
        }
      }
    } else {
#pragma unroll 4
      for (int64_t d = threadIdx.y; d < at_.d; d += kTy) {
#pragma unroll
        for (int k = 0; k < kIn; ++k) x[k] = ToAcc(at_.in[k][d * at_.inner]);
        g(static_cast<const Acc*>(x), d);
      }
    }
  }

 private:
  StridedReduceStorage<kTx, kTy>& storage_;
  int& parity_;
  StridedOperands<Args> at_;
  TIn cache_[kIn][kCache > 0 ? kCache : 1];
};

// The packed strided path: a thread owns kLanes adjacent columns i..i+kLanes-1 and at most
// kCache of their d-rows, read and written as packs, in one of two layouts:
// - the CTA layout (kWarpRows = 0): thread (tx, ty) owns pack tx of the tile and d-rows ty,
//   ty + kTy, ...; a column's kTy partials meet in shared memory, every lane's of a reduction
//   at once (RunLanes' rounds: two barriers a reduction, not one a lane);
// - the warp layout (kWarpRows = 1, 2 or 4 lanes per column, plan.h's StridedWarpRows): a
//   warp holds 32 / kWarpRows packs, lane l owning pack l / kWarpRows and d-rows
//   l % kWarpRows, + kWarpRows, ...; a column's partials meet by shuffles (none with one
//   lane), so no warp waits for another, and a warp's load of a d-row covers
//   32 / kWarpRows contiguous packs.
// A StridedTile holds those packs; StridedLane<Tile, J> is the row interface of its lane J
// (column i + J), and StridedPackKernel runs the op body once per lane, J a constant so that
// the lane's element of every pack is a register. The outputs are gathered in packs and written
// once all lanes have run (Flush): an op body stores each of its outputs once per row.
//
// With kSums > 0 (the backward with fused parameter gradients, StridedPackKernel) a tile also
// sums the op body's column terms (StridedLane::AddColumns) per d-row over its columns, and
// WriteSums writes them as the tile's partials (plan.h's StridedSumPlan).
template <class Args, int kTx, int kTy, int kCache, int kLanes, int kWarpRows = 0,
          bool kKeepParams = false, int kSums = 0, bool kFull = false, bool kStagedFirst = false>
struct StridedTile {
  static_assert(kWarpRows == 0 || (kTx == kWarpSize && kWarpRows <= kWarpSize &&
                                   (kWarpRows & (kWarpRows - 1)) == 0),
                "the warp layout splits each warp (a thread row) into groups of kWarpRows lanes");
  // Lanes of a column pack's d-rows, and the stride between a thread's d-rows.
  static constexpr int kColumnThreads = kWarpRows == 0 ? kTy : kWarpRows;
  // Packs of columns per CTA.
  static constexpr int kTilePacks = kTx * kTy / kColumnThreads;
  // This thread's first d-row and its column pack within the tile: thread (tx, ty) owns pack
  // tx, d-rows ty, ty + kTy, ...; in the warp layout lane l of warp w owns pack
  // w * (32 / kWarpRows) + l / kWarpRows, d-rows l % kWarpRows + c * kWarpRows.
  // Unsigned, as threadIdx: computed as signed ints, the CTA layout's d = 64 backwards with a
  // weight took 1.05-1.09x the time (benchmarks/results/h100/NOTES.md §39).
  ROWNORM_DEVICE static unsigned Dy() {
    return kWarpRows == 0 ? threadIdx.y : threadIdx.x % kColumnThreads;
  }
  ROWNORM_DEVICE static unsigned PackInTile() {
    return kWarpRows == 0
               ? threadIdx.x
               : threadIdx.y * (kWarpSize / kColumnThreads) + threadIdx.x / kColumnThreads;
  }
  using TIn = typename Args::InElem;
  using TOut = typename Args::OutElem;
  using Acc = AccType<TIn>;
  static constexpr int kCacheRows = kCache;
  static constexpr int kThreadLanes = kLanes;  // adjacent columns a thread
  // With kFull, columns of exactly kFullD elements (plan.h's StridedPlan::full_columns): every
  // thread's kCache d-rows are in the column, so no d-row is tested against d, and the
  // column's length is a constant (a division by it a multiplication: d is a power of two, so
  // the same bits). The tests were a branch per element and lane: without them bf16
  // layer_norm's fused backward has 31% fewer SASS instructions (5384 -> 3696), its forward
  // 36% (4072 -> 2608), CTA layout; benchmarks/results/h200/NOTES.md §50.
  static constexpr int64_t kFullD = int64_t{kCache} * kColumnThreads;
  static constexpr bool kFullColumns = kFull;
  ROWNORM_DEVICE static bool HasRow(int64_t r, int64_t d) { return kFull || r < d; }
  static constexpr bool kWarpLayout = kWarpRows > 0;
  // The shared memory of the lanes' all-reduces, one per kernel: the CTA layout's; none in the
  // warp layout.
  using Storage =
      std::conditional_t<kWarpLayout, NoStridedStorage, StridedLaneStorage<kTx, kTy, kLanes, Acc>>;
  static constexpr int kIn = Args::kNumIn;
  static constexpr int kOut = Args::kNumOut;

  // One tile's packs staged in shared memory by a prefetching kernel, thread t's at
  // [k][c][t] (a warp's 16-byte accesses contiguous); with kStagedFirst (ops that read First(),
  // OpTraits::kReadsFirst) also d-row 0's pack of the thread's columns at first[t], which
  // every thread of the column copies for itself: read from another thread's slot it would
  // want a barrier.
  struct StagedPacks {
    Pack<TIn, kLanes> packs[kIn][kCache][kTx * kTy];
  };
  struct StagedPacksAndFirst : StagedPacks {
    Pack<TIn, kLanes> first[kTx * kTy];
  };
  static constexpr bool kFirstStaged = kStagedFirst;
  using Stage = std::conditional_t<kStagedFirst, StagedPacksAndFirst, StagedPacks>;

  // With kKeepParams, the parameters at this thread's d-rows: the same in every tile, so the
  // kernel reads them once (ReadParams) and hands them to each tile.
  static constexpr bool kKeepsParams = kKeepParams;
  static constexpr int kMaxParams = 2;
  using Params = Acc[kKeepsParams ? kMaxParams : 1][kCache];

  ROWNORM_DEVICE StridedTile(Storage& s, const Args& a, int64_t o, int64_t i, const Params& kept)
      : storage(s), at(a, o, i) {
    ForEachOwned(at, [&](int k, int c, const TIn* src) { cache[k][c].Load(src); });
    Init(kept);
  }

  // The tile whose packs Prefetch staged in `stage` (the caller waited for the copies).
  ROWNORM_DEVICE StridedTile(Storage& s, const Args& a, int64_t o, int64_t i, const Stage& stage,
                             const Params& kept)
      : storage(s), at(a, o, i) {
    const int t = threadIdx.y * kTx + threadIdx.x;
    ForEachOwned(at, [&](int k, int c, const TIn*) { cache[k][c] = stage.packs[k][c][t]; });
    if constexpr (kStagedFirst) {
      if (at.valid) first = stage.first[t];
    }
    Init(kept);
  }

  // The parameters of `op` (its ColumnParams(), op_traits.h) at this thread's d-rows, for
  // every tile of the kernel. Read by lane 0 in each tile instead, they were 16 of the bf16
  // layer_norm forward's 40 global loads a tile (benchmarks/results/h200/NOTES.md §53).
  template <class Op>
  ROWNORM_DEVICE static void ReadParams(const Op& op, int64_t d, Params& kept) {
    if constexpr (kKeepsParams && OpTraits<Op>::kColumnParams) {
      const auto ps = op.ColumnParams();
      constexpr int kCount = decltype(ps)::kCount;
      static_assert(kCount <= kMaxParams, "a tile keeps at most kMaxParams parameters");
#pragma unroll
      for (int c = 0; c < kCache; ++c) {
        const int64_t r = Dy() + c * kColumnThreads;
#pragma unroll
        for (int j = 0; j < kCount; ++j) {
          if (HasRow(r, d)) kept[j][c] = ps.template At<Acc>(j, r);
        }
      }
    }
  }

  // The kernel's parameters (ReadParams) and the column sums zeroed.
  ROWNORM_DEVICE void Init(const Params& kept) {
    if constexpr (kKeepsParams) {
#pragma unroll
      for (int j = 0; j < kMaxParams; ++j) {
#pragma unroll
        for (int c = 0; c < kCache; ++c) params[j][c] = kept[j][c];
      }
    }
    if constexpr (kSums > 0) {
#pragma unroll
      for (int j = 0; j < kSums; ++j) {
#pragma unroll
        for (int c = 0; c < kCache; ++c) sums[j][c] = Acc(0);
      }
    }
  }

  // Issues the asynchronous copies of this thread's packs of tile (o, i) into `stage`, under the
  // L2 eviction `policy` (d-row 0's copy for First() as a plain one: its lines are the packs').
  ROWNORM_DEVICE static void Prefetch(const Args& a, int64_t o, int64_t i, Stage& stage,
                                      uint64_t policy) {
    const int t = threadIdx.y * kTx + threadIdx.x;
    const StridedOperands<Args> at(a, o, i);
    ForEachOwned(at, [&](int k, int c, const TIn* src) {
      CopyPackAsync(&stage.packs[k][c][t], src, policy);
    });
    if constexpr (kStagedFirst) {
      if (at.valid) CopyPackAsync(&stage.first[t], at.in[0]);
    }
  }

  // Sets the L2 lines of tile (o, i)'s inputs back to evict_normal (copied under evict_last):
  // each line by the thread whose pack starts it.
  ROWNORM_DEVICE static void ReleaseInputs(const Args& a, int64_t o, int64_t i) {
    const StridedOperands<Args> at(a, o, i);
    ForEachOwned(at, [&](int, int, const TIn* src) {
      if (reinterpret_cast<uintptr_t>(src) % 128 == 0) ReleaseL2Line(src);
    });
  }

  // Brings the saved statistics of this thread's columns of tile (o, i) into L1, kPerRow values
  // a column at stats[kPerRow · index] (OpTraits::kSavedStats), once per pack (the thread of
  // d-row 0): the op body reads them first, and in a staged tile nothing else waits on memory.
  template <int kPerRow, typename S>
  ROWNORM_DEVICE static void PrefetchSavedStats(const Args& a, const S* stats, int64_t o,
                                                int64_t i) {
    static_assert(kLanes * kPerRow * sizeof(S) <= 128 && 128 % (kLanes * kPerRow * sizeof(S)) == 0,
                  "a pack's statistics lie in one 128-byte line");
    if (Dy() == 0 && i < a.inner) PrefetchL1(stats + kPerRow * (o * a.inner + i));
  }

  // Writes the gathered outputs.
  ROWNORM_DEVICE void Flush() const {
#pragma unroll
    for (int c = 0; c < kCache; ++c) {
      const int64_t r = Dy() + c * kColumnThreads;
      if (at.valid && HasRow(r, at.d)) {
#pragma unroll
        for (int j = 0; j < kOut; ++j) gathered[j][c].Store(at.out[j] + r * at.inner);
      }
    }
  }

  // The tile's column sums: sum j of each d-row over the tile's columns, written as partial
  // [j][chunk][d-row] (a StridedSumPlan's layout, `chunks` tiles per sum). A thread holds its
  // d-rows' sums over its own lanes; the warp's lanes of the same d-rows add theirs by a
  // reduce-scatter (WarpScatterSum: kCache values in 3 halving steps and the rest whole, 9
  // shuffles a sum where an all-reduce of each value takes 40), after which lane l holds d-row
  // slot (l / 4) % 8. In the CTA layout a warp is one thread row, whose d-rows no other warp has,
  // so its lanes write; in the warp layout the kTy warps share d-rows and add theirs in warp order
  // through `exchange`. Every thread of the CTA calls it (shuffles of the whole warp, a barrier).
  struct SumExchange {
    Acc v[kWarpLayout ? kTy : 1][kSums > 0 ? kSums : 1][kWarpLayout ? kWarpSize : 1];
  };
  ROWNORM_DEVICE void WriteSums(Acc* partial, int64_t chunk, int64_t chunks,
                                SumExchange& exchange) const {
    static_assert(kSums > 0, "the tile keeps no column sums");
    static_assert(kCache == 8 && kTx == kWarpSize && (!kWarpLayout || kColumnThreads <= 4),
                  "the scatter below leaves one d-row slot a lane: 8 slots over 32 / 4 lanes");
    const unsigned lane = threadIdx.x % kWarpSize;
    const int slot = static_cast<int>(lane / 4) % kCache;
    const int64_t row = Dy() + int64_t{slot} * kColumnThreads;
    // Lanes whose bits below 4 past the column threads' are zero hold distinct d-rows.
    const bool writer = (lane % 4) / (kWarpLayout ? kColumnThreads : 1) == 0;
    Acc total[kSums];
#pragma unroll
    for (int j = 0; j < kSums; ++j) {
      total[j] = WarpScatterSum<kCache, kWarpSize / 2, kWarpLayout ? kColumnThreads : 1>(sums[j]);
    }
    if constexpr (!kWarpLayout) {
      if (writer && row < at.d) {
#pragma unroll
        for (int j = 0; j < kSums; ++j) partial[(j * chunks + chunk) * at.d + row] = total[j];
      }
    } else {
      if (writer) {
#pragma unroll
        for (int j = 0; j < kSums; ++j) exchange.v[threadIdx.y][j][row] = total[j];
      }
      __syncthreads();
      const int t = threadIdx.y * kTx + threadIdx.x;
      constexpr int kRows = kCache * kColumnThreads;  // the d-rows a tile may hold
      if (t < kSums * kRows && t % kRows < at.d) {
        const int j = t / kRows;
        const int r = t % kRows;
        Acc s = exchange.v[0][j][r];
#pragma unroll
        for (int w = 1; w < kTy; ++w) s += exchange.v[w][j][r];
        partial[(j * chunks + chunk) * at.d + r] = s;
      }
      __syncthreads();  // the exchange is free for the next tile
    }
  }

  // g(k, c, address) for each pack this thread owns of the tile at `at`: input k's element row
  // ty + c·kTy.
  template <class G>
  ROWNORM_DEVICE static void ForEachOwned(const StridedOperands<Args>& at, G g) {
#pragma unroll
    for (int c = 0; c < kCache; ++c) {
      const int64_t r = Dy() + c * kColumnThreads;
      if (at.valid && HasRow(r, at.d)) {
#pragma unroll
        for (int k = 0; k < kIn; ++k) g(k, c, at.in[k] + r * at.inner);
      }
    }
  }

  // With kKeepParams (the prefetching kernel: the forwards; the sums kernel on half a pack),
  // the parameters at this thread's d-rows for all its lanes (StridedLane::StoreWith,
  // ReduceWith). Not in the other StridedPackKernels, whose registers it raised (fp32
  // rms_norm's one-lane warp layout 84 -> 108, bf16 layer_norm's CTA layout 122 -> 128 and an
  // 8-byte spill) where no measurement covers it (the H100's fp32 forwards run it).
  Storage& storage;
  StridedOperands<Args> at;  // of lane 0
  Pack<TIn, kLanes> cache[kIn][kCache];
  Pack<TOut, kLanes> gathered[kOut][kCache];
  Pack<TIn, kLanes> first;  // with kStagedFirst: d-row 0 of the columns
  Params params;
  static constexpr int kColumnSums = kSums;
  Acc sums[kSums > 0 ? kSums : 1][kCache];  // with kSums: per d-row, over the thread's lanes
};

// Lane J of a tile in round kRound of RunLanes. In the CTA layout a tile's lanes make their
// all-reduces together, in rounds: in round k every lane runs the op body and leaves its partial
// of all-reduce k in shared memory (the op body's outputs past that point are not stored:
// Collected()); after a barrier, round k + 1's first lane combines all lanes' partials of
// all-reduce k at once, and every lane runs the op body again with all-reduces 0..k done. The
// last round, in which no all-reduce is left, stores. The compiler keeps of each round only
// what it stores: a round's work past its partial, and an earlier round's partials, are dead.
// Made one lane at a time, the all-reduces cost a barrier and kTy loads a lane: the 16-bit
// tiles (eight lanes) were issue-bound (benchmarks/results/h200/NOTES.md §47-§49). The warp
// layout's all-reduces are shuffles: one round.
template <class Tile, int J, int kRound = 0>
class StridedLane : public RowOps<StridedLane<Tile, J, kRound>, typename Tile::Acc> {
 public:
  using Acc = typename Tile::Acc;
  static constexpr bool kCached = true;

  // StoreWith takes the parameters from the tile's copy, not once per lane, where it keeps them.
  static constexpr bool kPackedParams = Tile::kKeepsParams;
  static constexpr bool kSharedParams = Tile::kKeepsParams && Tile::kColumnSums > 0;

  ROWNORM_DEVICE explicit StridedLane(Tile& t) : t_(t) {}

  ROWNORM_DEVICE int64_t Size() const { return Tile::kFullColumns ? Tile::kFullD : t_.at.d; }
  ROWNORM_DEVICE int64_t Index() const { return t_.at.index + J; }
  ROWNORM_DEVICE bool Valid() const { return t_.at.valid; }
  ROWNORM_DEVICE bool Leader() const { return !collected_ && t_.at.valid && Tile::Dy() == 0; }
  // Whether this round left a partial of an all-reduce for the next (and so stores nothing).
  ROWNORM_DEVICE bool Collected() const { return collected_; }
  ROWNORM_DEVICE Acc First() const {
    if constexpr (Tile::kFirstStaged) {
      return t_.first.Get(J);
    } else {
      return ToAcc(t_.at.in[0][J]);
    }
  }

  // Primitives of RowOps.
  template <typename Op, typename V>
  ROWNORM_DEVICE V AllReduce(V acc, Op op) {
    if constexpr (Tile::kWarpLayout) {  // the column's lanes: shuffles, no barrier
      return WarpAllReduce<Tile::kColumnThreads>(acc, op);
    } else {
      const int call = calls_++;
      if (call < kRound) {  // done: all-reduce `call`'s partials were left by round `call`
        if (J == 0 && call == kRound - 1) t_.storage.template Combine<V>(call, op);
        return t_.storage.template Result<V>(call, J);
      }
      static_assert(kRound <= Tile::Storage::kCalls, "more rounds than all-reduces kept");
      if (call == kRound) {
        t_.storage.Leave(J, acc);
        collected_ = true;
      }
      return acc;  // a partial: nothing past this is stored in this round
    }
  }
  // Output 0 = f(x, r, p) (the forwards): a tile's lanes share its d-rows, and the tile keeps
  // the parameters at them (`ps` is the op's ColumnParams(), which the kernel read: op_traits.h).
  // Read per element and lane, they took 1.21x the time in LayerNorm's forward over the
  // channels and 1.02x in fp32 RMSNorm's with a weight (H200, 112x64x512x512;
  // benchmarks/results/h200/NOTES.md §47). Where no parameter is present each element takes
  // the absent value, as before: the tile's copy took 1.07x the time there (bf16 RMSNorm).
  template <typename F, class PS>
  ROWNORM_DEVICE void StoreWith(F f, const PS& ps) {
    static_assert(PS::kCount <= Tile::kMaxParams, "a tile keeps at most kMaxParams parameters");
    if (collected_) return;
    if (!AnyParam(ps)) {
      this->template StoreTo<0>(WithParams<Acc>(f, ps));
      return;
    }
    ForEach([&](const Acc* x, int64_t r, int c) {
      const auto p = KeptParams<PS::kCount>(c);
      t_.gathered[0][c].Set(J, static_cast<AccType<typename Tile::TOut>>(f(x, r, p.v)));
    });
  }
  // f(x, r, p) reduced over the column (row_ops.h's ReduceWith), the parameters from the
  // tile's copy as in StoreWith; the same terms in the same order as Reduce's.
  template <typename Op, typename F, class PS>
  ROWNORM_DEVICE auto ReduceWith(Op op, F f, const PS& ps) {
    using V =
        decltype(f(static_cast<const Acc*>(nullptr), int64_t{}, static_cast<const Acc*>(nullptr)));
    if (!AnyParam(ps)) return this->Reduce(op, WithParams<Acc>(f, ps));
    V acc = Op::template Identity<V>();
    ForEach([&](const Acc* x, int64_t r, int c) {
      const auto p = KeptParams<PS::kCount>(c);
      acc = op(acc, f(x, r, static_cast<const Acc*>(p.v)));
    });
    return AllReduce(acc, op);
  }
  // The tile's column sums += f(x, r) at each of this lane's elements (the fused parameter
  // gradients; `sums` only names their count); StoreWithColumns: StoreWith, then those (the
  // elements are in registers: the second pass reads no memory).
  template <typename F, class Sums>
  ROWNORM_DEVICE void AddColumns(F f, Sums*) {
    static_assert(Sums::kCount == Tile::kColumnSums, "the tile keeps the op's column sums");
    if (collected_) return;
    ForEach([&](const Acc* x, int64_t r, int c) {
      const Array<Acc, Sums::kCount> v = f(x, r);
#pragma unroll
      for (int j = 0; j < Sums::kCount; ++j) t_.sums[j][c] += v[j];
    });
  }
  template <typename F, class PS, typename C, class Sums>
  ROWNORM_DEVICE void StoreWithColumns(F f, const PS& ps, C c, Sums* sums) {
    rownorm::StoreWith(*this, f, ps);
    AddColumns(c, sums);
  }
  template <int K, typename F>
  ROWNORM_DEVICE void StoreTo(F f) {
    static_assert(K >= 0 && K < Tile::kOut, "the op has no such output");
    if (collected_) return;
    ForEach([&](const Acc* x, int64_t r, int c) {
      t_.gathered[K][c].Set(J, static_cast<AccType<typename Tile::TOut>>(f(x, r)));
    });
  }
  template <typename G>
  ROWNORM_DEVICE void ForEachValue(G g) const {
    ForEach([&](const Acc* x, int64_t r, int) { g(x, r); });
  }

 private:
  // Whether any of the op's parameters is present (else each element takes the absent value).
  template <class PS>
  ROWNORM_DEVICE static bool AnyParam(const PS& ps) {
    bool present = false;
#pragma unroll
    for (int j = 0; j < PS::kCount; ++j) present = present || ps.p[j] != nullptr;
    return present;
  }
  // The parameters the tile keeps at this thread's d-row slot c (StridedTile::ReadParams).
  template <int kCount>
  ROWNORM_DEVICE Array<Acc, (kCount > 0 ? kCount : 1)> KeptParams(int c) const {
    Array<Acc, (kCount > 0 ? kCount : 1)> p;
#pragma unroll
    for (int j = 0; j < kCount; ++j) p[j] = t_.params[j][c];
    return p;
  }
  template <typename G>
  ROWNORM_DEVICE void ForEach(G g) const {
    if (!t_.at.valid) return;
    Acc x[Tile::kIn];
#pragma unroll
    for (int c = 0; c < Tile::kCacheRows; ++c) {
      const int64_t r = Tile::Dy() + c * Tile::kColumnThreads;
      if (Tile::HasRow(r, t_.at.d)) {
#pragma unroll
        for (int k = 0; k < Tile::kIn; ++k) x[k] = t_.cache[k][c].Get(J);
        g(static_cast<const Acc*>(x), r, c);
      }
    }
  }

  Tile& t_;
  int calls_ = 0;           // all-reduces made so far in this round
  bool collected_ = false;  // one of them left its partial for the next round
};

#endif  // __CUDACC__

}  // namespace rownorm
