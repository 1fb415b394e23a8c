// LayerNorm along one dimension: the op bodies, run by every tier of row.cuh (and by the CPU
// rows of kernels/cpu/row_cpu.h, with Acc = double).
//
//   forward   μ = mean(x), var = mean((x − μ)²) (biased, two passes over the row: stable),
//             r = 1/sqrt(var + eps), y = (x − μ)·r·w + b
//   backward  ŷ = (x − μ)·r, g = w⊙dy;  dx = r·(g − mean(g) − ŷ·mean(ŷ⊙g))
//             dw = Σ_rows dy⊙ŷ, db = Σ_rows dy  (fused column sums on the CTA / group tiers,
//             else kernels/param_grad.h from the (μ, r) saved per row here)
//
// Both passes run over the row where the tier caches it (registers), so the row is read from
// memory once; the streaming tier reads it once per pass. Where an all-reduce is a cluster
// barrier (PrefersOneRound) each thread first makes its own two-pass statistics (count, mean,
// Σ(x − mean)²; the backward also Σg and Σ(x − mean)·g) and one all-reduce merges them
// (MeanM2Op): one barrier round per row where a reduction per statistic took two.
#pragma once

#include <type_traits>

#include "kernels/common/reduce.cuh"

namespace rownorm {

// Merges per-thread statistics of disjoint parts a and b of a row (Chan, Golub and LeVeque):
//   [0] count, [1] mean, [2] M2 = Σ(x − mean)²,
//   and with K = 5 (the backward) [3] G = Σg, [4] C = Σ(x − mean)·g:
//   n = na + nb, mean = (na·ma + nb·mb)/n, M2 = M2a + M2b + (mb − ma)²·na·nb/n,
//   C = Ca + Cb + (ma − mean)·Ga + (mb − mean)·Gb.
// Written symmetric in a and b, bit for bit (the products that are summed are rounded on their
// own, never contracted into an FMA with the other side's), so both lanes of a butterfly step
// obtain the same value. Empty parts have count 0 and merge as the identity.
struct MeanM2Op {
  template <typename V>
  ROWNORM_HOST_DEVICE V operator()(const V& a, const V& b) const {
    const auto n = a[0] + b[0];
    if (n == 0) return a;
    V r;
    r[0] = n;
    r[1] = (MulRn(a[0], a[1]) + MulRn(b[0], b[1])) / n;
    const auto d = b[1] - a[1];
    r[2] = (a[2] + b[2]) + d * d * (a[0] * b[0] / n);
    if constexpr (sizeof(V) == 5 * sizeof(r[0])) {
      r[3] = a[3] + b[3];
      r[4] = (a[4] + b[4]) + (MulRn(a[1] - r[1], a[3]) + MulRn(b[1] - r[1], b[3]));
    }
    return r;
  }
  template <typename V>
  ROWNORM_HOST_DEVICE static V Identity() {
    return Filler<V>::Fill(0);
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
    Acc mu;
    Acc var;
    if constexpr (PrefersOneRound<Row>::value) {
      const Acc count = static_cast<Acc>(row.LocalCount());
      const Acc sum = row.ReduceLocal(SumOp{}, [](const Acc* x, int64_t) { return x[0]; });
      const Acc mean = count > 0 ? sum / count : Acc(0);
      const Acc m2 = row.ReduceLocal(SumOp{}, [mean](const Acc* x, int64_t) {
        const Acc d = x[0] - mean;
        return d * d;
      });
      const Array<Acc, 3> st = row.AllReduce(Array<Acc, 3>{{count, mean, m2}}, MeanM2Op{});
      mu = st[1];
      var = st[2] / n;
    } else {
      mu = row.Reduce(SumOp{}, [](const Acc* x, int64_t) { return x[0]; }) / n;
      var = row.Reduce(SumOp{}, [mu](const Acc* x, int64_t) {
        const Acc d = x[0] - mu;
        return d * d;
      }) / n;
    }
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
  static constexpr int kColumnSums = 2;        // Σ dy⊙ŷ, Σ dy (fused on the CTA/group tiers)
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
    // μ and (Σ(x − μ)², Σg, Σ(x − μ)·g)
    Acc mu;
    Array<Acc, 3> s;
    if constexpr (PrefersOneRound<Row>::value) {
      const Acc count = static_cast<Acc>(row.LocalCount());
      const Acc sum = row.ReduceLocal(SumOp{}, [](const Acc* v, int64_t) { return v[0]; });
      const Acc mean = count > 0 ? sum / count : Acc(0);
      const Array<Acc, 3> part = row.ReduceLocal(SumOp{}, [mean, w](const Acc* v, int64_t col) {
        const Acc d = v[0] - mean;
        const Acc g = MulRn(v[1], Param(w, col, Acc(1)));
        return Array<Acc, 3>{{d * d, g, d * g}};
      });
      const Array<Acc, 5> st =
          row.AllReduce(Array<Acc, 5>{{count, mean, part[0], part[1], part[2]}}, MeanM2Op{});
      mu = st[1];
      s = Array<Acc, 3>{{st[2], st[3], st[4]}};
    } else {
      mu = row.Reduce(SumOp{}, [](const Acc* v, int64_t) { return v[0]; }) / n;
      s = row.Reduce(SumOp{}, [mu, w](const Acc* v, int64_t col) {
        const Acc d = v[0] - mu;
        const Acc g = MulRn(v[1], Param(w, col, Acc(1)));
        return Array<Acc, 3>{{d * d, g, d * g}};
      });
    }
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
