// The __global__ kernels of the tiers: each builds the row view of its tier for every row it
// owns and runs the op body on it (the tier table that picks one is in plan.h).
//
//   GroupRowKernel      kWidth (4..32) lanes per row, several rows per CTA; row in registers.
//   CtaRowKernel        one CTA per row; row in registers, warp shuffles + one smem round.
//   ClusterRowKernel    a cluster of kCluster CTAs per row (sm_90+); each CTA keeps its slice
//                       in registers, partials exchanged through distributed shared memory, so
//                       a 256 KB fp32 row is read from HBM exactly once.
//   StreamingRowKernel  one CTA per row, nothing cached: every Reduce/Store re-reads the row
//                       (from L2 when it fits). Any length, any arch, any vector width.
//   *RowSumsKernel      the tiers with fused column sums (parameter gradients): the CTA one
//                       keeps two rows in flight at two packs per thread, the staged CTA one
//                       (persistent) its next rows in shared memory; the slice one (longer
//                       rows: wide CTA, clusters; persistent) its sums in shared memory.
//   StridedKernel       reduction over a non-last dim of a contiguous (outer, D, inner) tensor:
//   StridedPackKernel   lanes walk the contiguous inner dim (coalesced), kTy threads split D
//                       (the CTA layout) or 1, 2 or 4 lanes of a warp (the warp layout);
//   StridedPrefetchKernel  the packed one with later tiles in flight into shared memory.
//
// Every row loop is uniform across the threads that reduce together (the warp for groups, the
// CTA, the cluster), as the barriers and full-mask shuffles require. `Args` is the problem type
// (RowArgs / StridedArgs of the op's element types and operand counts).
#pragma once

#include <cooperative_groups.h>

#include <type_traits>
#include <utility>

#include "kernels/common/plan.h"
#include "kernels/common/row_views.cuh"
#include "kernels/common/strided_views.cuh"

namespace rownorm {

#if defined(__CUDACC__)

// How the row kernels load a cached Row: plainly, or where the op opts in (kKeeps, from
// OpTraits::kKeepsInputInL2 and the tier) with input 0 under the L2 policy that the plan's
// RowPlan::l2_keep (args.keep_input0_in_l2) picks; Release then sets the lines of a row
// loaded with evict_last back to evict_normal once the row is stored.
template <class Row, bool kKeeps>
struct RowLoads {
  template <class Args>
  ROWNORM_DEVICE explicit RowLoads(const Args& args)
      : keep(kKeeps && args.keep_input0_in_l2), policy(L2EvictionPolicy(keep)) {}

  template <class Team, class Args>
  ROWNORM_DEVICE typename Row::Loaded Load(const Team& team, const Args& args, int64_t row,
                                           bool valid) const {
    if constexpr (kKeeps) {
      return Row::LoadWithPolicy(team, args, row, valid, policy);
    } else {
      return Row::Load(team, args, row, valid);
    }
  }
  template <class Team, class Args>
  ROWNORM_DEVICE void Release(const Team& team, const Args& args, int64_t row, bool valid) const {
    if (keep) Row::ReleaseInput0(team, args, row, valid);
  }

  const bool keep;
  const uint64_t policy;
};

// With kAligned, the rows of aligned problems (plan.h's RowsAligned), as CtaRows', and
// CachedRow's kFlatPacks.
template <class Op, class Args, int kVec, int kVecs, int kWidth, int kCtaThreads, bool kAligned>
__global__ void __launch_bounds__(kCtaThreads) GroupRowKernel(const Args args, const Op op) {
  static_assert(kCtaThreads % kWarpSize == 0 && kWarpSize % kWidth == 0, "bad group shape");
  constexpr int kRowsPerCta = kCtaThreads / kWidth;
  GroupTeam<kWidth> team{static_cast<int>(threadIdx.x % kWidth)};
  const int group = threadIdx.x / kWidth;
  using Row = CachedRow<Args, kVec, kVecs, GroupTeam<kWidth>, kAligned, NoParamCache, true>;
  const RowLoads<Row, OpTraits<Op>::kKeepsInputInL2> loads(args);
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kRowsPerCta; base < args.rows;
       base += static_cast<int64_t>(gridDim.x) * kRowsPerCta) {
    const int64_t row = base + group;
    const bool valid = row < args.rows;
    Row r(team, args, row, valid, loads.Load(team, args, row, valid));
    op(r);
    loads.Release(team, args, row, valid);
  }
}

// The loop of the prefetching kernels: units (rows, tiles) first, first + step, ... below
// `end`, with the next kStages units' packs in flight into shared memory (cp.async) while the
// current one is reduced and stored. prefetch(u, s) issues unit u's copies into stage s;
// process(u, s, refill) runs unit u from stage s (its copies have landed) and calls refill()
// once it has used every staged pack, which puts unit u + kStages·step in flight into stage s.
// Each thread reads back only the packs it copied itself: no barrier beyond the op's own.
template <int kStages, class Prefetch, class Process>
ROWNORM_DEVICE void PipelineUnits(int64_t first, int64_t step, int64_t end, Prefetch prefetch,
                                  Process process) {
  static_assert(kStages >= 2, "one stage would leave nothing in flight while a unit is processed");
  const auto issue = [&](int64_t u, int s) {
    if (u < end) prefetch(u, s);
    CommitAsyncCopies();  // one group per unit, empty past the end, so that the count holds
  };
#pragma unroll
  for (int s = 0; s < kStages; ++s) issue(first + s * step, s);
  int s = 0;
  for (int64_t u = first; u < end; u += step) {
    WaitAsyncCopies<kStages - 1>();  // unit u's group, the oldest in flight
    process(u, s, [&] { issue(u + kStages * step, s); });
    s = s + 1 == kStages ? 0 : s + 1;
  }
}

// The CTA tier: CTA b runs rows b, b + gridDim.x, ... (a CTA per row, in a grid that GridFor
// caps). With kAligned, the rows of aligned problems (plan.h's RowsAligned: no head or tail
// scalars, no bound on every pack), which LaunchCtaRow picks for them. kFlatPacks: CachedRow's
// (the held kernel's rows).
template <class Op, class Args, int kVec, int kVecs, int kThreads, bool kAligned,
          bool kFlatPacks = false>
ROWNORM_DEVICE void CtaRows(const Args& args, const Op& op) {
  using Row = CachedRow<Args, kVec, kVecs, CtaTeam<kThreads>, kAligned, NoParamCache, kFlatPacks>;
  __shared__ BlockReduceStorage<kThreads> storage;
  CtaTeam<kThreads> team{storage};
  // Not the CTAs of 512 threads (plan.h's KeepsL2OnTier says why).
  const RowLoads<Row, OpTraits<Op>::kKeepsInputInL2 && kThreads <= kMaxL2KeepCtaThreads> loads(
      args);
  for (int64_t row = blockIdx.x; row < args.rows; row += gridDim.x) {
    Row r(team, args, row, true, loads.Load(team, args, row, true));
    op(r);
    loads.Release(team, args, row, true);
  }
}

template <class Op, class Args, int kVec, int kVecs, int kThreads, bool kAligned>
__global__ void __launch_bounds__(kThreads) CtaRowKernel(const Args args, const Op op) {
  CtaRows<Op, Args, kVec, kVecs, kThreads, kAligned>(args, op);
}

// The CTA tier held to the registers of kCtasPerSm CTAs per SM (OpTraits::CtaCtasPerSm): one
// CTA waiting at its row's barriers leaves the SM's memory idle unless the others' loads are in
// flight. A second kernel, not a bound on CtaRowKernel, whose other configurations keep
// ptxas's own choice (see ClusterRowKernelBounded).
template <class Op, class Args, int kVec, int kVecs, int kThreads, bool kAligned, int kCtasPerSm>
__global__ void __launch_bounds__(kThreads, kCtasPerSm)
    CtaRowKernelBounded(const Args args, const Op op) {
  CtaRows<Op, Args, kVec, kVecs, kThreads, kAligned, true>(args, op);
}

// Fused parameter gradients: the CTA and group tiers with column sums. A "chunk" is the
// fixed set of rows one team (a CTA, or a group of lanes) runs in order, accumulating
// Op::kColumnSums column sums in registers (the op body's AddColumns); it then writes them as
// its chunk's partials, partial[(j·chunks + chunk)·n + col]. Rows start 16-byte aligned and n
// is a multiple of kVec (checked on the host), so a thread owns the same columns in every row,
// and the chunks do not depend on the number of rows: neither do the results.
template <typename Acc, int kK, int kVecs, int kVec>
ROWNORM_DEVICE void ZeroSums(ColumnSums<Acc, kK, kVecs, kVec>& sums) {
#pragma unroll
  for (int j = 0; j < kK; ++j) {
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) sums.v[j][k][e] = Acc(0);
    }
  }
}

// The rows of a fused kernel's team of kThreads x kVecs packs: aligned (no head or tail), with
// the op's ColumnParams() in shared memory where that takes at most kMaxParamCacheBytes (not
// 16-bit rows of 512 threads x 4 packs: 64 KB of fp32, past the static limit; their rows read
// the parameters from global memory, with vector loads in StoreWith, per element in ReduceWith).
constexpr size_t kMaxParamCacheBytes = 32 * 1024;
template <class Op, class Args, int kVec, int kVecs, int kThreads>
using FusedParamCache = ParamCache<decltype(std::declval<const Op&>().ColumnParams()),
                                   AccType<typename Args::InElem>, kVecs, kVec, kThreads>;
template <class Op, class Args, int kVec, int kVecs, int kThreads>
using FusedParams =
    std::conditional_t<sizeof(FusedParamCache<Op, Args, kVec, kVecs, kThreads>) <=
                           kMaxParamCacheBytes,
                       FusedParamCache<Op, Args, kVec, kVecs, kThreads>, NoParamCache>;
// kAligned false: rows in phase (plan.h's PhasedSumPlan), a chunk's rows of one class.
template <class Op, class Args, int kVec, int kVecs, class Team, bool kAligned = true>
using FusedRow = CachedRow<Args, kVec, kVecs, Team, kAligned,
                           FusedParams<Op, Args, kVec, kVecs, Team::kThreads>>;

