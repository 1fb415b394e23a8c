// THE OP CONCEPT: what an op type provides, in one place, with the defaults of what it may omit.
//
// An op is a functor holding its scalars and parameter pointers:
//
//   template <typename T, typename Acc, ...>
//   struct MyOp {
//     using Elem = T;                        // required: element type of the inputs
//     static constexpr int kIn = 2;          // required: row-shaped inputs (x, dy, ...)
//     using OutElem = T;                     // optional, default Elem: element type of outputs
//     static constexpr int kOut = 1;         // optional, default 1: row-shaped outputs
//     static constexpr bool kWideCta;        // optional, default true (see below)
//     static constexpr int kColumnSums;      // optional, default 0 (see below)
//     static constexpr int CtaCtasPerSm(int threads, int packs);  // optional, default 0
//                                            // (see below)
//     static constexpr int kClusterPacks;    // optional, default 8 (see below)
//     static constexpr int kWideClusterPacks;  // optional, default kClusterPacks (see below)
//     static constexpr int ClusterCtasPerSm(int cluster, int threads, int packs);  // optional,
//                                            // default 0 (see below)
//     using Narrowings = Narrowing<...>;     // optional, default NoNarrowing (see below)
//     static constexpr bool kKeepsInputInL2;  // optional, default false (see below)
//     static constexpr int kSavedStats;      // optional, default 0 (see below)
//     static constexpr bool kReadsFirst;     // optional, default false (see below)
//     template <class Row>
//     ROWNORM_HOST_DEVICE void operator()(Row& row) const;   // the maths, on any row view
//   };
//
// The body runs unchanged on every GPU tier (kernels/common/row.cuh) and on the CPU
// (kernels/cpu/row_cpu.h, Acc = double), and is written only in terms of (row_ops.h)
//   V    row.Reduce(op, f)        f(const Acc* x, int64_t col) -> V reduced over the row and
//                                 returned to every thread that shares the row;
//   void row.Store(f)             output 0 at col = f(x, col), for every element of the row;
//   void row.Store(Output<j>{}, f)  the same into output j (each output stored once per row);
//   V    ReduceWith(row, op, f, ps)  as row.Reduce with f(x, col, p), p[j] = parameter j of
//                                 the ParamList `ps` at col (weights: a pack at a time);
//   void StoreWith(row, f, ps)    output 0 = f(x, col, p), p as in ReduceWith;
//   row.Size(), row.Index()       the row length and the row's number;
//   row.Leader()                  true in exactly one thread of the row (per-row side outputs
//                                 such as saved statistics, written through the op's pointers);
//   row.Valid()                   false in the threads of a row past the end (a group's or a
//                                 strided tile's spare lanes): a per-row side input (saved
//                                 statistics) must not be read at Index() there;
//   Row::kCached                  whether another Reduce is free (row in registers);
//   PrefersOneRound<Row>          whether an all-reduce is expensive (it crosses a cluster), so
//                                 that statistics needing two are better made from
//                                   row.ReduceLocal(op, f)  (this thread's elements only;
//                                                            row.MaxLocal() its max of x[0]) and
//                                   row.AllReduce(v, op)    (Reduce = AllReduce ∘ ReduceLocal),
//                                 or per CTA (row_ops.h: row.ReduceSlice, row.SliceSize,
//                                 row.MergeSlices; layer_norm.cuh's SliceMoments).
// x[i] is input i at column col, in the accumulator type; the value returned by a Store
// function is rounded to OutElem.
//
// kWideCta = false: rows of the wide CTA's lengths (more than 512 threads x 4 packs, at most
// 512 x 8) run on 2-CTA clusters of 256 x 8 packs instead (the backward of layer_norm and
// add_rms_norm, whose fused sums fit those: kernels/layer_norm.cuh, rms_norm.cuh). Every op
// runs the wide cluster (16 x 512 x 8 packs): the longest rows stream only past it.
//
// kClusterPacks = 4: the cluster tier holds the rows that 4 to 16 CTAs of 8 packs a thread would
// with 4 packs a thread on twice the threads (8 and 16 CTAs of 256, 16 of 512; plan.h,
// kClusterHalfVecs), the others as other ops do. For the 16-bit backward of layer_norm and
// rms_norm, whose fused column sums (in shared memory) then fit two CTAs per SM where 8 packs a
// thread fit one (layer_norm's two sums; on 16 CTAs of 512, one CTA of 16 warps where 8 packs
// had one of 8), or four where 8 packs fit two (rms_norm's one): benchmarks/results/h100/NOTES.md
// §34, §37. And for add_rms_norm's 16-bit forward, whose two inputs at 8 packs took 103-128
// registers (two CTAs per SM): kernels/rms_norm.cuh.
//
// kWideClusterPacks = 8 with kClusterPacks = 4: the 4-pack rows end at 16 CTAs of 256; longer
// rows run 16 CTAs of 256 x 8 packs and the wide cluster as other ops do (add_rms_norm's
// forward, whose kept-parameter rows there beat 16 CTAs of 512 x 4: kernels/rms_norm.cuh).
//
// kKeepsInputInL2 = true: the group and CTA tiers load input 0 with L2's evict_last priority
// where the device takes it (plan.h's KeepsRowInputInL2, KeepsL2OnTier) and release its lines
// after each row (row_views.cuh's CachedRow::LoadWithPolicy, ReleaseInput0). For the ops whose
// short rows are bound by DRAM: H200, bf16, 2^27 elements back to back, time ÷ main's:
// l2_normalize 0.975-0.992, rms_norm 0.982-0.998 (fp32 0.979-0.983), add_rms_norm 0.988,
// rms_norm's dx 0.980. Not layer_norm's and softmax's forwards, bound by their instructions:
// 1.028-1.071, and with the hint off 1.002-1.032, from the kernels' code alone
// (benchmarks/results/h200/NOTES.md §38). Input 0 only: the backwards' every input kept (x and
// dy, and add_rms_norm's third; in their fused-sums kernels too) took 1.01-1.07x the time of
// input 0 in the row kernels alone (H200, bf16 512-8192 fwd+bwd; NOTES.md §39).
//
// CtaCtasPerSm(threads, packs) = c > 0 (ops of one input): the CTA tier's rows of `threads` x
// `packs` run held to the registers of c CTAs per SM (CtaRowKernelBounded, tier_kernels.cuh),
// where the device holds more of those than of the plain kernel (dispatch.cuh's PlanRowOp): the
// other CTAs' loads are in flight while one waits at its barriers. The wide CTA (512 x 8) held
// to two: on the H100 that took softmax / log_softmax bf16 32768 and 24576 and fp32 16384
// 0.88-0.95x the time (from 85-92% of copy to 97-98%; it replaced their rows prefetched into
// shared memory), and 16-bit layer_norm 0.93-0.96x; rms_norm, l2 bf16 within 1%, and float32
// layer_norm 1.05x at 16384 (its kernel spills at 64 registers): benchmarks/results/h100/
// NOTES.md §35. The 512 x 4 CTA held to three: layer_norm's and rms_norm's forwards
// (kernels/layer_norm.cuh, rms_norm.cuh; 16-bit layer_norm at 8704-12288 from 73-89% of copy to
// 89-96%, NOTES.md §48). A held kernel that spills past dispatch.cuh's kMaxHeldLocalBytes is
// not run. The cluster tier keeps rows in flight its own way (dispatch.cuh's ClusterKind),
// for every op.
//
// ClusterCtasPerSm(cluster, threads, packs) = c > 0: the cluster tier's register rows of
// `cluster` CTAs of `threads` x `packs` (ClusterRowKernel) run held to the registers of c CTAs
// per SM (ClusterRowKernelBounded, tier_kernels.cuh), which the launcher weighs against its
// other cluster kernels by how many rows the device holds (dispatch.cuh's PlanRowOp). layer_norm's
// backward: 2 on 256 threads (ptxas alone gave 131-135 registers, one CTA per SM; its 8-CTA
// rows, bf16 131072, took 1.30x the time: NOTES.md §20); softmax / log_softmax: 4 on 256
// (kernels/softmax.cuh); the forwards of rms_norm, add_rms_norm and layer_norm
// (kernels/rms_norm.cuh, layer_norm.cuh).
//
// Narrowings (args.h): operands stored in a type narrower than Elem / OutElem, which are then
// their register types (add_rms_norm with a float32 residual stream: x and out in 16 bits). The
// row tiers load and store those as stored and never stage them in shared memory.
//
// kSavedStats = k > 0: the body reads k saved values of its row at stats[k·Index() + j] (the
// op's `stats` member: layer_norm's backward, the forward's (μ, r)). The staged strided
// backward brings a tile's into L1 as it issues the tile's packs (StridedPrefetchKernel): their
// loads, the first of the body, were what its warps waited on (benchmarks/results/h200/
// NOTES.md §52).
//
// kReadsFirst = true: the body reads row.First() (layer_norm's forward: the shift of its mean).
// The staged 16-bit strided forwards of the CTA layout copy d-row 0 of a tile's columns with
// the tile's packs (StridedPrefetchTile), where its loads, three a column and tile (the rounds'
// barriers make the compiler read it again), took 10% of the forward's stall samples: H200,
// bf16 LayerNorm's forward over 64 channels 0.87x the time (benchmarks/results/h200/NOTES.md
// §53).
//
// ColumnParams() (optional; required with kColumnSums): the ParamList of per-column parameters
// its body reads, only through ReduceWith and StoreWith with that list. Kernels that run many
// rows per CTA keep them per CTA (the fused sums below; the persistent cluster kernel of the
// forwards, ClusterParamRowKernel) instead of reading them again in every row.
//
// kColumnSums = K > 0: the op also has `operator()(Row& row, Sums* sums)` that adds K per-column
// sums over its rows with row.AddColumns(f, sums) (f(x, col) -> Array<Acc, K>; fused parameter
// gradients, where the tier supports it; `sums` is a NoColumnSums* elsewhere), or with
// StoreWithColumns(row, f, ps, c, sums) (row_ops.h: StoreWith and AddColumns in one pass over
// the row where the row view has one; layer_norm's backward), and
// `ColumnParams()`, the ParamList its body reads with ReduceWith and StoreWith: the fused
// kernels read those parameters once per CTA into shared memory (ParamCache, row_views.cuh),
// and their rows hand them to ReduceWith and StoreWith from there.
#pragma once

