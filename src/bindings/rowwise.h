// The shared body of every binding of an op that reduces over one dim: parameter checks, the
// layout a problem runs in (row tiers without a copy, the strided-dim path, or contiguous
// (outer, d, inner) operands on the CPU), and the launch on the tensor's device and stream.
#pragma once

#include <cuda_fp8.h>

#include <array>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "bindings/utils.h"
#include "kernels/common/args.h"
#include "kernels/cpu/row_cpu.h"
#include "kernels/launch.h"
#include "kernels/param_grad.h"

namespace rownorm {

// Same-shaped operands of one op, seen as (outer, d, inner) with element strides per operand.
// `row_tiers`: every operand is row-viewable (the row tiers apply, inner == 1).
template <int kIn>
struct Problem {
  std::array<Tensor, kIn> in;  // the tensors the kernels read (copies where one was needed)
  int64_t stride[kIn][3];
  int64_t outer = 1;
  int64_t d = 1;
  int64_t inner = 1;
  bool row_tiers = false;
  bool cuda = false;
};

// CUDA: row views where every operand allows one, else contiguous copies (row tiers when dim
// is then innermost, the strided-dim path otherwise). CPU: contiguous operands.
template <int kIn>
Problem<kIn> MakeProblem(const Tensor (&ins)[kIn], int64_t dim) {
  Problem<kIn> p;
  p.cuda = ins[0].is_cuda();
  if (p.cuda) {
    std::array<RowView, kIn> views;
    bool all = true;
    for (int i = 0; i < kIn; ++i) {
      views[i] = TryRowView(ins[i], dim);
      all = all && views[i].ok;
    }
    if (all) {
      for (int i = 0; i < kIn; ++i) p.in[i] = ins[i];
      p.row_tiers = true;
      p.outer = views[0].rows;
      p.d = views[0].n;
      for (int i = 0; i < kIn; ++i) {
        p.stride[i][0] = views[i].row_stride;
        p.stride[i][1] = 1;
        p.stride[i][2] = 0;
      }
      return p;
    }
  }
  for (int i = 0; i < kIn; ++i) p.in[i] = Contiguous(ins[i]);
  const StridedShape s = StridedShapeOf(p.in[0], dim);
  p.outer = s.outer;
  p.d = s.d;
  p.inner = s.inner;
  p.row_tiers = p.cuda && s.inner == 1;
  for (int i = 0; i < kIn; ++i) {
    p.stride[i][0] = s.d * s.inner;
    p.stride[i][1] = s.inner;
    p.stride[i][2] = p.row_tiers ? 0 : 1;
  }
  return p;
}

// The dtype of kernel element type T.
template <typename T>
constexpr ScalarType DtypeOf() {
  if constexpr (std::is_same_v<T, float>) {
    return ScalarType::Float;
  } else if constexpr (std::is_same_v<T, double>) {
    return ScalarType::Double;
  } else if constexpr (std::is_same_v<T, __half>) {
    return ScalarType::Half;
  } else if constexpr (std::is_same_v<T, __nv_fp8_e4m3>) {
    return ScalarType::Float8_e4m3fn;
  } else if constexpr (std::is_same_v<T, __nv_fp8_e5m2>) {
    return ScalarType::Float8_e5m2;
  } else {
    static_assert(std::is_same_v<T, __nv_bfloat16>, "no dtype for this element type");
    return ScalarType::BFloat16;
  }
}

// The dtype of output j of a problem of type Args (its narrowed outputs' in their own type).
template <class Args>
ScalarType OutDtype(int j) {
  if constexpr (Args::kMixed) {
    if (Args::NarrowOut(j)) return DtypeOf<typename Args::Narrow>();
  }
  return DtypeOf<typename Args::OutElem>();
}

// The row-tier arguments (Args: RowArgsFor<Op>) of a problem with p.row_tiers; outputs are new
// contiguous tensors. A narrowed operand's pointer travels in the array of the register type
// (args.h).
template <class Args, int kIn, int kOut>
Args RowArgsOf(const Problem<kIn>& p, const Tensor (&outs)[kOut]) {
  Args a{};
  for (int i = 0; i < kIn; ++i) {
    a.in[i] = ConstPtr<typename Args::InElem>(p.in[i]);
    a.in_stride[i] = p.stride[i][0];
  }
  for (int j = 0; j < kOut; ++j) {
    a.out[j] = MutPtr<typename Args::OutElem>(outs[j]);
    a.out_stride[j] = p.d;
  }
  a.rows = p.outer;
  a.n = p.d;
  return a;
}

// The (outer, d, inner) arguments (Args: StridedArgsFor<Op>) of a problem of contiguous
// operands (the CPU rows and the strided-dim path).
template <class Args, int kIn, int kOut>
Args StridedArgsOf(const Problem<kIn>& p, const Tensor (&outs)[kOut]) {
  Args a{};
  for (int i = 0; i < kIn; ++i) a.in[i] = ConstPtr<typename Args::InElem>(p.in[i]);
  for (int j = 0; j < kOut; ++j) a.out[j] = MutPtr<typename Args::OutElem>(outs[j]);
  a.outer = p.outer;
  a.d = p.d;
  a.inner = p.inner;
  return a;
}

// Runs the op made by `make(acc)` (acc: a value of the accumulator type to use; the CPU
// accumulates in double) over the problem, writing the op's outputs `outs` (new contiguous
// tensors of the problem's shape in the op's output dtype, in the op's output order). T is the
// inputs' element type; kStrided = false for ops only instantiated on the row tiers (last-dim
// ops).
template <typename T, bool kStrided = true, int kIn, int kOut, class MakeOp>
void RunOp(const char* name, const Problem<kIn>& p, const Tensor (&outs)[kOut], MakeOp make) {
  using Op = decltype(make(AccType<T>{}));
  static_assert(std::is_same_v<typename Op::Elem, T> && Op::kIn == kIn,
                "the op's inputs are not the problem's");
  static_assert(OpTraits<Op>::kOut == kOut, "pass one tensor per output of the op");
  for (int j = 0; j < kOut; ++j) {
    const ScalarType want = OutDtype<RowArgsFor<Op>>(j);
    ROWNORM_CHECK(outs[j].scalar_type() == want, name, ": internal error: output ", j, " is ",
                  DtypeName(outs[j].scalar_type()), ", the kernel writes ", DtypeName(want));
  }
  if (!p.cuda) {
    const auto a = StridedArgsOf<StridedArgsFor<Op>>(p, outs);
    const auto op = make(double{});
    LogPlan(name, p.outer * p.inner, p.d, [] { return std::string("path=cpu"); });
    ParallelRows(p.outer * p.inner, p.d,
                 [&](int64_t begin, int64_t end) { RunRowsCpu(a, op, begin, end); });
    return;
  }
  const cudaStream_t stream = CurrentCudaStream(outs[0]);
  const Op op = make(AccType<T>{});
  if (p.row_tiers) {
    const auto a = RowArgsOf<RowArgsFor<Op>>(p, outs);
    RowPlan plan;
    CheckPlan(name, PlanRows<Op>(a, GivenParamBytes(op), &plan));
    LogPlan(name, a.rows, a.n, [&] { return Describe(plan); });
    CheckLaunch(name, LaunchRows(a, op, plan, stream));
  } else if constexpr (kStrided) {
    const auto a = StridedArgsOf<StridedArgsFor<Op>>(p, outs);
    StridedPlan plan;
    CheckPlan(name, PlanStrided<Op>(a, &plan));
    LogPlan(name, p.outer * p.inner, p.d, [&] { return Describe(plan); });
    CheckLaunch(name, LaunchStrided(a, op, plan, stream));
  } else {
    ROWNORM_CHECK(false, name, ": internal error: no strided-dim kernel for this op");
  }
}

// Makes t's device current for the scope when t is a CUDA tensor (nothing for CPU tensors).
class DeviceScope {
 public:
  explicit DeviceScope(const Tensor& t) {
    if (t.is_cuda()) guard_.emplace(t.get_device_index());
  }

