// LayerNorm along one dimension: the op bodies, run by every tier of row.cuh (and by the CPU
// rows of kernels/cpu/row_cpu.h, with Acc = double). The op concept is in
// kernels/common/op_traits.h.
//
//   forward   μ = mean(x), var = mean((x − μ)²) (biased, two passes over the row: stable),
//             r = 1/sqrt(var + eps), y = (x − μ)·r·w + b
//             The mean is corrected in the second pass (RowMoments): μ₀ = Σx/n rounds, so
//             μ = μ₀ + Σd/n and var = Σd²/n − (Σd/n)² with d = x − μ₀. On a constant row c,
//             d = c − μ₀ is the same exact value everywhere, Σd = n·d is exact (d is a few
//             units in the last place of c) and μ comes out as c, so x − μ = 0 as in torch
//             (y = 0; NaN for eps = 0 where var is 0), where μ₀ alone gives ŷ = ±1 whenever
//             (c − μ₀)² ≫ eps.
//   backward  ŷ = (x − μ)·r, g = w⊙dy;  dx = r·(g − mean(g) − ŷ·mean(ŷ⊙g))
//             dw = Σ_rows dy⊙ŷ, db = Σ_rows dy  (fused column sums where plan.h's
//             PlanFusedSums takes them: with two sums, groups of 16+ lanes only; else
//             kernels/param_grad.h from the (μ, r) saved per row here)
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

// μ and var from μ₀ = Σx/n and the second pass's Σd², Σd (d = x − μ₀): see the header. The
// variance is clamped at 0 against rounding (by a comparison, so that NaN stays NaN).
template <typename Acc>
struct RowMoments {
  Acc mu;
  Acc var;

  ROWNORM_HOST_DEVICE RowMoments(Acc mu0, Acc sum_d2, Acc sum_d, Acc n) {
    const Acc shift = sum_d / n;
    const Acc v = sum_d2 / n - shift * shift;
    mu = mu0 + shift;
    var = v < Acc(0) ? Acc(0) : v;
  }
};

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
    const Acc mu0 = row.Reduce(SumOp{}, [](const Acc* x, int64_t) { return x[0]; }) / n;
    const Array<Acc, 2> s = row.Reduce(SumOp{}, [mu0](const Acc* x, int64_t) {
      const Acc d = x[0] - mu0;
      return Array<Acc, 2>{{d * d, d}};
    });
    const RowMoments<Acc> m(mu0, s[0], s[1], n);
    const Acc mu = m.mu;
    const Acc r = Acc(1) / Sqrt(m.var + eps);
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
    // μ₀ and (Σd², Σg, Σd·g, Σd) with d = x − μ₀; Σ(x − μ)·g = Σd·g − (μ − μ₀)·Σg
    const Acc mu0 = row.Reduce(SumOp{}, [](const Acc* v, int64_t) { return v[0]; }) / n;
    const Array<Acc, 4> s = row.Reduce(SumOp{}, [mu0, w](const Acc* v, int64_t col) {
      const Acc d = v[0] - mu0;
      const Acc g = MulRn(v[1], Param(w, col, Acc(1)));
      return Array<Acc, 4>{{d * d, g, d * g, d}};
    });
    const RowMoments<Acc> m(mu0, s[0], s[3], n);
    const Acc mu = m.mu;
    const Acc r = Acc(1) / Sqrt(m.var + eps);
    const Acc mean_g = s[1] / n;
    const Acc c = r * r * (s[2] - (mu - mu0) * s[1]) / n;  // mean(ŷ⊙g)·r: multiplies (x − μ)
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
