// Bindings of rms_norm, add_rms_norm and their backward ops.
#include "kernels/rms_norm.cuh"
#include "bindings/rowwise.h"

namespace rownorm {
namespace {

// F.rms_norm's default eps: the epsilon of the accumulation type, torch.finfo(float32).eps
// for float32 and 16-bit x (what torch computes, although its docs say finfo(x.dtype)) and
// torch.finfo(float64).eps for float64.
double DefaultEps(ScalarType t) {
  return t == ScalarType::Double ? 2.220446049250313e-16 : 1.1920928955078125e-07;
}

double ResolveEps(const char* op, const Tensor& x, std::optional<double> eps) {
  const double e = eps.has_value() ? *eps : DefaultEps(x.scalar_type());
  CheckEps(op, e);
  return e;
}

// weight_offset c scales by (w + c): it needs a weight (without one the scale is 1).
void CheckWeightOffset(const char* op, const std::optional<Tensor>& weight, double offset) {
  ROWNORM_CHECK(weight.has_value() || offset == 0, op,
                ": weight_offset needs a weight, got weight=None and weight_offset=", offset);
}

// The schema's casting_mode: "once" (ŷ·w rounded once) or "llama" (ŷ rounded to x's dtype, then
// multiplied by the weight and rounded again); whether ŷ is rounded first.
bool RoundsNormalized(const char* op, const std::string& casting_mode) {
  ROWNORM_CHECK(casting_mode == "once" || casting_mode == "llama", op,
                ": casting_mode must be 'once' or 'llama', got '", casting_mode, "'");
  return casting_mode == "llama";
}

// rms_norm's backward op reading kIn inputs: x, dy and (add_rms_norm) the gradient of h.
template <int kIn>
struct RmsNormBwd {
  template <typename T, typename Acc, typename W>
  using Op = RmsNormBwdOp<T, Acc, W, kIn>;
};

// dx = rms_norm_backward(grad, x) (+ ins[2], the gradient of add_rms_norm's second output),
// and dweight when asked.
template <int kIn>
std::tuple<Tensor, Tensor> RmsNormGrads(const char* op, const Tensor (&ins)[kIn],
                                        const std::optional<Tensor>& weight, int64_t dim,
                                        double eps, bool weight_grad, double weight_offset) {
  const std::array<Tensor, 3> g = RunParamGrads<RmsNormBwd<kIn>::template Op, kIn == 2>(
      op, ins, dim, weight, eps, weight_grad, false, weight_offset);
  return {g[0], g[1]};
}

Tensor RmsNorm(Tensor x, std::optional<Tensor> weight, int64_t dim, std::optional<double> eps,
               double weight_offset, std::string casting_mode) {
  constexpr const char* kOp = "rms_norm";
  dim = CheckRowwiseInput(kOp, "x", x, dim);
  const double e = ResolveEps(kOp, x, eps);
  CheckParam(kOp, "weight", weight, "x", x, dim);
  CheckWeightOffset(kOp, weight, weight_offset);
  const bool round = RoundsNormalized(kOp, casting_mode);
  // weight_offset and round: the op's RmsNormScale.
  return RunParamOp<RmsNormFwdOp>(kOp, {x}, dim, {weight}, e, weight_offset, round)[0];
}

std::tuple<Tensor, Tensor> RmsNormBackward(Tensor grad, Tensor x, std::optional<Tensor> weight,
                                           int64_t dim, double eps, bool weight_grad,
                                           double weight_offset) {
  constexpr const char* kOp = "rms_norm_backward";
  dim = CheckWeightedBackward(kOp, grad, std::nullopt, "x", x, weight, dim, eps, weight_grad);
  CheckWeightOffset(kOp, weight, weight_offset);
  return RmsNormGrads<2>(kOp, {x, grad}, weight, dim, eps, weight_grad, weight_offset);
}

// The float32 residual stream of a pre-norm model: a 16-bit x (a block's output) added to a
// float32 residual; the sum r stays float32 and the norm has x's dtype. Its backward reads r,
// the gradient of the norm (x's dtype) and that of r (float32). Whether `narrow` (x, or the
// backward's grad) and `wide` (the residual, or r) are its two sides.
bool IsResidualStream(const Tensor& narrow, const Tensor& wide) {
  return Is16Bit(narrow.scalar_type()) && wide.scalar_type() == ScalarType::Float;
}

// add_rms_norm on the float32 residual stream: one pass reads x (T) and the residual (float32)
// and writes out (T) and r (float32), r = x + residual in float32 (AddRmsNormFwdOp<..., R =
// float>, whose inputs are (residual, x)).
std::tuple<Tensor, Tensor> AddRmsNormStream(const char* op, const Tensor& x, const Tensor& residual,
                                            const std::optional<Tensor>& weight, int64_t dim,
                                            double eps, double weight_offset, bool round) {
  const DeviceScope scope(x);
  const ScalarType pt = ParamDtype(x, {weight});
  const std::optional<Tensor> w[1] = {ParamAs(weight, pt)};
  Tensor outs[2] = {NewLike(x), NewLike(residual)};
  if (x.numel() > 0) {
    const Problem<2> p = MakeProblem<2>({residual, x}, dim);
    DispatchFloating(x.scalar_type(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) {
        DispatchParam<T>(pt, [&](auto wtag) {
          using W = decltype(wtag);
          RunOp<float, false>(op, p, outs, [&](auto acc) {
            using Acc = decltype(acc);
            return WithParams<AddRmsNormFwdOp<T, Acc, W, float>, W>(
                static_cast<Acc>(eps), w, std::make_index_sequence<1>{},
                static_cast<Acc>(weight_offset), round);
          });
        });
      }
    });
  }
  return {outs[0], outs[1]};
}

std::tuple<Tensor, Tensor> AddRmsNorm(Tensor x, Tensor residual, std::optional<Tensor> weight,
                                      std::optional<double> eps, double weight_offset,
                                      std::string casting_mode) {
  constexpr const char* kOp = "add_rms_norm";
  const int64_t dim = CheckRowwiseInput(kOp, "x", x, -1);
  const double e = ResolveEps(kOp, x, eps);
  // A 16-bit x's residual may be float32 (the residual stream).
  const std::optional<ScalarType> stream =
      Is16Bit(x.scalar_type()) ? std::optional(ScalarType::Float) : std::nullopt;
  CheckLike(kOp, "residual", residual, "x", x, stream);
  CheckParam(kOp, "weight", weight, "x", x, dim);
  CheckWeightOffset(kOp, weight, weight_offset);
  const bool round = RoundsNormalized(kOp, casting_mode);
  if (IsResidualStream(x, residual)) {
    return AddRmsNormStream(kOp, x, residual, weight, dim, e, weight_offset, round);
  }
  const std::array<Tensor, 2> out = RunParamOp<AddRmsNormFwdOp, 2, false>(
      kOp, {x, residual}, dim, {weight}, e, weight_offset, round);
  return {out[0], out[1]};
}

// The float32 residual stream's backward: d_r (float32, r's dtype) = grad_residual + rms_norm's
// dx(grad, r) and x's gradient, the same values rounded to grad's (x's) 16-bit dtype, from one
// pass that reads grad as stored; and dweight. The parameters run as x's would (ParamDtype of
// grad: in its dtype, or float32 beside a float32 weight), and dweight comes back in it.
std::tuple<Tensor, Tensor, Tensor> AddRmsNormStreamGrads(const char* op, const Tensor& grad,
                                                         const std::optional<Tensor>& grad_residual,
                                                         const Tensor& r,
                                                         const std::optional<Tensor>& weight,
                                                         int64_t dim, double eps, bool weight_grad,
                                                         double weight_offset) {
  const DeviceScope scope(r);
  const Tensor outs[2] = {NewLike(r), NewLike(grad)};
  const ScalarType pt = ParamDtype(grad, {weight});
  const std::optional<Tensor> w[1] = {ParamAs(weight, pt)};
  std::array<Tensor, 2> g;
  auto run = [&](auto tag, const auto& p) {
    using T = decltype(tag);
    constexpr int kIn = std::tuple_size_v<decltype(p.in)>;
    DispatchParam<T>(pt, [&](auto wtag) {
      using W = decltype(wtag);
      // The op holds every operand as float: element type float.
      g = RowNormGradsAs<float, W, false>(
          op, p, outs, ParamGradDtype(grad, pt, true), weight_grad, false,
          [&](auto, auto, auto acc, auto* stats) {
            using Acc = decltype(acc);
            return WithParams<RmsNormBwdOp<T, Acc, W, kIn, float>, W>(
                static_cast<Acc>(eps), w, std::make_index_sequence<1>{},
                static_cast<Acc>(weight_offset), stats);
          });
    });
  };
  DispatchFloating(grad.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) {
      if (grad_residual.has_value()) {
        run(tag, MakeProblem<3>({r, grad, *grad_residual}, dim));
      } else {
        run(tag, MakeProblem<2>({r, grad}, dim));
      }
    }
  });
  return {outs[0], outs[1], g[0]};
}