 private:
  std::optional<torch::stable::accelerator::DeviceGuard> guard_;
};

// A new contiguous tensor of x's shape and dtype (or `dtype`): an op's output.
inline Tensor NewLike(const Tensor& x) { return torch::stable::new_empty(x, x.sizes()); }
inline Tensor NewLike(const Tensor& x, ScalarType dtype) {
  return torch::stable::new_empty(x, x.sizes(), dtype);
}

inline bool Is16Bit(ScalarType t) { return t == ScalarType::Half || t == ScalarType::BFloat16; }

// The dtype per-column parameters run in: x's dtype when every given parameter has it, else
// float32 for 16-bit x (the mixed-precision case), else x's dtype. CheckParam admits only
// parameters this converts exactly.
template <size_t kParams>
ScalarType ParamDtype(const Tensor& x, const std::optional<Tensor> (&params)[kParams]) {
  bool all_same = true;
  for (const std::optional<Tensor>& p : params) {
    all_same = all_same && (!p.has_value() || p->scalar_type() == x.scalar_type());
  }
  if (all_same) return x.scalar_type();
  return Is16Bit(x.scalar_type()) ? ScalarType::Float : x.scalar_type();
}

// Checks an optional parameter (weight, bias) of the tensor x (named `x_name`) reduced over
// dim: floating, no finer than the dtype it runs in (so float64 only with float64 x: a float64
// weight with float32 x would be rounded), of shape (x.size(dim),), on x's device.
inline void CheckParam(const char* op, const char* name, const std::optional<Tensor>& p,
                       const char* x_name, const Tensor& x, int64_t dim) {
  if (!p.has_value()) return;
  const Tensor& w = *p;
  CheckFloating(op, name, w);
  ROWNORM_CHECK(w.scalar_type() != ScalarType::Double || x.scalar_type() == ScalarType::Double, op,
                ": ", name, " must be float32, float16 or bfloat16 for a ",
                DtypeName(x.scalar_type()), " ", x_name, " (float64 needs a float64 ", x_name,
                "), got float64");
  ROWNORM_CHECK(w.dim() == 1 && w.size(0) == x.size(dim), op, ": ", name, " must have shape (",
                x.size(dim), ",) (the size of ", x_name, " along dim ", dim, "), got ",
                ShapeString(w));
  ROWNORM_CHECK(w.device() == x.device(), op, ": ", name, " must be on ", x_name, "'s device (",
                DeviceString(x), "), got ", DeviceString(w));
}

// A backward op's request for the weight's gradient needs the weight.
inline void CheckWeightGrad(const char* op, const std::optional<Tensor>& weight, bool weight_grad) {
  ROWNORM_CHECK(!weight_grad || weight.has_value(), op,
                ": weight_grad=True needs the weight, got weight=None");
}

// The checks of the backward ops with a weight (rms_norm, layer_norm, add_rms_norm), in the
// order of every op's checks: x (named `x_name`: x, or add_rms_norm's r) and dim, eps, grad and
// grad_residual (when given) like x, the weight, weight_grad. Returns dim wrapped. `grad_stream`:
// another dtype grad may have (CheckLike; add_rms_norm's 16-bit grad beside a float32 r).
inline int64_t CheckWeightedBackward(const char* op, const Tensor& grad,
                                     const std::optional<Tensor>& grad_residual, const char* x_name,
                                     const Tensor& x, const std::optional<Tensor>& weight,
                                     int64_t dim, double eps, bool weight_grad,
                                     std::optional<ScalarType> grad_stream = std::nullopt) {
  dim = CheckRowwiseInput(op, x_name, x, dim);
  CheckEps(op, eps);
  CheckLike(op, "grad", grad, x_name, x, grad_stream);
  if (grad_residual.has_value()) CheckLike(op, "grad_residual", *grad_residual, x_name, x);
  CheckParam(op, "weight", weight, x_name, x, dim);
  CheckWeightGrad(op, weight, weight_grad);
  return dim;
}

// The parameter contiguous in `dtype` (nothing when absent).
inline std::optional<Tensor> ParamAs(const std::optional<Tensor>& p, ScalarType dtype) {
  if (!p.has_value()) return std::nullopt;
  Tensor t = p->scalar_type() == dtype ? *p : torch::stable::to(*p, dtype);
  return Contiguous(t);
}

// Calls f(W{}) with W the kernel type of parameters of dtype `pt` for elements of type T:
// T itself, or float (16-bit T with float32 parameters).
template <typename T, typename F>
void DispatchParam(ScalarType pt, F&& f) {
  if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) {
    if (pt == ScalarType::Float) {
      f(float{});
      return;
    }
  }
  f(T{});
}