// Threads `rank` of one team (`filler`) write op's parameters into `cache` (for rows whose
// packs start `head` columns in), then the CTA waits for them.
template <class Cache, class Op>
ROWNORM_DEVICE void FillParams(Cache& cache, const Op& op, int rank, bool filler, int64_t n,
                               int64_t head = 0) {
  if constexpr (!std::is_same_v<Cache, NoParamCache>) {
    if (filler) cache.Fill(op.ColumnParams(), rank, n, head);
    __syncthreads();
  }
}

// Thread `rank` of a team of kThreads writes its columns' sums as chunk `chunk`'s partials, its
// packs those of rows whose packs start `head` columns in: a pack at a time (16-byte stores)
// where the partial's row starts 16-byte aligned, as it does for aligned rows (n a multiple of
// the pack width), else an element at a time.
template <typename Acc, int kK, int kVecs, int kVec, int kThreads>
ROWNORM_DEVICE void WriteSums(const ColumnSums<Acc, kK, kVecs, kVec>& sums, int rank, int64_t chunk,
                              int64_t chunks, int64_t n, Acc* partial, int64_t head = 0) {
  const int64_t vecs = (n - head) / kVec;
#pragma unroll
  for (int j = 0; j < kK; ++j) {
    Acc* const to = partial + (j * chunks + chunk) * n + head;
    const bool aligned = reinterpret_cast<uintptr_t>(to) % 16 == 0;
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int64_t v = rank + k * kThreads;
      if (v < vecs) StoreValues(to + v * kVec, sums.v[j][k], aligned);
    }
  }
}

// Row `row`'s geometry in input 0, which every operand of a problem in phase shares
// (plan.h's OperandsInPhase).
template <class Args>
ROWNORM_DEVICE RowGeometry<typename Args::InElem, Args::kPackWidth> GeometryOfRow(const Args& args,
                                                                                  int64_t row) {
  return RowGeometry<typename Args::InElem, Args::kPackWidth>::template Of<false>(
      InOffset<Args>(args.in[0], 0, row * args.in_stride[0]), args.n);
}

// The chunks of rows in phase (plan.h's PhasedSumPlan): chunk c, of class Class(c), holds rows
// First(c) + kVec·i, i < chunk_rows, below the last row.
template <int kVec>
struct PhasedChunks {
  int64_t block;   // rows of a block, kVec·chunk_rows: a chunk of each class
  int64_t blocks;  // ceil(rows / block)
  int64_t chunks;  // kVec·blocks
  ROWNORM_DEVICE PhasedChunks(int64_t rows, int chunk_rows)
      : block(int64_t{kVec} * chunk_rows),
        blocks((rows + block - 1) / block),
        chunks(kVec * blocks) {}
  ROWNORM_DEVICE int64_t Class(int64_t c) const { return c / blocks; }
  ROWNORM_DEVICE int64_t First(int64_t c) const { return (c % blocks) * block + c / blocks; }
};

// A persistent CTA's chunks first, first + step, ... of PhasedChunks, the k-th's class and
// block kept by additions as k grows (Seek), so that a row's chunk costs no 64-bit division
// (CtaRowSumsStagedKernel finds the chunk of every row it stages and runs).
template <int kVec>
struct PhasedChunkCursor {
  const PhasedChunks<kVec>& pc;
  int64_t step, step_q, step_b;  // step, step / blocks, step % blocks
  int64_t k = 0, c, q, b;        // the k-th chunk c = first + k·step, of class q, block b
  ROWNORM_DEVICE PhasedChunkCursor(const PhasedChunks<kVec>& chunks, int64_t first, int64_t stride)
      : pc(chunks),
        step(stride),
        step_q(stride / chunks.blocks),
        step_b(stride % chunks.blocks),
        c(first),
        q(first / chunks.blocks),
        b(first % chunks.blocks) {}
  ROWNORM_DEVICE void Seek(int64_t to) {  // to >= k
    for (; k < to; ++k) {
      c += step;
      q += step_q;
      b += step_b;
      if (b >= pc.blocks) {
        b -= pc.blocks;
        ++q;
      }
    }
  }
  ROWNORM_DEVICE int64_t First() const { return b * pc.block + q; }  // PhasedChunks::First(c)
};

// The geometry of class q's rows (that of any row where the class holds none: its chunks
// write zeros at every column).
template <class Args>
ROWNORM_DEVICE RowGeometry<typename Args::InElem, Args::kPackWidth> GeometryOfClass(
    const Args& args, int64_t q) {
  return GeometryOfRow(args, q < args.rows ? q : 0);
}

// The column sums of a chunk of rows in phase (the fused kernels without kAligned): the packs'
// in registers (ColumnSums) or shared memory (SharedColumnSums), the head and tail scalars' of
// this thread (at most one each: Ownership) in registers.
template <class PackSums, typename Acc, int kK>
struct PhasedSums {
  static constexpr int kCount = kK;
  PackSums& packs;
  Acc scalar[2][kK];  // the head's, the tail's

  template <int kVec>
  ROWNORM_DEVICE void Add(int k, int rank, const Acc (&a)[kK][kVec]) {
    packs.Add(k, rank, a);
  }
  template <int kWhich>
  ROWNORM_DEVICE void AddScalar(const Array<Acc, kK>& v) {
#pragma unroll
    for (int j = 0; j < kK; ++j) scalar[kWhich][j] += v[j];
  }
  // Writes scalar kWhich's sums at column `col` (where this thread owns one: col >= 0) as chunk
  // `chunk`'s partials, and zeroes them.
  template <int kWhich>
  ROWNORM_DEVICE void WriteScalarAndZero(int64_t col, int64_t chunk, int64_t chunks, int64_t n,
                                         Acc* partial) {
#pragma unroll
    for (int j = 0; j < kK; ++j) {
      if (col >= 0) partial[(j * chunks + chunk) * n + col] = scalar[kWhich][j];
      scalar[kWhich][j] = Acc(0);
    }
  }
};

// What a row's AddColumns adds into: the packs' sums (aligned rows), or those and the head and
// tail scalars' (rows in phase).
template <bool kAligned, class Sums, class Phased>
ROWNORM_DEVICE auto* SumsOfRows(Sums& sums, Phased& phased) {
  if constexpr (kAligned) {
    return &sums;
  } else {
    return &phased;
  }
}

// The column sums of the kCluster CTAs of a thread-block cluster, added in rank order into one
// partial of chunk `chunk` (CtaRowSumsKernel with kCluster > 1; plan.h's kSumClusterCtas):
// each thread puts its sums into its CTA's `exchange`, and CTA r adds up the r-th share of
// every thread's values over the cluster's CTAs (distributed shared memory) and writes them.
template <typename Acc, int kK, int kVecs, int kVec, int kThreads>
struct SumExchange {
  Acc v[kK][kVecs * kVec][kThreads];  // thread t's value i of sum j at [j][i][t]
};
struct NoSumExchange {};

template <int kCluster, typename Acc, int kK, int kVecs, int kVec, int kThreads>
ROWNORM_DEVICE void ClusterWriteSums(const ColumnSums<Acc, kK, kVecs, kVec>& sums,
                                     SumExchange<Acc, kK, kVecs, kVec, kThreads>& exchange,
                                     int64_t chunk, int64_t chunks, int64_t n, Acc* partial) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kValues = kVecs * kVec;
  static_assert(kValues % kCluster == 0, "each CTA adds an equal share");
  constexpr int kShare = kValues / kCluster;
  static_assert(kVec % kShare == 0, "a CTA's share of a thread's values lies in one pack");
  const int t = threadIdx.x;
  __syncthreads();  // `exchange` shares its memory with the parameters the last row read
#pragma unroll
  for (int j = 0; j < kK; ++j) {
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) exchange.v[j][k * kVec + e][t] = sums.v[j][k][e];
    }
  }
  cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  cluster.sync();
  const int rank = static_cast<int>(cluster.block_rank());
  // This CTA's share of thread t's values: columns col .. col + kShare - 1 of one pack, whole
  // below n or wholly past it (aligned rows of whole packs), at a multiple of kShare
  // (clustered rows are aligned: kShare values at a time).
  const int i0 = rank * kShare;
  const int64_t col = (t + int64_t{i0 / kVec} * kThreads) * kVec + i0 % kVec;
#pragma unroll
  for (int j = 0; j < kK; ++j) {
    Acc sum[kShare];
#pragma unroll
    for (int h = 0; h < kShare; ++h) {
      sum[h] = *cluster.map_shared_rank(&exchange.v[j][i0 + h][t], 0);
#pragma unroll
      for (int q = 1; q < kCluster; ++q) {
        sum[h] += *cluster.map_shared_rank(&exchange.v[j][i0 + h][t], q);
      }
    }
    if (col < n) StoreValues(partial + (j * chunks + chunk) * n + col, sum, true);
  }
  cluster.sync();  // keep `exchange` alive until the peers have read it
#else
  __trap();
#endif
}

// CTA tier: CTA c runs rows [c·kRows, (c+1)·kRows); chunks = ceil(rows / kRows). With
// kPipelined the next row's loads are issued before the current row is reduced and stored
// (two rows in flight per CTA, at the cost of a second cached row's registers): one CTA ran
// its rows one load-reduce-store round after another, latency-bound at 77% of the DRAM
// bandwidth with 4 CTAs per SM; pipelined, the bf16 rms_norm step at N = 4096 took 0.91x the
// time (benchmarks/results/h100/NOTES.md §16). Left alone, ptxas gave
// the pipelined kernel 116 registers (2 CTAs of 256 per SM, no more rows in flight than
// before); the launch bound keeps 768 threads per SM (80 registers), 512 (128 registers) with
// three inputs or two sums (add_rms_norm, layer_norm: 80 registers spilled 64-144 bytes).
// Either way the first row's loads are issued before the CTA fills its parameters, whose L2
// round trip then overlaps theirs. Without the pipeline, `prefetch_next_row` brings each row's
// next row into L2 once its loads are issued (plan.h's CtaSumsPrefetchNextRow).
template <class Op, class Args>
constexpr int PipelinedSumThreads() {
  return Args::kNumIn <= 2 && Op::kColumnSums == 1 ? 768 : 512;
}
// The kernels running one row at a time (4 packs) keep at least 512 threads per SM (two CTAs
// of 256): left alone, ptxas gave the 256-thread bf16 rms_norm kernel 159 registers once its
// packs lost their branch (523d731): one CTA per SM, and the fwd+bwd step at bf16 8192 took
// 1.11x the time; bounded, 127 and no spills (benchmarks/results/h100/NOTES.md §30).
constexpr int kUnpipelinedSumThreads = 512;
// kCluster > 1 (sm_90+, launched as clusters of kCluster CTAs): chunk c / kCluster of
// kCluster·kRows rows is written by the cluster as one partial (ClusterWriteSums), so
// chunks = ceil(rows / (kCluster·kRows)); CTAs past the last row add zeros. kAligned false:
// rows in phase (plan.h's PhasedSumPlan), unclustered: CTA c runs chunk c of PhasedChunks
// (rows of one class, kVec apart) and writes its head and tail scalars' sums too.
template <class Op, class Args, int kVec, int kVecs, int kThreads, int kRows, bool kPipelined,
          int kCluster = 1, bool kAligned = true>
