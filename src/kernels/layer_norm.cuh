// LayerNorm along one dimension: the op bodies, run by every tier of row.cuh (and by the CPU
// rows of kernels/cpu/row_cpu.h, with Acc = double). The op concept is in
// kernels/common/op_traits.h.
//
//   forward   μ = mean(x), var = mean((x − μ)²) (biased, two passes over the row: stable),
//             r = 1/sqrt(var + eps), y = (x − μ)·r·w + b; saves (μ, r) per row when asked
//             (layer_norm_with_stats: what autograd runs).
//             The mean is taken shifted by the row's first element x₀: μ = x₀ + Σ(x − x₀)/n.
//             On a constant row c every x − x₀ is 0, so μ = c exactly and x − μ = 0 as in
//             torch (y = b; NaN for eps = 0, where var is 0), where Σx/n rounds and gives
//             ŷ = ±1 whenever (c − Σx/n)² ≫ eps. Same cost as Σx/n: one sum per pass, and the
//             one extra load of x₀ is a cache hit.
//   backward  from the forward's (μ, r): ŷ = (x − μ)·r, g = w⊙dy;
//             dx = r·(g − mean(g) − ŷ·mean(ŷ⊙g))
//             dw = Σ_rows dy⊙ŷ, db = Σ_rows dy  (fused column sums where plan.h's
//             PlanFusedSums takes them, else kernels/param_grad.h from the same (μ, r))
//
// The forward runs both passes over the row where the tier caches it (registers), so the row is
// read from memory once; the streaming tier reads it once per pass. Two all-reduces per row,
// except on cluster rows: there each CTA takes both passes over its own slice (two block
// barriers), and the slices' (count, Σ(x − x₀), M2) meet in one exchange between the CTAs
// (SliceMoments), which saves the second round trip. Merging per-thread (count, mean, M2)
// triples in one all-reduce (Chan's formula at every level) measured 1.2x slower on the wide
// CTA: three passes over a thread's values and a division per merge cost more than the barrier
// they save (benchmarks/results/h100/NOTES.md §6, §33). The backward reads the saved (μ, r)
// (8 bytes a row) instead of making them again, so it reduces once per row, as rms_norm's
// does: its second all-reduce was a second barrier between the loads and the stores.
#pragma once

#include "kernels/common/row_ops.h"