template <typename W>
const W* ParamPtr(const std::optional<Tensor>& p) {
  return p.has_value() ? static_cast<const W*>(p->data_ptr()) : nullptr;
}

// The accumulator dtype of the per-row statistics and parameter gradients on x's device:
// float64 on the CPU and for float64 x, float32 otherwise.
inline ScalarType AccDtype(const Tensor& x) {
  return !x.is_cuda() || x.scalar_type() == ScalarType::Double ? ScalarType::Double
                                                               : ScalarType::Float;
}

// (rows, 2) statistics saved by a backward kernel for the parameter gradients.
inline Tensor NewStats(const Tensor& x, int64_t rows) {
  return torch::stable::new_empty(x, {rows, 2}, AccDtype(x));
}

// The shape of a forward's per-row statistics over x's dim: x's, with 2 along dim (so that a
// placement of x, e.g. a DTensor shard of the rows, fits them as it is).
inline std::vector<int64_t> RowStatsShape(const Tensor& x, int64_t dim) {
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape[dim] = 2;
  return shape;
}

// The strides of RowStatsShape(x, dim) laid out as the kernels write the statistics: (rows, 2)
// in the row order of the problem (row o·inner + i, the pair adjacent), so the dim of 2 has
// stride 1 and the others are those of a contiguous (outer dims..., inner dims..., 2).
inline std::vector<int64_t> RowStatsStrides(const Tensor& x, int64_t dim) {
  std::vector<int64_t> strides(x.dim());
  int64_t step = 2;
  for (int64_t i = x.dim() - 1; i >= 0; --i) {
    if (i == dim) continue;
    strides[i] = step;
    step *= x.size(i);
  }
  strides[dim] = 1;
  return strides;
}

