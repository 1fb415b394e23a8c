// Planning: which kernel configuration runs a problem. Host-only, with no CUDA or torch header,
// so the launchers (dispatch.cuh), the plan log and rownorm.explain share this one code and the
// table can be exercised without a GPU (the rownorm::plan_row_tier op).
//
// THE TIER TABLE lives here (PlanRowTier) and nowhere else. A tier is chosen from the row
// length n, the element size and the GPU's architecture only -- never from the number of
// rows -- so a row's result does not depend on the batch it came in.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "kernels/common/args.h"

namespace rownorm {

constexpr int kPlanWarpSize = 32;  // = kWarpSize of the kernels (checked in dispatch.cuh)
constexpr int kPackBytes = 16;     // one pack: a 16-byte vector load / store

// Elements per pack: 4 fp32, 8 fp16 / bf16, 2 fp64 (= MaxPackWidth of pack.cuh).
constexpr int PackWidth(int elem_size) { return kPackBytes / elem_size; }

// ROWNORM_DISABLE_CLUSTERS=1 (read once per process) plans every row as on a GPU without
// thread-block clusters, as before sm_90: the pre-Hopper tier table, testable on a Hopper.
inline bool ClustersDisabled() {
  static const bool disabled = [] {
    const char* v = std::getenv("ROWNORM_DISABLE_CLUSTERS");
    return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
  }();
  return disabled;
}

// ROWNORM_PLAN_AS_N=m (read at every plan: benchmarks/tier_sweep.py sets it between calls)
// plans a row of n < m elements as a row of m: a configuration that holds m elements holds n,
// so this runs any configuration of the table above a row's own on that row, which is how the
// sweep that justifies each boundary times the next configuration at the boundary. A tool for
// measuring: results may differ in the last bits from the table's own configuration. Unset,
// empty or 0: the table as is.
inline int64_t PlanLengthFloor() {
  const char* v = std::getenv("ROWNORM_PLAN_AS_N");
  return v == nullptr ? 0 : std::max<int64_t>(0, std::strtoll(v, nullptr, 10));
}

// The cluster tier's kernels (dispatch.cuh has them and how PlanRowOp picks one per device):
// rows in registers, a cluster per row; rows in shared memory by bulk copies, persistent; rows
// in registers with the parameters read once per CTA, persistent (forwards with parameters).
enum class ClusterKind { kRegisters, kShared, kParams };

// ROWNORM_CLUSTER_ROWS=registers|shared|params (read at every plan, like ROWNORM_PLAN_AS_N)
// runs the cluster tier on that kernel where it exists for the op and fits the device, on the
// register one elsewhere: every path testable on a Hopper, and the A/B of them in one build.
// Unset or empty: PlanRowOp's choice; any other value too, said once on stderr (a measuring
// tool's knob, read below the op's argument checks).
inline std::optional<ClusterKind> ForcedClusterKind() {
  const char* v = std::getenv("ROWNORM_CLUSTER_ROWS");
  if (v == nullptr || v[0] == '\0') return std::nullopt;
  if (std::strcmp(v, "registers") == 0) return ClusterKind::kRegisters;
  if (std::strcmp(v, "shared") == 0) return ClusterKind::kShared;
  if (std::strcmp(v, "params") == 0) return ClusterKind::kParams;
  static const bool said = [v] {
    std::fprintf(stderr,
                 "rownorm: ROWNORM_CLUSTER_ROWS=%s is not one of registers, shared, params; "
                 "ignored\n",
                 v);
    return true;
  }();
  (void)said;
  return std::nullopt;
}

// ROWNORM_PARAM_GRADS=two-pass (read at every plan, like ROWNORM_PLAN_AS_N) runs every
// backward with parameter gradients on the two-pass path (per-row statistics, then
// kernels/param_grad.h), where PlanFusedSums would fuse them: the A/B of the two paths in one
// build. Unset or empty: the plan's choice; any other value too, said once on stderr.
inline bool ParamGradsTwoPass() {
  const char* v = std::getenv("ROWNORM_PARAM_GRADS");
  if (v == nullptr || v[0] == '\0') return false;
  if (std::strcmp(v, "two-pass") == 0) return true;
  static const bool said = [v] {
    std::fprintf(stderr, "rownorm: ROWNORM_PARAM_GRADS=%s is not two-pass; ignored\n", v);
    return true;
  }();
  (void)said;
  return false;
}

// Whether the table plans the cluster tier on a device of compute capability `cc_major`.
inline bool PlanClusters(int cc_major) { return cc_major >= 9 && !ClustersDisabled(); }

enum class RowTier { kGroup, kCta, kCluster, kStreaming };

// One launch configuration of the row tiers.
struct RowPlan {
  RowTier tier = RowTier::kStreaming;
  int vec = 1;      // elements per load (a full pack, or 1 where the operands' alignment differs)
  int width = 0;    // kGroup: threads per row
  int threads = 0;  // threads per CTA
  int cluster = 0;  // kCluster: CTAs per row
  int packs = 0;    // kGroup / kCta / kCluster: packs per thread held in registers
  int stages = 0;   // rows in flight ahead of the current one (set by the launcher's planning)
  bool params_once = false;  // the parameters read once per CTA: the cluster tier's forwards
                             // (the launcher's choice), SliceRowSumsKernel (PlanFusedSums)
  int ctas_per_sm = 0;       // kCta: held to the registers of that many CTAs per SM (the launcher's
                             // choice: OpTraits::CtaCtasPerSm); 0: as ptxas allocates
  bool l2_keep = false;      // input 0 loaded with L2's evict_last priority and released after
                             // each row (PlanRowOp's choice: dispatch.cuh's KeepsL2)
};

// Whether the group tier and the CTAs of up to kMaxL2KeepCtaThreads load a row's input 0 with
// L2's evict_last priority and set its lines back to evict_normal once the row is stored
// (RowPlan::l2_keep, for the ops of OpTraits::kKeepsInputInL2; pack.cuh says why): on GPUs of
// at least kKeepRowInputGbpsPerSm of DRAM bandwidth per SM (the H200, ~37 GB/s; unmeasured on
// the H100, 25.4 GB/s, which keeps plain loads). H200, bf16, 2^28 elements, the L2 flushed,
// time ÷ plain loads: l2_normalize 1024 / 8192 0.983 / 0.974, rms_norm 0.981 / 0.979.
// Released, the lines leave the next kernel its L2: left at evict_last, 10 copies of 16 MB
// after the row kernel took 1.22x their time (benchmarks/results/h200/NOTES.md §38).
// ROWNORM_L2_KEEP (read once per process) overrides the device's choice, 0 off and any other
// non-empty value on: the A/B in one build.
constexpr float kKeepRowInputGbpsPerSm = 30.0f;
constexpr int kMaxL2KeepCtaThreads = 256;
inline bool KeepsRowInputInL2(float dram_gbps_per_sm) {
  static const int forced = [] {
    const char* v = std::getenv("ROWNORM_L2_KEEP");
    if (v == nullptr || v[0] == '\0') return -1;
    return std::strcmp(v, "0") == 0 ? 0 : 1;
  }();
  if (forced >= 0) return forced == 1;
  return dram_gbps_per_sm >= kKeepRowInputGbpsPerSm;
}
// Whether the row kernels of `plan` (PlanRowOp's) take RowPlan::l2_keep: the group tier and the
// CTAs of up to kMaxL2KeepCtaThreads, not the CTAs of 512 (ptxas took those from 54-64 to 85-103
// registers, one CTA per SM where two ran: H200, bf16 32768, 95-96 to 76-82% of copy; §38).
// Not the fused-sums kernels of the backward with parameter gradients (PlanFusedSums'): there,
// input 0 kept took the training step to 1.02-1.05x the time at bf16 2048-8192 (CTA sums) and
// the group sums to 1.02-1.04x their time with it off at 256-1024; every input kept, 1.01-1.07x
// (H200, benchmarks/results/h200/NOTES.md §39).
constexpr bool KeepsL2OnTier(const RowPlan& plan) {
  return plan.tier == RowTier::kGroup ||
         (plan.tier == RowTier::kCta && plan.threads <= kMaxL2KeepCtaThreads);
}

// Per-thread register budget of the cached tiers, in packs (16 bytes each).
constexpr int kGroupVecs = 4;          // group tier: 4 packs in flight per lane
constexpr int kWideGroupVecs = 8;      // a warp per row: 8 packs per lane (1024 fp32 / 2048 16-bit)
constexpr int kGroupCtaThreads = 128;  // CTA size of the group tier
constexpr int kCtaVecs = 4;            // CTA tier
constexpr int kWideCtaThreads = 512;   // and one CTA of 512 x 8 packs (16384 fp32 / 32768 16-bit)
constexpr int kWideCtaVecs = 8;
constexpr int kClusterVecs = 8;      // cluster tier: 8 packs = 32 fp32 / 64 bf16 values per thread
constexpr int kClusterHalfVecs = 4;  // and for ops with kClusterPacks = 4 (op_traits.h), rows of
                                     // 8 and 16 CTAs x 256 x 4 packs, on twice the CTAs
constexpr int kClusterThreads = 256;
constexpr int kWideClusterThreads = 512;  // 16 x 512 x 8 packs: 262144 fp32 / 524288 bf16
constexpr int kMaxCluster = 16;
constexpr int kStreamingThreads = 512;

inline RowPlan StreamingPlan(int vec) { return {RowTier::kStreaming, vec, 0, kStreamingThreads}; }

// GPUs of at least kKeptParamsGbpsPerSm of DRAM bandwidth per SM (the H200, ~37 GB/s; the
// H100: 25.4) run the cluster tier's forwards with per-column parameters on the kernel that
// reads those once per CTA wherever it fits (KeepsClusterParams): their L2 does not serve the
// parameters' reads in every row without holding the row back. Below it, reading them in
// every row is what runs where the kernel keeps enough of the row in flight. (The CTA tier
// reads them in every row on both: dispatch.cuh's PlanCtaKernel.)
constexpr float kKeptParamsGbpsPerSm = 30.0f;

// Whether the cluster tier's forwards with per-column parameters read them in every row (the
// register kernel, a cluster per row: ClusterRowKernel) rather than once per CTA (a persistent
// grid: ClusterParamRowKernel) on a device of `sms` SMs and `dram_gbps_per_sm` GB/s of DRAM
// bandwidth per SM, where the register kernel holds `register_clusters` clusters at once: on
// GPUs below kKeptParamsGbpsPerSm, on clusters of fewer than 16 CTAs, where those clusters'
// rows (`inputs` operands of `threads` x `packs` packs a CTA) keep at least kPerRowInFlightUs
// of the SM's DRAM bandwidth in flight. There the persistent loop costs more than the
// parameters' reads; with fewer rows in flight (a register kernel held to fewer CTAs by its
// registers) the kept copy's rows count more. Measured on the H100 (forward, the per-row
// kernel's time ÷ the kept copy's): 4 CTAs of 256 x 8 packs an SM (4.8 µs in flight; the
// register rows held to 64 registers, OpTraits::ClusterCtasPerSm): rms_norm bf16 65536 / 131072
// 0.94 / 0.93, fp32 32768 / 65536 0.95, layer_norm bf16 0.97 / 0.98 (NOTES.md §42); 3 CTAs
// (3.6 µs) against the pipelined kept rows (dispatch.cuh's KeptRowsPipelined): layer_norm fp32
// 32768 1.00, 65536 1.03 (§42), where against the unpipelined ones it took 0.97-0.98 (§40);
// 2 CTAs (2.4 µs) 1.20-1.30 (§40); 16-CTA clusters 1.03-1.39 (a 16-CTA cluster per row costs
// more to schedule; §40, and 1.09 at layer_norm bf16 262144 in §42). H200: the kept copy took
// 0.83-0.97x the per-row kernel's time at every length measured but one, 1.003 (§28).
constexpr double kPerRowInFlightUs = 4.0;
// Per-column parameters of more than kMaxPerRowParamRatio times the bytes of the row's inputs
// per column are kept per CTA wherever that kernel exists, whatever rows the register kernel
// holds: read in every row, they are most of what the SMs load from L2. H100, forward, time ÷
// the kept copy's: float32 weight and bias on 16-bit layer_norm rows (8 bytes a column against
// 2) 1.15-1.17 at 65536 / 131072 on four register CTAs per SM, 1.23-1.24 at 262144; a float32
// weight on 16-bit rms_norm rows (4 against 2) 0.95-0.96 (benchmarks/results/h100/NOTES.md §42).
constexpr int kMaxPerRowParamRatio = 2;
inline bool ClusterParamsPerRow(int cluster, int threads, int packs, int inputs,
                                int register_clusters, int sms, float dram_gbps_per_sm) {
  if (cluster >= kMaxCluster || dram_gbps_per_sm <= 0 || dram_gbps_per_sm >= kKeptParamsGbpsPerSm ||
      register_clusters <= 0 || sms <= 0) {
    return false;
  }
  const double bytes_per_sm = static_cast<double>(register_clusters) * cluster * threads * packs *
                              kPackBytes * inputs / sms;
  return bytes_per_sm >= kPerRowInFlightUs * dram_gbps_per_sm * 1e3;  // GB/s x µs = 1e3 bytes
}

// On GPUs of at least kKeptParamsGbpsPerSm, the pipelined kept rows (two a cluster: dispatch.cuh's
// KeptRowsPipelined) count as holding as many rows as the register kernel where they hold at least
// (kKeptRowsSlack - 1) / kKeptRowsSlack of them: 8-CTA clusters of 256 x 8 packs, where the H200
// holds 30 kept clusters (105-128 registers, two CTAs per SM) against 62 register ones (ncu), 60
// rows against 62. There, forward, the kept copy's time ÷ the per-row kernel's
// (benchmarks/results/h200/NOTES.md §35): rms_norm bf16 73728 / 98304 / 114688 / 131072 0.904 /
// 0.963 / 1.015 / 1.010, fp16 98304 / 131072 0.959 / 1.010, fp32 40960 / 49152 / 65536 0.947 /
// 0.989 / 1.006, bf16 with a float32 weight 98304 / 131072 0.935 / 0.986; layer_norm bf16 98304 /
// 114688 / 131072 0.978 / 0.972 / 0.924, 73728 1.015, fp16 98304 / 131072 1.014 / 0.954.
constexpr int kKeptRowsSlack = 16;
// Rows that fill less than their cluster (n below its threads x packs x vec) read their
// parameters in every row on those GPUs where the parameters take more than
// kMaxPartialKeptParamBytes a column (two float32 ones: layer_norm fp32, or 16-bit with float32
// weight and bias). H200, forward, the kept copy's time ÷ the per-row kernel's: layer_norm fp32
// 24576 (4 CTAs) 1.12, 40960 / 49152 (8 CTAs) 1.23 / 1.13, bf16 with float32 weight and bias
// 98304 1.11; on full rows 0.99-1.01 (fp32 32768 / 65536) and 0.94 (bf16, float32 parameters,
// 131072) (NOTES.md §35).
constexpr int kMaxPartialKeptParamBytes = 4;

// Forwards whose register rows stage their parameters per row (aligned rows of 256 threads,
// one 16-byte copy a pack: rms_norm and add_rms_norm; tier_kernels.cuh's StagesRowParams) read
// them per row on those GPUs wherever the register kernel runs: staged, the weight costs those
// rows nothing. H200, forward, time ÷ l2_normalize's on the same rows (NOTES.md §36): rms_norm
// bf16 65536 / 131072 / 262144 on the register kernel 1.001 / 1.004 / 1.014, the kept copy
// 1.102 / 1.104 / 1.076; fp32 32768 / 131072 0.984 / 0.983 against 1.049 / 1.017. (A rule
// that read per row, on full rows of fewer than kMaxCluster CTAs, the parameters no wider than
// the row went once staging covered rms_norm's weight, measured run by run at 1.004-1.050 of
// the per-row time kept (§34-§35): it then decided only layer_norm given a weight alone, whose
// kept copy took 0.947 / 0.907 of the per-row time at bf16 65536 / 131072 and 1.036 / 1.026 at
// fp32 32768 / 65536: NOTES.md §37.)

// Whether the cluster tier's forward given per-column parameters of `param_bytes` a column (those
// given: op_traits.h's GivenParamBytes; none given, there is no kept copy to run) runs the kept
// copy (ClusterParamRowKernel) of `plan` on a row of `n` elements, where the device holds
// `kept_rows` rows of it at once (0: none fit), `register_rows` of the register kernel and
// `shared_rows` of the bulk one; `row_bytes`: the row's input bytes a column (parameters of more
// than kMaxPerRowParamRatio times those are kept wherever the rule does not read them per row on
// fast GPUs); `pipelined`: the kept rows load their next row early (their clusters counted twice;
// rows of one input); `staged`: the register rows stage the parameters per row; `inputs`, `sms`,
// `dram_gbps_per_sm`: as ClusterParamsPerRow's. `per_row` (set where the kept copy exists): the
// rows read their parameters in every row on purpose, so that no persistent kernel runs them (not
// the bulk one).
inline bool KeepsClusterParams(int64_t n, const RowPlan& plan, int param_bytes, int row_bytes,
                               bool pipelined, bool staged, int inputs, int kept_rows,
                               int register_rows, int shared_rows, int sms, float dram_gbps_per_sm,
                               bool* per_row) {
  *per_row = false;
  if (kept_rows <= 0) return false;
  const bool fast = dram_gbps_per_sm >= kKeptParamsGbpsPerSm;
  if (fast && staged && register_rows > 0) {
    *per_row = true;
    return false;
  }
  const bool partial = n < int64_t{plan.cluster} * plan.threads * plan.packs * plan.vec;
  if (fast && partial && param_bytes > kMaxPartialKeptParamBytes) {
    *per_row = true;
    return false;
  }
  if (param_bytes > kMaxPerRowParamRatio * row_bytes) return true;
  if (ClusterParamsPerRow(plan.cluster, plan.threads, plan.packs, inputs, register_rows, sms,
                          dram_gbps_per_sm)) {
    *per_row = true;
    return false;
  }
  const int slack = fast && pipelined ? register_rows / kKeptRowsSlack : 0;
  return kept_rows + slack >= register_rows && kept_rows >= shared_rows;
}

// THE TIER TABLE. `vec` is the full pack width of the dtype (4 fp32, 8 bf16/fp16); rows
// whose operands do not allow it stream. Boundaries (elements per row, fp32 / 16-bit):
//   n <= 32 lanes x 4 packs          (512 / 1024): group tier, lanes per row = the fewest
//                                    that hold the row (>= the pack width, >= 4), 128-thread
//                                    CTAs, several rows in flight per SM per warp.
//   n <= 32 lanes x 8 packs          (1024 / 2048): a warp per row, 8 packs per lane: no
//                                    block barrier (a LayerNorm reduces twice per row).
//   n <= 512 threads x 4 packs       (8192 / 16384): one CTA per row, 128/256/512 threads;
//   n <= 512 threads x 8 packs       (16384 / 32768): one CTA of 512 threads x 8 packs (the
//                                    2-CTA cluster measured 95% of copy here, torch.compile's
//                                    one-CTA kernel 99%); ops with `wide_cta` = false
//                                    (OpTraits::kWideCta) use 2-CTA clusters there.
//   sm_90+, n <= 16 CTAs x 256 x 8 packs (131072 / 262144): cluster per row, the fewest of
//                                    2/4/8/16 CTAs that hold it (16 is non-portable; the
//                                    launcher checks that the device co-schedules it); with
//                                    `cluster_packs` = 4, rows past 2 CTAs of 8 packs hold 4
//                                    packs a thread on twice the threads: 8 and 16 CTAs of 256,
//                                    then 16 of 512 (to 262144 16-bit; the 16-bit backward of
//                                    layer_norm and rms_norm: more of its fused sums' CTAs fit
//                                    an SM, or, for layer_norm's two sums at 131073-262144, one
//                                    CTA of 16 warps where 8 packs would hold one of 8), or,
//                                    with `wide_cluster_packs` = 8 (0: as `cluster_packs`), 16
//                                    CTAs of 256 x 8 packs (add_rms_norm's 16-bit forward: more
//                                    rows in flight per SM on 256 threads; its kept parameters
//                                    past them, OpTraits::kWideClusterPacks);
//           n <= 16 CTAs x 512 x 8 packs (262144 / 524288): 16 CTAs of 512 threads.
//   otherwise: streaming (two or more passes over the row, the later ones mostly from L2).
// Every boundary is a power of two. They follow the register budget;
// benchmarks/results/h100/NOTES.md has the measurements.
inline RowPlan PlanRowTier(int64_t n, int vec, bool clusters, bool wide_cta,
                           int cluster_packs = kClusterVecs, int wide_cluster_packs = 0) {
  if (wide_cluster_packs == 0) wide_cluster_packs = cluster_packs;
  n = std::max(n, PlanLengthFloor());
  if (n <= int64_t{kPlanWarpSize} * kGroupVecs * vec) {
    int width = std::max(4, vec);
    while (int64_t{width} * kGroupVecs * vec < n) width *= 2;
    return {RowTier::kGroup, vec, width, kGroupCtaThreads, 0, kGroupVecs};
  }
  if (n <= int64_t{kPlanWarpSize} * kWideGroupVecs * vec) {
    return {RowTier::kGroup, vec, kPlanWarpSize, kGroupCtaThreads, 0, kWideGroupVecs};
  }
  for (int threads : {128, 256, 512}) {
    if (n <= int64_t{threads} * kCtaVecs * vec) {
      return {RowTier::kCta, vec, 0, threads, 0, kCtaVecs};
    }
  }
  if (wide_cta && n <= int64_t{kWideCtaThreads} * kWideCtaVecs * vec) {
    return {RowTier::kCta, vec, 0, kWideCtaThreads, 0, kWideCtaVecs};
  }
  if (clusters) {
    if (cluster_packs == kClusterHalfVecs &&
        n > int64_t{2} * kClusterThreads * kClusterVecs * vec) {
      for (const auto& [threads, cluster] :
           {std::pair{kClusterThreads, 8}, std::pair{kClusterThreads, kMaxCluster},
            std::pair{kWideClusterThreads, kMaxCluster}}) {
        if (threads == kWideClusterThreads && wide_cluster_packs != kClusterHalfVecs) break;
        if (n <= int64_t{cluster} * threads * kClusterHalfVecs * vec) {
          return {RowTier::kCluster, vec, 0, threads, cluster, kClusterHalfVecs};
        }
      }
    }
    for (int cluster : {2, 4, 8, kMaxCluster}) {
      if (n <= int64_t{cluster} * kClusterThreads * kClusterVecs * vec) {
        return {RowTier::kCluster, vec, 0, kClusterThreads, cluster, kClusterVecs};
      }
    }
    if (n <= int64_t{kMaxCluster} * kWideClusterThreads * kClusterVecs * vec) {
      return {RowTier::kCluster, vec, 0, kWideClusterThreads, kMaxCluster, kClusterVecs};
    }
  }
  return StreamingPlan(vec);
}

// The widest load width w (elements, power of two, <= one pack of either element type) at
// which every operand's rows start at the same element phase mod w: base offsets (in elements
// of the operand's own type, so inputs and outputs of different widths compare by their byte
// phase mod a pack) and row strides congruent mod w. Then one head/tail split (computed from
// input 0) serves all operands.
template <class Args>
int RowVecWidth(const Args& a) {
  for (int w = Args::kPackWidth; w > 1; w /= 2) {
    auto phase = [w](const void* p, size_t elem) {
      return static_cast<int64_t>((reinterpret_cast<uintptr_t>(p) / elem) % w);
    };
    auto stride_phase = [w](int64_t s) { return ((s % w) + w) % w; };
    const int64_t p0 = phase(a.out[0], Args::OutBytes(0));
    const int64_t s0 = stride_phase(a.out_stride[0]);
    bool ok = true;
    for (int j = 0; j < Args::kNumOut; ++j) {
      ok = ok && phase(a.out[j], Args::OutBytes(j)) == p0 &&
           (a.rows == 1 || stride_phase(a.out_stride[j]) == s0);
    }
    for (int i = 0; i < Args::kNumIn; ++i) {
      ok = ok && phase(a.in[i], Args::InBytes(i)) == p0 &&
           (a.rows == 1 || stride_phase(a.in_stride[i]) == s0);
    }
    if (ok) return w;
  }
  return 1;
}

// The plan of a row problem of `elem_size`-byte elements whose operands allow loads of
// `load_vec` elements (RowVecWidth). `wide_cta`: the op may run the wide CTA (OpTraits::kWideCta);
// `cluster_packs`, `wide_cluster_packs`: its cluster rows' packs a thread
// (OpTraits::kClusterPacks, kWideClusterPacks; 0: as cluster_packs).
inline RowPlan PlanRowProblem(int64_t n, int elem_size, int load_vec, bool clusters, bool wide_cta,
                              int cluster_packs = kClusterVecs, int wide_cluster_packs = 0) {
  const int vec = PackWidth(elem_size);
  // float64 exists for gradcheck and reference work, not speed: one streaming kernel.
  if (elem_size == 8) return StreamingPlan(load_vec == vec ? vec : 1);
  if (load_vec != vec) return StreamingPlan(1);
  return PlanRowTier(n, vec, clusters, wide_cta, cluster_packs, wide_cluster_packs);
}

// ---------------------------------------------------------------------------------------
// Fused parameter gradients (ops with column sums): rows that start 16-byte aligned and whose
// n is a multiple of the pack width run CtaRowSumsKernel / CtaRowSumsStagedKernel /
// GroupRowSumsKernel (the CTA tier's 2- and 4-pack rows, a warp x 8 packs, the 4-pack group
// tier) or SliceRowSumsKernel (longer rows), which write per-chunk partials of the sums; rows
// in phase (PhasedSumPlan) run the same kernels.
// Elsewhere the backward saves per-row statistics for kernels/param_grad.h (a second read of x
// and dy).
//
// 16 rows per CTA: enough CTAs to fill the GPU at M·N = 2^27 for every CTA size of the tier,
// while the float partials stay at 1/16 of the rows (32 rows per CTA left half the SMs'
// thread slots empty). A group runs kFusedGroupRows rows (below), and a CTA's groups write one
// partial (of 128 / lanes x kFusedGroupRows rows).
//
// Two column sums (LayerNorm) write twice the partials, and their CTAs hold more registers
// (two CTAs of 256 per SM): there a persistent grid runs chunks of 64 rows, each CTA chunks
// blockIdx.x, + gridDim.x, ..., with the next rows staged in shared memory (kFusedSumStages
// row loads in flight, cp.async) — CtaRowSumsStagedKernel. The chunks, and so the results, are
// the same whatever the grid: CtaRowSumsKernel runs the same 64-row chunks where no staged CTA
// fits (benchmarks/results/h100/NOTES.md §24 has the measurements).
constexpr int kFusedChunkRows = 16;
constexpr int kStagedChunkRows = 64;
constexpr int kFusedSumStages = 2;
// A group-tier CTA runs its rows one load-reduce-store round after another, so its lifetime
// grows with its rows; the fewer they are, the less a grid of under a wave, or a last wave of
// few CTAs per SM, waits on a few CTAs' round trips. 16 rows per group against 32 (H200, the
// sums kernel's time): rms_norm bf16 1024 at 16384 / 32768 / 89600 rows 0.68 / 0.82 / 0.89x,
// layer_norm bf16 512 x 40000 0.70x; at 2^27 elements 0.99-1.00x (fp32 512 0.94x, layer_norm
// bf16 1024 1.02x, rows in phase at bf16 1023 1.04x); 1.05x at 65536 x 1024, where the chunks
// go from under one wave to 1.55 waves. The partials double (rms_norm at 1024 16-bit elements:
// 3.1% of x's bytes). benchmarks/results/h200/NOTES.md §40.
constexpr int kFusedGroupRows = 16;
constexpr int kFusedSumVecs = 2;  // packs per thread of the short CTA-tier rows (see below)
// One column sum on the CTA tier, sm_90+: a thread-block cluster of kSumClusterCtas CTAs runs a
// chunk of kSumClusterCtas x kFusedChunkRows rows, each CTA kFusedChunkRows of them with two in
// flight (CtaRowSumsKernel). The CTAs add their column sums in rank order through distributed
// shared memory and write one partial: a partial per 16 rows is, at 16-bit x, an eighth of an
// input's bytes written and read again (~5% of the training step's traffic), where the grid
// keeps the granularity of 16-row CTAs (64-row CTAs left 1-2 waves and a tail: 13% slower at
// bf16 2048-4096, NOTES.md §24). The sums travel through kMaxSumExchangeBytes of shared memory
// at most (the 512-thread x 4-pack rows, 64 KB, keep 16-row partials).
constexpr int kSumClusterCtas = 4;
constexpr int64_t kMaxSumExchangeBytes = 32 * 1024;
// Rows past the CTA tier's 4 packs (the wide CTA, the cluster tier) and 16-bit layer_norm
// rows of 512 threads x 4 packs: a persistent grid of CTAs or clusters, each running whole
// chunks in turn, its columns' sums in shared memory (SliceRowSumsKernel, planned with
// params_once: each CTA keeps its columns' weight). A chunk holds kSliceChunkBytes of each
// column (32 16-bit / 16 fp32 rows), so its float partial is a sixteenth of an input's bytes,
// or a multiple of them where the rows fill the teams' waves (SliceChunkMultiple).
// The launcher's planning runs it only where the chunks keep most of the teams the device
// holds at once busy (PlanRowSumOp in dispatch.cuh): with fewer, teams would idle where the
// two-pass path runs a CTA or cluster per row.
constexpr int kSliceChunkBytes = 64;

// The slice sums' chunks made m = 2, 4 or 8 times as long where that takes no more waves of the
// `teams` the device holds at once (the plain kernel's, PlanRowSumOp) and keeps at least 15/16
// of them busy in every wave: fewer partials to write and add, the grid's time unchanged. The
// multiple depends on rows, the chunk and the device, so the sums stay deterministic for each.
// H200, fwd+bwd with every gradient, 2^27 elements, time ÷ 64-byte chunks (step / sums kernel;
// benchmarks/results/h200/NOTES.md §55): layer_norm bf16 8192 0.964 / 0.978 (the finalize 12.8
// -> 4.7 µs: one level), 16384 0.978 / 0.969, 32768 0.987, fp32 16384 0.960 (24.3 -> 6.6 µs);
// rms_norm bf16 32768 0.992, fp32 16384 0.990; the rest 0.997-1.002. Longer chunks that add a
// wave or idle teams lost: 2x at layer_norm bf16 65536 1.10, rms_norm bf16 32768 1.24, 6000 rows
// of 8192 1.14; 4x 1.07-2.39.
constexpr int kSliceChunkMaxMultiple = 8;
inline int SliceChunkMultiple(int64_t rows, int chunk_rows, int teams) {
  if (teams <= 0 || rows <= 0 || chunk_rows <= 0) return 1;
  const auto chunks_of = [rows](int64_t len) { return (rows + len - 1) / len; };
  const auto waves = [teams](int64_t chunks) { return (chunks + teams - 1) / teams; };
  const int64_t base_waves = waves(chunks_of(chunk_rows));
  int m = 1;
  for (int k = 2; k <= kSliceChunkMaxMultiple; k *= 2) {
    const int64_t chunks = chunks_of(int64_t{k} * chunk_rows);
    const int64_t w = waves(chunks);
    if (k * w <= base_waves && 16 * chunks >= 15 * w * teams) m = k;
  }
  return m;
}

// Two sums (layer_norm) of 16-bit rows of 256 threads x 4 packs: the slice sums (two CTAs per
// SM: 64 KB of sums, 32 KB of weight and bias) on rows in phase and on aligned rows past 384
// threads x 2 packs, where the staged kernel runs 512 x 2 packs with pack slots empty (n <
// 8192). H200, fwd+bwd with every gradient, 2^27 elements, time ÷ the staged kernel's (step /
// sums kernel; benchmarks/results/h200/NOTES.md §42): in phase bf16 4097 / 4607 1.00 / 0.98-0.99,
// 5121 / 6143 / 6145 / 7167 / 8191 0.83 / 0.85 / 0.80 / 0.76 / 0.85 (0.67-0.77), fp16 8191
// 0.85 / 0.76, 8191 at 8192 / 65536 rows 0.85 / 0.85; aligned 7168 / 8192 0.87 / 0.99 (0.79 /
// 0.95). Not aligned rows of 384 threads x 2 packs and fewer (4608 / 6144: 1.11 / 1.03), nor
// one sum (rms_norm bf16 4608-8192 1.03-1.10, add_rms_norm 8192 1.05: the CTA sums stay).
constexpr bool SliceSums256x4(int64_t n, bool whole, int vec) {
  return !whole || n > int64_t{384} * kFusedSumVecs * vec;
}

// Whether the rows of a tier-table configuration (tier, threads, packs, cluster) of
// `elem_size`-byte elements run SliceRowSumsKernel for `column_sums` sums (PlanFusedSums;
// dispatch.cuh compiles the kernel for these configurations only): the wide CTA, the cluster
// tier, 16-bit rows of 512 threads x 4 packs (8193-16384), and two sums of 16-bit rows of 256
// x 4 packs (4097-8192) of the lengths SliceSums256x4 gives. One sum on 512 x 4 took 0.89x the
// time of 16-row CTAs reading the weight per row (rms_norm bf16 12288 / 16384 fwd+bwd on the
// H100; add_rms_norm 0.93x), fp32 rows of that shape 1.00x (kept on 16-row CTAs), and two
// sums of fp32 ones are staged (NOTES.md §30). Not two
// sums of 16-bit rows on 8-pack clusters of more than two CTAs: one CTA per SM fits their
// shared memory (128 KB of sums, 32 KB of weight), and the fused step took 1.06-1.12x the
// two-pass one on the H200 at bf16 65536-262144 (0.97-1.00x on the H100; NOTES.md §29), where
// at 16384 (512 x 4 packs) and 32768 (2 CTAs) it took 0.79-0.89x. Those rows (16-bit
// layer_norm's backward) of 32769-131072 run on 4-pack clusters of 8 and 16 CTAs (4 packs a
// thread on twice the CTAs, OpTraits::kClusterPacks): 64 KB of sums and 16 KB of weight a CTA,
// two CTAs per SM; fused, the H100's step took 0.83x / 0.81x the two-pass one at bf16 65536 /
// 131072, where 4 such CTAs at 32768 took 1.07x the 2-CTA 8-pack kernel's (kept). Rows of
// 131073-262144 hold 4 packs on 16 CTAs of 512 (128 KB of sums, 32 KB of weight, one CTA per
// SM): the H100's step took 0.86x (bf16 262144) / 0.91x (196608) the two-pass one (NOTES.md
// §37); the wide cluster's rows stay two-pass. rms_norm's one sum on 4-pack clusters (48 KB a
// CTA of 256, four per SM against two): 0.94x / 0.89x its 8-pack step at 65536 / 131072
// (NOTES.md §34); on 16 CTAs of 512 (96 KB, two per SM against one) 0.98x at 196608-262144.
constexpr bool SliceSumsApply(RowTier tier, int threads, int packs, int cluster, int elem_size,
                              int column_sums) {
  const bool two_16bit = column_sums == 2 && elem_size < 4;
  if (tier == RowTier::kCluster) {
    return packs == kClusterHalfVecs || (packs == kClusterVecs && !(two_16bit && cluster > 2));
  }
  if (tier == RowTier::kCta && threads == 256 && packs == kCtaVecs) return two_16bit;
  return tier == RowTier::kCta && threads == 512 &&
         (packs == kWideCtaVecs || (packs == kCtaVecs && elem_size < 4));
}

// Whether SliceRowSumsKernel's team of `cluster` CTAs of `threads` x `packs` (packs of `vec`
// elements) brings its next row into L2 once the current row's loads are issued
// (cp.async.bulk.prefetch.L2), for rows of `n` elements with `column_sums` sums. A team has
// nothing in flight from its row's barrier to its next row's loads; the prefetch fills that gap
// where the team's own loads keep too few bytes in flight. The H100's fwd+bwd step with it
// (benchmarks/results/h100/NOTES.md §38, §39):
// - 16 CTAs of 512 (one per SM), 16-bit rows (4 packs) or two sums: 0.90-0.96x the time
//   (layer_norm bf16 163840-262144), 0.88-0.98x (rms_norm bf16), 0.93-0.94x (layer_norm fp32);
//   fp32 rms_norm 1.03-1.05x (not: it runs at 89-91% of copy without).
// - two sums (layer_norm) on 16-bit 4-pack clusters: bf16 40000 0.92x, 65536 0.97x (8 CTAs),
//   131072 0.94x (16 CTAs); fp32 on 16 CTAs of 256 0.97-1.00x, on 2-8 CTAs 1.015-1.07x (not).
// - two sums of 16-bit rows that fill at most 3/4 of the other teams: 12288 on the 512 x 4 CTA
//   0.92x, 24576 on 2 CTAs of 256 x 8 0.92x, where full rows (16384, 32768) took 1.00-1.03x.
// - on GPUs of at least kFullRowPrefetchGbpsPerSm of DRAM bandwidth per SM (the H200, ~37 GB/s
//   per SM; benchmarks/results/h200/NOTES.md §32), full 16-bit rows of two sums too: layer_norm
//   bf16 14336 / 16384 0.93 / 0.89x, 28672 / 32768 0.93 / 0.94x; and fp32 two sums on 8-CTA
//   clusters: 49152 / 65536 0.94 / 0.96x, where on 2 and 4 CTAs they took 0.98-1.05x.
// - one sum elsewhere: rms_norm bf16 0.97-1.09x (40000 gained, full rows lost), fp32 1.06-1.08x.
//   On GPUs of at least kFullRowPrefetchGbpsPerSm, one sum (rms_norm's 16-bit rows) on the
//   4-pack clusters of 8 and 16 CTAs of 256 too: bf16 49152 / 65536 0.95 / 0.98x (8 CTAs),
//   81920-131072 0.94-0.95x (16 CTAs); not one sum on 8-pack clusters, where it lost there as
//   well: rms_norm fp32 1.01-1.06x, add_rms_norm 1.05-1.09x on 2 and 4 CTAs and 0.98-0.99x on
//   8 and 16 (benchmarks/results/h200/NOTES.md §34); and on the 16-bit wide CTA (512 x 8
//   packs, 16385-32768): bf16 18432-24576 0.90-0.95x, 28672 / 32767 / 32768 0.98 / 0.94 /
//   0.98x, fp16 24576 / 32768 0.94 / 1.00x (§34). Not fp32's wide CTA (1.03-1.04x) nor the
//   512 x 4 CTA (0.91-1.04x, no pattern).
// The kernels of the teams for which it may hold are compiled with the prefetch
// (SliceMayPrefetchNextRow: teams of `vec`-element packs); the others' code has none.
constexpr float kFullRowPrefetchGbpsPerSm = 30.0f;
constexpr bool SliceMayPrefetchNextRow(int threads, int packs, int cluster, int vec,
                                       int column_sums) {
  const bool wide_cta_16bit =
      cluster <= 1 && threads == kWideCtaThreads && packs == kWideCtaVecs && vec == 8;
  return column_sums == 2 || (cluster > 1 && packs == kClusterHalfVecs) || wide_cta_16bit;
}
constexpr bool SlicePrefetchesNextRow(int threads, int packs, int cluster, int vec, int elem_size,
                                      int column_sums, int64_t n, float dram_gbps_per_sm) {
  if (!SliceMayPrefetchNextRow(threads, packs, cluster, vec, column_sums)) return false;
  const bool fast_dram = dram_gbps_per_sm >= kFullRowPrefetchGbpsPerSm;
  if (column_sums == 1) return (cluster == 16 && threads == 512) || fast_dram;
  const bool half_packs = cluster > 1 && packs == kClusterHalfVecs && elem_size < 4;
  if (cluster == 16 || half_packs) return true;
  if (elem_size == 4) return cluster == 8 && fast_dram;
  const int64_t team = int64_t{threads} * packs * vec * std::max(cluster, 1);
  return 4 * n <= 3 * team || fast_dram;
}

// Whether SliceRowSumsKernel runs its rows pipelined (kPipelined: the next row's loads issued
// before the current row is reduced and stored; no prefetch into L2): one sum (rms_norm,
// add_rms_norm) of whole 16-bit rows of 512 threads x 4 packs where every thread owns at
// least three packs (n >= 12288). One CTA of up to 128 registers per SM, where the kernel one
// row at a time holds two of 64. H200, fwd+bwd with every gradient, bf16 but where said,
// 2^27 elements, the sums kernel's time pipelined ÷ not (step in brackets;
// benchmarks/results/h200/NOTES.md §43): rms_norm 16384 / 12288 0.968 / 0.956 (0.981 /
// 0.970), fp16 16384 0.979, 16384 at 12288 / 65536 rows 0.824 / 1.002, add_rms_norm 16384 /
// 12288 0.972 / 0.954; not at 10240 (2-3 packs a thread): 1.067. The next row's loads and the
// row after it into L2 took 1.00-1.02 at 2^27 (1.17 at 10240); layer_norm's two sums spill
// pipelined (128 registers): 1.09-1.15.
constexpr int64_t kPipelinedSliceMinPacks = 3;
constexpr bool SliceSumsPipelined(int threads, int packs, int cluster, int elem_size,
                                  int column_sums, int64_t n, bool whole) {
  return whole && column_sums == 1 && elem_size == 2 && cluster <= 1 && threads == 512 &&
         packs == kCtaVecs && n >= kPipelinedSliceMinPacks * threads * PackWidth(elem_size);
}

// Whether SliceRowSumsKernel's cluster team stages its next row in shared memory (kStageNext:
// StagedSliceRows, one bulk copy per input into one stage, no L2 prefetch) on 16-bit whole
// rows: for one sum, and for two where the staged team keeps the plain team's CTAs per SM
// (checked on the device: dispatch.cuh's PlanRowSumOp). H200, fwd+bwd with every gradient,
// 2^27 elements, the sums kernel's time staged ÷ the plain kernel with its next row into L2
// (benchmarks/results/h200/NOTES.md §45):
// - one sum on clusters, which the stage holds to half the plain kernel's CTAs per SM:
//   rms_norm bf16 49152 / 65536 / 131072 / 262144 0.96 / 0.87 / 0.89 / 0.94 (steps 0.98 /
//   0.92 / 0.92 / 0.96), fp16 65536 0.88, add_rms_norm bf16 65536 0.87;
// - two sums (layer_norm), as many CTAs per SM: 2-CTA 8-pack clusters bf16 24576 / 32768 0.94
//   / 0.96, fp16 32768 0.96; 16 CTAs of 512 at 262144 0.92; 4-pack clusters of 256 (their
//   reduce slots cut to 16 bytes so that two fit: SliceSums::kStagedSlotBytes) 49152 / 65536
//   / 131072 0.95 / 0.94 / 0.92 (steps 0.97 / 0.96 / 0.95), where one staged CTA per SM took
//   1.14-1.28;
// - not the CTA tier (16-bit 512 x 4 rows 1.02-1.03, rms_norm's pipelined 1.05-1.10,
//   layer_norm's 256 x 4 1.06-1.08: its loads of a row from L2 cost less there than the
//   stage's wait and barrier).
constexpr bool SliceSumsStageNextRow(int cluster, int elem_size, bool whole) {
  return whole && cluster > 1 && elem_size == 2;
}

// Whether SliceRowSumsKernel's threads hold their columns' sums in registers (kRegisterSums:
// RegisterColumnSums) rather than in shared memory: two sums (layer_norm) of whole 16-bit rows
// of 512 threads x 4 packs (8193-16384), 64 sums a thread at 128 registers, one CTA per SM as
// with the shared sums, whose read-modify-write (256 KB a row a CTA at 16384) held L1 and
// shared memory at 70% of their peak (ncu; 38% with the sums in registers). H200, fwd+bwd with
// every gradient, 2^27 elements, the sums kernel's time ÷ the shared sums' (step in brackets;
// benchmarks/results/h200/NOTES.md §46): bf16 16384 / 12288 / 10240 0.980-0.983 / 0.960-0.961 /
// 0.944 (0.988-0.990 / 0.975-0.977 / 0.966), fp16 16384 0.981-0.989. Not on 256 x 4 rows (two
// CTAs per SM): 7168 / 8192 0.991 / 1.009-1.010, one of the two sums in registers 0.976-0.994 /
// 1.000-1.003; nor one sum on 512 x 4 (rms_norm, add_rms_norm bf16 10240: 1.26-1.27, one CTA
// per SM where the shared sums fit two); rows in phase not measured.
constexpr bool SliceSumsInRegisters(int threads, int packs, int cluster, int elem_size,
                                    int column_sums, bool whole) {
  return whole && column_sums == 2 && elem_size == 2 && cluster <= 1 && threads == 512 &&
         packs == kCtaVecs;
}

// Whether the CTA sums of one row at a time (4 packs a thread: CtaRowSumsKernel unpipelined) on
// CTAs of `threads` bring each row's next row into L2 once its loads are issued (sm_90+). A CTA
// has no load in flight from its row's barrier to its next row's loads; the prefetch fills that
// gap without a second row's registers. H200, fwd+bwd with every gradient, 2^27 elements, the
// sums kernel's time with it ÷ without (benchmarks/results/h200/NOTES.md §41): 16-bit rows of
// 256 threads (6145-8192) rms_norm bf16 6400 / 6912 / 7424 / 7936 / 8192 0.90 / 0.92 / 0.93 /
// 0.97 / 0.96-0.97, in phase 8191 0.96, fp16 8192 0.95, add_rms_norm bf16 8192 0.96; fp32 rows
// of 512 threads (4097-8192) 4608 / 6144 / 8192 0.83 / 0.88 / 0.98-0.99. Not fp32 rows of 256
// threads (3073-4096): 3584 / 4096 1.01 / 1.02.
constexpr bool CtaSumsPrefetchNextRow(int threads, int elem_size) {
  return elem_size < 4 ? threads == 256 : threads == 512;
}

// Whether the group sums (GroupRowSumsKernel) bring each group's next row into L2 once its
// row is loaded (sm_90+): where the grid, `chunks` CTAs, puts at most kGroupSumPrefetchCtasPerSm
// CTAs on each of the device's `sms` SMs, whose rows in flight leave DRAM idle. H200, fwd+bwd
// with every gradient, the sums kernel's time with it ÷ without (benchmarks/results/h200/
// NOTES.md §42): rms_norm bf16 1024 at 128 / 256 / 384 / 512 / 1024 / 2048 chunks 0.83 / 0.87 /
// 1.00 / 1.07 / 1.05 / 1.06; at 256 chunks bf16 256 / 512 0.87, layer_norm / add_rms_norm
// bf16 1024 0.88 / 0.86, fp32 512 0.89, rows in phase (1023) 0.90.
constexpr int kGroupSumPrefetchCtasPerSm = 2;
constexpr bool GroupSumsPrefetchNextRow(int64_t chunks, int sms) {
  return sms > 0 && chunks <= int64_t{kGroupSumPrefetchCtasPerSm} * sms;
}

struct FusedSumPlan {
  // CtaRowSumsKernel (tier kCta), CtaRowSumsStagedKernel (kCta, stages > 0),
  // GroupRowSumsKernel (kGroup) or SliceRowSumsKernel (kCta or kCluster, params_once)
  RowPlan kernel;
  int64_t chunks = 0;      // partials per column sum (column_sums x chunks x n in all)
  int chunk_rows = 0;      // rows of a chunk (kFusedChunkRows, kStagedChunkRows, kernel.cluster x
                           // kFusedChunkRows, kSliceChunkBytes / elem_size x SliceChunkMultiple,
                           // or a group-tier CTA's kFusedGroupRows x groups)
  int teams = 0;           // SliceRowSumsKernel: the teams the device holds at once (PlanRowSumOp)
  bool pipelined = false;  // SliceRowSumsKernel: SliceSumsPipelined
  bool register_sums = false;      // SliceRowSumsKernel: SliceSumsInRegisters
  bool stage_next_row = false;     // SliceRowSumsKernel: SliceSumsStageNextRow (prefetch_next_row
                                   // false), where PlanRowSumOp finds the staged team fits
  bool prefetch_next_row = false;  // SliceRowSumsKernel: SlicePrefetchesNextRow; the CTA sums
                                   // of 4-pack rows: CtaSumsPrefetchNextRow; the group sums:
                                   // GroupSumsPrefetchNextRow
  int row_classes = 1;  // 1 for aligned rows; the pack width for rows in phase that do not
                        // start 16-byte aligned (PhasedSumPlan)
};

// A fused CTA-tier plan: rows of `chunk_rows` per chunk.
inline FusedSumPlan CtaSumPlan(const RowPlan& kernel, int64_t rows, int chunk_rows) {
  return FusedSumPlan{kernel, (rows + chunk_rows - 1) / chunk_rows, chunk_rows};
}

// Rows that do not start 16-byte aligned (odd N) in operands that share each row's alignment
// (OperandsInPhase): row r has the same geometry as row r + vec (a scalar head, vec-wide
// packs, a scalar tail: RowGeometry), so the fused kernels run them in `vec` classes whose
// chunks hold rows of one geometry each, and a thread's packs keep their columns through a
// chunk as on aligned rows. Chunk c of class q = c / blocks, block b = c % blocks
// (blocks = ceil(rows / (vec·chunk_rows))) holds rows b·vec·chunk_rows + q + vec·i, i <
// chunk_rows; a chunk past the last row writes zeros. The chunks depend on rows, n and the
// element size only, as the aligned ones do. H100, fwd+bwd with every gradient, 2^27 elements,
// time of the two-pass step ÷ this one (benchmarks/results/h100/NOTES.md §44): slice sums, bf16
// 16383-131071 layer_norm 1.25-1.46, rms_norm 1.39-1.56, add_rms_norm 1.20-1.39; fp32
// 1.26-1.49. The CTA tier's register sums run them too, unclustered (§45).
inline FusedSumPlan PhasedSumPlan(const RowPlan& kernel, int64_t rows, int chunk_rows, int vec) {
  const int64_t block = int64_t{vec} * chunk_rows;
  FusedSumPlan f{kernel, vec * ((rows + block - 1) / block), chunk_rows};
  f.row_classes = vec;
  return f;
}

// Whether the fused sums of an op with `column_sums` sums over `row_inputs` row operands of
// `elem_size`-byte elements run the 2-pack CTAs of 320 and 384 threads (PlanFusedSums), for
// rows that 256 x 2 packs do not hold and those do (16-bit 4097-6144, fp32 2049-3072), where
// the 512 threads before them left up to 3/8 of the pack slots empty. H100, fwd+bwd with every
// gradient, 2^27 elements, time of these ÷ 512 x 2 (layer_norm, add_rms_norm) or 256 x 4
// (rms_norm), NOTES.md §49: layer_norm bf16 4608-6144 0.935-0.981 (before its 16-bit CTAs were
// held to two per SM: dispatch.cuh's StagedHeldCtas), fp32 2304-3072 0.967-0.999; rms_norm
// bf16 0.914-0.955, fp32 0.980-0.987; add_rms_norm fp32 0.913-0.986, with the float32 residual
// stream 0.86-0.88 at 2304-2560 (two CTAs of 320 per SM at 90 registers, against one of 512);
// rows in phase 0.950-0.983. Not add_rms_norm's 16-bit rows: one CTA per SM either way
// (119-127 registers), 0.988-1.015.
constexpr bool FillsTwoPackCtas(int column_sums, int row_inputs, int elem_size) {
  return column_sums == 2 || row_inputs < 3 || elem_size == 4;
}

// The fused plan of `rows` rows of n `elem_size`-byte elements of an op with `column_sums`
// sums (1 or 2) that reads `row_inputs` row operands, or nothing where the fused path does not
// apply. `aligned`: every operand starts 16-byte aligned and has a row stride that is a
// multiple of the pack width; `in_phase`: each row starts at the same offset from 16 bytes in
// every operand (PhasedSumPlan); `dram_gbps_per_sm` and `sms`: the device's
// (SlicePrefetchesNextRow, GroupSumsPrefetchNextRow).
inline std::optional<FusedSumPlan> PlanFusedSums(int64_t rows, int64_t n, int elem_size,
                                                 bool aligned, bool in_phase, bool clusters,
                                                 bool wide_cta, int column_sums, int row_inputs,
                                                 int cluster_packs, float dram_gbps_per_sm,
                                                 int sms) {
  const int vec = PackWidth(elem_size);
  const bool whole = aligned && n % vec == 0;
  if (elem_size == 8 || column_sums < 1 || rows == 0 || n == 0 || !(whole || in_phase) ||
      ParamGradsTwoPass()) {
    return std::nullopt;
  }
  const RowPlan plan = PlanRowTier(n, vec, clusters, wide_cta, cluster_packs);
  n = std::max(n, PlanLengthFloor());  // the configurations below hold n (ROWNORM_PLAN_AS_N)
  // The chunks of `chunk_rows` rows of kernel k: of the rows' classes where they are not whole.
  const auto chunked = [&](const RowPlan& k, int chunk_rows) {
    return whole ? CtaSumPlan(k, rows, chunk_rows) : PhasedSumPlan(k, rows, chunk_rows, vec);
  };
  // Sums in shared memory, chunks of kSliceChunkBytes per column (see there). None of the
  // configurations below is one of these (but two sums of 16-bit 256 x 4 rows SliceSums256x4
  // leaves to the staged kernel; groups, fp32 rows of 512 x 4).
  const bool cta256 = plan.tier == RowTier::kCta && plan.threads == 256;
  if (SliceSumsApply(plan.tier, plan.threads, plan.packs, plan.cluster, elem_size, column_sums) &&
      (!cta256 || SliceSums256x4(n, whole, vec))) {
    RowPlan k = plan;
    k.params_once = true;
    FusedSumPlan fused = chunked(k, kSliceChunkBytes / elem_size);
    fused.pipelined =
        SliceSumsPipelined(k.threads, k.packs, k.cluster, elem_size, column_sums, n, whole);
    fused.register_sums =
        SliceSumsInRegisters(k.threads, k.packs, k.cluster, elem_size, column_sums, whole);
    // (the bulk prefetch needs sm_90, as the clusters do)
    fused.prefetch_next_row = clusters && !fused.pipelined &&
                              SlicePrefetchesNextRow(k.threads, k.packs, k.cluster, vec, elem_size,
                                                     column_sums, n, dram_gbps_per_sm);
    // (PlanRowSumOp keeps it where the staged team fits, then without the L2 prefetch)
    fused.stage_next_row = clusters && SliceSumsStageNextRow(k.cluster, elem_size, whole);
    return fused;
  }
  // Where the fused path measured faster than the two-pass one (benchmarks/results/h100/
  // NOTES.md §5, §16, §24). The rows of a warp x 8 packs (2048 / 1024 16-bit / fp32 elements)
  // and of the 4-pack CTA rows run with two packs per thread: at four, the column sums double
  // the registers a cached pack costs and fewer CTAs fit an SM (the two-pass path took 1.28x
  // as long for rms_norm at 2048).
  const bool cta = plan.tier == RowTier::kCta && plan.packs == kCtaVecs;
  const bool wide_group = plan.tier == RowTier::kGroup && plan.packs == kWideGroupVecs;
  const auto two_packs = [&](int threads) {
    return RowPlan{RowTier::kCta, vec, 0, threads, 0, kFusedSumVecs};
  };
  const bool fill = FillsTwoPackCtas(column_sums, row_inputs, elem_size);
  const int threads = n <= int64_t{128} * kFusedSumVecs * vec           ? 128
                      : n <= int64_t{256} * kFusedSumVecs * vec         ? 256
                      : fill && n <= int64_t{320} * kFusedSumVecs * vec ? 320
                      : fill && n <= int64_t{384} * kFusedSumVecs * vec ? 384
                                                                        : 512;
  // One sum on CTA rows: 16-row CTAs, in clusters (see kSumClusterCtas) where the exchange
  // fits, on the 2-pack rows and on 16-bit 4-pack rows. Graph-timed fwd+bwd steps on the H100
  // (NOTES.md §25), clustered against 16-row partials: bf16 2048 0.97x, 4096 0.96x, 8192
  // (256 x 4) 0.97x, fp32 1024 0.985x, 2048 0.99x; fp32 4096 (256 x 4, whose 16-row
  // partials are a sixteenth of an input's bytes) 1.03x. Rows in phase run unclustered: in
  // clusters (their head and tail scalars' sums added across the cluster too) the step took
  // 0.95-1.07x the time of 16-row partials at 1025-8191, 1.03-1.07x at 1025 (rms_norm and
  // add_rms_norm, bf16 and fp32, NOTES.md §45).
  const auto one_sum = [&](RowPlan k) {
    const int64_t exchange =
        int64_t{k.threads} * k.packs * vec * static_cast<int64_t>(sizeof(float));
    if (whole && clusters && exchange <= kMaxSumExchangeBytes &&
        (k.packs == kFusedSumVecs || elem_size < 4)) {
      k.cluster = kSumClusterCtas;
      return CtaSumPlan(k, rows, kSumClusterCtas * kFusedChunkRows);
    }
    return chunked(k, kFusedChunkRows);
  };
  // Two sums, rows of up to 512 threads x 2 packs (8192 16-bit / 4096 fp32): the staged
  // persistent kernel on 64-row chunks. fwd+bwd A/B against the table before it (two-pass sums
  // for bf16 4096 / 8192, 16-row chunks with two rows in registers elsewhere), H100 / H200:
  // bf16 2048 1.00 / 0.87x the time, 4096 0.92 / 0.93x, 8192 0.90 / 1.01x; fp32 2048
  // 0.91 / 0.86x, 4096 0.92 / 0.82x (NOTES.md §24, h200/NOTES.md §6). The register-pipelined
  // kernel on 16-row chunks took the two-pass time at bf16 4096 (§23).
  if (column_sums == 2 && (cta || wide_group) && n <= int64_t{512} * kFusedSumVecs * vec) {
    RowPlan k = two_packs(threads);
    k.stages = kFusedSumStages;
    return chunked(k, kStagedChunkRows);
  }
  // Two sums, fp32 rows of 512 threads x 4 packs (4097-8192): the same staged kernel, one CTA
  // per SM (two 64 KB stages); two-pass, they ran at 70-72% of copy, 0.74x Liger's step on
  // both GPUs (NOTES.md §26). 16-bit rows of that shape hold twice the sums' registers: their
  // sums go to shared memory (below).
  if (column_sums == 2 && cta && elem_size == 4 && n <= int64_t{512} * kCtaVecs * vec) {
    RowPlan k{RowTier::kCta, vec, 0, 512, 0, kCtaVecs};
    k.stages = kFusedSumStages;
    return chunked(k, kStagedChunkRows);
  }
  // One sum from here on. Rows of up to 384 threads x 2 packs (6144 16-bit / 3072 fp32) with
  // two rows in flight per CTA in registers (CtaRowSumsKernel's pipeline; staged, the rms_norm
  // step took 1.05-1.14x as long at bf16 2048-4096, NOTES.md §24).
  if ((cta || wide_group) && threads < 512) return one_sum(two_packs(threads));
  // Rows of 512 threads x 2 packs (8192 16-bit / 4096 fp32) with three row inputs
  // (add_rms_norm's dy, x + r and its gradient): one CTA of 512 with two rows in flight took
  // 0.91x the time of 256 threads x 4 packs one row at a time; with two inputs (rms_norm) it
  // took 1.06x (NOTES.md §18).
  if (cta && row_inputs == 3 && n <= int64_t{512} * kFusedSumVecs * vec) {
    return one_sum(two_packs(512));
  }
  // Longer rows of one sum: four packs (256 threads, and 512 for fp32: 16-bit ones are slice
  // sums, above; NOTES.md §5, §30), one row at a time.
  if (cta && column_sums == 1) {
    RowPlan k = plan;
    k.threads = n <= int64_t{256} * kCtaVecs * vec ? 256 : 512;
    FusedSumPlan fused = one_sum(k);
    fused.prefetch_next_row = clusters && CtaSumsPrefetchNextRow(k.threads, elem_size);
    return fused;
  }
  // 4-pack groups (rows of up to 32 lanes x 4 packs), on the table's lanes, so that dx comes out
  // the same bits whether or not the parameter gradients are asked for: the fused step took
  // 0.75-0.84x the two-pass one at 256 16-bit / 128 fp32 elements (8-lane groups; NOTES.md
  // §18); aligned fp32 rows of 32 / 64 on the table's 4 lanes 0.64-0.81x, and 0.95-1.00x the
  // time of 8-lane groups (H100, NOTES.md §47).
  // A CTA's groups add their sums into one partial of its kFusedGroupRows x groups rows. Rows
  // in phase: a CTA's rows are one chunk of one class, as its groups share its copy of the
  // parameters (filled for the class's head); a lane owns at most one head and one tail scalar
  // (groups of at least a pack's width). Not rows in phase on groups narrower than 8 lanes
  // (fp32 rows of up to 64): fused on their 4 lanes, the step took 1.14-1.24x the two-pass
  // one (33 and 61 elements, NOTES.md §47).
  if (plan.tier == RowTier::kGroup && plan.packs == kGroupVecs && (whole || plan.width >= 8)) {
    const int per_cta = kGroupCtaThreads / plan.width * kFusedGroupRows;
    FusedSumPlan fused = chunked(plan, per_cta);
    // (the bulk prefetch needs sm_90, as the clusters do)
    fused.prefetch_next_row = clusters && GroupSumsPrefetchNextRow(fused.chunks, sms);
    return fused;
  }
  return std::nullopt;
}

// Whether every operand of `a` allows the fused path's loads: 16-byte aligned, row strides a
// multiple of the pack width.
template <class Args>
bool FusedOperandsAligned(const Args& a) {
  constexpr int kVec = Args::kPackWidth;
  bool ok = true;
  for (int j = 0; j < Args::kNumOut; ++j) {
    ok = ok && reinterpret_cast<uintptr_t>(a.out[j]) % kPackBytes == 0 &&
         a.out_stride[j] % kVec == 0;
  }
  for (int i = 0; i < Args::kNumIn; ++i) {
    ok = ok && reinterpret_cast<uintptr_t>(a.in[i]) % kPackBytes == 0 && a.in_stride[i] % kVec == 0;
  }
  return ok;
}

// Whether each row of `a` starts at the same offset from 16 bytes in every operand
// (PhasedSumPlan): row 0 at the same offset, the row strides equal modulo the pack width.
// Not mixed problems, whose operands differ in element size.
template <class Args>
bool OperandsInPhase(const Args& a) {
  if constexpr (Args::kMixed) {
    return false;
  } else {
    constexpr int kVec = Args::kPackWidth;
    const auto offset = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % kPackBytes; };
    const uintptr_t at = offset(a.in[0]);
    const int64_t step = a.in_stride[0] % kVec;
    bool ok = true;
    for (int j = 0; j < Args::kNumOut; ++j) {
      ok = ok && offset(a.out[j]) == at && a.out_stride[j] % kVec == step;
    }
    for (int i = 1; i < Args::kNumIn; ++i) {
      ok = ok && offset(a.in[i]) == at && a.in_stride[i] % kVec == step;
    }
    return ok;
  }
}

