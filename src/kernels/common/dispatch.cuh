// Host-side launches of the row tiers, the fused column sums and the strided-dim path, and the
// device-dependent half of planning (the device's attributes and whether it co-schedules a
// cluster). The tier table and the rest of planning are in plan.h.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <optional>
#include <type_traits>

#include "kernels/common/op_traits.h"
#include "kernels/common/plan.h"
#include "kernels/common/row.cuh"

namespace rownorm {

static_assert(kPlanWarpSize == kWarpSize, "plan.h plans warps of the kernels' size");
static_assert(PackWidth(4) == MaxPackWidth(4) && PackWidth(2) == MaxPackWidth(2) &&
                  PackWidth(8) == MaxPackWidth(8),
              "plan.h plans packs of the kernels' width");

constexpr int kMaxDevices = 64;

// A value per CUDA device, computed on first use and kept for the process (what is planned on
// does not change while it runs). Two threads may both compute it, with the same result;
// devices beyond kMaxDevices are computed on every call.
template <typename V>
class PerDevice {
 public:
  // The current device's value (and its index in *current where given); `compute(device,
  // &value)` returns a cudaError_t, and a failure is returned and not cached.
  template <class Compute>
  cudaError_t Get(V* value, Compute compute, int* current = nullptr) {
    int device = 0;
    const cudaError_t got = cudaGetDevice(&device);
    if (got != cudaSuccess) return got;
    if (current != nullptr) *current = device;
    const bool cached = device >= 0 && device < kMaxDevices;
    if (cached && known_[device].load(std::memory_order_acquire)) {
      *value = values_[device].load(std::memory_order_relaxed);
      return cudaSuccess;
    }
    const cudaError_t err = compute(device, value);
    if (err == cudaSuccess && cached) {
      values_[device].store(*value, std::memory_order_relaxed);
      known_[device].store(true, std::memory_order_release);
    }
    return err;
  }

 private:
  std::atomic<V> values_[kMaxDevices] = {};
  std::atomic<bool> known_[kMaxDevices] = {};
};

// What planning reads of a device: 8 bytes, so that PerDevice's std::atomic of it is lock-free
// (no libatomic to link).
struct DeviceInfo {
  int16_t cc_major = 0;        // the cluster tier needs sm_90+
  int16_t sms = 0;             // streaming multiprocessors
  float dram_gbps_per_sm = 0;  // peak DRAM bandwidth / SMs (GB/s); 0 where not reported
};
static_assert(sizeof(DeviceInfo) == 8, "PerDevice<DeviceInfo> holds it in a lock-free atomic");

// Peak DRAM bandwidth per SM of device d in GB/s: 2 transfers per memory clock (the attribute,
// in kHz) over the bus width, over the SMs (H100 SXM: 2 x 2.619 GHz x 640 B / 132 = 25.4;
// H200: ~37). 0 where the driver does not report the memory clock or bus width.
inline float DramGbpsPerSm(int d) {
  int khz = 0, bits = 0, sms = 0;
  if (cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, d) != cudaSuccess ||
      cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, d) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d) != cudaSuccess || khz <= 0 ||
      bits <= 0 || sms <= 0) {
    (void)cudaGetLastError();  // "not reported", not a sticky error
    return 0;
  }
  return static_cast<float>(2.0 * khz * 1e3 * (bits / 8) / sms / 1e9);
}

// The attributes of device d that planning reads.
inline cudaError_t ReadDeviceInfo(int d, DeviceInfo* out) {
  int cc_major = 0, sms = 0;
  cudaError_t e = cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, d);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d);
  if (e == cudaSuccess) {
    out->cc_major = static_cast<int16_t>(cc_major);
    out->sms = static_cast<int16_t>(std::min(sms, 32767));
    out->dram_gbps_per_sm = DramGbpsPerSm(d);
  }
  return e;
}

// The current device (in `device`) and its attributes, read once per device.
inline cudaError_t GetDeviceInfo(int* device, DeviceInfo* info) {
  static PerDevice<DeviceInfo> cache;
  return cache.Get(info, ReadDeviceInfo, device);
}

// RowPlan::l2_keep of `plan` for Op on `dev`: where Op opts in (OpTraits::kKeepsInputInL2), the
// device keeps row inputs in L2 (KeepsRowInputInL2) and the plan's kernel is a row kernel that
// takes it (KeepsL2OnTier).
template <class Op>
bool KeepsL2(const RowPlan& plan, const DeviceInfo& dev) {
  return OpTraits<Op>::kKeepsInputInL2 && KeepsL2OnTier(plan) &&
         KeepsRowInputInL2(dev.dram_gbps_per_sm);
}

// `a` with input 0 kept in L2 where its plan says so (RowPlan::l2_keep).
template <class Args>
Args WithL2Keep(Args a, const RowPlan& plan) {
  a.keep_input0_in_l2 = plan.l2_keep;
  return a;
}

// `a` with its inputs kept in L2 where its strided plan says so (StridedPlan::l2_keep).
template <class Args>
Args WithStridedL2Keep(Args a, const StridedPlan& plan) {
  a.keep_inputs_in_l2 = plan.l2_keep;
  return a;
}

// The element size the tier table plans a problem with: the widest operand's (a pack holds
// kPackWidth elements of every operand type, so the row is counted in packs of the widest).
template <class Args>
constexpr int PlannedElemSize() {
  return kPackBytes / Args::kPackWidth;
}

inline unsigned GridFor(int64_t units) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(units, INT_MAX)));
}

// How many CTAs of kKernel (`threads` threads, always the same for a kernel; kSmem bytes of
// dynamic shared memory) the current device holds at once: the grid of a persistent kernel.
// Read once per device, when the kernel's dynamic shared memory limit is raised to kSmem; 0
// where not one CTA fits.
template <auto kKernel, size_t kSmem>
cudaError_t ResidentCtas(int threads, int* ctas) {
  static PerDevice<int> cache;
  return cache.Get(ctas, [threads](int d, int* out) {
    int per_sm = 0, sms = 0;
    cudaError_t e = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kSmem));
    if (e == cudaSuccess) {
      e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kKernel, threads, kSmem);
    }
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d);
    if (e != cudaSuccess) (void)cudaGetLastError();  // "none fits", not a sticky error
    *out = e == cudaSuccess ? per_sm * sms : 0;
    return cudaSuccess;
  });
}

// Launches kKernel over `units` as a persistent grid of the CTAs the device holds at once
// (ResidentCtas), with kSmem bytes of dynamic shared memory; *launched = false, launching
// nothing, where not one CTA fits (the caller then runs a kernel without stages).
template <auto kKernel, size_t kSmem, class... KernelArgs>
cudaError_t LaunchPersistent(int64_t units, dim3 block, cudaStream_t stream, bool* launched,
                             const KernelArgs&... args) {
  int ctas = 0;
  const cudaError_t err =
      ResidentCtas<kKernel, kSmem>(static_cast<int>(block.x * block.y * block.z), &ctas);
  *launched = err == cudaSuccess && ctas > 0;
  if (!*launched) return err;
  kKernel<<<GridFor(std::min<int64_t>(units, ctas)), block, kSmem, stream>>>(args...);
  return cudaGetLastError();
}

// ---------------------------------------------------------------------------------------
// The row tiers.

// The cluster tier's kernels (sm_90+), per configuration:
//   kRegisters  ClusterRowKernel: a cluster per row, the row loaded into registers (general
//               rows, or aligned ones: ClusterRegisterKernel);
//   kShared     BulkRowKernel: a persistent grid, the rows in shared memory by bulk copies with
//               kBulkStages in flight, where the stages take at most kMaxClusterSmem (one
//               input: every configuration; three: the 256-thread ones, one CTA per SM);
//   kParams     ClusterParamRowKernel: forwards with per-column parameters on aligned rows or
//               rows in phase (OperandsInPhase: then class by class, the parameters read once
//               per class), a persistent grid of register rows whose parameters are read once
//               per CTA; with the next row's loads in flight where KeptRowsPipelined.
// PlanRowOp picks, per device, the one it holds the most rows of at once (the GPU's
// properties, not the row count; a cluster holds one row, a pipelined kParams one two): ties
// go to kParams (it reads the fewest bytes), then to kRegisters (measured against kShared:
// benchmarks/results/h100/NOTES.md §27); but kRegisters wherever its rows keep the SM's DRAM
// busy (plan.h's ClusterParamsPerRow).
constexpr int kBulkStages = 2;
// Whether the kept-parameter rows of kThreads threads load their next row while they reduce and
// store the current one (ClusterRows' kPipelined): one-input rows of 256 threads, whose second
// row's 32 registers keep two CTAs per SM (101-128 registers) where the plain kernel held three
// or four, four rows in flight as before, but no SM idle from a row's barrier to its stores. On
// the H100 (forward, time ÷ unpipelined) layer_norm bf16 262144 0.908, fp32 65536 / 131072
// 0.972 / 0.966 (94 / 93% of copy), rms_norm bf16 262144 0.987, fp32 131072 0.991. Not two
// inputs (add_rms_norm: 170 registers, one CTA per SM, 1.016 at bf16 65536) nor 512 threads,
// which it holds to one CTA per SM (rms_norm fp32 262144: as fast as two unpipelined;
// layer_norm fp32 262144 0.99, where the register rows held to two per SM take 0.88):
// benchmarks/results/h100/NOTES.md §42.
template <class Args>
constexpr bool KeptRowsPipelined(int threads) {
  return Args::kNumIn == 1 && threads == kClusterThreads;
}
constexpr size_t kMaxClusterSmem = 200 * 1024;
template <class Op, class Args, int kThreads, ClusterKind kKind, int kVecs = kClusterVecs>
constexpr size_t ClusterSmem() {
  if constexpr (kKind == ClusterKind::kShared) {
    return kBulkStages * sizeof(RowSlices<Args, Args::kPackWidth, kVecs, kThreads>);
  } else if constexpr (kKind == ClusterKind::kParams) {
    return sizeof(ParamSlicesOf<Op, Args, Args::kPackWidth, kVecs, kThreads>);
  } else {
    return 0;
  }
}
// Whether the configuration has that kernel (the narrow rows of OpTraits::kClusterPacks: the
// register one only).
template <class Op, class Args, int kThreads, ClusterKind kKind, int kVecs = kClusterVecs>
constexpr bool ClusterKindExists() {
  if constexpr (kKind == ClusterKind::kParams &&
                (!OpTraits<Op>::kColumnParams || OpTraits<Op>::kColumnSums > 0)) {
    return false;
  } else if constexpr (kKind == ClusterKind::kShared && Args::kMixed) {
    return false;  // the bulk copies move packs of one type
  } else if constexpr (kVecs != kClusterVecs && kKind != ClusterKind::kRegisters) {
    return false;
  } else {
    return ClusterSmem<Op, Args, kThreads, kKind, kVecs>() <= kMaxClusterSmem;
  }
}