__global__ void __launch_bounds__(kThreads, (kPipelined ? PipelinedSumThreads<Op, Args>()
                                                        : kUnpipelinedSumThreads) /
                                                kThreads)
    CtaRowSumsKernel(const Args args, const Op op, AccType<typename Args::InElem>* partial,
                     bool prefetch_next_row) {
  static_assert(kAligned || kCluster == 1, "rows in phase run unclustered (plan.h)");
  using Acc = AccType<typename Args::InElem>;
  using Row = FusedRow<Op, Args, kVec, kVecs, CtaTeam<kThreads>, kAligned>;
  using Sums = ColumnSums<Acc, Op::kColumnSums, kVecs, kVec>;
  using Exchange =
      std::conditional_t<(kCluster > 1), SumExchange<Acc, Op::kColumnSums, kVecs, kVec, kThreads>,
                         NoSumExchange>;
  union Shared {  // the parameters while rows run, then the cluster's exchange of sums
    FusedParams<Op, Args, kVec, kVecs, kThreads> params;
    Exchange exchange;
  };
  __shared__ BlockReduceStorage<kThreads> storage;
  __shared__ Shared shared;
  auto& params = shared.params;
  CtaTeam<kThreads> team{storage};
  Sums sums;
  ZeroSums(sums);
  const int64_t c = blockIdx.x;
  // The chunk's rows first, first + kStep, ... below end, of geometry `geo`.
  constexpr int64_t kStep = kAligned ? 1 : kVec;
  int64_t chunks, first, end;
  RowGeometry<typename Args::InElem, kVec> geo{0, args.n / kVec, 0};
  if constexpr (kAligned) {
    chunks = (args.rows + int64_t{kCluster} * kRows - 1) / (int64_t{kCluster} * kRows);
    first = c * kRows;
    end = min(args.rows, first + kRows);
  } else {
    const PhasedChunks<kVec> pc(args.rows, kRows);
    chunks = pc.chunks;
    first = pc.First(c);
    end = min(args.rows, first + pc.block);
    geo = GeometryOfClass(args, pc.Class(c));
  }
  PhasedSums<Sums, Acc, Op::kColumnSums> phased{sums, {}};
  auto* const sums_of_rows = SumsOfRows<kAligned>(sums, phased);
  typename Row::Loaded loaded = Row::Load(team, args, first, first < end);
  // while the first row's loads fly
  FillParams(params, op, threadIdx.x, true, args.n, geo.head);
#pragma unroll 1
  for (int64_t row = first; row < end; row += kStep) {
    const bool more = row + kStep < end;
    if constexpr (kPipelined) {
      const typename Row::Loaded next = Row::Load(team, args, row + kStep, more);
      Row r(team, args, row, true, loaded, &params);
      op(r, sums_of_rows);
      loaded = next;
    } else {
      if (prefetch_next_row && more) Row::template PrefetchL2<true>(team, args, row + kStep);
      Row r(team, args, row, true, loaded, &params);
      op(r, sums_of_rows);
      if (more) loaded = Row::Load(team, args, row + kStep, true);
    }
  }
  if constexpr (kCluster > 1) {
    ClusterWriteSums<kCluster>(sums, shared.exchange, c / kCluster, chunks, args.n, partial);
  } else {
    WriteSums<Acc, Op::kColumnSums, kVecs, kVec, kThreads>(sums, threadIdx.x, c, chunks, args.n,
                                                           partial, geo.head);
    if constexpr (!kAligned) {
      const Ownership<CtaTeam<kThreads>, kVec> own(team, geo, true);
      phased.template WriteScalarAndZero<0>(own.head_col, c, chunks, args.n, partial);
      phased.template WriteScalarAndZero<1>(own.tail_col, c, chunks, args.n, partial);
    }
  }
}

// CTA tier, persistent, rows staged in shared memory: CTA b runs chunks b, b + gridDim.x, ...
// of kRows rows (chunks = ceil(rows / kRows), the chunk partials as CtaRowSumsKernel writes
// them, so the results do not depend on the grid). Its rows, in order across its chunks, go
// through PipelineUnits: the next kStages - 1 rows' loads are in flight into shared memory
// while one is reduced and stored, where CtaRowSumsKernel holds the next row in registers and
// restarts its pipeline every chunk. For two column sums, whose partials (twice those of one)
// want long chunks and whose CTAs fit two to an SM (benchmarks/results/h100/NOTES.md §24).
// The launcher sizes the grid to the CTAs the GPU holds at once (LaunchPersistent).
// kAligned false: rows in phase, the chunks of PhasedChunks; every chunk takes kRows units,
// those past the last row idle, and the parameters are refilled where the class changes. A
// row's head and tail scalars (not staged: cp.async copies 4 bytes and more) are loaded into
// registers while the row before it runs (no gain that showed at fp32 1025-8191). These rows
// execute 1.5-1.6x the instructions of aligned ones (ncu, bf16 2047-8191: the scalars' work
// and the per-row geometry), and run at 58-67% of DRAM peak against 75-82% (NOTES.md §45).
// kCtasPerSm: the CTAs per SM its registers are held to (dispatch.cuh's StagedHeldCtas).
template <class Op, class Args, int kVec, int kVecs, int kThreads, int kRows, int kStages,
          bool kAligned = true, int kCtasPerSm = PipelinedSumThreads<Op, Args>() / kThreads>
__global__ void __launch_bounds__(kThreads, kCtasPerSm)
    CtaRowSumsStagedKernel(const Args args, const Op op, AccType<typename Args::InElem>* partial) {
  using Acc = AccType<typename Args::InElem>;
  using Row = FusedRow<Op, Args, kVec, kVecs, CtaTeam<kThreads>, kAligned>;
  using Sums = ColumnSums<Acc, Op::kColumnSums, kVecs, kVec>;
  __shared__ BlockReduceStorage<kThreads> storage;
  __shared__ FusedParams<Op, Args, kVec, kVecs, kThreads> params;
  CtaTeam<kThreads> team{storage};
  auto* stages = reinterpret_cast<typename Row::Stage*>(DynamicSharedMemory());
  Sums sums;
  ZeroSums(sums);
  const int64_t first = blockIdx.x;  // < chunks: the grid is at most `chunks` CTAs
  const int64_t step = gridDim.x;
  if constexpr (kAligned) {
    FillParams(params, op, threadIdx.x, true, args.n);
    const int64_t chunks = (args.rows + kRows - 1) / kRows;
    const int64_t own = (chunks - first + step - 1) / step;  // chunks this CTA runs
    // Its rows, counted 0, 1, ...: all kRows of each chunk but the last chunk of all, which
    // holds rows - (chunks - 1)·kRows.
    int64_t units = own * kRows;
    if (first + (own - 1) * step == chunks - 1) units -= chunks * kRows - args.rows;
    const auto row_of = [&](int64_t u) { return (first + (u / kRows) * step) * kRows + u % kRows; };
    PipelineUnits<kStages>(
        0, 1, units, [&](int64_t u, int s) { Row::Prefetch(team, args, row_of(u), stages[s]); },
        [&](int64_t u, int s, auto refill) {
          const int64_t row = row_of(u);
          Row r(team, args, row, true, Row::LoadStaged(team, args, row, stages[s]), &params);
          op(r, &sums);
          refill();  // the row's stores have used every staged pack
          if (u % kRows == kRows - 1 || u == units - 1) {  // the chunk's last row
            WriteSums<Acc, Op::kColumnSums, kVecs, kVec, kThreads>(sums, threadIdx.x, row / kRows,
                                                                   chunks, args.n, partial);
            ZeroSums(sums);
          }
        });
  } else {
    const PhasedChunks<kVec> pc(args.rows, kRows);
    const int64_t units = (pc.chunks - first + step - 1) / step * kRows;
    // the chunks of the units staged and of those run (unit u: row u % kRows of chunk u / kRows;
    // the next unit's, whose scalars load while one runs, from a copy of `running`: a third
    // cursor took the fp32 kernels from 96-108 registers to 120-124, NOTES.md §47)
    PhasedChunkCursor<kVec> staged(pc, first, step), running(pc, first, step);
    const auto row_of = [](const PhasedChunkCursor<kVec>& at, int64_t u) {
      return at.First() + kVec * (u % kRows);
    };
    typename Row::Scalars scalars =  // the next unit's
        Row::LoadScalars(team, args, row_of(running, 0), row_of(running, 0) < args.rows);
    PhasedSums<Sums, Acc, Op::kColumnSums> phased{sums, {}};
    int64_t filled = -1;  // the class whose columns `params` holds
    PipelineUnits<kStages>(
        0, 1, units,
        [&](int64_t u, int s) {
          staged.Seek(u / kRows);
          const int64_t row = row_of(staged, u);
          if (row < args.rows) Row::Prefetch(team, args, row, stages[s]);
        },
        [&](int64_t u, int s, auto refill) {
          running.Seek(u / kRows);
          const int64_t c = running.c;
          const int64_t q = running.q;
          const int64_t row = row_of(running, u);
          const typename Row::Scalars mine = scalars;
          PhasedChunkCursor<kVec> next = running;
          next.Seek((u + 1) / kRows);
          const int64_t next_row = row_of(next, u + 1);
          scalars = Row::LoadScalars(team, args, next_row, u + 1 < units && next_row < args.rows);
          if (row < args.rows) {
            if (q != filled) {
              FillParams(params, op, threadIdx.x, true, args.n, GeometryOfRow(args, q).head);
              filled = q;
            }
            Row r(team, args, row, true, Row::LoadStaged(team, args, row, stages[s], &mine),
                  &params);
            op(r, &phased);
          }
          refill();                      // the row's stores have used every staged pack
          if (u % kRows == kRows - 1) {  // the chunk's last unit
            const auto geo = GeometryOfClass(args, q);
            WriteSums<Acc, Op::kColumnSums, kVecs, kVec, kThreads>(sums, threadIdx.x, c, pc.chunks,
                                                                   args.n, partial, geo.head);
            ZeroSums(sums);
            const Ownership<CtaTeam<kThreads>, kVec> at(team, geo, true);
            phased.template WriteScalarAndZero<0>(at.head_col, c, pc.chunks, args.n, partial);
            phased.template WriteScalarAndZero<1>(at.tail_col, c, pc.chunks, args.n, partial);
          }
        });
  }
}