// Whether every row of `a` starts 16-byte aligned in every operand and holds whole packs: rows
// without head or tail scalars, which the kernels specialized for them run (kAligned).
template <class Args>
bool RowsAligned(const Args& a) {
  return FusedOperandsAligned(a) && a.n % Args::kPackWidth == 0;
}

// ---------------------------------------------------------------------------------------
// The strided-dim path: contiguous (outer, d, inner) operands reduced over d. A CTA of
// 32 x 8 threads owns 32 adjacent columns (32 packs of columns with kPacked). Columns of up to
// 8 x 8 = 64 elements stay in registers (one read of the tensor); longer ones are read twice,
// the second time mostly from L2 (a CTA's 32 x d tile is reused at once).
// Packed tiles of one-input ops (the forwards) are prefetched where that measured faster: a
// persistent CTA keeps its next kStridedStages tiles in flight into shared memory (2 x 32 KB)
// while it reduces the current one.
// Packed columns of at most 32 elements split d among the lanes of a warp, not the thread rows
// of the CTA (StridedTile's warp layout): kWarpRows = 1, 2 or 4 lanes a column, the fewest
// that hold d in kStridedCache packs each. A column's lanes then reduce by shuffles (one lane:
// not at all) where the CTA layout waits at a barrier per reduction and lane of a pack, and a
// warp's load of a d-row covers 8-32 contiguous packs. H100, forward time against the CTA
// layout (benchmarks/results/h100/NOTES.md §39): fp32 rms_norm d = 16 / 24 / 32 0.75x / 0.79x /
// 0.85x, bf16 d = 16 / 32 0.76x / 0.83x, bf16 l2_normalize d = 3 0.69x (all with 8 lanes a
// column). With 8 lanes at d = 64 the one-reduction 16-bit forwards took 1.21-1.31x (a warp's
// d-row load 64 bytes; softmax and layer_norm gained 0.71-0.88x): d past 32 keeps the CTA
// layout.
enum class StridedKind { kPacked, kCached, kStreamed };