// A forward's per-row statistics (layer_norm's (μ, r)): RowStatsShape(x, dim) with
// RowStatsStrides(x, dim). In AccDtype(x).
inline Tensor NewRowStats(const Tensor& x, int64_t dim) {
  const StridedShape s = StridedShapeOf(x, dim);
  const Tensor pairs = torch::stable::new_empty(x, {s.outer, s.inner, 2}, AccDtype(x));
  return torch::stable::view(torch::stable::transpose(pairs, 1, 2), RowStatsShape(x, dim));
}

// The statistics `stats` (named `name`) a backward op takes, checked against x and dim (device,
// dtype, shape), in NewRowStats's layout: a copy where the given strides differ (a tensor the
// forward did not make, or one that was moved since, e.g. gathered by DTensor).
inline Tensor RowStatsOf(const char* op, const char* name, const Tensor& stats, const char* x_name,
                         const Tensor& x, int64_t dim) {
  ROWNORM_CHECK(stats.device() == x.device(), op, ": ", name, " must be on ", x_name, "'s device (",
                DeviceString(x), "), got ", DeviceString(stats));
  ROWNORM_CHECK(DtypeCode(stats) == static_cast<int32_t>(AccDtype(x)), op, ": ", name, " must be ",
                DtypeName(AccDtype(x)), " for a ", DtypeName(DtypeCode(x)), " ", x_name, " on ",
                DeviceString(x), ", got ", DtypeName(DtypeCode(stats)));
  const std::vector<int64_t> shape = RowStatsShape(x, dim);
  bool same = stats.dim() == x.dim();
  for (int64_t i = 0; same && i < x.dim(); ++i) same = stats.size(i) == shape[i];
  ROWNORM_CHECK(same, op, ": ", name, " must have shape ", ShapeString(shape), " (", x_name,
                "'s, with 2 along dim ", dim, "), got ", ShapeString(stats));
  const std::vector<int64_t> strides = RowStatsStrides(x, dim);
  bool layout = true;
  for (int64_t i = 0; layout && i < x.dim(); ++i) {
    layout = stats.size(i) <= 1 || stats.stride(i) == strides[i];
  }
  if (layout) return stats;
  Tensor laid = NewRowStats(x, dim);
  torch::stable::copy_(laid, stats);
  return laid;
}

// The dtype a backward op returns its parameter gradients in: the dtype the parameters run in
// (ParamDtype: the weight's, or float32 for a 16-bit x with parameters of mixed dtypes), which
// the finalize writes directly; float32 (float64 for float64 x) where the op does not see every
// parameter it differentiates (layer_norm's bias without a weight).
inline ScalarType ParamGradDtype(const Tensor& x, ScalarType param_dtype, bool params_known) {
  if (params_known) return param_dtype;
  return x.scalar_type() == ScalarType::Double ? ScalarType::Double : ScalarType::Float;
}