// Whether the register rows of kThreads threads have a kernel specialized for problems whose
// rows all start 16-byte aligned and hold whole packs (RowsAligned; ClusterRegisterKernel's
// kAligned), which LaunchClusterRow picks for them. The general rows carry the head and
// tail scalars and a bound on every pack through every pass: on the H100 layer_norm bf16 65536
// executed 119.0 M instructions there against 100.4 M aligned (the kept-parameter kernel,
// aligned too: 82.7 M), and its forward is bound by instruction issue (NOTES.md §42).
// Time general ÷ aligned: layer_norm bf16 65536 / 131072 1.046 / 1.042 (to 92 / 89% of copy),
// fwd+bwd 1.016 / 1.014; fp32 layer_norm's aligned rows take 64 registers where the general
// ones take 80 (four CTAs per SM against three), which makes its rows of 32768 / 65536 read
// their parameters per row (0.955 / 0.977 the kept rows' time); the other ops within 1-2%.
// Not the 512-thread CTAs of 16 x 512 rows: l2_normalize fp32 262144 took 1.037x the general
// rows' time aligned, layer_norm fp32 1.009x (softmax 0.987x).
template <int kThreads>
constexpr bool AlignedRegisterRows() {
  return kThreads == kClusterThreads;
}

// The register rows' kernel of a configuration, for rows of any alignment or (kAligned) for
// aligned problems.
template <class Op, class Args, int kThreads, int kCluster, int kVecs, bool kAligned>
constexpr auto ClusterRegisterKernel() {
  constexpr int kVec = Args::kPackWidth;
  constexpr int kHeld = OpTraits<Op>::ClusterCtasPerSm(kCluster, kThreads, kVecs);
  if constexpr (kHeld > 0) {
    return ClusterRowKernelBounded<Op, Args, kVec, kVecs, kThreads, kCluster, kHeld, kAligned>;
  } else {
    return ClusterRowKernel<Op, Args, kVec, kVecs, kThreads, kCluster, kAligned>;
  }
}

// The cluster kernel of a configuration (kParams: of aligned rows, or with kAligned false of
// rows in phase).
template <class Op, class Args, int kThreads, int kCluster, ClusterKind kKind,
          int kVecs = kClusterVecs, bool kAligned = true>
constexpr auto ClusterKernel() {
  static_assert(ClusterKindExists<Op, Args, kThreads, kKind, kVecs>(),
                "planned only where it exists");
  constexpr int kVec = Args::kPackWidth;
  if constexpr (kKind == ClusterKind::kShared) {
    return BulkRowKernel<Op, Args, kVec, kVecs, kThreads, kCluster, kBulkStages>;
  } else if constexpr (kKind == ClusterKind::kParams) {
    return ClusterParamRowKernel<Op, Args, kVec, kVecs, kThreads, kCluster,
                                 KeptRowsPipelined<Args>(kThreads), kAligned>;
  } else {
    return ClusterRegisterKernel<Op, Args, kThreads, kCluster, kVecs, false>();
  }
}

// f(kThreads, kCluster, kVecs) (std::integral_constant<int, ·> each) for the cluster-tier
// configuration of `plan` that the table plans for Op (plan.h): 256 x 8-pack clusters of 2-16
// CTAs, the wide cluster (16 x 512 x 8); for ops with kClusterPacks = 4, 256 x 8 packs on 2
// CTAs, 256 x 4 on 8 and 16, then 512 x 4 on 16 (kWideClusterPacks = 4) or 256 x 8 on 16, and
// the wide cluster. cudaErrorInvalidConfiguration for a configuration the table never plans.
template <class Op, class F>
cudaError_t WithClusterShape(const RowPlan& plan, F f) {
  static_assert(OpTraits<Op>::kClusterPacks == kClusterVecs ||
                    OpTraits<Op>::kClusterPacks == kClusterHalfVecs,
                "the table plans 8 or 4 packs a thread on the cluster tier");
  using I256 = std::integral_constant<int, kClusterThreads>;
  using I512 = std::integral_constant<int, kWideClusterThreads>;
  using I2 = std::integral_constant<int, 2>;
  using I8 = std::integral_constant<int, kClusterVecs>;
  using I4 = std::integral_constant<int, kClusterHalfVecs>;
  using IMax = std::integral_constant<int, kMaxCluster>;
  const bool narrow = plan.threads == kClusterThreads;
  if (plan.threads == kWideClusterThreads && plan.packs == kClusterVecs) {
    return f(I512{}, IMax{}, I8{});
  }
  if constexpr (OpTraits<Op>::kClusterPacks == kClusterHalfVecs) {
    if (narrow && plan.packs == kClusterVecs && plan.cluster == 2) return f(I256{}, I2{}, I8{});
    if (narrow && plan.packs == kClusterHalfVecs && plan.cluster == 8) {
      return f(I256{}, std::integral_constant<int, 8>{}, I4{});
    }
    if (plan.packs == kClusterHalfVecs && plan.cluster == kMaxCluster) {
      if (narrow) return f(I256{}, IMax{}, I4{});
      if constexpr (OpTraits<Op>::kWideClusterPacks == kClusterHalfVecs) {
        if (plan.threads == kWideClusterThreads) return f(I512{}, IMax{}, I4{});
      }
    }
    if constexpr (OpTraits<Op>::kWideClusterPacks == kClusterVecs) {
      if (narrow && plan.packs == kClusterVecs && plan.cluster == kMaxCluster) {
        return f(I256{}, IMax{}, I8{});
      }
    }
  } else if (narrow && plan.packs == kClusterVecs) {
    switch (plan.cluster) {
      case 2: return f(I256{}, I2{}, I8{});
      case 4: return f(I256{}, std::integral_constant<int, 4>{}, I8{});
      case 8: return f(I256{}, std::integral_constant<int, 8>{}, I8{});
      case kMaxCluster: return f(I256{}, IMax{}, I8{});
    }
  }
  return cudaErrorInvalidConfiguration;
}