constexpr int kStridedTx = 32;
constexpr int kStridedTy = 8;
constexpr int kStridedCache = 8;
constexpr int kStridedStages = 2;

// Tiles in flight ahead of the current one on the packed path of `Args`' problems, where the
// kernel exists (one input: the forwards; the fused backwards: StridedSumStages).
template <class Args>
constexpr int StridedStages() {
  return Args::kNumIn == 1 ? kStridedStages : 0;
}

// Packed tiles of 4-byte elements are prefetched only on GPUs of at least this DRAM bandwidth
// per SM (GB/s; the launcher reads it from the device): channel RMSNorm fp32 112x64x512x512
// took 0.81x the time prefetched on the H200 (~37 GB/s per SM) but 1.018x on the H100 (25.4),
// whose two CTAs per SM of the unstaged kernel keep enough bytes in flight (16-bit tiles:
// 0.87x / 0.85x; benchmarks/results/h200/NOTES.md §4, h100/NOTES.md §34).
constexpr float kStridedPrefetch4ByteGbpsPerSm = 30.0f;

constexpr int kStridedMaxWarpRows = 4;

struct StridedPlan {
  StridedKind kernel = StridedKind::kStreamed;
  int lanes = 1;      // adjacent columns per thread (a pack with kPacked)
  int stages = 0;     // tiles in flight ahead of the current one (kPacked)
  int warp_rows = 0;  // kPacked: lanes of a warp per column (0: the CTA layout)
  // kPacked: every thread's kStridedCache d-rows are in the column (StridedFullColumns): the
  // kernels without a bound per d-row
  bool full_columns = false;
  // kPacked with stages: the inputs copied under L2's evict_last, each tile's lines set back once
  // it is stored (StridedKeepsInputsInL2)
  bool l2_keep = false;
};