// Group tier: CTA b holds G = kCtaThreads / kWidth groups; group g runs rows
// b·kRows·G + g + k·G (k < kRows; neighbouring groups read neighbouring rows), and the CTA's
// kRows·G rows are chunk b: the groups add their sums in group order through shared memory
// (GroupsWriteSums), so chunks = ceil(rows / (kRows·G)). One partial per group wrote G times
// the bytes, which the finalize read again: at 16-bit x, a quarter of an input's bytes for
// layer_norm, about 5% of its training step at 256-1024 elements. Every group runs kRows
// iterations (rows past the end as invalid rows) so that the warp's shuffles stay uniform.
// kAligned false: rows in phase (plan.h's PhasedSumPlan), CTA b runs chunk b of PhasedChunks
// (kRows·G rows of one class, kVec apart; group g takes the chunk's rows g, g + G, ...): its
// groups share the parameters filled for that class and add their head and tail scalars' sums
// in group order too (GroupsWriteScalars). kPrefetch (the plan's prefetch_next_row: plan.h's
// GroupSumsPrefetchNextRow, grids of at most two CTAs per SM): each group brings its next row
// into L2 once its row is loaded. A kernel of its own: its registers (16-bit rms_norm 96 →
// 116-127, layer_norm 128 → 167) cost nothing on such grids, but as a branch of the one kernel
// they took CTAs per SM from full grids (layer_norm bf16 1024, 2048 chunks: the sums kernel
// 1.12x the time; benchmarks/results/h200/NOTES.md §42).
template <typename Acc, int kK, int kVecs, int kVec, int kWidth, int kCtaThreads>
struct GroupSumExchange {
  // A group's values, q = ((j·kVecs + k)·kWidth + l)·kVec + e for value e of pack k of sum j
  // of lane l: column (l + k·kWidth)·kVec + e of sum j, so that consecutive q are consecutive
  // columns of one sum (pack k of lane l holds columns (l + k·kWidth)·kVec ...).
  static constexpr int kValues = kK * kVecs * kWidth * kVec;
  Acc v[kCtaThreads / kWidth * kValues];  // group g's value q at [g·kValues + q]
};

// The column sums of the CTA's groups (those of lane `lane` of group `group` in `sums`), added
// in group order and written as chunk `chunk`'s partial, the packs' columns those of rows whose
// packs start `head` columns in.
template <typename Acc, int kK, int kVecs, int kVec, int kWidth, int kCtaThreads>
ROWNORM_DEVICE void GroupsWriteSums(const ColumnSums<Acc, kK, kVecs, kVec>& sums,
                                    GroupSumExchange<Acc, kK, kVecs, kVec, kWidth, kCtaThreads>& ex,
                                    int group, int lane, int64_t chunk, int64_t chunks, int64_t n,
                                    Acc* partial, int64_t head = 0) {
  constexpr int kGroups = kCtaThreads / kWidth;
  constexpr int kValues = GroupSumExchange<Acc, kK, kVecs, kVec, kWidth, kCtaThreads>::kValues;
  __syncthreads();  // `ex` shares its memory with the parameters the last rows read
#pragma unroll
  for (int j = 0; j < kK; ++j) {
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        ex.v[group * kValues + ((j * kVecs + k) * kWidth + lane) * kVec + e] = sums.v[j][k][e];
      }
    }
  }
  __syncthreads();
  const int64_t vecs = (n - head) / kVec;
#pragma unroll 1
  for (int q = threadIdx.x; q < kValues; q += kCtaThreads) {
    const int e = q % kVec;
    const int l = (q / kVec) % kWidth;
    const int k = (q / (kVec * kWidth)) % kVecs;
    const int j = q / (kVec * kWidth * kVecs);
    const int64_t v = l + int64_t{k} * kWidth;
    if (v < vecs) {
      Acc sum = ex.v[q];
#pragma unroll
      for (int g = 1; g < kGroups; ++g) sum += ex.v[g * kValues + q];
      partial[(j * chunks + chunk) * n + head + v * kVec + e] = sum;
    }
  }
}

// The head and tail scalars' sums of the CTA's groups (rows in phase: PhasedSums, at most one
// of each per lane), lane l's of group g at [which][j][g][l].
template <typename Acc, int kK, int kWidth, int kCtaThreads>
struct GroupScalarExchange {
  Acc v[2][kK][kCtaThreads / kWidth][kWidth];
};
struct NoGroupScalarExchange {};

// Group `group`'s lane `lane` puts its scalars' sums into `ex`, then (Finish, after a barrier)
// the lanes of group 0 add every group's in group order and write them at the lane's head and
// tail columns in the chunk's geometry (Ownership's; -1 where it owns none).
template <typename Acc, int kK, int kWidth, int kCtaThreads>
struct GroupsWriteScalars {
  GroupScalarExchange<Acc, kK, kWidth, kCtaThreads>& ex;
  template <class Phased>
  ROWNORM_DEVICE void Put(const Phased& phased, int group, int lane) {
#pragma unroll
    for (int w = 0; w < 2; ++w) {
#pragma unroll
      for (int j = 0; j < kK; ++j) ex.v[w][j][group][lane] = phased.scalar[w][j];
    }
  }
  ROWNORM_DEVICE void Finish(int group, int lane, int64_t head_col, int64_t tail_col, int64_t chunk,
                             int64_t chunks, int64_t n, Acc* partial) {
    if (group != 0) return;
#pragma unroll
    for (int w = 0; w < 2; ++w) {
      const int64_t col = w == 0 ? head_col : tail_col;
      if (col < 0) continue;
#pragma unroll
      for (int j = 0; j < kK; ++j) {
        Acc sum = ex.v[w][j][0][lane];
#pragma unroll
        for (int g = 1; g < kCtaThreads / kWidth; ++g) sum += ex.v[w][j][g][lane];
        partial[(j * chunks + chunk) * n + col] = sum;
      }
    }
  }
};

template <class Op, class Args, int kVec, int kVecs, int kWidth, int kCtaThreads, int kRows,
          bool kAligned, bool kPrefetch>
ROWNORM_DEVICE void GroupRowSums(const Args& args, const Op& op,
                                 AccType<typename Args::InElem>* partial) {
  static_assert(kAligned || kVec <= kWidth, "a lane owns at most one head and one tail scalar");
  using Acc = AccType<typename Args::InElem>;
  using Sums = ColumnSums<Acc, Op::kColumnSums, kVecs, kVec>;
  constexpr int kGroups = kCtaThreads / kWidth;
  union Shared {  // the parameters (one copy for all groups) while rows run, then the sums
    FusedParams<Op, Args, kVec, kVecs, kWidth> params;
    GroupSumExchange<Acc, Op::kColumnSums, kVecs, kVec, kWidth, kCtaThreads> exchange;
  };
  using ScalarExchange =
      std::conditional_t<kAligned, NoGroupScalarExchange,
                         GroupScalarExchange<Acc, Op::kColumnSums, kWidth, kCtaThreads>>;
  __shared__ Shared shared;
  __shared__ ScalarExchange scalar_exchange;
  auto& params = shared.params;
  GroupTeam<kWidth> team{static_cast<int>(threadIdx.x % kWidth)};
  const int group = threadIdx.x / kWidth;
  Sums sums;
  ZeroSums(sums);
  const int64_t chunk = blockIdx.x;
  // The chunk's rows first, first + kStep, ... (kRows·G of them), of geometry `geo`.
  constexpr int64_t kStep = kAligned ? 1 : kVec;
  constexpr int64_t kChunkRows = int64_t{kRows} * kGroups;
  const PhasedChunks<kVec> pc(args.rows, kChunkRows);  // (rows in phase)
  int64_t first = chunk * kChunkRows;
  RowGeometry<typename Args::InElem, kVec> geo{0, args.n / kVec, 0};
  if constexpr (!kAligned) {
    first = pc.First(chunk);
    geo = GeometryOfClass(args, pc.Class(chunk));
  }
  PhasedSums<Sums, Acc, Op::kColumnSums> phased{sums, {}};
  auto* const sums_of_rows = SumsOfRows<kAligned>(sums, phased);
  FillParams(params, op, team.rank, group == 0, args.n, geo.head);
  const int64_t base = first + group * kStep;
  using Row = FusedRow<Op, Args, kVec, kVecs, GroupTeam<kWidth>, kAligned>;
  for (int k = 0; k < kRows; ++k) {
    const int64_t row = base + static_cast<int64_t>(k) * kGroups * kStep;
    Row r(team, args, row, row < args.rows, &params);
    if constexpr (kPrefetch) {
      const int64_t next = row + kGroups * kStep;
      if (k + 1 < kRows && next < args.rows) Row::template PrefetchL2<true>(team, args, next);
    }
    op(r, sums_of_rows);
  }
  // (after the rows: computed before them, it took an aligned kernel from 72 to 80 registers)
  const int64_t chunks = kAligned ? (args.rows + kChunkRows - 1) / kChunkRows : pc.chunks;
  if constexpr (!kAligned) {  // read after GroupsWriteSums's barriers
    GroupsWriteScalars<Acc, Op::kColumnSums, kWidth, kCtaThreads>{scalar_exchange}.Put(
        phased, group, team.rank);
  }
  GroupsWriteSums<Acc, Op::kColumnSums, kVecs, kVec, kWidth, kCtaThreads>(
      sums, shared.exchange, group, team.rank, chunk, chunks, args.n, partial, geo.head);
  if constexpr (!kAligned) {
    const Ownership<GroupTeam<kWidth>, kVec> own(team, geo, true);
    GroupsWriteScalars<Acc, Op::kColumnSums, kWidth, kCtaThreads>{scalar_exchange}.Finish(
        group, team.rank, own.head_col, own.tail_col, chunk, chunks, args.n, partial);
  }
}