// f(ParamGradOut<G>) over the requested ones of dw / db, G the C++ type of their dtype: W (the
// parameters' type) or Acc (the accumulator).
template <typename W, typename Acc, class F>
void WithParamGradOut(const Tensor& dw, const Tensor& db, bool want_w, bool want_b, F f) {
  auto out = [&](auto tag) {
    using G = decltype(tag);
    return ParamGradOut<G>{want_w ? MutPtr<G>(dw) : nullptr, want_b ? MutPtr<G>(db) : nullptr};
  };
  if (dw.scalar_type() == DtypeOf<W>()) {
    f(out(W{}));
  } else {
    ROWNORM_CHECK(dw.scalar_type() == DtypeOf<Acc>(), "internal error: parameter gradients in ",
                  DtypeName(dw.scalar_type()), ", neither ", DtypeName(DtypeOf<W>()), " nor ",
                  DtypeName(DtypeOf<Acc>()));
    f(out(Acc{}));
  }
}

// The fused path of parameter gradients (CUDA: the row tiers, and with kStrided the strided-dim
// path's packed kernel): runs `op` (float accumulation, no saved statistics) with column sums,
// writing its row outputs `outs` (dx); returns {dweight, dbias} in `grad_dtype` (the parameters'
// W or float32; (d,), or (0,) when not requested), or nothing where the path does not apply
// (then nothing ran).
template <typename W, bool kStrided, class Op, int kIn, int kOut>
std::optional<std::array<Tensor, 2>> FusedParamGrads(const char* name, const Problem<kIn>& p,
                                                     const Tensor (&outs)[kOut], const Op& op,
                                                     bool want_w, bool want_b,
                                                     ScalarType grad_dtype) {
  if (!p.cuda) return std::nullopt;
  const Tensor& dx = outs[0];
  // `launch(partial)` writes kColumnSums x chunks x d partials; the finalize adds them.
  auto run = [&](int64_t chunks, auto launch) {
    const int64_t sums = OpTraits<Op>::kColumnSums * chunks * p.d;
    Tensor partial = torch::stable::new_empty(dx, {sums + ParamGradFinalizeScratch(chunks, p.d)},
                                              ScalarType::Float);
    Tensor dw = torch::stable::new_empty(dx, {want_w ? p.d : 0}, grad_dtype);
    Tensor db = torch::stable::new_empty(dx, {want_b ? p.d : 0}, grad_dtype);
    const cudaStream_t stream = CurrentCudaStream(dx);
    CheckLaunch(name, launch(MutPtr<float>(partial), stream));
    WithParamGradOut<W, float>(dw, db, want_w, want_b, [&](auto out) {
      CheckLaunch(name, ParamGradFinalize(ConstPtr<float>(partial), chunks, p.d, out,
                                          MutPtr<float>(partial) + sums, stream));
    });
    return std::array<Tensor, 2>{dw, db};
  };
  if (p.row_tiers) {
    const auto a = RowArgsOf<RowArgsFor<Op>>(p, outs);
    std::optional<FusedSumPlan> plan;
    CheckPlan(name, PlanRowsWithSums<Op>(a, &plan));
    if (!plan.has_value()) return std::nullopt;
    LogPlan(name, a.rows, a.n, [&] { return Describe(*plan); });
    return run(plan->chunks, [&](float* partial, cudaStream_t stream) {
      return LaunchRowsWithSums(a, op, *plan, partial, stream);
    });
  }
  if constexpr (kStrided) {
    const auto a = StridedArgsOf<StridedArgsFor<Op>>(p, outs);
    std::optional<StridedSumPlan> plan;
    CheckPlan(name, PlanStridedWithSums<Op>(a, &plan));
    if (!plan.has_value()) return std::nullopt;
    LogPlan(name, p.outer * p.inner, p.d, [&] { return Describe(*plan); });
    return run(plan->chunks, [&](float* partial, cudaStream_t stream) {
      return LaunchStridedWithSums(a, op, *plan, partial, stream);
    });
  }
  return std::nullopt;
}