// The warp layout's lanes per column for columns of `d` elements (0: the CTA layout).
constexpr int StridedWarpRows(int64_t d) {
  for (int rows = 1; rows <= kStridedMaxWarpRows; rows *= 2) {
    if (d <= int64_t{rows} * kStridedCache) return rows;
  }
  return 0;
}

// Whether packed columns of `d` elements in layout `warp_rows` fill every thread's
// kStridedCache d-rows: d = 64 in the CTA layout, 8 / 16 / 32 in the warp layout's.
constexpr bool StridedFullColumns(int64_t d, int warp_rows) {
  return d == int64_t{kStridedCache} * (warp_rows == 0 ? kStridedTy : warp_rows);
}

// Whether the staged strided kernel of a plan with `stages` in layout `warp_rows` keeps its
// `elem_size`-byte inputs in L2 on a device of `dram_gbps_per_sm` (KeepsRowInputInL2's rule,
// which ROWNORM_L2_KEEP overrides): the warp layouts and 4-byte tiles, not 16-bit tiles of the
// CTA layout. H200, over the channels of NCHW, time with it ÷ without, forward / step
// (benchmarks/results/h200/NOTES.md §54): fp32 RMSNorm over 112x64x512x512 (the seed) 0.983,
// with a weight 0.979 / 0.993, fp32 LayerNorm 0.996 / 1.001, fp32 RMSNorm over 32 channels
// 0.922 / 0.960, bf16 LayerNorm over 16 0.893 / 0.951; 16-bit tiles of the CTA layout lost (bf16
// LayerNorm over 64 1.121 / 1.100, softmax 1.100 / 1.043, RMSNorm 0.999 / 0.999).
inline bool StridedKeepsInputsInL2(int stages, int warp_rows, int elem_size,
                                   float dram_gbps_per_sm) {
  return stages > 0 && (warp_rows > 0 || elem_size == 4) && KeepsRowInputInL2(dram_gbps_per_sm);
}

