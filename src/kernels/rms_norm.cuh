// RMSNorm and residual-add + RMSNorm along one dimension: the op bodies, run by every tier of
// row.cuh (and by the CPU rows of kernels/cpu/row_cpu.h, with Acc = double). The op concept is
// in kernels/common/op_traits.h.
//
//   forward   y  = ŷ·(w + c),   ŷ = x·r,   r = 1/sqrt(mean(x²) + eps)   (w = 1 without a weight)
//             c: the weight offset (Gemma's 1 + w), added in Acc (no rounded 1 + w in memory).
//             Casting mode "once": y rounded once to T. "llama" (HF LlamaRMSNorm's
//             `w * x̂.to(dtype)`): ŷ rounded to T first, then the product rounded again.
//   backward  g = (w + c)⊙dy;  dx = r·(g − x·r²·mean(x⊙g))   = r·(g − ŷ·mean(ŷ⊙g))
//             dw = Σ_rows dy⊙ŷ  (fused column sums where plan.h's PlanFusedSums takes them,
//             else kernels/param_grad.h from the (0, r) saved per row here). The backward is
//             that of the unrounded formula in both casting modes.
//   add_rms_norm: h = x + residual (rounded to T, as torch's x + residual is; float32 on the
//             float32 residual stream of a 16-bit x, AddRmsNormFwdOp's R), returns
//             (rms_norm(h), h): two outputs (the schema's and Python's `r`; h here, as r is
//             the reciprocal RMS). Its backward is rms_norm's plus the gradient flowing into h
//             from the second output.
//
// The backward recomputes r in the pass that reads dy (one two-value reduction): it moves x
// and dy in and dx out once, and saves (0, r) per row for the weight gradient when asked.
#pragma once

#include <type_traits>

#include "kernels/common/args.h"
#include "kernels/common/row_ops.h"

namespace rownorm {

// How the forward's normalized value meets the weight: y = ŷ·(w + c), with w the weight at the
// column in Acc (1 without a weight). Both fields are uniform runtime values, not template
// flags, which would double the instantiations of every tier. The casting mode is tested once
// per row, outside the element loop: a select per element cost add_rms_norm's forward 2–8% on
// the H100 (benchmarks/results/h100/NOTES.md §9). Where T is Acc (float32 x on the GPU,
// float64 x) the two modes are one.
template <typename T, typename Acc>
struct RmsNormScale {
  Acc weight_offset;      // c of y = ŷ·(w + c); 0 without a weight (the binding checks it)
  bool round_normalized;  // casting mode "llama": ŷ rounded to T before the product

  // Output 0 at col = ŷ(x, col)·(w + c), ŷ rounded to T first in the "llama" mode; `params`
  // lists the weight (the op's ColumnParams()).
  template <class Row, class Yhat, class PS>
  ROWNORM_HOST_DEVICE void Store(Row& row, Yhat yhat, const PS& params) const {
    const Acc c = weight_offset;
    if (!std::is_same_v<T, Acc> && round_normalized) {
      StoreWith(
          row,
          [yhat, c](const Acc* x, int64_t col, const Acc* w) {
            return RoundTo<T>(yhat(x, col)) * (w[0] + c);
          },
          params);
    } else {
      StoreWith(
          row,
          [yhat, c](const Acc* x, int64_t col, const Acc* w) { return yhat(x, col) * (w[0] + c); },
          params);
    }
  }
};

template <typename T, typename Acc, typename W>
struct RmsNormFwdOp {
  using Elem = T;
  static constexpr int kIn = 1;                  // x
  static constexpr bool kKeepsInputInL2 = true;  // bound by DRAM (op_traits.h)
  // Cluster rows of 256 threads held to 64 registers, four CTAs per SM (op_traits.h; ptxas
  // alone: 71-80 at 16 bits, 76-78 at float32 on 2-4 CTAs, three per SM). H100, forward, time ÷
  // main's plan: bf16 65535 / 65536 / 131072 0.978 / 0.982 / 0.974 (to 90 / 95 / 94% of copy),
  // fp32 32768 0.982. benchmarks/results/h100/NOTES.md §42.
  static constexpr int ClusterCtasPerSm(int, int threads, int) { return threads == 256 ? 4 : 0; }
  // The 512 x 4 CTA held to three per SM (op_traits.h), where ptxas alone allocates for two
  // (16-bit rows with a float32 weight, 50-52 registers; rows not 16-byte aligned). H100,
  // forward, time held ÷ plain: bf16 with a float32 weight 9216 / 12288 / 16384 0.91 / 0.97 /
  // 0.99, fp32 6143 0.955 (benchmarks/results/h100/NOTES.md §48); 16-bit rows not aligned spill
  // past dispatch.cuh's kMaxHeldLocalBytes and run the plain kernel.
  static constexpr int CtaCtasPerSm(int threads, int packs) {
    return threads == 512 && packs == 4 ? 3 : 0;
  }
  Acc eps;
  const W* weight;  // (n,) or nullptr
  RmsNormScale<T, Acc> scale;