// The checks both backward ops share; returns the reduced dim. `stream`: whether grad and r are
// the float32 residual stream's (grad 16-bit, r float32), which the checks then accept.
int64_t CheckAddRmsNormBackward(const char* op, const Tensor& grad,
                                const std::optional<Tensor>& grad_residual, const Tensor& r,
                                const std::optional<Tensor>& weight, double eps, bool weight_grad,
                                double weight_offset, bool stream) {
  const int64_t dim =
      CheckWeightedBackward(op, grad, grad_residual, "r", r, weight, -1, eps, weight_grad,
                            stream ? std::optional(grad.scalar_type()) : std::nullopt);
  CheckWeightOffset(op, weight, weight_offset);
  return dim;
}

std::tuple<Tensor, Tensor> AddRmsNormBackward(Tensor grad, std::optional<Tensor> grad_residual,
                                              Tensor r, std::optional<Tensor> weight, double eps,
                                              bool weight_grad, double weight_offset) {
  constexpr const char* kOp = "add_rms_norm_backward";
  // The float32 residual stream: r (and grad_residual) float32, grad of x's 16-bit dtype.
  const bool stream = IsResidualStream(grad, r);
  const int64_t dim = CheckAddRmsNormBackward(kOp, grad, grad_residual, r, weight, eps, weight_grad,
                                              weight_offset, stream);
  if (stream) {
    // The stream's one kernel also writes x's 16-bit gradient, which this op does not return
    // (add_rms_norm_stream_backward does; autograd calls that one).
    const auto [dr, dx, dw] = AddRmsNormStreamGrads(kOp, grad, grad_residual, r, weight, dim, eps,
                                                    weight_grad, weight_offset);
    return {dr, dw};
  }
  if (grad_residual.has_value()) {
    return RmsNormGrads<3>(kOp, {r, grad, *grad_residual}, weight, dim, eps, weight_grad,
                           weight_offset);
  }
  return RmsNormGrads<2>(kOp, {r, grad}, weight, dim, eps, weight_grad, weight_offset);
}

