// The row interface op bodies are written on (the op concept is in op_traits.h), shared by every
// row view: the GPU row views (row_views.cuh, strided_views.cuh) and the CPU row
// (kernels/cpu/row_cpu.h).
//
// RowOps<Derived> derives the interface from a few primitives of the view (CRTP, so everything
// inlines into the tier kernels as if written out):
//   ForEachValue(g)     g(const Acc* x, int64_t col) for each element of the row this thread owns;
//   AllReduce(v, op)    v combined over the threads that share the row, in every one of them;
//   StoreTo<j>(f)       output j at col = f(x, col) for each element this thread owns;
//   First()             element 0 of the row of input 0, in every thread (a shift that makes
//                       sums exact on constant rows: layer_norm.cuh).
// Rows that cross a cluster (kOneRound) also have the all-reduce's two levels apart:
//   SliceSize()               the elements of this CTA's slice of the row;
//   SliceAllReduce(v, op)     v combined over the threads of this CTA's slice of the row;
//   MergeSlices(v, combine)   combine(parts) over every slice's v (reduce.cuh's SliceParts),
//                             the same in every thread; v must be a SliceAllReduce's result
//                             computed after the previous MergeSlices (reduce.cuh: Merge).
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include "kernels/common/reduce.cuh"

namespace rownorm {

// Selects output j of a multi-output op: row.Store(Output<1>{}, f).
template <int J>
struct Output {
  static constexpr int kIndex = J;
};

template <typename F, typename Acc>
using ReduceValue = decltype(std::declval<F>()(std::declval<const Acc*>(), int64_t{}));

template <class Derived, typename AccT>
class RowOps {
 public:
  using Acc = AccT;
  // Row views that differ override these (see op_traits.h and StoreWith below).
  static constexpr bool kOneRound = false;      // an all-reduce crosses a cluster
  static constexpr bool kPackedParams = false;  // StoreWith reads parameters a pack at a time
  static constexpr bool kSharedParams = false;  // ReduceWith reads them from shared memory
  static constexpr int kSlices = 1;             // CTAs that share a row (cluster rows: more)
  static constexpr int kSliceThreads = 0;       // threads of each slice (0: no CTA team)

  template <typename Op, typename F>
  ROWNORM_HOST_DEVICE ReduceValue<F, Acc> Reduce(Op op, F f) {
    return Self().AllReduce(Self().ReduceLocal(op, f), op);  // a view may refine ReduceLocal
  }

  // f reduced over this CTA's slice of a cluster row (kOneRound views only).
  template <typename Op, typename F>
  ROWNORM_HOST_DEVICE ReduceValue<F, Acc> ReduceSlice(Op op, F f) {
    return Self().SliceAllReduce(Self().ReduceLocal(op, f), op);
  }

  template <typename Op, typename F>
  ROWNORM_HOST_DEVICE ReduceValue<F, Acc> ReduceLocal(Op op, F f) const {
    using V = ReduceValue<F, Acc>;
    V acc = Op::template Identity<V>();
    Self().ForEachValue([&](const Acc* x, int64_t col) { acc = op(acc, f(x, col)); });
    return acc;
  }

  // The largest element of input 0 this thread owns (−inf where it owns none): ReduceLocal of
  // MaxOp, which a view may do on the stored values (CachedRow: 16-bit pairs).
  ROWNORM_HOST_DEVICE Acc MaxLocal() const {
    return Self().ReduceLocal(MaxOp{}, [](const Acc* x, int64_t) { return x[0]; });
  }

  template <typename F>
  ROWNORM_HOST_DEVICE void Store(F f) {
    Self().template StoreTo<0>(f);
  }
  template <int J, typename F>
  ROWNORM_HOST_DEVICE void Store(Output<J>, F f) {
    Self().template StoreTo<J>(f);
  }