// The plan of `a` on a device of `dram_gbps_per_sm` GB/s of DRAM bandwidth per SM (0: not
// known, as on a GPU whose driver does not report it).
template <class Args>
StridedPlan PlanStridedOp(const Args& a, float dram_gbps_per_sm) {
  constexpr int kLanes = Args::kPackWidth;
  if (a.d > kStridedTy * kStridedCache) return {StridedKind::kStreamed, 1};
  // Packs of adjacent columns where inner is a multiple of the pack width, there is at least
  // one full tile of columns and every operand is aligned to a pack (not for float64).
  const uintptr_t in_bytes = sizeof(typename Args::InElem) * kLanes;
  const uintptr_t out_bytes = sizeof(typename Args::OutElem) * kLanes;
  bool packs =
      sizeof(typename Args::InElem) != 8 && a.inner % kLanes == 0 && a.inner >= kStridedTx * kLanes;
  for (int j = 0; j < Args::kNumOut; ++j) {
    packs = packs && reinterpret_cast<uintptr_t>(a.out[j]) % out_bytes == 0;
  }
  for (int i = 0; i < Args::kNumIn; ++i) {
    packs = packs && reinterpret_cast<uintptr_t>(a.in[i]) % in_bytes == 0;
  }
  if (!packs) return {StridedKind::kCached, 1};
  const bool staged =
      sizeof(typename Args::InElem) < 4 || dram_gbps_per_sm >= kStridedPrefetch4ByteGbpsPerSm;
  const int warp_rows = StridedWarpRows(a.d);
  StridedPlan p{StridedKind::kPacked, kLanes, staged ? StridedStages<Args>() : 0, warp_rows,
                StridedFullColumns(a.d, warp_rows)};
  p.l2_keep =
      StridedKeepsInputsInL2(p.stages, warp_rows, sizeof(typename Args::InElem), dram_gbps_per_sm);
  return p;
}

