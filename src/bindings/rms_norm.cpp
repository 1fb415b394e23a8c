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

std::tuple<Tensor, Tensor> AddRmsNorm(Tensor x, Tensor residual, std::optional<Tensor> weight,
                                      std::optional<double> eps, double weight_offset,
                                      std::string casting_mode) {
  constexpr const char* kOp = "add_rms_norm";
  const int64_t dim = CheckRowwiseInput(kOp, "x", x, -1);
  const double e = ResolveEps(kOp, x, eps);
  CheckLike(kOp, "residual", residual, "x", x);
  CheckParam(kOp, "weight", weight, "x", x, dim);
  CheckWeightOffset(kOp, weight, weight_offset);
  const bool round = RoundsNormalized(kOp, casting_mode);
  const std::array<Tensor, 2> out = RunParamOp<AddRmsNormFwdOp, 2, false>(
      kOp, {x, residual}, dim, {weight}, e, weight_offset, round);
  return {out[0], out[1]};
}

std::tuple<Tensor, Tensor> AddRmsNormBackward(Tensor grad, std::optional<Tensor> grad_residual,
                                              Tensor r, std::optional<Tensor> weight, double eps,
                                              bool weight_grad, double weight_offset) {
  constexpr const char* kOp = "add_rms_norm_backward";
  const int64_t dim =
      CheckWeightedBackward(kOp, grad, grad_residual, "r", r, weight, -1, eps, weight_grad);
  CheckWeightOffset(kOp, weight, weight_offset);
  if (grad_residual.has_value()) {
    return RmsNormGrads<3>(kOp, {r, grad, *grad_residual}, weight, dim, eps, weight_grad,
                           weight_offset);
  }
  return RmsNormGrads<2>(kOp, {r, grad}, weight, dim, eps, weight_grad, weight_offset);
}

template <class Library>
void Impls(Library& m) {
  m.impl("rms_norm", TORCH_BOX(&RmsNorm));
  m.impl("rms_norm_backward", TORCH_BOX(&RmsNormBackward));
  m.impl("add_rms_norm", TORCH_BOX(&AddRmsNorm));
  m.impl("add_rms_norm_backward", TORCH_BOX(&AddRmsNormBackward));
}

}  // namespace

ROWNORM_IMPL_CPU_AND_CUDA(Impls)

}  // namespace rownorm