  // The weight (the parameters a persistent kernel may keep per CTA: op_traits.h).
  ROWNORM_HOST_DEVICE ParamList<W, 1> ColumnParams() const { return {{weight}, {1.0f}}; }

  template <class Row>
  ROWNORM_HOST_DEVICE void operator()(Row& row) const {
    const Acc n = static_cast<Acc>(row.Size());
    const Acc ss = row.Reduce(SumOp{}, [](const Acc* x, int64_t) { return x[0] * x[0]; });
    const Acc r = Acc(1) / Sqrt(ss / n + eps);
    scale.Store(row, [r](const Acc* x, int64_t) { return x[0] * r; }, ColumnParams());
  }
};

// The operand types of a body whose x has type T on a residual stream of type R: T, or float for
// the float32 residual stream of a 16-bit x. There the problem is mixed (args.h): its register
// type is float, and the operands in kInMask / kOutMask (those of x's dtype) are stored as T.
// kCopy: on the stream, output 1 is output 0 again in T (args.h's Narrowing); kOut counts it.
template <typename T, typename R, unsigned kInMask, unsigned kOutMask, bool kCopy = false>
struct StreamOperands {
  static constexpr bool kStream = !std::is_same_v<T, R>;
  using Elem = R;
  using Narrowings =
      std::conditional_t<kStream, Narrowing<T, kInMask, kOutMask, kCopy>, NoNarrowing>;
  static constexpr int kCopies = kStream && kCopy ? 1 : 0;
};

// in = {x, dy, extra}: dx = rms_norm_backward(dy, x) + extra. rms_norm runs it with kIn = 2
// (no extra); add_rms_norm with kIn = 3 (extra = the gradient of the h output).
//
// Weight gradient: on the tiers that accumulate column sums (the *RowSumsKernel) the body adds
// dy⊙x·r to them (Σ over the CTA's rows: one chunk partial); elsewhere it saves (0, r) per row
// in `stats` for kernels/param_grad.h. The binding sets at most one of the two.
//
// R = float with a 16-bit T (the float32 residual stream): inputs (h, dy, dh) with dy stored as
// T; outputs dresidual in float and x's gradient, the same values rounded to T, written by the
// same stores.
template <typename T, typename Acc, typename W, int kInputs, typename R = T>
struct RmsNormBwdOp {
  using Operands = StreamOperands<T, R, 0b010u, 0b10u, /*kCopy=*/true>;
  using Elem = typename Operands::Elem;
  using Narrowings = typename Operands::Narrowings;
  static constexpr int kIn = kInputs;
  static constexpr bool kKeepsInputInL2 = true;  // bound by DRAM (op_traits.h)
  static constexpr int kOut = 1 + Operands::kCopies;
  static constexpr int kColumnSums = 1;  // Σ dy⊙ŷ
  // Three inputs: rows of the wide CTA's lengths on 2-CTA clusters (op_traits.h), where the
  // wide CTA's register kernel spills (128 registers)
  static constexpr bool kWideCta = kInputs < 3;
  // 16-bit rows of two inputs on clusters of 4 packs a thread: their fused sums' CTAs fit
  // four to an SM where 8 packs fit two (op_traits.h)
  static constexpr int kClusterPacks = kInputs == 2 && sizeof(Elem) == 2 ? 4 : 8;
  Acc eps;
  const W* weight;    // (n,) or nullptr
  Acc weight_offset;  // g = (w + weight_offset)⊙dy; 0 without a weight
  Acc* stats;         // (rows, 2): (0, r) per row, or nullptr

  template <class Row>
  ROWNORM_HOST_DEVICE void operator()(Row& row) const {
    (*this)(row, static_cast<NoColumnSums*>(nullptr));
  }