// The strided path's fused parameter gradients: the packed kernel of the backward (`kernel`,
// PlanStridedOp's) adds each tile's column sums over its columns (the op body's AddColumns,
// Σ_i of a d-row's terms) and writes them as one partial per tile, `chunks` of them (the
// tiles, in order) per sum, which ParamGradFinalize adds (param_grad.h). A tile is a fixed set
// of columns of one outer index, so the sums are deterministic and do not depend on the grid or
// the batch. Only the packed kernel fuses (d of at most 64, inner a multiple of the pack): its
// threads hold a tile's d-rows in registers. The cached and streamed kernels (d past 64, odd
// inner, float64) keep the two-pass path.
struct StridedSumPlan {
  StridedPlan kernel;
  int64_t chunks = 0;  // the packed kernel's tiles: partials per column sum
};

// Adjacent columns a thread of the fused backward (the packed kernel with column sums) of an
// op with `sums` column sums: half a pack of 16-bit inputs with two sums (layer_norm: 4
// columns, 8-byte packs), else a whole pack. A 16-bit layer_norm thread of 8 columns holds x
// and dy in each of its 8 d-rows (64 registers) beside 16 sums, and spilled at the 128
// registers of two CTAs per SM (CTA layout: 332-436 bytes; ncu: 16.8 M spill requests, L2
// 90%); on 4 columns it takes 109-118 registers and spills nothing. H200, the channel-dim
// training step, time on half a pack ÷ a whole one: bf16 layer_norm d = 64 0.896 (61 -> 68% of
// copy), d = 3 0.983; bf16 rms_norm (one sum: no spills on 8 columns) 1.08-1.11, d = 48 1.015;
// float32 on 2 columns 1.07-1.08 (benchmarks/results/h200/NOTES.md §51).
template <class Args>
constexpr int StridedSumLanes(int sums) {
  return sizeof(typename Args::InElem) == 2 && sums > 1 ? Args::kPackWidth / 2 : Args::kPackWidth;
}

