// LayerNorm along one dimension: the op bodies, run by every tier of row.cuh (and by the CPU
// rows of kernels/cpu/row_cpu.h, with Acc = double). The op concept is in
// kernels/common/op_traits.h.
//
//   forward   μ = mean(x), var = mean((x − μ)²) (biased, two passes over the row: stable),
//             r = 1/sqrt(var + eps), y = (x − μ)·r·w + b
//             The mean is taken shifted by the row's first element x₀: μ = x₀ + Σ(x − x₀)/n.
//             On a constant row c every x − x₀ is 0, so μ = c exactly and x − μ = 0 as in
//             torch (y = b; NaN for eps = 0, where var is 0), where Σx/n rounds and gives
//             ŷ = ±1 whenever (c − Σx/n)² ≫ eps. Same cost as Σx/n: one sum per pass, and the
//             one extra load of x₀ is a cache hit.
//   backward  ŷ = (x − μ)·r, g = w⊙dy;  dx = r·(g − mean(g) − ŷ·mean(ŷ⊙g))
//             dw = Σ_rows dy⊙ŷ, db = Σ_rows dy  (fused column sums where plan.h's
//             PlanFusedSums takes them: with two sums, groups of 16+ lanes and short CTA
//             rows; else kernels/param_grad.h from the (μ, r) saved per row here)
//
// Both passes run over the row where the tier caches it (registers), so the row is read from
// memory once; the streaming tier reads it once per pass. Two all-reduces per row: merging
// per-thread (count, mean, M2) triples in one all-reduce (Chan's formula) measured slower on
// the cluster tier, although a second all-reduce costs a cluster barrier there
// (benchmarks/results/h100/NOTES.md §6 has the numbers).
#pragma once

#include <type_traits>

#include "kernels/common/row_ops.h"

namespace rownorm {

// μ = x₀ + Σ(x − x₀)/n with x₀ the row's first element: exact on constant rows (see the header).
template <class Row, typename Acc = typename Row::Acc>
ROWNORM_HOST_DEVICE Acc ShiftedMean(Row& row) {
  const Acc x0 = row.First();
  return x0 + row.Reduce(SumOp{}, [x0](const Acc* x, int64_t) { return x[0] - x0; }) /
                  static_cast<Acc>(row.Size());
}

template <typename T, typename Acc, typename W>
struct LayerNormFwdOp {
  using Elem = T;
  static constexpr int kIn = 1;  // x
  Acc eps;
  const W* weight;  // (n,) or nullptr
  const W* bias;    // (n,) or nullptr

  template <class Row>
  ROWNORM_HOST_DEVICE void operator()(Row& row) const {
    const Acc n = static_cast<Acc>(row.Size());
    const Acc mu = ShiftedMean(row);
    const Acc var = row.Reduce(SumOp{}, [mu](const Acc* x, int64_t) {
      const Acc d = x[0] - mu;
      return d * d;
    }) / n;
    const Acc r = Acc(1) / Sqrt(var + eps);
    StoreWith(
        row, [mu, r](const Acc* x, int64_t, const Acc* p) { return (x[0] - mu) * r * p[0] + p[1]; },
        ParamList<W, 2>{{weight, bias}, {1.0f, 0.0f}});
  }
};

template <typename T, typename Acc, typename W>
struct LayerNormBwdOp {
  using Elem = T;
  static constexpr int kIn = 2;                // x, dy
  static constexpr bool kWideCluster = false;  // spills at 128 registers: streams instead
  static constexpr int kColumnSums = 2;        // Σ dy⊙ŷ, Σ dy
  Acc eps;
  const W* weight;  // (n,) or nullptr
  Acc* stats;       // (rows, 2): (μ, r) per row, or nullptr

  template <class Row>
  ROWNORM_HOST_DEVICE void operator()(Row& row) const {
    (*this)(row, static_cast<NoColumnSums*>(nullptr));
  }

  template <class Row, class Sums>
  ROWNORM_HOST_DEVICE void operator()(Row& row, Sums* sums) const {
    const Acc n = static_cast<Acc>(row.Size());
    const W* w = weight;
    // μ, then (Σ(x − μ)², Σg, Σ(x − μ)·g)
    const Acc mu = ShiftedMean(row);
    const Array<Acc, 3> s = row.Reduce(SumOp{}, [mu, w](const Acc* v, int64_t col) {
      const Acc d = v[0] - mu;
      const Acc g = MulRn(v[1], Param(w, col, Acc(1)));
      return Array<Acc, 3>{{d * d, g, d * g}};
    });
    const Acc r = Acc(1) / Sqrt(s[0] / n + eps);
    const Acc mean_g = s[1] / n;
    const Acc c = r * r * s[2] / n;  // mean(ŷ⊙g)·r: multiplies (x − μ)
    if (stats != nullptr && row.Leader()) {
      stats[2 * row.Index()] = mu;
      stats[2 * row.Index() + 1] = r;
    }
    StoreWith(
        row,
        [mu, r, mean_g, c](const Acc* v, int64_t, const Acc* pw) {
          return r * (MulRn(v[1], pw[0]) - mean_g - (v[0] - mu) * c);
        },
        ParamList<W, 1>{{w}, {1.0f}});
    if constexpr (!std::is_same_v<Sums, NoColumnSums>) {
      row.AddColumns(
          [mu, r](const Acc* v, int64_t) { return Array<Acc, 2>{{v[1] * (v[0] - mu) * r, v[1]}}; },
          sums);
    }
  }
};

}  // namespace rownorm