namespace rownorm {

// μ = x₀ + Σ(x − x₀)/n with x₀ the row's first element: exact on constant rows (see the header).
template <class Row, typename Acc = typename Row::Acc>
ROWNORM_HOST_DEVICE Acc ShiftedMean(Row& row) {
  const Acc x0 = row.First();
  return x0 + row.Reduce(SumOp{}, [x0](const Acc* x, int64_t) { return x[0] - x0; }) /
                  static_cast<Acc>(row.Size());
}

// (μ, var) of a cluster row, var = M2 / n: each CTA's slice c of n_c elements reduced in the
// CTA alone, S_c = Σ(x − x₀), then M2_c = Σ(x − m_c)² about the slice's mean m_c = x₀ + s_c,
// s_c = S_c / n_c; the slices' (n_c, S_c, s_c, M2_c) merged in one exchange, the same in
// every CTA: μ = x₀ + ΣS_c / n and M2 = Σ (M2_c + n_c·(s_c − ΣS_c / n)²) (the parallel-variance
// formula, exact in real arithmetic and free of cancellation; the slices' offsets from the
// mean taken on the shifted means, which a large common offset does not round). A constant row
// gives S_c = 0, m_c = μ = x₀ and var = 0 exactly.
template <class Row, typename Acc = typename Row::Acc>
ROWNORM_DEVICE Array<Acc, 2> SliceMoments(Row& row) {
  const Acc x0 = row.First();
  const Acc sum_c = row.ReduceSlice(SumOp{}, [x0](const Acc* x, int64_t) { return x[0] - x0; });
  const Acc n_c = static_cast<Acc>(row.SliceSize());
  const Acc s_c = n_c > Acc(0) ? sum_c / n_c : Acc(0);  // a slice may own no element
  const Acc m_c = x0 + s_c;
  const Acc m2_c = row.ReduceSlice(SumOp{}, [m_c](const Acc* x, int64_t) {
    const Acc d = x[0] - m_c;
    return d * d;
  });
  const Acc n = static_cast<Acc>(row.Size());
  return row.MergeSlices(Array<Acc, 4>{{n_c, sum_c, s_c, m2_c}}, [x0, n](const auto& parts) {
    // Each lane takes one slice's part and two butterfly sums over the slices make the totals
    // (reduce.cuh's SliceParts): a 16-byte load and 2·log2(kSlices) shuffles a thread. A loop
    // over the parts took two loads a slice and left the 16-CTA rows 1.02-1.03x the
    // two-all-reduce time (benchmarks/results/h100/NOTES.md §41).
    const Array<Acc, 4> p = parts.Mine();
    const Acc s = parts.Reduce(p[1], SumOp{}) / n;
    const Acc d = p[2] - s;
    const Acc m2 = parts.Reduce(p[3] + p[0] * d * d, SumOp{});
    return Array<Acc, 2>{{x0 + s, m2 / n}};
  });
}

template <typename T, typename Acc, typename W>
struct LayerNormFwdOp {
  using Elem = T;
  static constexpr int kIn = 1;              // x
  static constexpr bool kReadsFirst = true;  // ShiftedMean's x₀ (op_traits.h)
  Acc eps;
  const W* weight;  // (n,) or nullptr
  const W* bias;    // (n,) or nullptr
  Acc* stats;       // (rows, 2): (μ, r) per row for the backward, or nullptr
  // The CTA held to fewer registers (op_traits.h): the wide CTA two per SM, 16-bit rows only (the
  // float32 kernel spills at 64 registers); the 512 x 4 CTA three per SM (ptxas alone: 49-64,
  // two). H100, forward, time held ÷ plain: bf16 8704 / 9216 / 10240 / 12288 / 14336 / 16384
  // 0.82 / 0.83 / 0.88 / 0.93 / 0.98 / 0.99 (to 89-96% of copy), with float32 weight and bias
  // 9216 / 12288 / 16384 0.83 / 0.89 / 0.96; fp32 6143 0.985, the aligned fp32 rows held three
  // alone (benchmarks/results/h100/NOTES.md §48). Rows whose held kernel spills past
  // dispatch.cuh's kMaxHeldLocalBytes (16-bit ones not 16-byte aligned) run the plain one.
  static constexpr int CtaCtasPerSm(int threads, int packs) {
    if (threads != 512) return 0;
    if (packs == 4) return 3;
    return packs == 8 && sizeof(T) == 2 ? 2 : 0;
  }
  // Cluster rows held to 64 registers (op_traits.h): 16-bit rows on 256 threads four CTAs per SM
  // (ptxas alone: 80 registers, three; held, 6-24 bytes spilled), float32 rows on 512 two (87,
  // one). H100, forward, time ÷ main's plan: bf16 65535 / 65536 / 131072 0.941 / 0.962 / 0.968
  // (to 76 / 87 / 86% of copy), fp32 262144 0.877 (72 to 83%; its kept parameters, 128 KB,
  // held one CTA per SM). benchmarks/results/h100/NOTES.md §42.
  static constexpr int ClusterCtasPerSm(int, int threads, int) {
    if (sizeof(T) == 2) return threads == 256 ? 4 : 0;
    return threads == 512 ? 2 : 0;
  }

  ROWNORM_HOST_DEVICE ParamList<W, 2> ColumnParams() const {
    return {{weight, bias}, {1.0f, 0.0f}};
  }