// The group tier's kernels. GroupRowSumsKernel: aligned rows, and layer_norm's rows in phase,
// with ptxas's own register choice. PhasedGroupRowSumsKernel: the rows in phase of one column
// sum, held to kPhasedGroupSumCtas CTAs of 128 per SM. Left alone, ptxas gave those 136-161
// registers at 16-bit (three CTAs per SM) where the aligned rows take 96-128 (four or five);
// held, the H100's bf16 step took 0.95 / 0.93x the time at 511 / 1023 for rms_norm, 0.98 /
// 0.97x for add_rms_norm. Held to four, layer_norm's 16-bit kernel (176 registers left alone)
// spilled 80 bytes and took 1.08x the time at 255 (0.99-1.01x at 511-1023), so it keeps
// ptxas's choice. A bound of one CTA per SM is not that choice: on the aligned 16-bit
// layer_norm kernel it moved 128 registers to 167 (benchmarks/results/h100/NOTES.md §46).
template <class Op, class Args, int kVec, int kVecs, int kWidth, int kCtaThreads, int kRows,
          bool kAligned = true, bool kPrefetch = false>
__global__ void __launch_bounds__(kCtaThreads)
    GroupRowSumsKernel(const Args args, const Op op, AccType<typename Args::InElem>* partial) {
  GroupRowSums<Op, Args, kVec, kVecs, kWidth, kCtaThreads, kRows, kAligned, kPrefetch>(args, op,
                                                                                       partial);
}
constexpr int kPhasedGroupSumCtas = 4;
template <class Op, class Args, int kVec, int kVecs, int kWidth, int kCtaThreads, int kRows,
          bool kPrefetch = false>
__global__ void __launch_bounds__(kCtaThreads, kPhasedGroupSumCtas)
    PhasedGroupRowSumsKernel(const Args args, const Op op,
                             AccType<typename Args::InElem>* partial) {
  static_assert(Op::kColumnSums == 1, "two sums run GroupRowSumsKernel (see above)");
  GroupRowSums<Op, Args, kVec, kVecs, kWidth, kCtaThreads, kRows, false, kPrefetch>(args, op,
                                                                                    partial);
}

// The per-thread copies of an op's ColumnParams() that ClusterParamRowKernel keeps.
template <class Op, class Args, int kVec, int kVecs, int kThreads>
using ParamSlicesOf = ParamSlices<decltype(std::declval<const Op&>().ColumnParams()),
                                  AccType<typename Args::InElem>, kVecs, kVec, kThreads>;

// Whether the cluster tier's register rows of Op stage its ColumnParams() per row in shared
// memory (StagedParamSlices): forwards with per-column parameters, on aligned rows
// (dispatch.cuh's ClusterRegisterKernel), where a pack's parameters take one 16-byte copy: one
// parameter of the row's dtype (rms_norm, add_rms_norm), whose stage (32 KB on 256 x 8 packs)
// leaves four CTAs per SM. Not the 16-bit parameters of a float32 residual stream's packs of
// four, nor parameters of two copies a pack (layer_norm's two, a float32 weight on 16-bit rows),
// which staged ran slower than read per row and than the kept copy. H200, forward, time ÷ main's
// plan (the kept copy; benchmarks/results/h200/NOTES.md §37): layer_norm with 6 of 8 packs
// staged (48 KB, four CTAs per SM) bf16 65536 / 131072 / 262144 1.20 / 1.22 / 1.22, fp32 32768 /
// 131072 1.20 / 1.23; all 8 (64 KB, three CTAs) 1.40-1.42 and 1.23-1.30; rms_norm bf16 with a
// float32 weight, 6 of 8 staged, 1.22 (read per row: 1.01, §36).
template <class Op, class Args, bool kAligned>
constexpr bool StagesRowParams() {
  if constexpr (kAligned && OpTraits<Op>::kColumnParams && OpTraits<Op>::kColumnSums == 0) {
    using Params = decltype(std::declval<const Op&>().ColumnParams());
    constexpr int kBytesPerPack =
        Params::kCount * Args::kPackWidth * static_cast<int>(sizeof(typename Params::Elem));
    return kBytesPerPack == 16;
  } else {
    return false;
  }
}
template <class Op, class Args, int kVec, int kVecs, int kThreads, bool kStaged>
struct RowParamStage {
  using type = NoParamCache;
};
template <class Op, class Args, int kVec, int kVecs, int kThreads>
struct RowParamStage<Op, Args, kVec, kVecs, kThreads, true> {
  using type = StagedParamSlices<decltype(std::declval<const Op&>().ColumnParams()),
                                 AccType<typename Args::InElem>, kVecs, kVec, kThreads>;
};
// The register rows' dynamic shared memory: their parameters' stage, where they stage them.
template <class Op, class Args, int kVecs, int kThreads, bool kAligned>
constexpr size_t RowParamStageBytes() {
  if constexpr (StagesRowParams<Op, Args, kAligned>()) {
    return sizeof(typename RowParamStage<Op, Args, Args::kPackWidth, kVecs, kThreads, true>::type);
  } else {
    return 0;
  }
}

// The rows of a problem in phase (plan.h's PhasedSumPlan) class by class: position u of
// [0, rows) is row q + kVec·i of class q, the classes' rows in order, class 0's first. A
// persistent team running positions c, c + teams, ... meets at most kVec classes.
template <int kVec>
struct PhasedRowOrder {
  int64_t base;   // rows of the classes past `extra`; those before it have one more
  int64_t extra;  // rows % kVec
  ROWNORM_HOST_DEVICE explicit PhasedRowOrder(int64_t rows)
      : base(rows / kVec), extra(rows % kVec) {}
  ROWNORM_HOST_DEVICE int64_t Row(int64_t u) const {
    const int64_t longer = extra * (base + 1);  // the positions of the longer classes
    if (u < longer) return u / (base + 1) + kVec * (u % (base + 1));
    const int64_t v = u - longer;
    return extra + v / base + kVec * (v % base);
  }
};

// The rows of the cluster tier's register kernels, cluster c running rows c, c + clusters, ...:
// ClusterRowKernel and ClusterRowKernelBounded (a cluster per row), and ClusterParamRowKernel
// (Slices = ParamSlicesOf: a persistent grid of the clusters the device runs at once, whose
// threads copy their columns' parameters into dynamic shared memory instead of reading them in
// every row). With kPipelined (a persistent grid only) each thread issues its loads of the
// cluster's next row before it runs the current one, so that they are in flight through the
// row's barriers and stores (dispatch.cuh's KeptRowsPipelined). With kAligned the rows are
// those of aligned problems, without head or tail scalars (checked on the host: dispatch.cuh's
// ClusterRegisterKernel and ClusterParamRowKernel); kept parameters without kAligned are those
// of a problem in phase, its rows run class by class (PhasedRowOrder) and the parameters' copy
// refilled, shifted to the class's packs, where a cluster's next row is of another class.
// With a Slices refilled per row (StagesPerRow: StagedParamSlices; a cluster per row, aligned
// rows) each thread copies its columns' parameters for every row, asynchronously, after the
// row's loads.
template <class Op, class Args, int kVec, int kVecs, int kThreads, int kCluster,
          class Slices = NoParamCache, bool kPipelined = false, bool kAligned = false>
__device__ __forceinline__ void ClusterRows(const Args& args, const Op& op) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr bool kStaged = StagesPerRow<Slices>::value;
  static_assert(!kStaged || (kAligned && !kPipelined), "staged: aligned rows, one at a time");
  constexpr bool kKept = !std::is_same_v<Slices, NoParamCache> && !kStaged;
  constexpr bool kPhased = kKept && !kAligned;
  using Team = ClusterTeam<kThreads, kCluster>;
  using Row = CachedRow<Args, kVec, kVecs, Team, kAligned, Slices>;
  __shared__ typename Team::Storage storage;
  Team team{storage};
  const int64_t clusters = gridDim.x / kCluster;
  const int64_t first = blockIdx.x / kCluster;
  const PhasedRowOrder<kVec> order(args.rows);
  const auto row_at = [&](int64_t u) {
    if constexpr (kPhased) {
      return order.Row(u);
    } else {
      return u;
    }
  };
  typename Row::Loaded loaded;
  if constexpr (kPipelined) {
    loaded = Row::Load(team, args, first < args.rows ? row_at(first) : 0, first < args.rows);
  }
  Slices* kept = nullptr;
  const int slice = team.SliceRank();
  if constexpr (kKept || kStaged) kept = reinterpret_cast<Slices*>(DynamicSharedMemory());
  if constexpr (kKept) {
    if constexpr (kAligned) {
      const int64_t vecs = args.n / kVec;
      kept->Fill(op.ColumnParams(), threadIdx.x, Ownership<Team, kVec>::SliceBegin(vecs, slice),
                 Ownership<Team, kVec>::SliceBegin(vecs, slice + 1));
    }
  }
  int64_t filled = -1;  // kPhased: the class whose columns `kept` holds
  // Row `row`'s parameters in `kept` (kPhased: refilled for its class where that changed).
  const auto params_for = [&](int64_t row) {
    if constexpr (kPhased) {
      if (row % kVec != filled) {
        const auto geo = GeometryOfRow(args, row);
        kept->Fill(op.ColumnParams(), threadIdx.x,
                   Ownership<Team, kVec>::SliceBegin(geo.vecs, slice),
                   Ownership<Team, kVec>::SliceBegin(geo.vecs, slice + 1), geo.head);
        filled = row % kVec;
      }
    }
    return static_cast<const Slices*>(kept);
  };
  if constexpr (kPipelined) {
#pragma unroll 1
    for (int64_t u = first; u < args.rows; u += clusters) {
      const int64_t row = row_at(u);
      const bool more = u + clusters < args.rows;
      const typename Row::Loaded next =
          Row::Load(team, args, more ? row_at(u + clusters) : 0, more);
      Row r(team, args, row, true, loaded, params_for(row));
      op(r);
      loaded = next;
    }
  } else {
    for (int64_t u = first; u < args.rows; u += clusters) {
      const int64_t row = row_at(u);
      Row r(team, args, row, true, params_for(row));
      if constexpr (kStaged) {
        const int64_t vecs = args.n / kVec;
        kept->IssueAsync(op.ColumnParams(), threadIdx.x,
                         Ownership<Team, kVec>::SliceBegin(vecs, slice),
                         Ownership<Team, kVec>::SliceBegin(vecs, slice + 1));
      }
      op(r);
    }
  }
  team.Finish();
