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

template <typename T, typename Acc>
RmsNormScale<T, Acc> ScaleOf(double weight_offset, bool round_normalized) {
  return {static_cast<Acc>(weight_offset), round_normalized};
}

Tensor RmsNorm(Tensor x, std::optional<Tensor> weight, int64_t dim, std::optional<double> eps,
               double weight_offset, std::string casting_mode) {
  constexpr const char* kOp = "rms_norm";
  dim = CheckRowwiseInput(kOp, x, dim);
  const double e = ResolveEps(kOp, x, eps);
  CheckParam(kOp, "weight", weight, x, dim);
  CheckWeightOffset(kOp, weight, weight_offset);
  const bool round = RoundsNormalized(kOp, casting_mode);
  const DeviceScope scope(x);
  Tensor y = NewLike(x);
  if (x.numel() == 0) return y;
  const ScalarType pt = ParamDtype(x, {weight ? &*weight : nullptr});
  const std::optional<Tensor> w = ParamAs(weight, pt);
  const Problem<1> p = MakeProblem<1>({x}, dim);
  DispatchFloating(x.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    DispatchParam<T>(pt, [&](auto wtag) {
      using W = decltype(wtag);
      RunOp<T>(kOp, p, {y}, [&](auto acc) {
        using Acc = decltype(acc);
        return RmsNormFwdOp<T, Acc, W>{static_cast<Acc>(e), ParamPtr<W>(w),
                                       ScaleOf<T, Acc>(weight_offset, round)};
      });
    });
  });
  return y;
}

// dx = rms_norm_backward(grad, x) (+ extra, the gradient of add_rms_norm's second output),
// and dweight when asked.
template <int kIn>
std::tuple<Tensor, Tensor> RmsNormGrads(const char* op, const std::array<Tensor, kIn>& ins,
                                        const std::optional<Tensor>& weight, int64_t dim,
                                        double eps, bool weight_grad, double weight_offset) {
  const Tensor& x = ins[0];
  const DeviceScope scope(x);
  Tensor dx = NewLike(x);
  const ScalarType pt = ParamDtype(x, {weight ? &*weight : nullptr});
  const std::optional<Tensor> w = ParamAs(weight, pt);
  const Problem<kIn> p = MakeProblem<kIn>(ins, dim);
  const std::array<Tensor, 2> grads = RowNormGrads<kIn == 2>(
      op, p, dx, pt, weight_grad, false, [&](auto tag, auto wtag, auto acc, auto* stats) {
        using T = decltype(tag);
        using W = decltype(wtag);
        using Acc = decltype(acc);
        return RmsNormBwdOp<T, Acc, W, kIn>{static_cast<Acc>(eps), ParamPtr<W>(w),
                                            static_cast<Acc>(weight_offset), stats};
      });
  return {dx, grads[0]};
}

std::tuple<Tensor, Tensor> RmsNormBackward(Tensor grad, Tensor x, std::optional<Tensor> weight,
                                           int64_t dim, double eps, bool weight_grad,
                                           double weight_offset) {
  constexpr const char* kOp = "rms_norm_backward";
  dim = CheckRowwiseInput(kOp, x, dim);
  CheckEps(kOp, eps);
  CheckLike(kOp, "grad", grad, x);
  CheckParam(kOp, "weight", weight, x, dim);
  ROWNORM_CHECK(!weight_grad || weight.has_value(), kOp,
                ": weight_grad=True needs the weight, got weight=None");
  CheckWeightOffset(kOp, weight, weight_offset);
  return RmsNormGrads<2>(kOp, {x, grad}, weight, dim, eps, weight_grad, weight_offset);
}

void CheckAddInputs(const char* op, const Tensor& x) {
  CheckFloating(op, "x", x);
  ROWNORM_CHECK(x.dim() >= 1, op, ": x must have at least one dimension, got a 0-d tensor");
}

std::tuple<Tensor, Tensor> AddRmsNorm(Tensor x, Tensor residual, std::optional<Tensor> weight,
                                      std::optional<double> eps, double weight_offset,
                                      std::string casting_mode) {
  constexpr const char* kOp = "add_rms_norm";
  CheckAddInputs(kOp, x);
  CheckLike(kOp, "residual", residual, x);
  const int64_t dim = x.dim() - 1;
  const double e = ResolveEps(kOp, x, eps);
  CheckParam(kOp, "weight", weight, x, dim);
  CheckWeightOffset(kOp, weight, weight_offset);
  const bool round = RoundsNormalized(kOp, casting_mode);
  const DeviceScope scope(x);
  Tensor y = NewLike(x);
  Tensor h = NewLike(x);
  if (x.numel() == 0) return {y, h};
  const ScalarType pt = ParamDtype(x, {weight ? &*weight : nullptr});
  const std::optional<Tensor> w = ParamAs(weight, pt);
  const Problem<2> p = MakeProblem<2>({x, residual}, dim);
  DispatchFloating(x.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    DispatchParam<T>(pt, [&](auto wtag) {
      using W = decltype(wtag);
      RunOp<T, false>(kOp, p, {y, h}, [&](auto acc) {
        using Acc = decltype(acc);
        return AddRmsNormFwdOp<T, Acc, W>{static_cast<Acc>(e), ParamPtr<W>(w),
                                          ScaleOf<T, Acc>(weight_offset, round)};
      });
    });
  });
  return {y, h};
}

std::tuple<Tensor, Tensor> AddRmsNormBackward(Tensor grad, std::optional<Tensor> grad_residual,
                                              Tensor r, std::optional<Tensor> weight, double eps,
                                              bool weight_grad, double weight_offset) {
  constexpr const char* kOp = "add_rms_norm_backward";
  CheckAddInputs(kOp, r);
  CheckEps(kOp, eps);
  CheckLike(kOp, "grad", grad, r);
  const int64_t dim = r.dim() - 1;
  CheckParam(kOp, "weight", weight, r, dim);
  ROWNORM_CHECK(!weight_grad || weight.has_value(), kOp,
                ": weight_grad=True needs the weight, got weight=None");
  CheckWeightOffset(kOp, weight, weight_offset);
  if (grad_residual.has_value()) {
    CheckLike(kOp, "grad_residual", *grad_residual, r);
    return RmsNormGrads<3>(kOp, {r, grad, *grad_residual}, weight, dim, eps, weight_grad,
                           weight_offset);
  }
  return RmsNormGrads<2>(kOp, {r, grad}, weight, dim, eps, weight_grad, weight_offset);
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(rownorm, CPU, m) {
  m.impl("rms_norm", TORCH_BOX(&RmsNorm));
  m.impl("rms_norm_backward", TORCH_BOX(&RmsNormBackward));
  m.impl("add_rms_norm", TORCH_BOX(&AddRmsNorm));
  m.impl("add_rms_norm_backward", TORCH_BOX(&AddRmsNormBackward));
}

STABLE_TORCH_LIBRARY_IMPL(rownorm, CUDA, m) {
  m.impl("rms_norm", TORCH_BOX(&RmsNorm));
  m.impl("rms_norm_backward", TORCH_BOX(&RmsNormBackward));
  m.impl("add_rms_norm", TORCH_BOX(&AddRmsNorm));
  m.impl("add_rms_norm_backward", TORCH_BOX(&AddRmsNormBackward));
}

}  // namespace rownorm
