// rownorm::plan_info and rownorm::plan_row_tier: the plan a call gets, described by the planning
// code the launchers run (kernels/common/plan.h through PlanRows / PlanRowsWithSums /
// PlanStrided / PlanStridedWithSums of the op's own instantiation), so a description cannot
// drift from what launches.
//
// A description is `key=value` words: path (cpu, rows, strided, empty), rows, n, and for the
// row tiers tier, vec (elements per load), lanes_per_row (group tier), threads (per CTA),
// cluster (CTAs per row), packs (16-byte packs per thread held in registers); for the backward
// with parameter gradients param_grads (fused: one pass with chunks partials per column sum;
// two-pass: per-row statistics, then kernels/param_grad.h).
#include <string>

#include "bindings/rowwise.h"
#include "kernels/l1_normalize.cuh"
#include "kernels/l2_normalize.cuh"
#include "kernels/layer_norm.cuh"
#include "kernels/rms_norm.cuh"
#include "kernels/softmax.cuh"

namespace rownorm {
namespace {

constexpr const char* kName = "plan_info";
constexpr const char* kOps =
    "l2_normalize, l1_normalize, rms_norm, add_rms_norm, layer_norm, softmax, log_softmax";

// The op types of one op name for element type T (parameters of x's dtype): Fwd, Bwd, and
// whether the op reduces any dim (kStrided) and has fused parameter gradients (kSums).
template <class FwdOp, class BwdOp, bool kStridedOk, bool kSumsOk>
struct OpTypes {
  using Fwd = FwdOp;
  using Bwd = BwdOp;
  static constexpr bool kStrided = kStridedOk;
  static constexpr bool kSums = kSumsOk;
};

// Plans `Op` for x and kIn - 1 other operands that are new contiguous tensors like x (a grad
// from autograd, a residual), writing into a new output, as the op's binding would.
template <class Op, bool kStrided, bool kSums>
std::string DescribeOp(const Tensor& x, int64_t dim, bool param_grads) {
  using T = typename Op::Elem;
  constexpr int kIn = Op::kIn;
  Tensor ins[kIn];
  ins[0] = x;
  for (int i = 1; i < kIn; ++i) ins[i] = NewLike(x);
  const Problem<kIn> p = MakeProblem(ins, dim);
  constexpr int kOut = OpTraits<Op>::kOut;
  using TOut = OpOutElem<Op>;
  Tensor outs[kOut];
  for (Tensor& o : outs) o = NewLike(x, DtypeOf<TOut>());
  const std::string size =
      " rows=" + std::to_string(p.outer * p.inner) + " n=" + std::to_string(p.d);
  const std::string two_pass = param_grads ? " param_grads=two-pass" : "";
  if (!p.row_tiers) {
    ROWNORM_CHECK(kStrided, kName, ": internal error: the op reduces the last dim only");
    const auto a = StridedArgsOf<StridedArgsFor<Op>>(p, outs);
    if constexpr (kStrided && kSums && !std::is_same_v<T, double>) {
      if (param_grads) {
        std::optional<StridedSumPlan> fused;
        CheckPlan(kName, PlanStridedWithSums<Op>(a, &fused));
        if (fused.has_value()) return Describe(*fused) + size;
      }
    }
    StridedPlan plan;
    CheckPlan(kName, PlanStrided<Op>(a, &plan));
    return Describe(plan) + size + two_pass;
  }
  const auto a = RowArgsOf<RowArgsFor<Op>>(p, outs);
  if constexpr (kSums && !std::is_same_v<T, double>) {
    if (param_grads) {
      // The fused path runs Op itself (its Acc is float, as for every T but double).
      std::optional<FusedSumPlan> fused;
      CheckPlan(kName, PlanRowsWithSums<Op>(a, &fused));
      if (fused.has_value()) return Describe(*fused) + size;
    }
  }
  RowPlan plan;
  CheckPlan(kName, PlanRows<Op>(a, ParamBytesPerColumn<Op>(), &plan));
  return Describe(plan) + size + two_pass;
}

template <typename T, class F>
void WithOpTypes(const std::string& op, F&& f) {
  using Acc = AccType<T>;
  if (op == "l2_normalize") {
    f(OpTypes<L2NormalizeFwdOp<T, Acc>, L2NormalizeBwdOp<T, Acc>, true, false>{});
  } else if (op == "l1_normalize") {
    f(OpTypes<L1NormalizeFwdOp<T, Acc>, L1NormalizeBwdOp<T, Acc>, true, false>{});
  } else if (op == "rms_norm") {
    f(OpTypes<RmsNormFwdOp<T, Acc, T>, RmsNormBwdOp<T, Acc, T, 2>, true, true>{});
  } else if (op == "add_rms_norm") {
    // Both outputs receive a gradient (the residual stream does in training): dy, x, d(x + r).
    f(OpTypes<AddRmsNormFwdOp<T, Acc, T>, RmsNormBwdOp<T, Acc, T, 3>, false, true>{});
  } else if (op == "layer_norm") {
    f(OpTypes<LayerNormFwdOp<T, Acc, T>, LayerNormBwdOp<T, Acc, T>, true, true>{});
  } else if (op == "softmax" || op == "log_softmax") {
    f(OpTypes<SoftmaxFwdOp<T, Acc>, SoftmaxBwdOp<T, Acc>, true, false>{});
  } else {
    ROWNORM_CHECK(false, kName, ": op must be one of ", kOps, ", got '", op, "'");
  }
}

std::string PlanInfo(Tensor x, std::string op, int64_t dim, bool backward, bool param_grads) {
  bool has_params = false;  // WithOpTypes checks the name
  WithOpTypes<float>(op, [&](auto types) { has_params = decltype(types)::kSums; });
  dim = CheckRowwiseInput(kName, "x", x, dim);
  ROWNORM_CHECK(op != "add_rms_norm" || dim == x.dim() - 1, kName,
                ": add_rms_norm normalizes the last dim only, got dim=", dim, " for a ", x.dim(),
                "-d x");
  ROWNORM_CHECK(!param_grads || (backward && has_params), kName,
                ": param_grads=True needs backward=True and an op with parameters (rms_norm, "
                "add_rms_norm, layer_norm), got op='",
                op, "', backward=", backward ? "True" : "False");
  const StridedShape s = StridedShapeOf(x, dim);
  const std::string size =
      " rows=" + std::to_string(s.outer * s.inner) + " n=" + std::to_string(s.d);
  if (!x.is_cuda()) return "path=cpu" + size;
  if (x.numel() == 0) return "path=empty" + size;
  const DeviceScope scope(x);
  std::string text;
  DispatchFloating(x.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    WithOpTypes<T>(op, [&](auto types) {
      using Types = decltype(types);
      text = backward ? DescribeOp<typename Types::Bwd, Types::kStrided, Types::kSums>(x, dim,
                                                                                       param_grads)
                      : DescribeOp<typename Types::Fwd, Types::kStrided, false>(x, dim, false);
    });
  });
  return text;
}

// The tier table alone (PlanRowTier through PlanRowProblem), on any machine: rows of n elements
// of elem_size bytes whose operands allow full packs, of an op that may run the wide CTA
// (`wide`: OpTraits::kWideCta) and whose cluster rows hold cluster_packs packs a thread
// (OpTraits::kClusterPacks), wide_cluster_packs on the 16 x 512 cluster
// (OpTraits::kWideClusterPacks; 0: as cluster_packs).
std::string PlanRowTierInfo(int64_t n, int64_t elem_size, bool clusters, bool wide,
                            int64_t cluster_packs, int64_t wide_cluster_packs) {
  constexpr const char* kTable = "plan_row_tier";
  ROWNORM_CHECK(n >= 1, kTable, ": n must be >= 1, got ", n);
  ROWNORM_CHECK(elem_size == 2 || elem_size == 4 || elem_size == 8, kTable,
                ": elem_size must be 2, 4 or 8 (bytes), got ", elem_size);
  ROWNORM_CHECK(cluster_packs == kClusterVecs || cluster_packs == kClusterHalfVecs, kTable,
                ": cluster_packs must be ", kClusterVecs, " or ", kClusterHalfVecs, ", got ",
                cluster_packs);
  ROWNORM_CHECK(wide_cluster_packs == 0 || wide_cluster_packs == cluster_packs ||
                    wide_cluster_packs == kClusterVecs,
                kTable, ": wide_cluster_packs must be 0, ", kClusterVecs,
                " or cluster_packs (the 4-pack rows of the wide cluster follow those of 256 "
                "threads), got ",
                wide_cluster_packs, " with cluster_packs=", cluster_packs);
  const int size = static_cast<int>(elem_size);
  return Describe(PlanRowProblem(n, size, PackWidth(size), clusters, wide,
                                 static_cast<int>(cluster_packs),
                                 static_cast<int>(wide_cluster_packs))) +
         " rows=1 n=" + std::to_string(n);
}

template <class Library>
void Impls(Library& m) {
  m.impl("plan_info", TORCH_BOX(&PlanInfo));
}

}  // namespace

ROWNORM_IMPL_CPU_AND_CUDA(Impls)

STABLE_TORCH_LIBRARY_IMPL(rownorm, CompositeExplicitAutograd, m) {
  m.impl("plan_row_tier", TORCH_BOX(&PlanRowTierInfo));
}

}  // namespace rownorm