// Tiles in flight ahead of the current one in the fused backward of an op with `sums` column
// sums in layout `warp_rows` (StridedPrefetchKernel with the sums: a persistent grid, each
// tile's saved statistics brought into L1 with its packs, OpTraits::kSavedStats): where a
// thread takes half a pack (StridedSumLanes) in the CTA layout. A tile's x and dy are then
// 32 KB, so kStridedStages of them fit two CTAs of 256 per SM, whose 16 warps the tile's
// instructions need; a whole pack's 64 KB stages held one CTA per SM and took 1.02-1.22x the
// step (benchmarks/results/h200/NOTES.md §50). H200, the channel-dim training step, time ÷ the
// tiles loaded into registers: bf16 / fp16 layer_norm over 64 channels 0.955 / 0.957 (69 -> 72%
// of copy), over 48 0.981; prefetched without the statistics in L1, 0.990-0.994, their loads
// then the kernel's first wait. The warp layout's columns lost (d = 3 / 32: 1.038 / 1.022,
// d = 16 0.998) and keep the unstaged kernel (NOTES.md §52).
template <class Args>
constexpr int StridedSumStages(int sums, int warp_rows) {
  return warp_rows == 0 && StridedSumLanes<Args>(sums) < Args::kPackWidth ? kStridedStages : 0;
}