template <int kThreads, int kCluster, size_t kSmem = 0>
cudaLaunchConfig_t ClusterConfig(cudaLaunchAttribute* attr, unsigned grid, cudaStream_t stream) {
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = kCluster;
  attr->val.clusterDim.y = 1;
  attr->val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

// How many clusters of kCluster CTAs of kKernel (kThreads threads, kSmem bytes of dynamic
// shared memory) the current device runs at once; 0 where it cannot co-schedule one (16 is a
// non-portable size; a GPU or partition may hold fewer SMs per GPC; the shared memory may not
// fit). Read once per device, when the kernel's limits are raised (the non-portable size, its
// shared memory).
template <auto kKernel, int kThreads, int kCluster, size_t kSmem>
cudaError_t ResidentClusters(int* clusters) {
  static PerDevice<int> cache;
  return cache.Get(clusters, [](int, int* out) {
    cudaError_t e = cudaSuccess;
    if (kCluster > 8) {
      e = cudaFuncSetAttribute(kKernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    }
    if (e == cudaSuccess && kSmem > 0) {
      e = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(kSmem));
    }
    cudaLaunchAttribute attr[1];
    const cudaLaunchConfig_t cfg =
        ClusterConfig<kThreads, kCluster, kSmem>(attr, kCluster, nullptr);
    int n = 0;
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveClusters(&n, kKernel, &cfg);
    if (e != cudaSuccess) {
      // A failed query means "not co-schedulable" (as on a device without clusters); its
      // error is cleared so that it does not surface at the next launch.
      (void)cudaGetLastError();
    }
    *out = e == cudaSuccess ? n : 0;
    return cudaSuccess;
  });
}

// The same for one configuration of the cluster tier's row kernels; 0 where the kernel does
// not exist (kAligned false: kParams's rows in phase, not of mixed problems).
template <class Op, class Args, int kThreads, int kCluster, ClusterKind kKind,
          int kVecs = kClusterVecs, bool kAligned = true>
cudaError_t CoResidentClusters(int* clusters) {
  if constexpr (!ClusterKindExists<Op, Args, kThreads, kKind, kVecs>() ||
                (!kAligned && Args::kMixed)) {
    *clusters = 0;
    return cudaSuccess;
  } else {
    return ResidentClusters<ClusterKernel<Op, Args, kThreads, kCluster, kKind, kVecs, kAligned>(),
                            kThreads, kCluster, ClusterSmem<Op, Args, kThreads, kKind, kVecs>()>(
        clusters);
  }
}

template <class Op, class Args, ClusterKind kKind>
cudaError_t CoResidentClusters(const RowPlan& plan, int* clusters) {
  return WithClusterShape<Op>(plan, [&](auto t, auto c, auto v) {
    return CoResidentClusters<Op, Args, decltype(t)::value, decltype(c)::value, kKind,
                              decltype(v)::value>(clusters);
  });
}

// The clusters of register rows the device holds at once for `plan`, of the aligned kernel where
// `aligned` (RowsAligned) and the configuration runs it (AlignedRegisterRows), which may hold
// more CTAs per SM than the general one.
template <class Op, class Args>
cudaError_t RegisterRowsResident(const RowPlan& plan, bool aligned, int* clusters) {
  return WithClusterShape<Op>(plan, [&](auto t, auto c, auto v) {
    constexpr int kThreads = decltype(t)::value;
    constexpr int kCluster = decltype(c)::value;
    constexpr int kVecs = decltype(v)::value;
    if constexpr (AlignedRegisterRows<kThreads>()) {
      if (aligned) {
        return ResidentClusters<ClusterRegisterKernel<Op, Args, kThreads, kCluster, kVecs, true>(),
                                kThreads, kCluster,
                                RowParamStageBytes<Op, Args, kVecs, kThreads, true>()>(clusters);
      }
    }
    return CoResidentClusters<Op, Args, kThreads, kCluster, ClusterKind::kRegisters, kVecs>(
        clusters);
  });
}

// The bytes a column of Args' row inputs take.
template <class Args>
constexpr int RowInputBytes() {
  int in_bytes = 0;
  for (int i = 0; i < Args::kNumIn; ++i) in_bytes += Args::InBytes(i);
  return in_bytes;
}

// The rows the device holds at once in the kParams kernel of `plan` (0 where it does not
// exist) for aligned rows or rows in phase: two per cluster where KeptRowsPipelined.
template <class Op, class Args>
cudaError_t KeptRowsInFlight(const RowPlan& plan, bool aligned, int* rows) {
  return WithClusterShape<Op>(plan, [&](auto t, auto c, auto v) {
    constexpr int kThreads = decltype(t)::value;
    constexpr int kCluster = decltype(c)::value;
    constexpr int kVecs = decltype(v)::value;
    const cudaError_t err =
        aligned
            ? CoResidentClusters<Op, Args, kThreads, kCluster, ClusterKind::kParams, kVecs>(rows)
            : CoResidentClusters<Op, Args, kThreads, kCluster, ClusterKind::kParams, kVecs, false>(
                  rows);
    if (KeptRowsPipelined<Args>(kThreads)) *rows *= 2;
    return err;
  });
}

// How many CTAs per SM the CTA tier's rows of kThreads x kVecs are held to (CtaRowKernelBounded,
// OpTraits::CtaCtasPerSm), for ops of one input; 0: no such kernel.
template <class Op, class Args, int kThreads, int kVecs>
constexpr int CtaHeldCtas() {
  return Args::kNumIn == 1 ? OpTraits<Op>::CtaCtasPerSm(kThreads, kVecs) : 0;
}

// A held kernel whose registers spill more than kMaxHeldLocalBytes a thread (its local memory,
// as the driver reports it) is not run: the spills' traffic costs more than the rows gained in
// flight. H100, forward, time held ÷ plain, the 512 x 4 CTA held to three per SM
// (benchmarks/results/h100/NOTES.md §48): 16-bit layer_norm on rows not 16-byte aligned (40-56
// bytes) 1.11-1.34, rms_norm (48) 1.005-1.018; fp32 ones (8-24 bytes) 0.955-0.985. The wide
// CTA's rows not aligned hold 8-24 (two per SM, op_traits.h).
constexpr size_t kMaxHeldLocalBytes = 32;

// The local memory a thread of kKernel takes (its spilled registers), read once per device.
template <auto kKernel>
cudaError_t KernelLocalBytes(size_t* bytes) {
  static PerDevice<size_t> cache;
  return cache.Get(bytes, [](int, size_t* out) {
    cudaFuncAttributes attr{};
    const cudaError_t e = cudaFuncGetAttributes(&attr, kKernel);
    *out = attr.localSizeBytes;
    return e;
  });
}

// How many CTAs of the held kernel kKernel (`threads` threads, kSmem bytes of dynamic shared
// memory) the current device holds at once (*held): ResidentCtas, or 0 where its registers
// spill past kMaxHeldLocalBytes.
template <auto kKernel, size_t kSmem>
cudaError_t HeldResidentCtas(int threads, int* held) {
  size_t local = 0;
  const cudaError_t err = KernelLocalBytes<kKernel>(&local);
  *held = 0;
  if (err != cudaSuccess || local > kMaxHeldLocalBytes) return err;
  return ResidentCtas<kKernel, kSmem>(threads, held);
}

// How many CTAs of the CTA tier's kernels of `Op` for rows of kT x kV the device holds at once:
// CtaRowKernel (*plain) and CtaRowKernelBounded (*held; 0 where the op has none or it spills
// past kMaxHeldLocalBytes), both those LaunchCtaRow runs for rows `aligned` or not.
template <class Op, class Args, int kT, int kV, bool kAligned>
cudaError_t CtaResidency(int* plain, int* held) {
  constexpr int kVec = Args::kPackWidth;
  constexpr int kHeld = CtaHeldCtas<Op, Args, kT, kV>();
  *held = 0;
  cudaError_t err = ResidentCtas<CtaRowKernel<Op, Args, kVec, kV, kT, kAligned>, 0>(kT, plain);
  if constexpr (kHeld > 0) {
    constexpr auto kKernel = CtaRowKernelBounded<Op, Args, kVec, kV, kT, kAligned, kHeld>;
    if (err == cudaSuccess) err = HeldResidentCtas<kKernel, 0>(kT, held);
  }
  return err;
}

// The launcher's choice for the CTA tier's rows of kT x kV (`plan`), where the op has a held
// kernel for them: held where the device holds more of those CTAs than of the plain kernel.
// The CTA tier reads per-column parameters in every row on every GPU: a persistent grid that
// kept them per CTA (as the cluster tier's ClusterParamRowKernel does) took 1.05-1.11x the
// time of the per-row reads on the H100 (benchmarks/results/h100/NOTES.md §31), and on the
// H200 rms_norm 1.02-1.12x at bf16 16392-32768, 1.07-1.08x at fp32 8196-16384, 1.06-1.18x
// with float32 weights on bf16 rows, layer_norm 1.40-1.47x (benchmarks/results/h200/NOTES.md
// §32), where it had measured 0.89-0.92x against the per-row kernels of the time (§12).
template <class Op, class Args, int kT, int kV>
cudaError_t PlanCtaKernel(bool aligned, RowPlan* plan) {
  constexpr int kHeld = CtaHeldCtas<Op, Args, kT, kV>();
  if constexpr (kHeld > 0) {
    int plain = 0, held = 0;
    const cudaError_t err = aligned ? CtaResidency<Op, Args, kT, kV, true>(&plain, &held)
                                    : CtaResidency<Op, Args, kT, kV, false>(&plain, &held);
    if (err != cudaSuccess) return err;
    if (held > plain) plan->ctas_per_sm = kHeld;
  }
  return cudaSuccess;
}

// The plan of `a` on the current device: the tier table (plan.h), with a cluster the device
// cannot co-schedule replaced by streaming, and the rows in flight the launcher keeps.
template <class Op, class Args>
cudaError_t PlanRowOp(const Args& a, int param_bytes, RowPlan* plan) {
  int device = 0;
  DeviceInfo dev;
  cudaError_t err = GetDeviceInfo(&device, &dev);
  if (err != cudaSuccess) return err;
  *plan = PlanRowProblem(a.n, PlannedElemSize<Args>(), RowVecWidth(a), PlanClusters(dev.cc_major),
                         OpTraits<Op>::kWideCta, OpTraits<Op>::kClusterPacks,
                         OpTraits<Op>::kWideClusterPacks);
  if constexpr (!std::is_same_v<typename Args::InElem, double>) {
    // Aligned problems run the kernels specialized for them: their residency is what counts.
    const bool aligned = RowsAligned(a);
    if (plan->tier == RowTier::kCluster) {  // the kernel the device holds most of (above)
      const std::optional<ClusterKind> forced = ForcedClusterKind();
      const auto asked = [&](ClusterKind k) { return !forced.has_value() || *forced == k; };
      int shared = 0, params = 0, registers = 0;
      if (asked(ClusterKind::kShared)) {
        err = CoResidentClusters<Op, Args, ClusterKind::kShared>(*plan, &shared);
      }
      // Rows in phase (odd N) keep their parameters where the rule below would keep them only
      // for ops of two row inputs (add_rms_norm), or where forced. H100, forward, the kept rows
      // in phase against the register rows (ROWNORM_CLUSTER_ROWS; NOTES.md §44): add_rms_norm
      // fp32 131071 / 262143 0.94 / 0.86x the time; layer_norm 1.04-1.18x (fp32 32769-131071,
      // bf16 262143), rms_norm bf16 262143 1.12x, fp32 131071 1.01x, 262143 0.91x (the bulk
      // rows 0.99x).
      const bool kept_rows =
          param_bytes > 0 &&
          (aligned || (OperandsInPhase(a) && (forced.has_value() || Args::kNumIn == 2)));
      if (err == cudaSuccess && asked(ClusterKind::kParams) && kept_rows) {
        err = KeptRowsInFlight<Op, Args>(*plan, aligned, &params);
      }
      if (err == cudaSuccess) {
        err = RegisterRowsResident<Op, Args>(*plan, aligned, &registers);
      }
      if (err != cudaSuccess) return err;
      // Kept parameters against a cluster per row: plan.h's KeepsClusterParams. The aligned
      // register rows of 256 threads are the ones that stage their parameters.
      const bool staged = aligned && plan->threads == kClusterThreads &&
                          StagesRowParams<Op, Args, /*kAligned=*/true>();
      bool per_row = false;
      const bool keep = KeepsClusterParams(
          a.n, *plan, param_bytes, RowInputBytes<Args>(), KeptRowsPipelined<Args>(plan->threads),
          staged, Args::kNumIn, params, registers, shared, dev.sms, dev.dram_gbps_per_sm, &per_row);
      if (params > 0 && (forced.has_value() || keep)) {
        plan->params_once = true;
      } else if (shared > 0 && (forced.has_value() || (!per_row && shared > registers))) {
        plan->stages = kBulkStages;
      } else if (registers == 0) {
        *plan = StreamingPlan(plan->vec);
      }
    }
    if (plan->tier == RowTier::kCta && plan->threads == 512) {
      static_assert(kWideCtaThreads == 512, "the wide CTA is one of the CTAs of 512");
      err = plan->packs == kWideCtaVecs ? PlanCtaKernel<Op, Args, 512, kWideCtaVecs>(aligned, plan)
                                        : PlanCtaKernel<Op, Args, 512, kCtaVecs>(aligned, plan);
      if (err != cudaSuccess) return err;
    }
  }
  plan->l2_keep = KeepsL2<Op>(*plan, dev);
  return cudaSuccess;
}

// Launches one cluster configuration (PlanRowOp found that the device co-schedules it): the
// persistent kernels (kShared, kParams) as a grid of the clusters the device runs at once, the
// register one as a cluster per row.
template <class Op, class Args, int kThreads, int kCluster, ClusterKind kKind, int kVecs,
          bool kAligned = true>
cudaError_t LaunchClusterRow(const Args& a, const Op& op, cudaStream_t stream) {
  int64_t clusters = std::min<int64_t>(a.rows, INT_MAX / kCluster);
  if constexpr (kKind != ClusterKind::kRegisters) {
    int resident = 0;
    const cudaError_t err =
        CoResidentClusters<Op, Args, kThreads, kCluster, kKind, kVecs, kAligned>(&resident);
    if (err != cudaSuccess) return err;
    clusters = std::min<int64_t>(clusters, std::max(resident, 1));
  }
  const auto launch = [&](auto kernel, auto smem) {
    cudaLaunchAttribute attr[1];
    const cudaLaunchConfig_t cfg = ClusterConfig<kThreads, kCluster, decltype(smem)::value>(
        attr, static_cast<unsigned>(kCluster * clusters), stream);
    return cudaLaunchKernelEx(&cfg, kernel, a, op);
  };
  if constexpr (kKind == ClusterKind::kRegisters && AlignedRegisterRows<kThreads>()) {
    if (RowsAligned(a)) {
      constexpr auto kKernel = ClusterRegisterKernel<Op, Args, kThreads, kCluster, kVecs, true>();
      constexpr size_t kStage = RowParamStageBytes<Op, Args, kVecs, kThreads, true>();
      int resident = 0;  // sets the kernel's cluster attributes (once per device)
      const cudaError_t err = ResidentClusters<kKernel, kThreads, kCluster, kStage>(&resident);
      if (err != cudaSuccess) return err;
      return launch(kKernel, std::integral_constant<size_t, kStage>{});
    }
  }
  return launch(ClusterKernel<Op, Args, kThreads, kCluster, kKind, kVecs, kAligned>(),
                std::integral_constant<size_t, ClusterSmem<Op, Args, kThreads, kKind, kVecs>()>{});
}

template <class Op, class Args, int kThreads, int kCluster, int kVecs>
cudaError_t LaunchClusterRow(const Args& a, const Op& op, const RowPlan& plan,
                             cudaStream_t stream) {
  if constexpr (ClusterKindExists<Op, Args, kThreads, ClusterKind::kParams, kVecs>()) {
    if (plan.params_once) {
      if constexpr (!Args::kMixed) {  // PlanRowOp keeps them for rows in phase too
        if (!RowsAligned(a)) {
          return LaunchClusterRow<Op, Args, kThreads, kCluster, ClusterKind::kParams, kVecs, false>(
              a, op, stream);
        }
      }
      return LaunchClusterRow<Op, Args, kThreads, kCluster, ClusterKind::kParams, kVecs>(a, op,
                                                                                         stream);
    }
  }
  if constexpr (ClusterKindExists<Op, Args, kThreads, ClusterKind::kShared, kVecs>()) {
    if (plan.stages == kBulkStages) {
      return LaunchClusterRow<Op, Args, kThreads, kCluster, ClusterKind::kShared, kVecs>(a, op,
                                                                                         stream);
    }
  }
  if (plan.params_once || plan.stages != 0) return cudaErrorInvalidConfiguration;
  return LaunchClusterRow<Op, Args, kThreads, kCluster, ClusterKind::kRegisters, kVecs>(a, op,
                                                                                        stream);
}

template <class Op, class Args, int kVec>
cudaError_t LaunchStreamingRow(const Args& a, const Op& op, cudaStream_t stream) {
  StreamingRowKernel<Op, Args, kVec, kStreamingThreads>
      <<<GridFor(a.rows), kStreamingThreads, 0, stream>>>(a, op);
  return cudaGetLastError();
}

// The group tier, the rows of aligned problems (RowsAligned) on their own kernel, as the CTA
// tier's (LaunchCtaRow): on the H200 the group kernels are issue-bound (ncu, bf16 512: 87% of
// the issue slots for layer_norm, 77% for rms_norm; benchmarks/results/h200/NOTES.md §32), and
// aligned rows carry no head or tail scalars to place: layer_norm's bf16 forward at 256-1024
// took 0.95x the time, the others 0.98-1.01x (H200, the same bits). Not mixed problems (the
// float32 residual stream): the aligned kernel of its backward spilled on 32 lanes x 8 packs.
template <class Op, class Args, int kWidth, int kVecs = kGroupVecs>
cudaError_t LaunchGroupRow(const Args& a, const Op& op, cudaStream_t stream) {
  constexpr int kVec = Args::kPackWidth;
  static_assert(kWidth >= kVec, "a group is at least one pack wide");
  constexpr int kRowsPerCta = kGroupCtaThreads / kWidth;
  const unsigned grid = GridFor((a.rows + kRowsPerCta - 1) / kRowsPerCta);
  if constexpr (!Args::kMixed) {
    if (RowsAligned(a)) {
      GroupRowKernel<Op, Args, kVec, kVecs, kWidth, kGroupCtaThreads, true>
          <<<grid, kGroupCtaThreads, 0, stream>>>(a, op);
      return cudaGetLastError();
    }
  }
  GroupRowKernel<Op, Args, kVec, kVecs, kWidth, kGroupCtaThreads, false>
      <<<grid, kGroupCtaThreads, 0, stream>>>(a, op);
  return cudaGetLastError();
}

// The CTA tier's rows of one kind (CtaRows' kAligned).
template <class Op, class Args, int kThreads, int kVecs, bool kAligned>
cudaError_t LaunchCtaRows(const Args& a, const Op& op, const RowPlan& plan, cudaStream_t stream) {
  constexpr int kVec = Args::kPackWidth;
  constexpr int kHeld = CtaHeldCtas<Op, Args, kThreads, kVecs>();
  if constexpr (kHeld > 0) {
    if (plan.ctas_per_sm == kHeld) {
      CtaRowKernelBounded<Op, Args, kVec, kVecs, kThreads, kAligned, kHeld>
          <<<GridFor(a.rows), kThreads, 0, stream>>>(a, op);
      return cudaGetLastError();
    }
  }
  if (plan.ctas_per_sm != 0) return cudaErrorInvalidConfiguration;
  CtaRowKernel<Op, Args, kVec, kVecs, kThreads, kAligned>
      <<<GridFor(a.rows), kThreads, 0, stream>>>(a, op);
  return cudaGetLastError();
}

// The CTA tier: the rows of aligned problems (RowsAligned) on their own kernels. Those carry no
// head or tail scalars and no bound on every pack. On the H100 (forward, time general ÷ aligned;
// NOTES.md §43): 16-bit layer_norm 32768 (the wide CTA two per SM, whose general kernel spills at
// 64 registers) 1.078, and with float32 parameters 1.037 / 1.453 / 1.073 at 8192 / 16384 / 32768,
// rms_norm's 32768 with them 1.046 (its aligned wide CTA takes 60 registers, two per SM); the
// others 0.99-1.02.
template <class Op, class Args, int kThreads, int kVecs = kCtaVecs>
cudaError_t LaunchCtaRow(const Args& a, const Op& op, const RowPlan& plan, cudaStream_t stream) {
  if (plan.params_once) return cudaErrorInvalidConfiguration;  // a plan PlanCtaKernel never makes
  return RowsAligned(a) ? LaunchCtaRows<Op, Args, kThreads, kVecs, true>(a, op, plan, stream)
                        : LaunchCtaRows<Op, Args, kThreads, kVecs, false>(a, op, plan, stream);
}

// Runs `op` on every row of `a` on `stream` as `plan` (PlanRowOp of `a`) says; the caller has
// made the device current. A plan the table never makes is cudaErrorInvalidConfiguration.
template <class Op, class Args>
cudaError_t LaunchRowOp(const Args& a, const Op& op, const RowPlan& plan, cudaStream_t stream) {
  if (a.rows == 0 || a.n == 0) return cudaSuccess;
  constexpr int kVec = Args::kPackWidth;
  if (plan.tier == RowTier::kStreaming) {
    return plan.vec == kVec ? LaunchStreamingRow<Op, Args, kVec>(a, op, stream)
                            : LaunchStreamingRow<Op, Args, 1>(a, op, stream);
  }
  if constexpr (!std::is_same_v<typename Args::InElem, double>) {
    switch (plan.tier) {
      case RowTier::kGroup:
        switch (plan.width) {
          case 4:
            if constexpr (kVec <= 4) return LaunchGroupRow<Op, Args, 4>(a, op, stream);
            break;
          case 8: return LaunchGroupRow<Op, Args, 8>(a, op, stream);
          case 16: return LaunchGroupRow<Op, Args, 16>(a, op, stream);
          case kWarpSize:
            return plan.packs == kWideGroupVecs
                       ? LaunchGroupRow<Op, Args, kWarpSize, kWideGroupVecs>(a, op, stream)
                       : LaunchGroupRow<Op, Args, kWarpSize>(a, op, stream);
        }
        break;
      case RowTier::kCta:
        switch (plan.threads) {
          case 128: return LaunchCtaRow<Op, Args, 128>(a, op, plan, stream);
          case 256: return LaunchCtaRow<Op, Args, 256>(a, op, plan, stream);
          case 512:
            if constexpr (OpTraits<Op>::kWideCta) {
              if (plan.packs == kWideCtaVecs) {
                return LaunchCtaRow<Op, Args, kWideCtaThreads, kWideCtaVecs>(a, op, plan, stream);
              }
            }
            return LaunchCtaRow<Op, Args, 512>(a, op, plan, stream);
        }
        break;
      case RowTier::kCluster:
        return WithClusterShape<Op>(plan, [&](auto t, auto c, auto v) {
          return LaunchClusterRow<Op, Args, decltype(t)::value, decltype(c)::value,
                                  decltype(v)::value>(a, op, plan, stream);
        });
      case RowTier::kStreaming: break;
    }
  }
  return cudaErrorInvalidConfiguration;
}

// ---------------------------------------------------------------------------------------
// Fused parameter gradients (ops with kColumnSums; the plan is PlanFusedSums of plan.h).

// The staged fused-sum kernel of a kThreads x kVecs configuration (kAligned false: rows in
// phase; kCtasPerSm: held to the registers of that many CTAs per SM), its shared memory, and
// how many of its CTAs the device holds at once (0: none fits; CtaRowSumsKernel runs the same
// chunks instead).
template <class Op, class Args, int kThreads, int kVecs, bool kAligned = true,
          int kCtasPerSm = PipelinedSumThreads<Op, Args>() / kThreads>
constexpr auto StagedSumKernel =
    CtaRowSumsStagedKernel<Op, Args, Args::kPackWidth, kVecs, kThreads, kStagedChunkRows,
                           kFusedSumStages, kAligned, kCtasPerSm>;
template <class Args, int kThreads, int kVecs>
constexpr size_t StagedSumBytes() {
  return kFusedSumStages * sizeof(RowStage<Args, Args::kPackWidth, kVecs, kThreads>);
}
// Whether PlanFusedSums plans the staged kernel on 512 threads x kCtaVecs packs for these
// operands (fp32 only: plan.h).
template <class Args>
constexpr bool kStagedWideSums = sizeof(typename Args::InElem) == 4;

// The staged kernel of rows of 320 or 384 threads x 2 packs held to the registers of
// kStagedHeldCtas CTAs per SM (StagedHeldCtas: 0 for the others), where the device then holds
// more of them (PlanRowSumOp): the plain one takes 111 registers at 16 bits (84 for fp32 rows of
// 384), one CTA an SM, whose rows all wait at the same barriers; held, 96 / 80 (sm_90; rows of
// 384 in phase take a 24-byte frame, under kMaxHeldLocalBytes). fwd+bwd, time held ÷ plain:
// H100 bf16 / fp16 4608-5120 0.88-0.90, 6144 0.96-0.97, 5632 1.03, rows in phase 5119
// 0.78-0.81, 6143 0.94-0.98 (benchmarks/results/h100/NOTES.md §49); H200 fp32 3072 0.90, rows
// in phase 3071 0.78 (fp32 2560 holds two CTAs of 320 plain: the same plan;
// benchmarks/results/h200/NOTES.md §31).
constexpr int kStagedHeldCtas = 2;
constexpr int StagedHeldCtas(int threads, int vecs) {
  const bool shape = vecs == kFusedSumVecs && (threads == 320 || threads == 384);
  return shape ? kStagedHeldCtas : 0;
}

// f(kThreads, kVecs) (std::integral_constant<int, ·> each) for the shape of the CTA-tier plan
// `k` of two column sums (64-row chunks, staged or not): the shapes PlanFusedSums makes.
template <class Args, class F>
cudaError_t WithTwoSumShape(const RowPlan& k, F f) {
  using Two = std::integral_constant<int, kFusedSumVecs>;
  if constexpr (kStagedWideSums<Args>) {
    if (k.packs == kCtaVecs && k.threads == 512) {
      return f(std::integral_constant<int, 512>{}, std::integral_constant<int, kCtaVecs>{});
    }
  }
  if (k.packs == kFusedSumVecs) {
    switch (k.threads) {
      case 128: return f(std::integral_constant<int, 128>{}, Two{});
      case 256: return f(std::integral_constant<int, 256>{}, Two{});
      case 320: return f(std::integral_constant<int, 320>{}, Two{});
      case 384: return f(std::integral_constant<int, 384>{}, Two{});
      case 512: return f(std::integral_constant<int, 512>{}, Two{});
    }
  }
  return cudaErrorInvalidConfiguration;  // a plan PlanFusedSums never makes
}

// How many CTAs of the staged kernel of plan `k` the device holds at once (*plain), and of its
// held kernel (*held; 0 where there is none or it spills past kMaxHeldLocalBytes).
template <class Op, class Args, bool kAligned>
cudaError_t StagedSumCtas(const RowPlan& k, int* plain, int* held) {
  *held = 0;
  return WithTwoSumShape<Args>(k, [&](auto t, auto v) {
    constexpr int kT = decltype(t)::value;
    constexpr int kV = decltype(v)::value;
    constexpr size_t kSmem = StagedSumBytes<Args, kT, kV>();
    cudaError_t err = ResidentCtas<StagedSumKernel<Op, Args, kT, kV, kAligned>, kSmem>(kT, plain);
    constexpr int kHeld = StagedHeldCtas(kT, kV);
    if constexpr (kHeld > 0) {
      constexpr auto kKernel = StagedSumKernel<Op, Args, kT, kV, kAligned, kHeld>;
      if (err == cudaSuccess) err = HeldResidentCtas<kKernel, kSmem>(kT, held);
    }
    return err;
  });
}

// f(std::bool_constant<kAligned>) for a fused plan's rows: aligned (row_classes 1) or in phase,
// whose kernels are compiled for problems of one element type only (OperandsInPhase).
template <class Args, class F>
cudaError_t WithRowAlignment(const FusedSumPlan& plan, F f) {
  if (plan.row_classes == 1) return f(std::true_type{});
  if constexpr (!Args::kMixed) return f(std::false_type{});
  return cudaErrorInvalidConfiguration;  // a plan PlanFusedSums never makes
}

// Fused sums in shared memory (SliceRowSumsKernel) of a team of kCluster CTAs (1: the wide CTA,
// 16-bit 512 x 4 packs, or 16-bit layer_norm's 256 x 4) of kThreads x kVecs packs, for aligned rows
// or (kAligned false) rows in phase (plan.h's PhasedSumPlan; WithRowAlignment).
template <class Op, class Args, int kThreads, int kVecs, int kCluster>
using SliceSumsOf = SliceSums<Op, Args, Args::kPackWidth, kVecs, kThreads, kCluster>;
template <class Op, class Args, int kThreads, int kVecs, int kCluster, bool kAligned = true,
          bool kPipelined = false, bool kStageNext = false>
constexpr auto SliceSumKernel = SliceRowSumsKernel<Op, Args, Args::kPackWidth, kVecs, kThreads,
                                                   kCluster, kAligned, kPipelined, kStageNext>;
// Whether the pipelined kernel of a team is compiled: the teams SliceSumsPipelined can plan.
template <class Op, class Args, int kThreads, int kVecs, int kCluster, bool kAligned>
constexpr bool kSliceMayPipeline =
    kAligned && SliceSumsPipelined(kThreads, kVecs, kCluster, PlannedElemSize<Args>(),
                                   OpTraits<Op>::kColumnSums,
                                   kPipelinedSliceMinPacks * kThreads * Args::kPackWidth, true);
// Whether a team's threads hold the sums in registers (plan.h's SliceSumsInRegisters): its
// kernel is then SliceRowSumsRegisterKernel, whose shared memory holds the parameters only.
template <class Op, class Args, int kThreads, int kVecs, int kCluster, bool kAligned>
constexpr bool kSliceHoldsSums = SliceSumsInRegisters(
    kThreads, kVecs, kCluster, PlannedElemSize<Args>(), OpTraits<Op>::kColumnSums, kAligned);
template <class Op, class Args, int kThreads, int kVecs>
constexpr auto SliceRegisterSumKernel =
    SliceRowSumsRegisterKernel<Op, Args, Args::kPackWidth, kVecs, kThreads>;
template <class Op, class Args, int kThreads, int kVecs>
constexpr size_t kSliceRegisterSumBytes =
    SliceSums<Op, Args, Args::kPackWidth, kVecs, kThreads, 1, true>::kBytes;

template <class Op, class Args, int kThreads, int kVecs, int kCluster>
constexpr bool SliceSumsFit() {
  return SliceSumsOf<Op, Args, kThreads, kVecs, kCluster>::kBytes <= kMaxClusterSmem;
}
// Whether the kernel with the next row staged (plan.h's SliceSumsStageNextRow) of a team is
// compiled: where its sums, parameters and stage fit a CTA's shared memory on sm_90
// (kMaxStagedSliceSmem: 227 KB; the device may still fit fewer CTAs per SM).
constexpr size_t kMaxStagedSliceSmem = 227 * 1024;
template <class Op, class Args, int kThreads, int kVecs, int kCluster, bool kAligned>
constexpr bool kSliceMayStageNext =
    kAligned && !Args::kMixed && SliceSumsStageNextRow(kCluster, PlannedElemSize<Args>(), true) &&
    SliceSumsOf<Op, Args, kThreads, kVecs, kCluster>::kStagedBytes <= kMaxStagedSliceSmem;

// How many of its teams with the next row staged the current device runs at once (0: not one
// fits, or the kernel is not compiled).
template <class Op, class Args, int kThreads, int kVecs, int kCluster, bool kAligned>
cudaError_t ResidentStagedSliceTeams(int* teams) {
  *teams = 0;
  if constexpr (kSliceMayStageNext<Op, Args, kThreads, kVecs, kCluster, kAligned>) {
    return ResidentClusters<SliceSumKernel<Op, Args, kThreads, kVecs, kCluster, true, false, true>,
                            kThreads, kCluster,
                            SliceSumsOf<Op, Args, kThreads, kVecs, kCluster>::kStagedBytes>(teams);
  }
  return cudaSuccess;
}

// How many of its teams the current device runs at once (0: not one fits).
template <class Op, class Args, int kThreads, int kVecs, int kCluster, bool kAligned>
cudaError_t ResidentSliceTeams(int* teams) {
  constexpr size_t kSmem = SliceSumsOf<Op, Args, kThreads, kVecs, kCluster>::kBytes;
  if constexpr (kSliceHoldsSums<Op, Args, kThreads, kVecs, kCluster, kAligned>) {
    return ResidentCtas<SliceRegisterSumKernel<Op, Args, kThreads, kVecs>,
                        kSliceRegisterSumBytes<Op, Args, kThreads, kVecs>>(kThreads, teams);
  } else if constexpr (!SliceSumsFit<Op, Args, kThreads, kVecs, kCluster>()) {
    *teams = 0;
    return cudaSuccess;
  } else if constexpr (kCluster == 1) {
    return ResidentCtas<SliceSumKernel<Op, Args, kThreads, kVecs, kCluster, kAligned>, kSmem>(
        kThreads, teams);
  } else {
    return ResidentClusters<SliceSumKernel<Op, Args, kThreads, kVecs, kCluster, kAligned>, kThreads,
                            kCluster, kSmem>(teams);
  }
}

// A persistent grid of the teams the device runs at once, at most one per chunk.
template <class Op, class Args, int kThreads, int kVecs, int kCluster, bool kAligned>
cudaError_t LaunchSliceRowSums(const Args& a, const Op& op, const FusedSumPlan& plan,
                               AccType<typename Args::InElem>* partial, cudaStream_t stream) {
  if constexpr (kSliceHoldsSums<Op, Args, kThreads, kVecs, kCluster, kAligned>) {
    if (!plan.register_sums) return cudaErrorInvalidConfiguration;  // PlanFusedSums plans them
    int teams = 0;
    const cudaError_t err =
        ResidentSliceTeams<Op, Args, kThreads, kVecs, kCluster, kAligned>(&teams);
    if (err != cudaSuccess) return err;
    if (teams == 0) return cudaErrorInvalidConfiguration;
    SliceRegisterSumKernel<Op, Args, kThreads, kVecs>
        <<<static_cast<unsigned>(std::min<int64_t>(plan.chunks, teams)), kThreads,
           kSliceRegisterSumBytes<Op, Args, kThreads, kVecs>, stream>>>(
            a, op, partial, plan.chunk_rows, plan.prefetch_next_row);
    return cudaGetLastError();
  } else if constexpr (SliceSumsFit<Op, Args, kThreads, kVecs, kCluster>()) {
    if (plan.register_sums) return cudaErrorInvalidConfiguration;  // a plan never made
    constexpr size_t kSmem = SliceSumsOf<Op, Args, kThreads, kVecs, kCluster>::kBytes;
    constexpr auto kKernel = SliceSumKernel<Op, Args, kThreads, kVecs, kCluster, kAligned>;
    int teams = 0;
    if constexpr (kSliceMayStageNext<Op, Args, kThreads, kVecs, kCluster, kAligned>) {
      if (plan.stage_next_row) {  // a grid of the clusters it holds
        constexpr size_t kStagedSmem =
            SliceSumsOf<Op, Args, kThreads, kVecs, kCluster>::kStagedBytes;
        constexpr auto kStaged =
            SliceSumKernel<Op, Args, kThreads, kVecs, kCluster, true, false, true>;
        const cudaError_t err =
            ResidentStagedSliceTeams<Op, Args, kThreads, kVecs, kCluster, kAligned>(&teams);
        if (err != cudaSuccess) return err;
        if (teams == 0) return cudaErrorInvalidConfiguration;
        const unsigned grid =
            static_cast<unsigned>(kCluster * std::min<int64_t>(plan.chunks, teams));
        cudaLaunchAttribute attr[1];
        const cudaLaunchConfig_t cfg =
            ClusterConfig<kThreads, kCluster, kStagedSmem>(attr, grid, stream);
        return cudaLaunchKernelEx(&cfg, kStaged, a, op, partial, plan.chunk_rows, false);
      }
    }
    if (plan.stage_next_row) return cudaErrorInvalidConfiguration;  // PlanRowSumOp clears it
    if constexpr (kSliceMayPipeline<Op, Args, kThreads, kVecs, kCluster, kAligned>) {
      if (plan.pipelined) {  // a grid of the CTAs it holds (one per SM where the other holds two)
        constexpr auto kPiped = SliceSumKernel<Op, Args, kThreads, kVecs, 1, true, true>;
        const cudaError_t err = ResidentCtas<kPiped, kSmem>(kThreads, &teams);
        if (err != cudaSuccess) return err;
        if (teams == 0) return cudaErrorInvalidConfiguration;
        kPiped<<<static_cast<unsigned>(std::min<int64_t>(plan.chunks, teams)), kThreads, kSmem,
                 stream>>>(a, op, partial, plan.chunk_rows, false);
        return cudaGetLastError();
      }
    }
    if (plan.pipelined) return cudaErrorInvalidConfiguration;  // a plan PlanFusedSums never makes
    const cudaError_t err =
        ResidentSliceTeams<Op, Args, kThreads, kVecs, kCluster, kAligned>(&teams);
    if (err != cudaSuccess) return err;
    if (teams > 0) {
      const unsigned grid = static_cast<unsigned>(kCluster * std::min<int64_t>(plan.chunks, teams));
      if constexpr (kCluster == 1) {
        kKernel<<<grid, kThreads, kSmem, stream>>>(a, op, partial, plan.chunk_rows,
                                                   plan.prefetch_next_row);
        return cudaGetLastError();
      } else {
        cudaLaunchAttribute attr[1];
        const cudaLaunchConfig_t cfg = ClusterConfig<kThreads, kCluster, kSmem>(attr, grid, stream);
        return cudaLaunchKernelEx(&cfg, kKernel, a, op, partial, plan.chunk_rows,
                                  plan.prefetch_next_row);
      }
    }
  }
  return cudaErrorInvalidConfiguration;  // PlanRowSumOp plans none
}

// f(kThreads, kVecs, kCluster) (std::integral_constant<int, ·> each) for the team of a
// SliceRowSumsKernel plan `k`, for the configurations SliceSumsApply (plan.h) admits: only
// those are compiled.
template <class Op, class Args, class F>
cudaError_t WithSliceTeam(const RowPlan& k, F f) {
  constexpr int kElem = PlannedElemSize<Args>();
  constexpr int kSums = OpTraits<Op>::kColumnSums;
  const auto team = [&](auto t, auto v, auto c) {
    if constexpr (SliceSumsApply(decltype(c)::value == 1 ? RowTier::kCta : RowTier::kCluster,
                                 decltype(t)::value, decltype(v)::value, decltype(c)::value, kElem,
                                 kSums)) {
      return f(t, v, c);
    } else {
      return cudaErrorInvalidConfiguration;  // a plan PlanFusedSums never makes
    }
  };
  using I512 = std::integral_constant<int, 512>;
  using IOne = std::integral_constant<int, 1>;
  static_assert(kWideCtaThreads == 512 && kWideClusterThreads == 512, "I512 is both");
  if (k.tier == RowTier::kCta && k.threads == 256 && k.packs == kCtaVecs) {  // two sums
    return team(std::integral_constant<int, 256>{}, std::integral_constant<int, kCtaVecs>{},
                IOne{});
  }
  if (k.tier == RowTier::kCta && k.threads == 512) {
    if constexpr (OpTraits<Op>::kWideCta) {
      if (k.packs == kWideCtaVecs) {
        return team(I512{}, std::integral_constant<int, kWideCtaVecs>{}, IOne{});
      }
    }
    if (k.packs == kCtaVecs) return team(I512{}, std::integral_constant<int, kCtaVecs>{}, IOne{});
  } else if (k.tier == RowTier::kCluster) {
    return WithClusterShape<Op>(k, [&](auto t, auto c, auto v) { return team(t, v, c); });
  }
  return cudaErrorInvalidConfiguration;  // a plan PlanFusedSums never makes
}

// The fused plan of `a` on the current device, or nothing where the fused path does not apply;
// a staged plan whose CTA does not fit the device runs unstaged (the same chunks).
template <class Op, class Args>
cudaError_t PlanRowSumOp(const Args& a, std::optional<FusedSumPlan>* plan) {
  int device = 0;
  DeviceInfo dev;
  cudaError_t err = GetDeviceInfo(&device, &dev);
  if (err != cudaSuccess) return err;
  *plan = PlanFusedSums(a.rows, a.n, PlannedElemSize<Args>(), FusedOperandsAligned(a),
                        OperandsInPhase(a), PlanClusters(dev.cc_major), OpTraits<Op>::kWideCta,
                        OpTraits<Op>::kColumnSums, Args::kNumIn, OpTraits<Op>::kClusterPacks,
                        dev.dram_gbps_per_sm, dev.sms);
  if constexpr (!std::is_same_v<typename Args::InElem, double>) {
    if (plan->has_value() && (*plan)->kernel.params_once) {
      // Sums in shared memory: where there are chunks for at least 2/3 of the teams the
      // device holds at once. The two-pass backward moves 5 units of bytes where this one moves
      // 3 (x, dy and dx; the partials are a sixteenth), so this one is ahead with 3/5 of the
      // teams busy; 2/3 leaves a margin. A last wave part full costs less than its share (its
      // teams have the bandwidth to themselves): 64 chunks of bf16 rms_norm at 65536 on the
      // H100's fewer teams took 0.87x the two-pass time, 128 chunks on 132 wide CTAs at
      // 32768 0.81x (NOTES.md §29). With fewer rows the two-pass path runs a team per row.
      // Both paths write the same dx.
      int teams = 0, staged = 0;
      err = WithRowAlignment<Args>(**plan, [&](auto aligned) {
        return WithSliceTeam<Op, Args>((*plan)->kernel, [&](auto t, auto v, auto c) {
          constexpr int kT = decltype(t)::value, kV = decltype(v)::value, kC = decltype(c)::value;
          constexpr bool kA = decltype(aligned)::value;
          cudaError_t e = ResidentSliceTeams<Op, Args, kT, kV, kC, kA>(&teams);
          if (e == cudaSuccess && (*plan)->stage_next_row) {
            e = ResidentStagedSliceTeams<Op, Args, kT, kV, kC, kA>(&staged);
          }
          return e;
        });
      });
      if (err != cudaSuccess) return err;
      if (teams == 0 || 3 * (*plan)->chunks < 2 * int64_t{teams}) {
        plan->reset();
        return cudaSuccess;
      }
      FusedSumPlan& f = **plan;
      f.teams = teams;
      if (f.row_classes == 1) {  // (the classes of rows in phase keep their chunks)
        f.chunk_rows *= SliceChunkMultiple(a.rows, f.chunk_rows, teams);
        f.chunks = (a.rows + f.chunk_rows - 1) / f.chunk_rows;
      }
      if (f.stage_next_row) {
        // Staged where the team fits, and for two sums where it keeps the plain team's CTAs
        // per SM (plan.h's SliceSumsStageNextRow); else the plain kernel, its prefetch as planned.
        const bool keep = staged > 0 && (OpTraits<Op>::kColumnSums == 1 || staged >= teams);
        f.stage_next_row = keep;
        if (keep) f.prefetch_next_row = false;
      }
    }
  }
  if constexpr (OpTraits<Op>::kColumnSums == 2 && !std::is_same_v<typename Args::InElem, double>) {
    if (plan->has_value() && (*plan)->kernel.stages > 0) {
      int ctas = 0, held = 0;
      err = WithRowAlignment<Args>(**plan, [&](auto aligned) {
        return StagedSumCtas<Op, Args, decltype(aligned)::value>((*plan)->kernel, &ctas, &held);
      });
      if (err != cudaSuccess) return err;
      if (ctas == 0) {
        (*plan)->kernel.stages = 0;
      } else if (held > ctas) {
        (*plan)->kernel.ctas_per_sm = kStagedHeldCtas;
      }
    }
  }
  return cudaSuccess;
}

// Group-tier sums, a CTA per chunk (the plan's chunks): of kRows x groups aligned rows, or
// (kAligned false) a chunk of PhasedChunks; the prefetching kernels where the plan says so.
template <class Op, class Args, int kWidth, bool kAligned>
cudaError_t LaunchGroupRowSums(const Args& a, const Op& op, const FusedSumPlan& plan,
                               AccType<typename Args::InElem>* partial, cudaStream_t stream) {
  constexpr int kVec = Args::kPackWidth;
  static_assert(kWidth >= kVec, "a group is at least one pack wide");
  const dim3 grid = GridFor(plan.chunks);
  const auto launch = [&](auto prefetch) {
    constexpr bool kPrefetch = decltype(prefetch)::value;
    if constexpr (kAligned || OpTraits<Op>::kColumnSums == 2) {  // (tier_kernels.cuh)
      GroupRowSumsKernel<Op, Args, kVec, kGroupVecs, kWidth, kGroupCtaThreads, kFusedGroupRows,
                         kAligned, kPrefetch>
          <<<grid, kGroupCtaThreads, 0, stream>>>(a, op, partial);
    } else {
      PhasedGroupRowSumsKernel<Op, Args, kVec, kGroupVecs, kWidth, kGroupCtaThreads,
                               kFusedGroupRows, kPrefetch>
          <<<grid, kGroupCtaThreads, 0, stream>>>(a, op, partial);
    }
  };
  if (plan.prefetch_next_row) {
    launch(std::true_type{});
  } else {
    launch(std::false_type{});
  }
  return cudaGetLastError();
}

// CTA-tier sums of kRows-row CTAs, `chunks` (the plan's) of them; `cluster` = kSumClusterCtas:
// in clusters that write one partial per kSumClusterCtas CTAs (plan.h), where the sums'
// exchange fits; `prefetch_next_row`: the plan's (CtaSumsPrefetchNextRow). kAligned false: rows
// in phase, a CTA per chunk of PhasedChunks.
template <class Op, class Args, int kThreads, int kVecs, int kRows = kFusedChunkRows,
          bool kAligned = true>
cudaError_t LaunchCtaRowSums(const Args& a, const Op& op, int64_t chunks,
                             AccType<typename Args::InElem>* partial, cudaStream_t stream,
                             int cluster = 0, bool prefetch_next_row = false) {
  constexpr int kVec = Args::kPackWidth;
  constexpr bool kPipelined = kVecs == kFusedSumVecs;  // two packs: two rows in flight
  using Exchange =
      SumExchange<AccType<typename Args::InElem>, OpTraits<Op>::kColumnSums, kVecs, kVec, kThreads>;
  if constexpr (kAligned && kRows == kFusedChunkRows && sizeof(Exchange) <= kMaxSumExchangeBytes) {
    if (cluster == kSumClusterCtas) {
      cudaLaunchAttribute attr[1];
      const cudaLaunchConfig_t cfg = ClusterConfig<kThreads, kSumClusterCtas, 0>(
          attr, GridFor(chunks * kSumClusterCtas), stream);
      return cudaLaunchKernelEx(
          &cfg,
          CtaRowSumsKernel<Op, Args, kVec, kVecs, kThreads, kRows, kPipelined, kSumClusterCtas>, a,
          op, partial, prefetch_next_row);
    }
  }
  if (cluster > 1) return cudaErrorInvalidConfiguration;  // a plan PlanFusedSums never makes
  CtaRowSumsKernel<Op, Args, kVec, kVecs, kThreads, kRows, kPipelined, 1, kAligned>
      <<<GridFor(chunks), kThreads, 0, stream>>>(a, op, partial, prefetch_next_row);
  return cudaGetLastError();
}

// Two column sums: 64-row chunks, staged where planned (PlanRowSumOp checked that a CTA fits),
// held where planned (ctas_per_sm).
template <class Op, class Args, int kThreads, int kVecs, bool kAligned>
cudaError_t LaunchCtaRowSumsOfTwo(const Args& a, const Op& op, const FusedSumPlan& plan,
                                  AccType<typename Args::InElem>* partial, cudaStream_t stream) {
  if (plan.chunk_rows != kStagedChunkRows) return cudaErrorInvalidConfiguration;
  constexpr size_t kSmem = StagedSumBytes<Args, kThreads, kVecs>();
  bool launched = false;
  cudaError_t err = cudaSuccess;
  if constexpr (StagedHeldCtas(kThreads, kVecs) > 0) {
    constexpr int kHeld = StagedHeldCtas(kThreads, kVecs);
    if (plan.kernel.stages == kFusedSumStages && plan.kernel.ctas_per_sm == kHeld) {
      err = LaunchPersistent<StagedSumKernel<Op, Args, kThreads, kVecs, kAligned, kHeld>, kSmem>(
          plan.chunks, dim3(kThreads), stream, &launched, a, op, partial);
      if (err != cudaSuccess || launched) return err;
    }
  }
  if (plan.kernel.ctas_per_sm != 0) return cudaErrorInvalidConfiguration;
  if (plan.kernel.stages == kFusedSumStages) {
    err = LaunchPersistent<StagedSumKernel<Op, Args, kThreads, kVecs, kAligned>, kSmem>(
        plan.chunks, dim3(kThreads), stream, &launched, a, op, partial);
    if (err != cudaSuccess || launched) return err;
  }
  return LaunchCtaRowSums<Op, Args, kThreads, kVecs, kStagedChunkRows, kAligned>(a, op, plan.chunks,
                                                                                 partial, stream);
}

// The CTA tier's fused sums (CtaRowSumsKernel, CtaRowSumsStagedKernel) of `plan`, of aligned
// rows or (kAligned false) rows in phase.
template <class Op, class Args, bool kAligned>
cudaError_t LaunchCtaTierSums(const Args& a, const Op& op, const FusedSumPlan& plan,
                              AccType<typename Args::InElem>* partial, cudaStream_t stream) {
  const RowPlan& k = plan.kernel;
  if constexpr (OpTraits<Op>::kColumnSums == 2) {  // layer_norm: 64-row chunks
    return WithTwoSumShape<Args>(k, [&](auto t, auto v) {
      return LaunchCtaRowSumsOfTwo<Op, Args, decltype(t)::value, decltype(v)::value, kAligned>(
          a, op, plan, partial, stream);
    });
  } else {
    // launch(t, v): the kernel of t threads x v packs (std::integral_constant<int, ·> each)
    const auto launch = [&](auto t, auto v) {
      return LaunchCtaRowSums<Op, Args, decltype(t)::value, decltype(v)::value, kFusedChunkRows,
                              kAligned>(a, op, plan.chunks, partial, stream, k.cluster,
                                        plan.prefetch_next_row);
    };
    using Two = std::integral_constant<int, kFusedSumVecs>;
    using Four = std::integral_constant<int, kCtaVecs>;
    using T256 = std::integral_constant<int, 256>;
    using T512 = std::integral_constant<int, 512>;
    constexpr bool kFilled =
        FillsTwoPackCtas(OpTraits<Op>::kColumnSums, Args::kNumIn, PlannedElemSize<Args>());
    if (k.packs == kFusedSumVecs) {
      if (k.threads == 128) return launch(std::integral_constant<int, 128>{}, Two{});
      if (k.threads == 256) return launch(T256{}, Two{});
      if constexpr (kFilled) {
        if (k.threads == 320) return launch(std::integral_constant<int, 320>{}, Two{});
        if (k.threads == 384) return launch(std::integral_constant<int, 384>{}, Two{});
      }
      if constexpr (Args::kNumIn == 3) {  // add_rms_norm
        if (k.threads == 512) return launch(T512{}, Two{});
      }
    }
    if (k.packs == kCtaVecs && k.threads == 256) return launch(T256{}, Four{});
    // 16-bit rows of 512 x 4 run the slice sums (SliceSumsApply): compiled for fp32 only.
    if constexpr (!SliceSumsApply(RowTier::kCta, 512, kCtaVecs, 1, PlannedElemSize<Args>(), 1)) {
      if (k.packs == kCtaVecs && k.threads == 512) return launch(T512{}, Four{});
    }
  }
  return cudaErrorInvalidConfiguration;  // a plan PlanFusedSums never makes
}

// Runs `op` on every row of `a` as `plan` (PlanRowSumOp of `a`) says and writes its column
// sums as plan.chunks chunk partials to `partial` (OpTraits<Op>::kColumnSums x chunks x n
// accumulators).
template <class Op, class Args>
cudaError_t LaunchRowSumOp(const Args& a, const Op& op, const FusedSumPlan& plan,
                           AccType<typename Args::InElem>* partial, cudaStream_t stream) {
  if constexpr (!std::is_same_v<typename Args::InElem, double>) {  // PlanFusedSums plans no float64
    const RowPlan& k = plan.kernel;
    return WithRowAlignment<Args>(plan, [&](auto aligned) {
      constexpr bool kAligned = decltype(aligned)::value;
      if (k.tier == RowTier::kGroup) {
        if constexpr (Args::kPackWidth <= 4 && kAligned) {  // fp32 rows of up to 64 (plan.h)
          if (k.width == 4) {
            return LaunchGroupRowSums<Op, Args, 4, kAligned>(a, op, plan, partial, stream);
          }
        }
        switch (k.width) {
          case 8: return LaunchGroupRowSums<Op, Args, 8, kAligned>(a, op, plan, partial, stream);
          case 16: return LaunchGroupRowSums<Op, Args, 16, kAligned>(a, op, plan, partial, stream);
          case kWarpSize:
            return LaunchGroupRowSums<Op, Args, kWarpSize, kAligned>(a, op, plan, partial, stream);
        }
        return cudaErrorInvalidConfiguration;
      }
      if (k.params_once) {
        return WithSliceTeam<Op, Args>(k, [&](auto t, auto v, auto c) {
          return LaunchSliceRowSums<Op, Args, decltype(t)::value, decltype(v)::value,
                                    decltype(c)::value, kAligned>(a, op, plan, partial, stream);
        });
      }
      return LaunchCtaTierSums<Op, Args, kAligned>(a, op, plan, partial, stream);
    });
  }
  return cudaErrorInvalidConfiguration;  // a plan PlanFusedSums never makes
}

// ---------------------------------------------------------------------------------------
// The strided-dim path.

// The plan of `a` on the current device (PlanStridedOp of plan.h).
template <class Args>
cudaError_t PlanStridedOnDevice(const Args& a, StridedPlan* plan) {
  int device = 0;
  DeviceInfo dev;
  const cudaError_t err = GetDeviceInfo(&device, &dev);
  if (err == cudaSuccess) *plan = PlanStridedOp(a, dev.dram_gbps_per_sm);
  return err;
}

// f(rows) (std::integral_constant<int, ·>) for the packed kernel's layout `warp_rows`
// (StridedPlan::warp_rows; 0: the CTA layout).
template <class F>
cudaError_t WithStridedWarpRows(int warp_rows, F f) {
  static_assert(kStridedMaxWarpRows == 4, "the layouts below are 0, 1, 2, 4");
  switch (warp_rows) {
    case 0: return f(std::integral_constant<int, 0>{});
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 4: return f(std::integral_constant<int, 4>{});
  }
  return cudaErrorInvalidConfiguration;  // a plan PlanStridedOp never makes
}

// f(std::bool_constant<full>) for plan.full_columns (StridedTile's kFull), checked against
// the problem's d.
template <class Args, class F>
cudaError_t WithFullColumns(const Args& a, const StridedPlan& plan, F f) {
  if (plan.full_columns != StridedFullColumns(a.d, plan.warp_rows)) {
    return cudaErrorInvalidConfiguration;  // a plan PlanStridedOp never makes
  }
  return plan.full_columns ? f(std::true_type{}) : f(std::false_type{});
}

// The packed strided kernels of layout kWarpRows: tiles prefetched where the plan has stages
// and a CTA fits, else loaded straight into registers, a CTA per tile.
template <class Op, class Args, int kWarpRows>
cudaError_t LaunchStridedPacked(const Args& a, const Op& op, const StridedPlan& plan,
                                cudaStream_t stream) {
  constexpr int kTx = kStridedTx;
  constexpr int kTy = kStridedTy;
  constexpr int kLanes = Args::kPackWidth;
  using Tile = StridedTile<Args, kTx, kTy, kStridedCache, kLanes, kWarpRows>;
  static_assert(StridedFullColumns(Tile::kFullD, kWarpRows),
                "plan.h's full columns are the tile's");
  constexpr int64_t kTileCols = int64_t{Tile::kTilePacks} * kLanes;
  const int64_t pack_tiles = a.outer * ((a.inner + kTileCols - 1) / kTileCols);
  constexpr int kStages = StridedStages<Args>();
  if (plan.stages != 0 && plan.stages != kStages) return cudaErrorInvalidConfiguration;
  return WithFullColumns(a, plan, [&](auto full) {
    constexpr bool kFull = decltype(full)::value;
    if constexpr (kStages > 0) {
      if (plan.stages == kStages) {  // later tiles in flight
        using Staged =
            StridedPrefetchTile<Op, Args, kTx, kTy, kStridedCache, kLanes, kWarpRows, 0, kFull>;
        bool launched = false;
        const cudaError_t err =
            LaunchPersistent<StridedPrefetchKernel<Op, Args, kTx, kTy, kStridedCache, kLanes,
                                                   kWarpRows, kStages, kFull>,
                             kStages * sizeof(typename Staged::Stage)>(
                pack_tiles, dim3(kTx, kTy), stream, &launched, WithStridedL2Keep(a, plan), op,
                nullptr);
        if (err != cudaSuccess || launched) return err;
      }
    }
    StridedPackKernel<Op, Args, kTx, kTy, kStridedCache, kLanes, kWarpRows, 0, kFull>
        <<<GridFor(pack_tiles), dim3(kTx, kTy), 0, stream>>>(a, op, nullptr);
    return cudaGetLastError();
  });
}

// The plan of `a` with fused parameter gradients on the current device (PlanStridedSums).
template <class Op, class Args>
cudaError_t PlanStridedSumsOnDevice(const Args& a, std::optional<StridedSumPlan>* plan) {
  int device = 0;
  DeviceInfo dev;
  const cudaError_t err = GetDeviceInfo(&device, &dev);
  if (err == cudaSuccess)
    *plan = PlanStridedSums(a, OpTraits<Op>::kColumnSums, dev.dram_gbps_per_sm);
  return err;
}

// Runs `op` (an op with column sums) over dim d of `a` as `plan` says and writes its column
// sums as plan.chunks tile partials to `partial` (OpTraits<Op>::kColumnSums x chunks x d).
template <class Op, class Args>
cudaError_t LaunchStridedSumOp(const Args& a, const Op& op, const StridedSumPlan& plan,
                               AccType<typename Args::InElem>* partial, cudaStream_t stream) {
  if constexpr (!std::is_same_v<typename Args::InElem, double>) {  // no packed float64 kernel
    constexpr int kSums = OpTraits<Op>::kColumnSums;
    constexpr int kLanes = StridedSumLanes<Args>(kSums);
    if (plan.kernel.kernel != StridedKind::kPacked || plan.kernel.lanes != kLanes ||
        plan.kernel.stages != StridedSumStages<Args>(kSums, plan.kernel.warp_rows)) {
      return cudaErrorInvalidConfiguration;  // a plan PlanStridedSums never makes
    }
    return WithStridedWarpRows(plan.kernel.warp_rows, [&](auto rows) {
      constexpr int kWarpRows = decltype(rows)::value;
      constexpr int kStages = StridedSumStages<Args>(kSums, kWarpRows);
      using Tile = StridedTile<Args, kStridedTx, kStridedTy, kStridedCache, kLanes, kWarpRows>;
      constexpr int64_t kTileCols = StridedTileColumns(kLanes, kWarpRows);
      static_assert(kTileCols == int64_t{Tile::kTilePacks} * kLanes,
                    "plan.h's tiles are the kernel's");
      static_assert(StridedFullColumns(Tile::kFullD, kWarpRows),
                    "plan.h's full columns are the tile's");
      if (plan.chunks != a.outer * ((a.inner + kTileCols - 1) / kTileCols)) {
        return cudaErrorInvalidConfiguration;
      }
      return WithFullColumns(a, plan.kernel, [&](auto full) {
        constexpr bool kFull = decltype(full)::value;
        if constexpr (kStages > 0) {  // later tiles in flight
          using Staged = StridedPrefetchTile<Op, Args, kStridedTx, kStridedTy, kStridedCache,
                                             kLanes, kWarpRows, kSums, kFull>;
          bool launched = false;
          const cudaError_t err = LaunchPersistent<
              StridedPrefetchKernel<Op, Args, kStridedTx, kStridedTy, kStridedCache, kLanes,
                                    kWarpRows, kStages, kFull, kSums>,
              kStages * sizeof(typename Staged::Stage)>(
              plan.chunks, dim3(kStridedTx, kStridedTy), stream, &launched,
              WithStridedL2Keep(a, plan.kernel), op, partial);
          if (err != cudaSuccess || launched) return err;
        }
        StridedPackKernel<Op, Args, kStridedTx, kStridedTy, kStridedCache, kLanes, kWarpRows, kSums,
                          kFull>
            <<<GridFor(plan.chunks), dim3(kStridedTx, kStridedTy), 0, stream>>>(a, op, partial);
        return cudaGetLastError();
      });
    });
  }
  return cudaErrorInvalidConfiguration;  // PlanStridedSums plans no float64
}

// Runs `op` over dim d of contiguous (outer, d, inner) operands as `plan` says.
template <class Op, class Args>
cudaError_t LaunchStridedOp(const Args& a, const Op& op, const StridedPlan& plan,
                            cudaStream_t stream) {
  if (a.outer == 0 || a.d == 0 || a.inner == 0) return cudaSuccess;
  constexpr int kTx = kStridedTx;
  constexpr int kTy = kStridedTy;
  const int64_t tiles = a.outer * ((a.inner + kTx - 1) / kTx);
  switch (plan.kernel) {
    case StridedKind::kPacked:
      if constexpr (!std::is_same_v<typename Args::InElem, double>) {
        return WithStridedWarpRows(plan.warp_rows, [&](auto rows) {
          return LaunchStridedPacked<Op, Args, decltype(rows)::value>(a, op, plan, stream);
        });
      }
      break;
    case StridedKind::kCached:
      StridedKernel<Op, Args, kTx, kTy, kStridedCache>
          <<<GridFor(tiles), dim3(kTx, kTy), 0, stream>>>(a, op);
      return cudaGetLastError();
    case StridedKind::kStreamed:
      StridedKernel<Op, Args, kTx, kTy, 0><<<GridFor(tiles), dim3(kTx, kTy), 0, stream>>>(a, op);
      return cudaGetLastError();
  }
  return cudaErrorInvalidConfiguration;  // a plan PlanStridedOp never makes
}

}  // namespace rownorm