// Parameter gradients dweight / dbias (each requested one of shape (d,)) from x = p.in[0],
// dy = p.in[1] and the saved statistics, in `grad_dtype` (ParamGradDtype; W is the
// parameters' type). Unrequested ones are of shape (0,); a problem without rows gives zeros.
template <typename T, typename W, int kIn>
std::array<Tensor, 2> ParamGrads(const char* name, const Problem<kIn>& p, const Tensor& stats,
                                 bool want_w, bool want_b, ScalarType grad_dtype) {
  static_assert(kIn >= 2, "x and dy are operands 0 and 1");
  const Tensor& x = p.in[0];
  const ScalarType acc = AccDtype(x);
  // The float32 residual stream's dy is 16-bit beside a float32 x: these kernels read both as
  // x's type, so it is converted first (the fused path reads it as stored; this path runs
  // where that one does not apply).
  Problem<kIn> q = p;
  if (p.in[1].scalar_type() != x.scalar_type()) {
    q.in[1] = Contiguous(torch::stable::to(p.in[1], x.scalar_type()));
    q.stride[1][0] = p.d * p.inner;
    q.stride[1][1] = p.row_tiers ? 1 : p.inner;
    q.stride[1][2] = p.row_tiers ? 0 : 1;
  }
  // CUDA: the finalize writes grad_dtype; the CPU sums in double and casts.
  const ScalarType sums_dtype = p.cuda ? grad_dtype : acc;
  Tensor dw = torch::stable::new_empty(x, {want_w ? p.d : 0}, sums_dtype);
  Tensor db = torch::stable::new_empty(x, {want_b ? p.d : 0}, sums_dtype);
  if (want_w || want_b) {
    auto fill = [&](auto acc_tag) {
      using Acc = decltype(acc_tag);
      ParamGradArgs<T, Acc> a{};
      a.x = ConstPtr<T>(q.in[0]);
      a.dy = ConstPtr<T>(q.in[1]);
      for (int k = 0; k < 3; ++k) {
        a.x_stride[k] = q.stride[0][k];
        a.dy_stride[k] = q.stride[1][k];
      }
      a.stats = static_cast<const Acc*>(stats.data_ptr());
      a.outer = p.outer;
      a.d = p.d;
      a.inner = p.inner;
      a.weight = want_w;
      a.bias = want_b;
      if (!p.cuda) {
        const ParamGradOut<Acc> out{want_w ? MutPtr<Acc>(dw) : nullptr,
                                    want_b ? MutPtr<Acc>(db) : nullptr};
        // Columns split like rows: each column sums outer * inner rows' terms.
        ParallelRows(p.d, p.outer * p.inner,
                     [&](int64_t begin, int64_t end) { ParamGradCpu<T, Acc>(a, out, begin, end); });
      } else if constexpr (std::is_same_v<Acc, AccType<T>>) {
        const int64_t scratch = ParamGradScratch(p.outer * p.inner, p.d);
        Tensor partial = torch::stable::new_empty(x, {std::max<int64_t>(1, scratch)}, acc);
        WithParamGradOut<W, Acc>(dw, db, want_w, want_b, [&](auto out) {
          CheckLaunch(name, ParamGrad<T, Acc>(a, out, static_cast<Acc*>(partial.data_ptr()),
                                              CurrentCudaStream(x)));
        });
      } else {
        // AccDtype gives CUDA tensors AccType<T>; only the CPU accumulates in double.
        ROWNORM_CHECK(false, name, ": internal error: no CUDA parameter-gradient kernel for ",
                      DtypeName(x.scalar_type()), " with ", DtypeName(acc), " accumulation");
      }
    };
    if (acc == ScalarType::Double) {
      fill(double{});
    } else {
      fill(float{});
    }
  }
  if (sums_dtype != grad_dtype) {
    dw = torch::stable::to(dw, grad_dtype);
    db = torch::stable::to(db, grad_dtype);
  }
  return {dw, db};
}

// RowNormGrads for element type T (x's; float for the float32 residual stream, whose ops hold
// every operand as float) and parameter type W.
template <typename T, typename W, bool kStrided, int kIn, int kOut, class MakeOp>
std::array<Tensor, 2> RowNormGradsAs(const char* name, const Problem<kIn>& p,
                                     const Tensor (&outs)[kOut], ScalarType grad_dtype, bool want_w,
                                     bool want_b, MakeOp make,
                                     const std::optional<Tensor>& saved = std::nullopt) {
  const Tensor& x = p.in[0];
  const bool empty = x.numel() == 0;
  if constexpr (!std::is_same_v<T, double>) {  // float64 has no fused path
    if ((want_w || want_b) && !empty) {
      const auto op = make(T{}, W{}, float{}, static_cast<float*>(nullptr));
      const std::optional<std::array<Tensor, 2>> grads =
          FusedParamGrads<W, kStrided>(name, p, outs, op, want_w, want_b, grad_dtype);
      if (grads.has_value()) return *grads;
    }
  }
  const bool save_stats = want_w && !empty && !saved.has_value();
  Tensor stats = saved.has_value() ? *saved : NewStats(x, save_stats ? p.outer * p.inner : 0);
  if (!empty) {
    RunOp<T, kStrided>(name, p, outs, [&](auto acc) {
      using Acc = decltype(acc);
      return make(T{}, W{}, acc, save_stats ? static_cast<Acc*>(stats.data_ptr()) : nullptr);
    });
  }
  return ParamGrads<T, W>(name, p, stats, want_w, want_b, grad_dtype);
}