// Columns per tile of the packed kernel of `lanes` columns a pack in layout `warp_rows`
// (StridedTile: 32 packs a CTA in the CTA layout, 256 / warp_rows in the warp layout).
constexpr int64_t StridedTileColumns(int lanes, int warp_rows) {
  const int column_threads = warp_rows == 0 ? kStridedTy : warp_rows;
  return int64_t{kStridedTx} * kStridedTy / column_threads * lanes;
}

// The fused plan of `a` (an op with `sums` column sums) on a device of `dram_gbps_per_sm`, or
// nothing where the packed kernel does not run it or ROWNORM_PARAM_GRADS=two-pass.
template <class Args>
std::optional<StridedSumPlan> PlanStridedSums(const Args& a, int sums, float dram_gbps_per_sm) {
  StridedPlan k = PlanStridedOp(a, dram_gbps_per_sm);
  if (k.kernel != StridedKind::kPacked || k.stages != 0 || ParamGradsTwoPass()) {
    return std::nullopt;
  }
  k.lanes = StridedSumLanes<Args>(sums);
  k.stages = StridedSumStages<Args>(sums, k.warp_rows);
  k.l2_keep = StridedKeepsInputsInL2(k.stages, k.warp_rows, sizeof(typename Args::InElem),
                                     dram_gbps_per_sm);
  const int64_t cols = StridedTileColumns(k.lanes, k.warp_rows);
  return StridedSumPlan{k, a.outer * ((a.inner + cols - 1) / cols)};
}

// ---------------------------------------------------------------------------------------
// Descriptions, as `key=value` words (the plan log and rownorm.explain parse and print them).

inline const char* TierName(RowTier t) {
  switch (t) {
    case RowTier::kGroup: return "group";
    case RowTier::kCta: return "cta";
    case RowTier::kCluster: return "cluster";
    case RowTier::kStreaming: return "streaming";
  }
  return "?";
}

inline std::string Describe(const RowPlan& p) {
  std::string s =
      "path=rows tier=" + std::string(TierName(p.tier)) + " vec=" + std::to_string(p.vec);
  if (p.tier == RowTier::kGroup) s += " lanes_per_row=" + std::to_string(p.width);
  s += " threads=" + std::to_string(p.threads);
  if (p.tier == RowTier::kCluster) s += " cluster=" + std::to_string(p.cluster);
  if (p.tier != RowTier::kStreaming) s += " packs=" + std::to_string(p.packs);
  if (p.stages > 0) s += " stages=" + std::to_string(p.stages);
  if (p.params_once) s += " params=once";
  if (p.ctas_per_sm > 0) s += " ctas_per_sm=" + std::to_string(p.ctas_per_sm);
  if (p.l2_keep) s += " l2=keep";
  return s;
}

inline std::string Describe(const FusedSumPlan& f) {
  std::string s = Describe(f.kernel) + " param_grads=fused chunks=" + std::to_string(f.chunks);
  if (f.chunk_rows > 0) s += " chunk_rows=" + std::to_string(f.chunk_rows);
  if (f.teams > 0) s += " teams=" + std::to_string(f.teams);
  if (f.prefetch_next_row) s += " prefetch=next_row";
  if (f.pipelined) s += " prefetch=next_row_loads";
  if (f.stage_next_row) s += " prefetch=next_row_staged";
  if (f.register_sums) s += " sums=registers";
  if (f.row_classes > 1) s += " row_classes=" + std::to_string(f.row_classes);
  if (f.kernel.tier != RowTier::kCluster && f.kernel.cluster > 1) {
    s += " cluster=" + std::to_string(f.kernel.cluster);
  }
  return s;
}

inline std::string Describe(const StridedPlan& p) {
  const char* kernel = p.kernel == StridedKind::kPacked   ? "packed"
                       : p.kernel == StridedKind::kCached ? "cached"
                                                          : "streamed";
  std::string s = std::string("path=strided kernel=") + kernel + " vec=" + std::to_string(p.lanes) +
                  " threads=" + std::to_string(kStridedTx * kStridedTy);
  if (p.stages > 0) s += " stages=" + std::to_string(p.stages);
  if (p.warp_rows > 0) s += " warp_rows=" + std::to_string(p.warp_rows);
  if (p.full_columns) s += " columns=full";
  if (p.l2_keep) s += " l2=keep";
  return s;
}

inline std::string Describe(const StridedSumPlan& p) {
  return Describe(p.kernel) + " param_grads=fused chunks=" + std::to_string(p.chunks);
}

}  // namespace rownorm
