// Softmax and log-softmax along one dimension: the op bodies, run by every tier of row.cuh
// (and by the CPU rows of kernels/cpu/row_cpu.h, with Acc = double). The op concept is in
// kernels/common/op_traits.h.
//
//   forward   m = max(x), s = Σ exp(x − m): two plain all-reduces where the tier caches the
//             row; one online all-reduce of (max, Σ exp) pairs (merged by rescaling the
//             smaller maximum's sum) where it streams it (a pair per element); where an
//             all-reduce crosses the cluster (PrefersOneRound), a pair per thread, or on
//             16-CTA rows each CTA's (max, Σ exp) of its slice, the slices' pairs merged in one
//             exchange (SliceSoftmaxStats);
//             then softmax y = exp(x − m) / s;  log_softmax y = x − m − log(s)
//   backward  (from the forward's output y)  softmax dx = y⊙(dy − Σ dy⊙y)
//                                            log_softmax dx = dy − exp(y)·Σ dy
//
// exp(v) is computed as exp2(v·log2 e) (exp2f: at most 2 ulp, on the special-function unit).
// Special values follow torch: a row holding +inf gives NaN everywhere (torch's exp(inf − inf));
// an all −inf row gives NaN; −inf elements of other rows give 0 (log_softmax: −inf).
#pragma once

#include "kernels/common/row_ops.h"

namespace rownorm {

// Merges (max, Σ exp(x − max)) pairs: the sum of the smaller maximum is rescaled by
// exp(−|Δmax|), one exp a merge (1 where the maxima are equal, which covers two −inf: the
// identity's). Commutative bit for bit (|Δ| and the sum of the two terms do not depend on the
// order), so every lane of a butterfly all-reduce ends with the same value. A +inf maximum
// takes the other sum times 0; a NaN sum stays NaN. kExp2: the exp as exp2(−|Δmax|·log2 e)
// (the all-reduces' merges of per-thread pairs, where expf's longer code took 1.10-1.56x the
// time: held cluster rows of bf16 40000-65536, fp32 262144; float32 outputs' mean error 1.3x
// the expf merge's); else expf (the streamed rows' merge of every element, where it took 0.92x
// the exp2's time at fp32 524288). The merge before, two expf a merge, took up to 1.12x the
// time of this one on cluster rows and 1.2-1.3x on streamed ones (H100:
// benchmarks/results/h100/NOTES.md §37).
template <bool kExp2>
struct OnlineSoftmaxOp {
  template <typename V>
  ROWNORM_HOST_DEVICE V operator()(const V& a, const V& b) const {
    using Acc = std::remove_cv_t<std::remove_reference_t<decltype(a[0])>>;
    constexpr Acc kLog2e = Acc(1.4426950408889634);
    const Acc gap = a[0] == b[0] ? Acc(0) : -Abs(a[0] - b[0]);
    const Acc scale = kExp2 ? Exp2(gap * kLog2e) : Exp(gap);
    V r;
    r[0] = Max(a[0], b[0]);
    r[1] = a[0] >= b[0] ? a[1] + b[1] * scale : b[1] + a[1] * scale;
    return r;
  }
  template <typename V>
  ROWNORM_HOST_DEVICE static V Identity() {
    V r;
    r[0] = -INFINITY;
    r[1] = 0;
    return r;
  }
};

// (m, s) of a cluster row: each CTA's slice in the CTA alone, its max m_c (block barrier), then
// s_c = Σ exp(x − m_c) (block barrier); the slices' (m_c, s_c) merged in one exchange, each lane
// taking one slice's pair: m = max m_c and s = Σ s_c·exp(m_c − m) by butterfly reductions over
// the slices (reduce.cuh's SliceParts), a slice of only −inf adding 0.
// The slice's max is taken on the stored 16-bit pairs (row.MaxLocal: §37). The forward takes
// it on 16-CTA rows of 256 threads only (see there).
template <class Row, typename Acc = typename Row::Acc>
ROWNORM_DEVICE Array<Acc, 2> SliceSoftmaxStats(Row& row) {
  constexpr Acc kLog2e = Acc(1.4426950408889634);
  const Acc m_c = row.SliceAllReduce(row.MaxLocal(), MaxOp{});
  const Acc shift = m_c == -INFINITY ? Acc(0) : m_c;
  const Acc s_c = row.ReduceSlice(
      SumOp{}, [shift](const Acc* x, int64_t) { return Exp2((x[0] - shift) * kLog2e); });
  return row.MergeSlices(Array<Acc, 2>{{m_c, s_c}}, [](const auto& parts) {
    const Array<Acc, 2> p = parts.Mine();
    const Acc m = parts.Reduce(p[0], MaxOp{});
    const Acc t = p[0] == -INFINITY ? Acc(0) : p[1] * Exp2((p[0] - m) * kLog2e);
    return Array<Acc, 2>{{m, parts.Reduce(t, SumOp{})}};
  });
}

template <typename T, typename Acc>
struct SoftmaxFwdOp {
  using Elem = T;
  static constexpr int kIn = 1;  // x
  // The wide CTA two per SM (op_traits.h)
  static constexpr int CtaCtasPerSm(int threads, int packs) {
    return threads == 512 && packs == 8 ? 2 : 0;
  }
  // Cluster rows held to 64 registers, four CTAs per SM as l2_normalize's (op_traits.h; ptxas
  // alone gives 72-76, three per SM). H100, forward, time held ÷ alone: bf16 65536 / 131072
  // 0.959 / 0.887 (4 / 8 CTAs), 40000 0.868, log_softmax 131072 0.912, fp32 65536 0.972; 16-CTA
  // rows from 72 to 82% of copy (bf16 262144). Not fp32 rows of 4 CTAs (16385-32768): at 99% of
  // copy alone, 1.047x held (30 bytes spilled). benchmarks/results/h100/NOTES.md §36.
  static constexpr int ClusterCtasPerSm(int cluster, int threads, int) {
    return threads != 256 || (sizeof(T) == 4 && cluster <= 4) ? 0 : 4;
  }
  bool log;