  template <class Row>
  ROWNORM_HOST_DEVICE void operator()(Row& row) const {
    Acc mu, var;
    if constexpr (PrefersOneRound<Row>::value) {
      const Array<Acc, 2> m = SliceMoments(row);
      mu = m[0];
      var = m[1];
    } else {
      mu = ShiftedMean(row);
      var = row.Reduce(SumOp{}, [mu](const Acc* x, int64_t) {
        const Acc d = x[0] - mu;
        return d * d;
      }) / static_cast<Acc>(row.Size());
    }
    const Acc r = Acc(1) / Sqrt(var + eps);
    if (stats != nullptr && row.Leader()) {
      stats[2 * row.Index()] = mu;
      stats[2 * row.Index() + 1] = r;
    }
    StoreWith(
        row, [mu, r](const Acc* x, int64_t, const Acc* p) { return (x[0] - mu) * r * p[0] + p[1]; },
        ColumnParams());
  }
};

template <typename T, typename Acc, typename W>
struct LayerNormBwdOp {
  using Elem = T;
  static constexpr int kIn = 2;  // x, dy
  // Rows of the wide CTA's lengths on 2-CTA clusters, whose fused sums fit (op_traits.h): the
  // wide CTA's 16-bit sums (256 KB) do not
  static constexpr bool kWideCta = false;
  static constexpr int kColumnSums = 2;  // Σ dy⊙ŷ, Σ dy
  static constexpr int kSavedStats = 2;  // (μ, r) at stats[2·Index()] (op_traits.h)
  // 16-bit cluster rows of 4 packs a thread: their fused sums fit two CTAs per SM, or one of
  // 512 threads where 8 packs would hold one of 256 (op_traits.h)
  static constexpr int kClusterPacks = sizeof(T) == 2 ? 4 : 8;
  // Register rows of 256 threads: two CTAs per SM (op_traits.h)
  static constexpr int ClusterCtasPerSm(int, int threads, int) { return threads == 256 ? 2 : 0; }
  const W* weight;   // (n,) or nullptr
  const Acc* stats;  // (rows, 2): the forward's (μ, r) per row

  template <class Row>
  ROWNORM_HOST_DEVICE void operator()(Row& row) const {
    (*this)(row, static_cast<NoColumnSums*>(nullptr));
  }

  // The weight per column (what the fused kernels keep in shared memory).
  ROWNORM_HOST_DEVICE ParamList<W, 1> ColumnParams() const { return {{weight}, {1.0f}}; }

  template <class Row, class Sums>
  ROWNORM_HOST_DEVICE void operator()(Row& row, Sums* sums) const {
    const Acc n = static_cast<Acc>(row.Size());
    const auto params = ColumnParams();
    // A row past the end (a group's or a strided tile's spare lanes) reads row 0's pair.
    const int64_t at = row.Valid() ? 2 * row.Index() : 0;
    const Acc mu = stats[at];
    const Acc r = stats[at + 1];
    // (Σg, Σ(x − μ)·g): one all-reduce
    const Array<Acc, 2> s = ReduceWith(
        row, SumOp{},
        [mu](const Acc* v, int64_t, const Acc* w) {
          const Acc g = MulRn(v[1], w[0]);
          return Array<Acc, 2>{{g, (v[0] - mu) * g}};
        },
        params);
    const Acc mean_g = s[0] / n;
    const Acc c = r * r * s[1] / n;  // mean(ŷ⊙g)·r: multiplies (x − μ)
    // dx and the column sums in one pass over the row where the row view has it (row_ops.h):
    // x − μ and each element's conversions made once. H200, fwd+bwd with every gradient, time
    // ÷ two passes: bf16 2048-262144 0.94-1.00, fp32 65536 0.92 (benchmarks/results/h200/
    // NOTES.md §33). rms_norm's backward keeps two passes: its store and its sum share no
    // term, and fused, its held CTA sums kernels spilled and took 1.01-1.04x; on the group
    // tier it took 0.96-1.02x, no length gaining twice (§34).
    StoreWithColumns(
        row,
        [mu, r, mean_g, c](const Acc* v, int64_t, const Acc* w) {
          return r * (MulRn(v[1], w[0]) - mean_g - (v[0] - mu) * c);
        },
        params,
        [mu, r](const Acc* v, int64_t) { return Array<Acc, 2>{{v[1] * (v[0] - mu) * r, v[1]}}; },
        sums);
  }
};

}  // namespace rownorm