std::tuple<Tensor, Tensor, Tensor> AddRmsNormStreamBackward(Tensor grad,
                                                            std::optional<Tensor> grad_residual,
                                                            Tensor r, std::optional<Tensor> weight,
                                                            double eps, bool weight_grad,
                                                            double weight_offset) {
  constexpr const char* kOp = "add_rms_norm_stream_backward";
  const bool stream = IsResidualStream(grad, r);
  const int64_t dim = CheckAddRmsNormBackward(kOp, grad, grad_residual, r, weight, eps, weight_grad,
                                              weight_offset, stream);
  ROWNORM_CHECK(stream, kOp,
                ": expected the float32 residual stream, grad float16 or bfloat16 and r "
                "float32, got grad ",
                DtypeName(grad.scalar_type()), " and r ", DtypeName(r.scalar_type()),
                " (add_rms_norm_backward serves the other dtypes)");
  return AddRmsNormStreamGrads(kOp, grad, grad_residual, r, weight, dim, eps, weight_grad,
                               weight_offset);
}

template <class Library>
void Impls(Library& m) {
  m.impl("rms_norm", TORCH_BOX(&RmsNorm));
  m.impl("rms_norm_backward", TORCH_BOX(&RmsNormBackward));
  m.impl("add_rms_norm", TORCH_BOX(&AddRmsNorm));
  m.impl("add_rms_norm_backward", TORCH_BOX(&AddRmsNormBackward));
  m.impl("add_rms_norm_stream_backward", TORCH_BOX(&AddRmsNormStreamBackward));
}

}  // namespace

ROWNORM_IMPL_CPU_AND_CUDA(Impls)

}  // namespace rownorm
