// L1 / mean-abs normalization along one dimension: the op bodies, run by every tier of row.cuh
// (and by the CPU rows of kernels/cpu/row_cpu.h, with Acc = double). The op concept is in
// kernels/common/op_traits.h.
//
//   forward   y  = x / s,   s = clamp_min(S, eps),  S = Σ|x| (mean = false) or Σ|x| / D (mean)
//   backward  dx = dy/s − sign(x)·Σ(dy⊙x) / (s²·D')   where S > eps  (D' = 1, or D for mean)
//             dx = dy / eps                           where S ≤ eps (clamped)
//
// The clamp is torch's clamp_min, as in l2_normalize.cuh: a NaN sum stays NaN (the whole row
// becomes NaN) and at S == eps no gradient flows through S.
//
// The backward recomputes S in the pass that reads dy (one two-value reduction): it moves x
// and dy in and dx out once.
#pragma once

#include "kernels/common/reduce.cuh"

namespace rownorm {

template <typename T, typename Acc>
struct L1NormalizeFwdOp {
  using Elem = T;
  static constexpr int kIn = 1;                  // x
  static constexpr bool kKeepsInputInL2 = true;  // bound by DRAM (op_traits.h)
  Acc eps;
  bool mean;

  template <class Row>
  ROWNORM_HOST_DEVICE void operator()(Row& row) const {
    const Acc n = static_cast<Acc>(row.Size());
    Acc s = row.Reduce(SumOp{}, [](const Acc* x, int64_t) { return Abs(x[0]); });
    if (mean) s /= n;
    const Acc inv = Acc(1) / (s <= eps ? eps : s);  // not Max: fmax drops a NaN
    row.Store([inv](const Acc* x, int64_t) { return x[0] * inv; });
  }
};

template <typename T, typename Acc>
struct L1NormalizeBwdOp {
  using Elem = T;
  static constexpr int kIn = 2;                  // x, dy
  static constexpr bool kKeepsInputInL2 = true;  // bound by DRAM (op_traits.h)
  Acc eps;
  bool mean;

  template <class Row>
  ROWNORM_HOST_DEVICE void operator()(Row& row) const {
    const Acc n = static_cast<Acc>(row.Size());
    const Array<Acc, 2> s = row.Reduce(
        SumOp{}, [](const Acc* v, int64_t) { return Array<Acc, 2>{{Abs(v[0]), v[0] * v[1]}}; });
    const Acc norm = mean ? s[0] / n : s[0];
    const bool clamped = norm <= eps;  // false for a NaN sum: the row's dx is NaN
    const Acc inv = Acc(1) / (clamped ? eps : norm);
    const Acc coef = clamped ? Acc(0) : s[1] * inv * inv / (mean ? n : Acc(1));
    row.Store([inv, coef](const Acc* v, int64_t) { return v[1] * inv - Sign(v[0]) * coef; });
  }
};

}  // namespace rownorm