 protected:
  ROWNORM_HOST_DEVICE Derived& Self() { return static_cast<Derived&>(*this); }
  ROWNORM_HOST_DEVICE const Derived& Self() const { return static_cast<const Derived&>(*this); }
};

// Whether an op body should make statistics that take two all-reduces (softmax's max and
// Σ exp) from per-thread partials merged in one all-reduce (row.ReduceLocal / row.AllReduce):
// where an all-reduce crosses a cluster (a round trip between its CTAs: the cluster tier's
// rows). Elsewhere a second barrier costs about what the merge does (benchmarks/results/h100/
// NOTES.md §6; measured when the cluster's all-reduce was a cluster barrier, before §27).
template <class Row>
struct PrefersOneRound : std::bool_constant<Row::kOneRound> {};

// Parameters as stored (the default of ParamList).
struct NoParamOffset {
  template <typename Acc>
  ROWNORM_HOST_DEVICE Acc Apply(Acc v) const {
    return v;
  }
};

// A constant added to every parameter in the accumulator type: Gemma's (1 + w) without a
// rounded 1 + w in memory.
template <typename Acc>
struct ParamOffset {
  Acc c;
  ROWNORM_HOST_DEVICE Acc Apply(Acc v) const { return v + c; }
};

// K optional per-column parameters of one type (weight, bias), the value each stands for when
// absent (1 for a weight, 0 for a bias: exact in W, as row_views.cuh's LoadParamPack needs,
// which presets a pack to its stored bits), and an offset applied to all of them. Op bodies read
// them only through ReduceWith and StoreWith (below), so that a row view decides how: per
// element, a pack at a time, or from the copy the fused parameter-gradient kernels keep in
// shared memory (ParamCache in row_views.cuh).
template <typename W, int K, class Offset = NoParamOffset>
struct ParamList {
  using Elem = W;
  static constexpr int kCount = K;
  const W* p[K];
  float absent[K];
  Offset offset{};

  // Parameter j's value at col in Acc.
  template <typename Acc>
  ROWNORM_HOST_DEVICE Acc At(int j, int64_t col) const {
    return offset.Apply(Param(p[j], col, static_cast<Acc>(absent[j])));
  }
  // A stored value of parameter j (loaded by the caller) in Acc, as At gives it.
  template <typename Acc>
  ROWNORM_HOST_DEVICE Acc Of(Acc stored) const {
    return offset.Apply(stored);
  }
  // Parameter j's value where it is absent.
  template <typename Acc>
  ROWNORM_HOST_DEVICE Acc Absent(int j) const {
    return offset.Apply(static_cast<Acc>(absent[j]));
  }
};

// f(x, col, p) as a function of (x, col): p[j] = parameter j at col, read one element at a time.
template <typename Acc, typename F, class PS>
ROWNORM_HOST_DEVICE auto WithParams(F f, const PS& ps) {
  return [f, ps](const Acc* x, int64_t col) {
    Acc p[PS::kCount];
#pragma unroll
    for (int j = 0; j < PS::kCount; ++j) p[j] = ps.template At<Acc>(j, col);
    return f(x, col, p);
  };
}

// f(x, col, p) reduced over the row (as row.Reduce), p[j] = parameter j at col in the
// accumulator type. The rows of the fused parameter-gradient kernels (kSharedParams) read a
// pack's parameters from the copy their CTA keeps in shared memory; other rows read them one
// element at a time (vector loads there held more registers: ten kernels of the two-pass
// backward spilled).
template <class Row, typename Op, class F, class PS>
ROWNORM_HOST_DEVICE auto ReduceWith(Row& row, Op op, F f, const PS& ps) {
  if constexpr (Row::kSharedParams) {
    return row.ReduceWith(op, f, ps);
  } else {
    return row.Reduce(op, WithParams<typename Row::Acc>(f, ps));
  }
}

// Output 0 at col = f(x, col, p) for every element of the row, p as in ReduceWith (LayerNorm's
// forward: a weight and a bias, 16 scalar loads per 16-byte pack of bf16 x where read per
// element).
template <class Row, class F, class PS>
ROWNORM_HOST_DEVICE void StoreWith(Row& row, F f, const PS& ps) {
  if constexpr (Row::kPackedParams) {
    row.StoreWith(f, ps);
  } else {
    row.Store(WithParams<typename Row::Acc>(f, ps));
  }
}

// StoreWith(row, f, ps) and, where the row accumulates column sums (`sums` not a NoColumnSums*:
// the fused parameter-gradient kernels), row.AddColumns(c, sums), in one pass over the row
// where the view has one (CachedRow::StoreWithColumns).
template <class Row, class F, class PS, class C, class Sums>
ROWNORM_HOST_DEVICE void StoreWithColumns(Row& row, F f, const PS& ps, C c, Sums* sums) {
  if constexpr (std::is_same_v<Sums, NoColumnSums>) {
    StoreWith(row, f, ps);
  } else {
    row.StoreWithColumns(f, ps, c, sums);
  }
}

}  // namespace rownorm
