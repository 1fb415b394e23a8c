// L2 normalization along one dimension: the op bodies, run by every tier of row.cuh (and by the
// CPU rows of kernels/cpu/row_cpu.h, with Acc = double).
//
//   forward   y  = x / n,                 n = clamp_min(‖x‖₂, eps)
//   backward  dx = (dy − y·Σ(dy⊙y)) / n = dy/n − x·Σ(dy⊙x)/n³   where ‖x‖₂ > eps
//             dx = dy / eps                                   where ‖x‖₂ ≤ eps (clamped)
//
// The clamp is torch's clamp_min (what F.normalize computes): a NaN norm stays NaN, so a NaN
// anywhere in the row makes the whole row NaN, and at ‖x‖₂ == eps no gradient flows through the
// norm. The backward recomputes ‖x‖₂ in the same pass that reads dy (one two-value reduction),
// so it moves x, dy in and dx out once and needs nothing saved from the forward.
#pragma once

#include "kernels/common/reduce.cuh"

namespace rownorm {

template <typename T, typename Acc>
struct L2NormalizeFwdOp {
  using Elem = T;
  static constexpr int kIn = 1;                  // x
  static constexpr bool kKeepsInputInL2 = true;  // bound by DRAM (op_traits.h)
  Acc eps;

  template <class Row>
  ROWNORM_HOST_DEVICE void operator()(Row& row) const {
    const Acc ss = row.Reduce(SumOp{}, [](const Acc* x, int64_t) { return x[0] * x[0]; });
    const Acc norm = Sqrt(ss);
    const Acc inv = Acc(1) / (norm <= eps ? eps : norm);  // not Max: fmax drops a NaN
    row.Store([inv](const Acc* x, int64_t) { return x[0] * inv; });
  }
};

template <typename T, typename Acc>
struct L2NormalizeBwdOp {
  using Elem = T;
  static constexpr int kIn = 2;                  // x, dy
  static constexpr bool kKeepsInputInL2 = true;  // bound by DRAM (op_traits.h)
  Acc eps;

  template <class Row>
  ROWNORM_HOST_DEVICE void operator()(Row& row) const {
    const Array<Acc, 2> s = row.Reduce(
        SumOp{}, [](const Acc* v, int64_t) { return Array<Acc, 2>{{v[0] * v[0], v[0] * v[1]}}; });
    const Acc norm = Sqrt(s[0]);
    const bool clamped = norm <= eps;  // false for a NaN norm: the row's dx is NaN
    const Acc inv = Acc(1) / (clamped ? eps : norm);
    // dx = dy/n − y·(Σ(dy⊙x)/n²) with y = x/n formed per element: each factor stays near its
    // result's scale. (Σ(dy⊙x)/n³ as one coefficient fell into float32's subnormals for norms
    // near 1e19, where the row is still in range, and lost its bits.) Clamped rows keep y out:
    // dx = dy/eps, ±inf at eps = 0.
    const Acc y_scale = clamped ? Acc(0) : inv;
    const Acc coef = clamped ? Acc(0) : s[1] * inv * inv;
    row.Store([inv, y_scale, coef](const Acc* v, int64_t) {
      return v[1] * inv - (v[0] * y_scale) * coef;
    });
  }
};

}  // namespace rownorm