  template <class Row>
  ROWNORM_HOST_DEVICE void operator()(Row& row) const {
    constexpr Acc kLog2e = Acc(1.4426950408889634);
    Acc m;
    Acc s;
    if constexpr (PrefersOneRound<Row>::value && Row::kSlices >= 16 && Row::kSliceThreads <= 256) {
      // 16 CTAs of 256: the slices' pairs (SliceSoftmaxStats). The per-thread pairs' cluster
      // merge folds 15 pairs one after another, an exp each: bf16 / fp16 262144 took 0.963 /
      // 0.964x the time this way (91 → 95% of copy). With fewer CTAs the extra block barrier
      // cost more (4-8 CTAs, 65535-131072: 1.008-1.015x), and the 16-CTA rows of 512 threads
      // (fp32 262144) held 73 registers, one CTA per SM (1.41x). benchmarks/results/h100/
      // NOTES.md §41.
      const Array<Acc, 2> ms = SliceSoftmaxStats(row);
      m = ms[0];
      s = m == INFINITY ? Acc(NAN) : ms[1];
    } else if constexpr (PrefersOneRound<Row>::value) {
      // The row is cached and an all-reduce crosses the cluster: each thread makes its
      // own (max, Σ exp(x − max)) in two passes over its values, then one all-reduce merges
      // the pairs. A thread whose values are all −inf (or that holds none) contributes
      // (−inf, 0). The max on the stored 16-bit pairs (row.MaxLocal): H100 bf16 262144 90 →
      // 93% of copy, 196608 0.97x the time (benchmarks/results/h100/NOTES.md §37).
      const Acc m_t = row.MaxLocal();
      const Acc shift = m_t == -INFINITY ? Acc(0) : m_t;
      const Acc s_t = row.ReduceLocal(
          SumOp{}, [shift](const Acc* x, int64_t) { return Exp2((x[0] - shift) * kLog2e); });
      const Array<Acc, 2> v{{m_t, s_t}};
      const Array<Acc, 2> ms = row.AllReduce(v, OnlineSoftmaxOp<true>{});
      m = ms[0];
      s = m == INFINITY ? Acc(NAN) : ms[1];
    } else if constexpr (Row::kCached) {
      // The row is in registers and its all-reduces stay in the CTA: two plain all-reduces
      // (max, then Σ exp), one exp per element.
      m = row.Reduce(MaxOp{}, [](const Acc* x, int64_t) { return x[0]; });
      s = row.Reduce(SumOp{}, [m](const Acc* x, int64_t) { return Exp2((x[0] - m) * kLog2e); });
    } else {
      // Streamed rows: one pass for both statistics.
      const auto one = [](const Acc* x, int64_t) { return Array<Acc, 2>{{x[0], Acc(1)}}; };
      const Array<Acc, 2> ms = row.Reduce(OnlineSoftmaxOp<false>{}, one);
      m = ms[0];
      // exp(inf − inf) is NaN in torch's sum; the merge skips that term, so put it back.
      s = m == INFINITY ? Acc(NAN) : ms[1];
    }
    if (log) {
      const Acc log_s = Log(s);
      row.Store([m, log_s](const Acc* x, int64_t) { return (x[0] - m) - log_s; });
    } else {
      const Acc inv = Acc(1) / s;
      row.Store([m, inv](const Acc* x, int64_t) { return Exp2((x[0] - m) * kLog2e) * inv; });
    }
  }
};

template <typename T, typename Acc>
struct SoftmaxBwdOp {
  using Elem = T;
  static constexpr int kIn = 2;  // y, dy
  bool log;

  template <class Row>
  ROWNORM_HOST_DEVICE void operator()(Row& row) const {
    if (log) {
      const Acc s = row.Reduce(SumOp{}, [](const Acc* v, int64_t) { return v[1]; });
      row.Store([s](const Acc* v, int64_t) { return v[1] - Exp(v[0]) * s; });
    } else {
      const Acc s = row.Reduce(SumOp{}, [](const Acc* v, int64_t) { return v[0] * v[1]; });
      row.Store([s](const Acc* v, int64_t) { return v[0] * (v[1] - s); });
    }
  }
};

}  // namespace rownorm