#else
  __trap();
#endif
}

// The register rows (the forwards with per-column parameters staging them on aligned rows).
template <class Op, class Args, int kVec, int kVecs, int kThreads, int kCluster, bool kAligned>
__device__ __forceinline__ void RegisterClusterRows(const Args& args, const Op& op) {
  ClusterRows<Op, Args, kVec, kVecs, kThreads, kCluster,
              typename RowParamStage<Op, Args, kVec, kVecs, kThreads,
                                     StagesRowParams<Op, Args, kAligned>()>::type,
              false, kAligned>(args, op);
}

template <class Op, class Args, int kVec, int kVecs, int kThreads, int kCluster, bool kAligned>
__global__ void __launch_bounds__(kThreads) ClusterRowKernel(const Args args, const Op op) {
  RegisterClusterRows<Op, Args, kVec, kVecs, kThreads, kCluster, kAligned>(args, op);
}

// Forwards with per-column parameters (OpTraits::kColumnParams, no column sums): ClusterRows
// with the parameters kept per CTA, pipelined or not, of aligned rows or (kAligned false) of
// rows in phase.
template <class Op, class Args, int kVec, int kVecs, int kThreads, int kCluster, bool kPipelined,
          bool kAligned = true>
__global__ void __launch_bounds__(kThreads) ClusterParamRowKernel(const Args args, const Op op) {
  ClusterRows<Op, Args, kVec, kVecs, kThreads, kCluster,
              ParamSlicesOf<Op, Args, kVec, kVecs, kThreads>, kPipelined, kAligned>(args, op);
}

// Fused parameter gradients of rows past the CTA tier (the wide CTA: kCluster = 1, 512 x 8
// packs; the cluster tier) and of the CTA tier's 16-bit 512 x 4 rows and layer_norm's 256 x 4
// (plan.h's SliceSumsApply), rows in registers, persistent. A grid of the teams the device
// runs at once; team c runs chunks c, c + teams, ... of `chunk_rows` rows in order
// (chunks = ceil(rows / chunk_rows): the partials, and so the results, do not depend on the
// grid). Each thread copies its columns' parameters once (ParamSlices) and adds its columns'
// sums in shared memory (SharedColumnSums: 64 columns a thread at 16-bit, too many to hold in
// registers next to the row but where kRegisterSums: plan.h's SliceSumsInRegisters), which it
// writes as the chunk's partial after the chunk's last row. (Loading the team's next row into
// registers while the current one is reduced took 0.92-1.01x the time at 16-bit and needs a CTA per
// SM: benchmarks/results/h100/NOTES.md §29; with `prefetch_next_row` a team brings it into L2
// instead: plan.h's SlicePrefetchesNextRow.) Where it runs, x and dy are read once per step;
// elsewhere these rows save per-row statistics and kernels/param_grad.h reads them again. kAligned:
// aligned rows (head == tail
// == 0, checked on the host); else rows in phase in classes of one geometry (plan.h's
// PhasedSumPlan), each chunk's threads keeping their columns, the parameters refilled where
// a team's next chunk is of another class. Dynamic shared memory: SliceSums::kBytes.
template <class Op, class Args, int kVec, int kVecs, int kThreads, int kCluster,
          bool kRegisterSums = false>
struct SliceSums {
  using Acc = AccType<typename Args::InElem>;
  using Team =
      std::conditional_t<kCluster == 1, CtaTeam<kThreads>, ClusterTeam<kThreads, kCluster>>;
  using Slices = ParamSlicesOf<Op, Args, kVec, kVecs, kThreads>;
  using Sums = SharedColumnSums<Acc, Op::kColumnSums, kVecs, kVec, kThreads>;
  static_assert(sizeof(Slices) % 16 == 0, "the sums follow the parameters, 16-byte aligned");
  static constexpr size_t kBytes = sizeof(Slices) + (kRegisterSums ? 0 : sizeof(Sums));
  // What the rows add into: the sums in shared memory after the parameters, or (kRegisterSums)
  // in the thread's registers.
  using RowSums =
      std::conditional_t<kRegisterSums,
                         RegisterColumnSums<Acc, Op::kColumnSums, kVecs, kVec, kThreads>, Sums&>;
  ROWNORM_DEVICE static RowSums SumsOf(unsigned char* shared) {
    if constexpr (kRegisterSums) {
      return RowSums{};
    } else {
      return *reinterpret_cast<Sums*>(shared + sizeof(Slices));
    }
  }
  // kStageNext: the team's next row staged after the sums (RowSlices, bulk copies), and the
  // cluster's reduce slots of 16 bytes (the backwards' values, at most two floats), whose
  // static shared memory (1-1.5 KB at 32 bytes) held layer_norm's 4-pack staged CTAs of 256 to
  // one per SM: with 16, two fit, as the plain kernel's.
  using Stage = RowSlices<Args, kVec, kVecs, kThreads>;
  static_assert(kBytes % 16 == 0, "the stage follows the sums, 16-byte aligned");
  static constexpr size_t kStagedBytes = kBytes + sizeof(Stage);
  static constexpr int kStagedSlotBytes = 16;
  using StagedTeam = std::conditional_t<kCluster == 1, CtaTeam<kThreads>,
                                        ClusterTeam<kThreads, kCluster, kStagedSlotBytes>>;
};

// SliceRowSums of rows in phase (plan.h's PhasedSumPlan): the chunks of PhasedChunks, each of
// its class's geometry; a chunk past the last row writes zeros. The parameters' copy is
// refilled where the class changes.
template <class Row, int kVecs, class Team, class Slices, class Sums, class Op, class Args>
ROWNORM_DEVICE void PhasedSliceChunks(Team& team, const Args& args, const Op& op, Slices& slices,
                                      Sums& sums, AccType<typename Args::InElem>* partial,
                                      int chunk_rows, bool prefetch_next_row) {
  using Acc = AccType<typename Args::InElem>;
  constexpr int kVec = Args::kPackWidth;
  constexpr int kCluster = Team::kSlices;
  PhasedSums<Sums, Acc, Op::kColumnSums> phased{sums, {}};
  const PhasedChunks<kVec> pc(args.rows, chunk_rows);
  const int64_t chunks = pc.chunks;
  const int64_t teams = gridDim.x / kCluster;
  const int slice = team.SliceRank();
  int64_t filled = -1;  // the class whose columns `slices` holds
  for (int64_t c = blockIdx.x / kCluster; c < chunks; c += teams) {
    const int64_t q = pc.Class(c);
    const int64_t first = pc.First(c);
    const int64_t last = min(args.rows, first + pc.block);
    const auto geo = GeometryOfClass(args, q);
    const Ownership<Team, kVec> own(team, geo, true);
    const int64_t begin = Ownership<Team, kVec>::SliceBegin(geo.vecs, slice);
    const int64_t end = Ownership<Team, kVec>::SliceBegin(geo.vecs, slice + 1);
    if (first < last && q != filled) {
      slices.Fill(op.ColumnParams(), threadIdx.x, begin, end, geo.head);
      filled = q;
    }
    for (int64_t row = first; row < last; row += kVec) {
      Row r(team, args, row, true, &slices);
      if constexpr (SliceMayPrefetchNextRow(Team::kThreads, kVecs, kCluster, kVec,
                                            Op::kColumnSums)) {
        if (prefetch_next_row) {
          // the team's next row: this chunk's, else the first of its next chunk
          const int64_t next = row + kVec < last ? row + kVec
                               : c + teams < chunks && pc.First(c + teams) < args.rows
                                   ? pc.First(c + teams)
                                   : -1;
          if (next >= 0) Row::PrefetchL2(team, args, next);
        }
      }
      op(r, &phased);
    }
    sums.template WriteAndZero<false>(threadIdx.x, begin, end, c, chunks, args.n, partial,
                                      geo.head);
    phased.template WriteScalarAndZero<0>(own.head_col, c, chunks, args.n, partial);
    phased.template WriteScalarAndZero<1>(own.tail_col, c, chunks, args.n, partial);
  }
}

// SliceRowSums of aligned rows with the team's next row staged in shared memory (kStageNext;
// the cluster tier's 16-bit rows: plan.h's SliceSumsStageNextRow): each CTA's thread 0 copies
// the CTA's slice of the next row into one stage by bulk copies (SharedRow::Issue) once every
// thread has moved the current row's packs from the stage into registers, so that the next
// row's bytes are in flight while the current one is reduced, stored and summed, with no
// registers held for them (two rows held in registers spilled layer_norm's sums:
// benchmarks/results/h200/NOTES.md §43). Dynamic shared memory: SliceSums::kStagedBytes.
template <class Row, int kVecs, class Team, class Slices, class Sums, class Op, class Args,
          class Following>