  // w + weight_offset per column (the parameters the fused kernels keep in shared memory).
  ROWNORM_HOST_DEVICE ParamList<W, 1, ParamOffset<Acc>> ColumnParams() const {
    return {{weight}, {1.0f}, {weight_offset}};
  }

  template <class Row, class Sums>
  ROWNORM_HOST_DEVICE void operator()(Row& row, Sums* sums) const {
    const Acc n = static_cast<Acc>(row.Size());
    const auto params = ColumnParams();
    const Array<Acc, 2> s = ReduceWith(
        row, SumOp{},
        [](const Acc* v, int64_t, const Acc* w) {
          return Array<Acc, 2>{{v[0] * v[0], v[0] * v[1] * w[0]}};
        },
        params);
    const Acc r = Acc(1) / Sqrt(s[0] / n + eps);
    const Acc c = r * r * s[1] / n;
    if (stats != nullptr && row.Leader()) {
      stats[2 * row.Index()] = Acc(0);
      stats[2 * row.Index() + 1] = r;
    }
    StoreWith(
        row,
        [r, c](const Acc* v, int64_t, const Acc* w) {
          const Acc dx = r * (v[1] * w[0] - v[0] * c);
          if constexpr (kInputs == 3) {
            return dx + v[2];
          } else {
            return dx;
          }
        },
        params);
    if constexpr (!std::is_same_v<Sums, NoColumnSums>) {
      row.AddColumns([r](const Acc* v, int64_t) { return Array<Acc, 1>{{v[1] * v[0] * r}}; }, sums);
    }
  }
};

// x + residual in the residual's type R (StreamOperands). On the float32 residual stream the
// inputs are (residual, x), input 1 and output 0 (the norm) stored as T, output 1 (h) as float.
template <typename T, typename Acc, typename W, typename R = T>
struct AddRmsNormFwdOp {
  using Operands = StreamOperands<T, R, 0b10u, 0b01u>;
  using Elem = typename Operands::Elem;
  using Narrowings = typename Operands::Narrowings;
  static constexpr int kIn = 2;  // x, residual (residual, x for the float32 residual stream)
  static constexpr bool kKeepsInputInL2 = true;  // bound by DRAM (op_traits.h)
  static constexpr int kOut = 2;                 // rms_norm(h), h = x + residual
  // 16-bit rows on clusters of 8 and 16 CTAs of 256 x 4 packs a thread (op_traits.h), held to
  // 64 registers, four CTAs per SM: at 8 packs the two inputs took 103-128 registers, two CTAs
  // per SM (held to three, they spilled 90-720 bytes and took 1.15-1.40x the time, §42). H100,
  // forward, time 8 packs ÷ 4: bf16 40000 / 65535 / 65536 / 131072 1.049 / 1.036 / 1.036 /
  // 1.041 (to 94 / 95 / 97 / 96% of copy), fp16 1.026-1.049; fwd+bwd 1.024 / 1.026 at 65536 /
  // 131072. Longer rows keep 8 packs (kWideClusterPacks): on 16 CTAs of 512 x 4 bf16 196608 /
  // 262144 took 1.045 / 1.027x the time of the kept-parameter rows of 16 CTAs of 256 x 8.
  // benchmarks/results/h100/NOTES.md §43.
  static constexpr int kClusterPacks = sizeof(Elem) == 2 ? 4 : 8;
  static constexpr int kWideClusterPacks = 8;
  static constexpr int ClusterCtasPerSm(int, int threads, int packs) {
    return threads == 256 && packs == 4 ? 4 : 0;
  }
  Acc eps;
  const W* weight;  // (n,) or nullptr
  RmsNormScale<T, Acc> scale;

  ROWNORM_HOST_DEVICE ParamList<W, 1> ColumnParams() const { return {{weight}, {1.0f}}; }

  template <class Row>
  ROWNORM_HOST_DEVICE void operator()(Row& row) const {
    const Acc n = static_cast<Acc>(row.Size());
    const Acc ss = row.Reduce(SumOp{}, [](const Acc* v, int64_t) {
      const Acc h = RoundTo<R>(v[0] + v[1]);
      return h * h;
    });
    const Acc r = Acc(1) / Sqrt(ss / n + eps);
    scale.Store(
        row, [r](const Acc* v, int64_t) { return RoundTo<R>(v[0] + v[1]) * r; }, ColumnParams());
    row.Store(Output<1>{}, [](const Acc* v, int64_t) { return v[0] + v[1]; });
  }
};

}  // namespace rownorm