// The backward of a normalization with per-column parameters (rms_norm, add_rms_norm,
// layer_norm): writes the op's row outputs `outs` (dx, a new tensor of x's shape; the float32
// residual stream's backward also x's 16-bit gradient) and returns {dweight, dbias} as
// ParamGrads does, in `grad_dtype` (ParamGradDtype). Where a parameter gradient is wanted and
// PlanRowsWithSums plans the fused path, one pass writes dx and the column sums; otherwise the
// backward op saves per-row statistics (when dweight is wanted) for ParamGrads. `make(T{}, W{},
// Acc{}, stats)` returns the backward op for element type T, parameter type W and accumulator Acc,
// saving its statistics to `stats` (an Acc*, nullptr: none). kStrided as in RunOp.
//
// `saved`: the forward's per-row statistics (NewRowStats's layout), which the op reads itself;
// then the two-pass path reads them too and `make` is given nullptr.
template <bool kStrided, int kIn, int kOut, class MakeOp>
std::array<Tensor, 2> RowNormGrads(const char* name, const Problem<kIn>& p,
                                   const Tensor (&outs)[kOut], ScalarType param_dtype,
                                   ScalarType grad_dtype, bool want_w, bool want_b, MakeOp make,
                                   const std::optional<Tensor>& saved = std::nullopt) {
  std::array<Tensor, 2> grads;
  DispatchFloating(p.in[0].scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    DispatchParam<T>(param_dtype, [&](auto wtag) {
      grads = RowNormGradsAs<T, decltype(wtag), kStrided>(name, p, outs, grad_dtype, want_w, want_b,
                                                          make, saved);
    });
  });
  return grads;
}

// Registers the kernels that `impls(m)` gives m (a torch::stable library) for CPU and for CUDA
// tensors: every binding serves both, branching on the tensor's device.
#define ROWNORM_IMPL_CPU_AND_CUDA(impls)                   \
  STABLE_TORCH_LIBRARY_IMPL(rownorm, CPU, m) { impls(m); } \
  STABLE_TORCH_LIBRARY_IMPL(rownorm, CUDA, m) { impls(m); }

// ---- the bodies of the op bindings ----------------------------------------------------------

// A scalar argument of an op as its struct holds it: eps and other reals (weight_offset) in the
// accumulator type, flags (mean, log, rms_norm's casting mode) as they are.
template <typename Acc>
Acc OpScalar(double v) {
  return static_cast<Acc>(v);
}
template <typename Acc>
bool OpScalar(bool v) {
  return v;
}

// An op's per-row statistics output (a tensor of AccDtype(x), or none), given to the op as its
// data pointer in the accumulator type (nullptr: none).
struct RowStatsOut {
  const Tensor* stats;
};
template <typename Acc>
Acc* OpScalar(RowStatsOut s) {
  return s.stats == nullptr ? nullptr : static_cast<Acc*>(s.stats->data_ptr());
}

// What every binding writing new outputs of x's shape does after its checks, on x's device
// (the caller's DeviceScope): allocates kOut outputs in x's dtype and runs the op
// `make(T{}, W{}, Acc{})` over `ins` (x, then the same-shaped inputs the op reads) along dim,
// where T is x's element type and W the kernel type of parameters of dtype `param_dtype` (x's
// dtype for an op without parameters). Nothing runs for an empty x. kStrided as in RunOp.
template <int kOut, bool kStrided, int kIn, class MakeOp>
std::array<Tensor, kOut> RunNewOutputs(const char* name, const Tensor (&ins)[kIn], int64_t dim,
                                       ScalarType param_dtype, MakeOp make) {
  const Tensor& x = ins[0];
  Tensor outs[kOut];
  for (Tensor& o : outs) o = NewLike(x);
  if (x.numel() > 0) {
    const Problem<kIn> p = MakeProblem(ins, dim);
    DispatchFloating(x.scalar_type(), [&](auto tag) {
      using T = decltype(tag);
      DispatchParam<T>(param_dtype, [&](auto wtag) {
        RunOp<T, kStrided>(name, p, outs, [&](auto acc) { return make(tag, wtag, acc); });
      });
    });
  }
  std::array<Tensor, kOut> result;
  for (int j = 0; j < kOut; ++j) result[j] = outs[j];
  return result;
}