ROWNORM_DEVICE void StagedSliceRows(Team& team, const Args& args, const Op& op,
                                    const Slices& slices, Sums& sums,
                                    AccType<typename Args::InElem>* partial, int chunk_rows,
                                    int64_t chunks, int64_t teams, int64_t begin, int64_t end,
                                    Following following) {
  using Staged = SharedRow<Args, Args::kPackWidth, kVecs, Team>;
  __shared__ uint64_t landed;  // the stage's copies have landed
  auto& stage = *reinterpret_cast<typename Staged::Stage*>(DynamicSharedMemory() + sizeof(Slices) +
                                                           sizeof(Sums));
  constexpr int kCluster = Team::kSlices;
  const int64_t first = int64_t{blockIdx.x} / kCluster * chunk_rows;
  const bool issuer = threadIdx.x == 0;
  if (issuer) {
    InitBarrier(&landed);
    if (first < args.rows) Staged::Issue(team, args, first, stage, &landed);
  }
  __syncthreads();  // the barrier initialized
  unsigned parity = 0;
  for (int64_t c = blockIdx.x / kCluster; c < chunks; c += teams) {
    const int64_t last = min(args.rows, (c + 1) * chunk_rows);
    for (int64_t row = c * chunk_rows; row < last; ++row) {
      WaitBarrier(&landed, parity);
      parity ^= 1u;
      const typename Row::Loaded loaded = Row::LoadSlices(team, args, row, stage);
      __syncthreads();  // every thread's packs are out of the stage
      const int64_t next = following(row, c, last);
      if (issuer && next >= 0) Staged::Issue(team, args, next, stage, &landed);
      Row r(team, args, row, true, loaded, &slices);
      op(r, &sums);
    }
    sums.template WriteAndZero<true>(threadIdx.x, begin, end, c, chunks, args.n, partial);
  }
}

template <class Op, class Args, int kVec, int kVecs, int kThreads, int kCluster, bool kAligned,
          bool kPipelined, bool kStageNext, bool kRegisterSums = false>
__device__ __forceinline__ void SliceRowSums(const Args& args, const Op& op,
                                             AccType<typename Args::InElem>* partial,
                                             int chunk_rows, bool prefetch_next_row) {
  using S = SliceSums<Op, Args, kVec, kVecs, kThreads, kCluster, kRegisterSums>;
  static_assert(!kRegisterSums || (kAligned && !kPipelined && !kStageNext),
                "sums in registers: whole rows, one at a time");
  using Team = std::conditional_t<kStageNext, typename S::StagedTeam, typename S::Team>;
  using Row = CachedRow<Args, kVec, kVecs, Team, kAligned, typename S::Slices>;
  __shared__ std::conditional_t<
      kCluster == 1, BlockReduceStorage<kThreads>,
      ClusterReduceStorage<kThreads, kCluster, kStageNext ? S::kStagedSlotBytes : kReduceSlotBytes>>
      storage;
  Team team{storage};
  auto& slices = *reinterpret_cast<typename S::Slices*>(DynamicSharedMemory());
  typename S::RowSums sums = S::SumsOf(DynamicSharedMemory());
  if constexpr (!kAligned) {
    sums.Zero(threadIdx.x);
    PhasedSliceChunks<Row, kVecs>(team, args, op, slices, sums, partial, chunk_rows,
                                  prefetch_next_row);
  } else {
    const int64_t vecs = args.n / kVec;
    const int slice = team.SliceRank();
    const int64_t begin = Ownership<Team, kVec>::SliceBegin(vecs, slice);
    const int64_t end = Ownership<Team, kVec>::SliceBegin(vecs, slice + 1);
    slices.Fill(op.ColumnParams(), threadIdx.x, begin, end);
    sums.Zero(threadIdx.x);
    const int64_t chunks = (args.rows + chunk_rows - 1) / chunk_rows;
    const int64_t teams = gridDim.x / kCluster;
    // The team's row after `row` of chunk c (whose rows end at `last`): the chunk's next, else
    // the first of its next chunk; -1 past its last. What kPipelined loads ahead (plan.h's
    // SliceSumsPipelined) and prefetch_next_row brings into L2.
    const auto following = [&](int64_t row, int64_t c, int64_t last) -> int64_t {
      return row + 1 < last ? row + 1 : c + teams < chunks ? (c + teams) * chunk_rows : -1;
    };
    if constexpr (kStageNext) {
      StagedSliceRows<Row, kVecs>(team, args, op, slices, sums, partial, chunk_rows, chunks, teams,
                                  begin, end, following);
      if constexpr (kCluster > 1) team.Finish();
      return;
    }
    typename Row::Loaded loaded{};
    if constexpr (kPipelined) {
      const int64_t first = int64_t{blockIdx.x} / kCluster * chunk_rows;
      loaded = Row::Load(team, args, first < args.rows ? first : 0, first < args.rows);
    }
    for (int64_t c = blockIdx.x / kCluster; c < chunks; c += teams) {
      const int64_t last = min(args.rows, (c + 1) * chunk_rows);
      for (int64_t row = c * chunk_rows; row < last; ++row) {
        if constexpr (kPipelined) {
          const int64_t next = following(row, c, last);
          const typename Row::Loaded upcoming =
              Row::Load(team, args, next >= 0 ? next : 0, next >= 0);
          Row r(team, args, row, true, loaded, &slices);
          op(r, &sums);
          loaded = upcoming;
          continue;
        }
        Row r(team, args, row, true, &slices);
        if constexpr (SliceMayPrefetchNextRow(kThreads, kVecs, kCluster, kVec, Op::kColumnSums)) {
          if (prefetch_next_row) {
            const int64_t next = following(row, c, last);
            if (next >= 0) Row::PrefetchL2(team, args, next);
          }
        }
        op(r, &sums);
      }
      sums.template WriteAndZero<true>(threadIdx.x, begin, end, c, chunks, args.n, partial);
    }
  }
  if constexpr (kCluster > 1) team.Finish();
}

// kPipelined (aligned rows of one CTA): the next row's loads in flight (SliceRowSums).
// kStageNext (aligned rows, sm_90+): the next row staged by bulk copies (StagedSliceRows).
template <class Op, class Args, int kVec, int kVecs, int kThreads, int kCluster, bool kAligned,
          bool kPipelined = false, bool kStageNext = false>
__global__ void __launch_bounds__(kThreads)
    SliceRowSumsKernel(const Args args, const Op op, AccType<typename Args::InElem>* partial,
                       int chunk_rows, bool prefetch_next_row) {
  static_assert(!kPipelined || (kAligned && kCluster == 1), "pipelined: aligned rows of a CTA");
  static_assert(!kStageNext || (kAligned && !kPipelined), "staged: aligned rows, one in registers");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  if constexpr (kCluster > 1 || kStageNext) {
    __trap();  // launched on sm_90+ only (checked on the host)
  } else {
    SliceRowSums<Op, Args, kVec, kVecs, kThreads, kCluster, kAligned, kPipelined, false>(
        args, op, partial, chunk_rows, prefetch_next_row);
  }
#else
  SliceRowSums<Op, Args, kVec, kVecs, kThreads, kCluster, kAligned, kPipelined, kStageNext>(
      args, op, partial, chunk_rows, prefetch_next_row);
#endif
}

// SliceRowSumsKernel of whole rows of a CTA whose threads hold the sums in registers (plan.h's
// SliceSumsInRegisters: 128 registers a thread, one CTA of 512 per SM as the shared sums').
template <class Op, class Args, int kVec, int kVecs, int kThreads>
__global__ void __launch_bounds__(kThreads, 1)
    SliceRowSumsRegisterKernel(const Args args, const Op op,
                               AccType<typename Args::InElem>* partial, int chunk_rows,
                               bool prefetch_next_row) {
  SliceRowSums<Op, Args, kVec, kVecs, kThreads, 1, true, false, false, true>(
      args, op, partial, chunk_rows, prefetch_next_row);
}

// The cluster tier's register rows held to the registers of kCtasPerSm CTAs per SM, for ops
// with OpTraits::ClusterCtasPerSm (dispatch.cuh's ClusterKernel picks it). A second
// kernel, not a bound on ClusterRowKernel: any minimum-blocks argument there, even 1, changed
// ptxas's registers for every cluster kernel (a bound of 2 on all 1-2 input ones made rms_norm
// 1.13-1.20x slower, benchmarks/results/h100/NOTES.md §18).
template <class Op, class Args, int kVec, int kVecs, int kThreads, int kCluster, int kCtasPerSm,
          bool kAligned>
__global__ void __launch_bounds__(kThreads, kCtasPerSm)
    ClusterRowKernelBounded(const Args args, const Op op) {
  RegisterClusterRows<Op, Args, kVec, kVecs, kThreads, kCluster, kAligned>(args, op);
}

// Rows in shared memory, put there by bulk copies (sm_90+; the cluster tier's
// ClusterKind::kShared, dispatch.cuh): a persistent grid of the clusters of kCluster CTAs the
// device runs at once; cluster c runs rows c, c + clusters, ... One thread of
// each CTA keeps the CTA's slices of the next kStages rows in flight (SharedRow::Issue, one bulk
// copy per input), the CTA's threads run the op on the current row from shared memory
// (SharedRow), and once every thread is done with the row's slices the stage is refilled. Few
// registers, so more CTAs fit than of a register kernel that needs many (16-bit layer_norm's
// forward: 3 CTAs per SM against 2, 74-80% of copy against 58-69% on the H100); where the
// register kernel fits as many, it is as fast or faster (benchmarks/results/h100/NOTES.md §27).
template <class Op, class Args, int kVec, int kVecs, int kThreads, int kCluster, int kStages>
__global__ void __launch_bounds__(kThreads) BulkRowKernel(const Args args, const Op op) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  static_assert(kStages >= 2, "one stage would leave nothing in flight while a row is processed");
  using Team = ClusterTeam<kThreads, kCluster>;
  using Row = SharedRow<Args, kVec, kVecs, Team>;
  __shared__ typename Team::Storage storage;
  __shared__ uint64_t landed[kStages];  // stage s's copies have landed
  Team team{storage};
  auto* stages = reinterpret_cast<typename Row::Stage*>(DynamicSharedMemory());
  const int64_t first = blockIdx.x / kCluster;
  const int64_t step = gridDim.x / kCluster;
  const bool issuer = threadIdx.x == 0;
  if (issuer) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) InitBarrier(&landed[s]);
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      const int64_t row = first + s * step;
      if (row < args.rows) Row::Issue(team, args, row, stages[s], &landed[s]);
    }
  }
  __syncthreads();      // the barriers initialized
  unsigned parity = 0;  // bit s: the parity of stage s's next phase
  int s = 0;
  for (int64_t row = first; row < args.rows; row += step) {
    WaitBarrier(&landed[s], (parity >> s) & 1u);
    parity ^= 1u << s;
    Row r(team, args, row, stages[s]);
    op(r);
    __syncthreads();  // every thread is done with stage s
    const int64_t next = row + kStages * step;
    if (issuer && next < args.rows) Row::Issue(team, args, next, stages[s], &landed[s]);
    s = s + 1 == kStages ? 0 : s + 1;
  }
  team.Finish();