#include <type_traits>
#include <utility>

#include "kernels/common/args.h"

namespace rownorm {

namespace op_traits_detail {
template <class Op, class = void>
struct OutElemOf {
  using type = typename Op::Elem;
};
template <class Op>
struct OutElemOf<Op, std::void_t<typename Op::OutElem>> {
  using type = typename Op::OutElem;
};
template <class Op, class = void>
struct OutCount : std::integral_constant<int, 1> {};
template <class Op>
struct OutCount<Op, std::void_t<decltype(Op::kOut)>> : std::integral_constant<int, Op::kOut> {};
template <class Op, class = void>
struct WideCta : std::true_type {};
template <class Op>
struct WideCta<Op, std::void_t<decltype(Op::kWideCta)>> : std::bool_constant<Op::kWideCta> {};
template <class Op, class = void>
struct ClusterPacks : std::integral_constant<int, 8> {};
template <class Op>
struct ClusterPacks<Op, std::void_t<decltype(Op::kClusterPacks)>>
    : std::integral_constant<int, Op::kClusterPacks> {};
template <class Op, class = void>
struct WideClusterPacks : ClusterPacks<Op> {};
template <class Op>
struct WideClusterPacks<Op, std::void_t<decltype(Op::kWideClusterPacks)>>
    : std::integral_constant<int, Op::kWideClusterPacks> {};
template <class Op, class = void>
struct HasClusterCtasPerSm : std::false_type {};
template <class Op>
using ClusterCtasPerSmOf = decltype(Op::ClusterCtasPerSm(0, 0, 0));
template <class Op>
struct HasClusterCtasPerSm<Op, std::void_t<ClusterCtasPerSmOf<Op>>> : std::true_type {};
template <class Op, class = void>
struct HasCtaCtasPerSm : std::false_type {};
template <class Op>
struct HasCtaCtasPerSm<Op, std::void_t<decltype(Op::CtaCtasPerSm(0, 0))>> : std::true_type {};
template <class Op, class = void>
struct NarrowingsOf {
  using type = NoNarrowing;
};
template <class Op>
struct NarrowingsOf<Op, std::void_t<typename Op::Narrowings>> {
  using type = typename Op::Narrowings;
};
template <class Op, class = void>
struct KeepsInputInL2 : std::false_type {};
template <class Op>
struct KeepsInputInL2<Op, std::void_t<decltype(Op::kKeepsInputInL2)>>
    : std::bool_constant<Op::kKeepsInputInL2> {};
template <class Op, class = void>
struct SavedStats : std::integral_constant<int, 0> {};
template <class Op>
struct SavedStats<Op, std::void_t<decltype(Op::kSavedStats)>>
    : std::integral_constant<int, Op::kSavedStats> {};
template <class Op, class = void>
struct HasColumnParams : std::false_type {};
template <class Op>
struct HasColumnParams<Op, std::void_t<decltype(std::declval<const Op&>().ColumnParams())>>
    : std::true_type {};
template <class Op, class = void>
struct ReadsFirst : std::false_type {};
template <class Op>
struct ReadsFirst<Op, std::void_t<decltype(Op::kReadsFirst)>>
    : std::bool_constant<Op::kReadsFirst> {};
template <class Op, class = void>
struct ColumnSumCount : std::integral_constant<int, 0> {};
template <class Op>
struct ColumnSumCount<Op, std::void_t<decltype(Op::kColumnSums)>>
    : std::integral_constant<int, Op::kColumnSums> {};
}  // namespace op_traits_detail

// The optional members of an op with their defaults.
template <class Op>
struct OpTraits {
  static constexpr int kOut = op_traits_detail::OutCount<Op>::value;
  static constexpr bool kWideCta = op_traits_detail::WideCta<Op>::value;
  static constexpr int kColumnSums = op_traits_detail::ColumnSumCount<Op>::value;
  static constexpr bool kColumnParams = op_traits_detail::HasColumnParams<Op>::value;
  static constexpr int kClusterPacks = op_traits_detail::ClusterPacks<Op>::value;
  static constexpr int kWideClusterPacks = op_traits_detail::WideClusterPacks<Op>::value;
  static constexpr bool kKeepsInputInL2 = op_traits_detail::KeepsInputInL2<Op>::value;
  static constexpr int kSavedStats = op_traits_detail::SavedStats<Op>::value;
  static constexpr bool kReadsFirst = op_traits_detail::ReadsFirst<Op>::value;
  static_assert(kWideClusterPacks == kClusterPacks || kWideClusterPacks == 8,
                "the 4-pack rows of the wide cluster follow those of 256 threads");
  static constexpr int CtaCtasPerSm(int threads, int packs) {
    if constexpr (op_traits_detail::HasCtaCtasPerSm<Op>::value) {
      return Op::CtaCtasPerSm(threads, packs);
    } else {
      return 0;
    }
  }
  static constexpr int ClusterCtasPerSm(int cluster, int threads, int packs) {
    if constexpr (op_traits_detail::HasClusterCtasPerSm<Op>::value) {
      return Op::ClusterCtasPerSm(cluster, threads, packs);
    } else {
      return 0;
    }
  }
};

// The bytes a column of Op's per-column parameters take, all of them given (0: an op without).
template <class Op>
constexpr int ParamBytesPerColumn() {
  if constexpr (OpTraits<Op>::kColumnParams) {
    using Params = decltype(std::declval<const Op&>().ColumnParams());
    return Params::kCount * static_cast<int>(sizeof(typename Params::Elem));
  } else {
    return 0;
  }
}

// The bytes a column of the per-column parameters `op` is given take (a null pointer: not
// given). The cluster tier's forwards weigh them when they choose between keeping the
// parameters per CTA and reading them in every row (plan.h's KeepsClusterParams); given none,
// they plan as an op without parameters (rms_norm without a weight as l2_normalize).
template <class Op>
int GivenParamBytes(const Op& op) {
  if constexpr (OpTraits<Op>::kColumnParams) {
    const auto params = op.ColumnParams();
    int bytes = 0;
    for (int j = 0; j < params.kCount; ++j) {
      if (params.p[j] != nullptr) bytes += static_cast<int>(sizeof(*params.p[j]));
    }
    return bytes;
  } else {
    return 0;
  }
}

template <class Op>
using OpOutElem = typename op_traits_detail::OutElemOf<Op>::type;

template <class Op>
using OpNarrowings = typename op_traits_detail::NarrowingsOf<Op>::type;

// The problem types an op runs on.
template <class Op>
using RowArgsFor =
    RowArgs<typename Op::Elem, Op::kIn, OpOutElem<Op>, OpTraits<Op>::kOut, OpNarrowings<Op>>;
template <class Op>
using StridedArgsFor =
    StridedArgs<typename Op::Elem, Op::kIn, OpOutElem<Op>, OpTraits<Op>::kOut, OpNarrowings<Op>>;

}  // namespace rownorm