// The binding of an op without per-column parameters (l2 / l1 normalize, softmax, and their
// backward ops): Op<T, Acc>{scalars...} over `ins` along dim, written to a new tensor like x.
template <template <typename, typename> class Op, int kIn, typename... Scalars>
Tensor RunRowOp(const char* name, const Tensor (&ins)[kIn], int64_t dim, Scalars... scalars) {
  const DeviceScope scope(ins[0]);
  return RunNewOutputs<1, true>(name, ins, dim, ins[0].scalar_type(),
                                [&](auto tag, auto, auto acc) {
                                  using Acc = decltype(acc);
                                  return Op<decltype(tag), Acc>{OpScalar<Acc>(scalars)...};
                                })[0];
}

// Op{eps, the kernel pointers of `params` (nullptr where absent)..., extra...}.
template <class Op, typename W, typename Acc, size_t kParams, size_t... I, typename... Extra>
Op WithParams(Acc eps, const std::optional<Tensor> (&params)[kParams], std::index_sequence<I...>,
              Extra... extra) {
  return Op{eps, ParamPtr<W>(params[I])..., extra...};
}

// The forward binding of an op with per-column parameters (rms_norm, layer_norm, add_rms_norm):
// Op<T, Acc, W>{eps, parameter pointers..., OpScalar(scalars)...} over `ins` along dim, written
// to kOut new tensors like x; parameters run in ParamDtype. The scalars fill the op's fields
// after its parameters in order, a struct field (rms_norm's RmsNormScale) taking one per field
// of its own (brace elision).
template <template <typename, typename, typename> class Op, int kOut = 1, bool kStrided = true,
          int kIn, size_t kParams, typename... Scalars>
std::array<Tensor, kOut> RunParamOp(const char* name, const Tensor (&ins)[kIn], int64_t dim,
                                    const std::optional<Tensor> (&params)[kParams], double eps,
                                    Scalars... scalars) {
  const DeviceScope scope(ins[0]);
  const ScalarType pt = ParamDtype(ins[0], params);
  std::optional<Tensor> converted[kParams];
  for (size_t i = 0; i < kParams; ++i) converted[i] = ParamAs(params[i], pt);
  return RunNewOutputs<kOut, kStrided>(name, ins, dim, pt, [&](auto tag, auto wtag, auto acc) {
    using Acc = decltype(acc);
    return WithParams<Op<decltype(tag), Acc, decltype(wtag)>, decltype(wtag)>(
        static_cast<Acc>(eps), converted, std::make_index_sequence<kParams>{},
        OpScalar<Acc>(scalars)...);
  });
}

// The backward binding of an op with a weight (rms_norm, add_rms_norm, layer_norm): dx, a new
// tensor like x, and RowNormGrads's {dweight, dbias} from
// Op<T, Acc, W>{eps, weight, OpScalar(scalars)..., stats} over `ins` = {x, grad, ...} along dim.
template <template <typename, typename, typename> class Op, bool kStrided, int kIn,
          typename... Scalars>
std::array<Tensor, 3> RunParamGrads(const char* name, const Tensor (&ins)[kIn], int64_t dim,
                                    const std::optional<Tensor>& weight, double eps, bool want_w,
                                    bool want_b, Scalars... scalars) {
  const Tensor& x = ins[0];
  const DeviceScope scope(x);
  Tensor dx = NewLike(x);
  const ScalarType pt = ParamDtype(x, {weight});
  const std::optional<Tensor> w[1] = {ParamAs(weight, pt)};
  const Problem<kIn> p = MakeProblem(ins, dim);
  const std::array<Tensor, 2> grads = RowNormGrads<kStrided>(
      name, p, {dx}, pt, ParamGradDtype(x, pt, true), want_w, want_b,
      [&](auto tag, auto wtag, auto acc, auto* stats) {
        using Acc = decltype(acc);
        return WithParams<Op<decltype(tag), Acc, decltype(wtag)>, decltype(wtag)>(
            static_cast<Acc>(eps), w, std::make_index_sequence<1>{}, OpScalar<Acc>(scalars)...,
            stats);
      });
  return {dx, grads[0], grads[1]};
}

}  // namespace rownorm