#else
  __trap();
#endif
}

template <class Op, class Args, int kVec, int kThreads>
__global__ void __launch_bounds__(kThreads) StreamingRowKernel(const Args args, const Op op) {
  __shared__ BlockReduceStorage<kThreads> storage;
  CtaTeam<kThreads> team{storage};
  for (int64_t row = blockIdx.x; row < args.rows; row += gridDim.x) {
    StreamingRow<Args, kVec, CtaTeam<kThreads>> r(team, args, row, true);
    op(r);
  }
}

template <class Op, class Args, int kTx, int kTy, int kCache>
__global__ void __launch_bounds__(kTx* kTy) StridedKernel(const Args args, const Op op) {
  __shared__ StridedReduceStorage<kTx, kTy> storage;
  int parity = 0;
  const int64_t tiles = (args.inner + kTx - 1) / kTx;
  for (int64_t t = blockIdx.x; t < args.outer * tiles; t += gridDim.x) {
    const int64_t o = t / tiles;
    const int64_t i = (t % tiles) * kTx + threadIdx.x;
    StridedRow<Args, kTx, kTy, kCache> r(storage, parity, args, o, i);
    op(r);
  }
}

// Runs the op body on each of the tile's lanes, in rounds where the lanes' all-reduces go
// through shared memory (StridedLane): a round that left partials is followed by a barrier and
// the next, until one stores. The rounds' count is the op body's all-reduces plus one, known
// to the compiler once it has inlined the body (Collected() a constant in each round).
template <int kRound = 0, class Op, class Tile, int... J>
ROWNORM_DEVICE void RunLanes(const Op& op, Tile& tile, std::integer_sequence<int, J...> lanes) {
  bool collected = false;
  (
      [&] {
        StridedLane<Tile, J, kRound> lane(tile);
        op(lane);
        collected = lane.Collected();
      }(),
      ...);
  if constexpr (kRound < Tile::Storage::kCalls) {
    if (collected) {
      __syncthreads();  // every lane's partials are written
      RunLanes<kRound + 1>(op, tile, lanes);
    }
  } else {
    if (collected) __trap();  // an op body of more all-reduces than the storage keeps
  }
}

// Tile t of `chunks`: the op body on all the tile's lanes (with column sums, Tile::kColumnSums >
// 0, adding its column terms to the tile's sums), then before_store() (the staged kernel refills
// the tile's stage there: every staged pack has been read), the outputs written, and the tile's
// column sums written as partial t.
template <class Op, class Tile, class BeforeStore>
ROWNORM_DEVICE void RunStridedTile(const Op& op, Tile& tile, typename Tile::Acc* partial, int64_t t,
                                   int64_t chunks, BeforeStore before_store) {
  constexpr int kSums = Tile::kColumnSums;
  const auto lanes = std::make_integer_sequence<int, Tile::kThreadLanes>{};
  if constexpr (kSums == 0) {
    RunLanes(op, tile, lanes);
    before_store();
    tile.Flush();
  } else {
    __shared__ typename Tile::SumExchange exchange;
    StridedColumnSums<kSums> sums;
    RunLanes([&](auto& lane) { op(lane, &sums); }, tile, lanes);
    before_store();
    tile.Flush();
    tile.WriteSums(partial, t, chunks, exchange);
  }
}

// kFull: columns of exactly the tile's d-rows (StridedTile's kFull), run without bounds.
// kSums > 0: the backward with fused parameter gradients (plan.h's StridedSumPlan): the op body
// adds its kSums column terms to the tile's sums, which the tile writes to `partial` as tile
// t's partials (nullptr and unused with kSums = 0). Held to the registers of two CTAs per SM:
// unbounded, the sums took the kernels from 128 registers (two CTAs) to 150-172 (one); held,
// they spill (up to 372 bytes in rms_norm, 1 KB in 16-bit layer_norm) and still took 0.78-0.96x
// the time in the channel-dim training step (H200; benchmarks/results/h200/NOTES.md §48). On
// half a pack (plan.h's StridedSumLanes) a tile keeps the parameters at its d-rows for all
// lanes and rounds, where the registers allow it (116-122, no spills; on a whole pack
// rms_norm's spilled up to 952 bytes): the bf16 LayerNorm step over 64 / 3 channels 0.984x /
// 0.951x the time, the same bits (§51); the kernel reads them once per CTA (ReadParams, §53).
template <class Op, class Args, int kTx, int kTy, int kCache, int kLanes, int kWarpRows,
          int kSums = 0, bool kFull = false>
__global__ void __launch_bounds__(kTx* kTy, kSums > 0 ? 2 : 1)
    StridedPackKernel(const Args args, const Op op, AccType<typename Args::InElem>* partial) {
  constexpr bool kKeepParams = kSums > 0 && kLanes < Args::kPackWidth;
  using Tile = StridedTile<Args, kTx, kTy, kCache, kLanes, kWarpRows, kKeepParams, kSums, kFull>;
  __shared__ typename Tile::Storage storage;
  typename Tile::Params params{};
  Tile::ReadParams(op, args.d, params);
  constexpr int64_t kTileCols = int64_t{Tile::kTilePacks} * kLanes;
  const int64_t tiles = (args.inner + kTileCols - 1) / kTileCols;
  const int64_t chunks = args.outer * tiles;
  for (int64_t t = blockIdx.x; t < chunks; t += gridDim.x) {
    const int64_t o = t / tiles;
    const int64_t i = (t % tiles) * kTileCols + int64_t{Tile::PackInTile()} * kLanes;
    Tile tile(storage, args, o, i, params);
    RunStridedTile(op, tile, partial, t, chunks, [] {});
  }
}

// The tile of StridedPrefetchKernel: it keeps the parameters, and stages d-row 0 for 16-bit ops
// that read First() (op_traits.h's kReadsFirst) in the CTA layout. Elsewhere it lost: H200,
// layer_norm's forward over 64 channels in float32 1.017x the time, bf16 over 16 / 32 (the warp
// layouts) 1.05x, the bf16 step over 3 1.12x (benchmarks/results/h200/NOTES.md §53).
template <class Op, class Args, int kTx, int kTy, int kCache, int kLanes, int kWarpRows, int kSums,
          bool kFull>
using StridedPrefetchTile =
    StridedTile<Args, kTx, kTy, kCache, kLanes, kWarpRows, /*kKeepParams=*/true, kSums, kFull,
                OpTraits<Op>::kReadsFirst && kWarpRows == 0 && sizeof(typename Args::InElem) == 2>;

// The packed strided path with later tiles in flight (the forwards: plan.h's PlanStridedOp;
// with kSums > 0 the fused backward on half a pack, StridedSumStages): a persistent CTA runs
// tiles blockIdx.x, + gridDim.x, ... and keeps the packs of its next kStages tiles in flight
// into shared memory (cp.async) while it reduces and stores the current one (kFull and kSums as
// in StridedPackKernel: the same partial per tile), with their saved statistics brought into
// L1 (OpTraits::kSavedStats). Loaded straight into registers, a CTA had nothing in flight from
// its barrier to its last store, and two CTAs per SM took 1.34x a copy's time on the H200
// (channel RMSNorm, fp32); prefetched, 1.08x (0.81x the time; benchmarks/results/h200/NOTES.md
// §4); the bf16 layer_norm backward over 64 channels 0.955x the step (§52). Where the plan keeps
// the inputs in L2 (args.keep_inputs_in_l2: StridedPlan::l2_keep) they are copied under
// evict_last and each tile's lines set back once it is stored, as the row tiers' (pack.cuh).
template <class Op, class Args, int kTx, int kTy, int kCache, int kLanes, int kWarpRows,
          int kStages, bool kFull = false, int kSums = 0>
__global__ void __launch_bounds__(kTx* kTy, 2)
    StridedPrefetchKernel(const Args args, const Op op, AccType<typename Args::InElem>* partial) {
  using Tile = StridedPrefetchTile<Op, Args, kTx, kTy, kCache, kLanes, kWarpRows, kSums, kFull>;
  __shared__ typename Tile::Storage storage;
  typename Tile::Params params{};
  Tile::ReadParams(op, args.d, params);
  const uint64_t policy = L2EvictionPolicy(args.keep_inputs_in_l2);
  auto* stages = reinterpret_cast<typename Tile::Stage*>(DynamicSharedMemory());
  constexpr int64_t kTileCols = int64_t{Tile::kTilePacks} * kLanes;
  const int64_t tiles = (args.inner + kTileCols - 1) / kTileCols;
  const int64_t chunks = args.outer * tiles;
  const auto column = [&](int64_t t) {
    return (t % tiles) * kTileCols + int64_t{Tile::PackInTile()} * kLanes;
  };
  PipelineUnits<kStages>(
      blockIdx.x, gridDim.x, chunks,
      [&](int64_t t, int s) {
        Tile::Prefetch(args, t / tiles, column(t), stages[s], policy);
        if constexpr (OpTraits<Op>::kSavedStats > 0) {
          Tile::template PrefetchSavedStats<OpTraits<Op>::kSavedStats>(args, op.stats, t / tiles,
                                                                       column(t));
        }
      },
      [&](int64_t t, int s, auto refill) {
        Tile tile(storage, args, t / tiles, column(t), stages[s], params);
        // the lanes' reductions used every staged pack (each thread its own)
        RunStridedTile(op, tile, partial, t, chunks, refill);
        if (args.keep_inputs_in_l2) Tile::ReleaseInputs(args, t / tiles, column(t));
      });
}

#endif  // __CUDACC__

}  // namespace rownorm
