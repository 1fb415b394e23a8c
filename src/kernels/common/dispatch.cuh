// Host-side dispatch: vector width and tier for a problem, and the launches.
//
// THE TIER TABLE lives here (PlanRowTier) and nowhere else. A tier is chosen from the row
// length n, the element size and the GPU's architecture only -- never from the number of
// rows -- so a row's result does not depend on the batch it came in.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "kernels/common/row.cuh"

namespace rownorm {

struct DeviceInfo {
  int sm_count = 0;
  int cc_major = 0;
  bool clusters = false;  // plan the cluster tier (sm_90+, unless ROWNORM_DISABLE_CLUSTERS)
};

// ROWNORM_DISABLE_CLUSTERS=1 (read once per process) plans every row as on a GPU without
// thread-block clusters, as before sm_90: the pre-Hopper tier table, testable on a Hopper.
inline bool ClustersDisabled() {
  static const bool disabled = [] {
    const char* v = std::getenv("ROWNORM_DISABLE_CLUSTERS");
    return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
  }();
  return disabled;
}

// Attributes of the current device, read once per device (cudaGetDeviceProperties is slow).
inline cudaError_t GetDeviceInfo(DeviceInfo* info) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> sm_cache[kMaxDevices];
  static std::atomic<int> cc_cache[kMaxDevices];
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device < kMaxDevices && sm_cache[device].load() > 0) {
    info->sm_count = sm_cache[device].load();
    info->cc_major = cc_cache[device].load();
    info->clusters = info->cc_major >= 9 && !ClustersDisabled();
    return cudaSuccess;
  }
  err = cudaDeviceGetAttribute(&info->sm_count, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&info->cc_major, cudaDevAttrComputeCapabilityMajor, device);
  }
  if (err == cudaSuccess && device < kMaxDevices) {
    cc_cache[device].store(info->cc_major);
    sm_cache[device].store(info->sm_count);
  }
  info->clusters = info->cc_major >= 9 && !ClustersDisabled();
  return err;
}

// The widest pack width w (elements, power of two, a pack of either element type <= 16 bytes)
// at which every operand's rows start at the same element phase mod w: base offsets (in
// elements of the operand's own type, so inputs and outputs of different widths compare by
// their byte phase mod a pack) and row strides congruent mod w. Then one head/tail split
// (computed from input 0) serves all operands.
template <class Args>
int RowVecWidth(const Args& a) {
  for (int w = Args::kPackWidth; w > 1; w /= 2) {
    auto phase = [w](const void* p, size_t elem) {
      return static_cast<int64_t>((reinterpret_cast<uintptr_t>(p) / elem) % w);
    };
    auto stride_phase = [w](int64_t s) { return ((s % w) + w) % w; };
    constexpr size_t kInBytes = sizeof(typename Args::InElem);
    constexpr size_t kOutBytes = sizeof(typename Args::OutElem);
    const int64_t p0 = phase(a.out[0], kOutBytes);
    const int64_t s0 = stride_phase(a.out_stride[0]);
    bool ok = true;
    for (int j = 0; j < Args::kNumOut; ++j) {
      ok = ok && phase(a.out[j], kOutBytes) == p0 &&
           (a.rows == 1 || stride_phase(a.out_stride[j]) == s0);
    }
    for (int i = 0; i < Args::kNumIn; ++i) {
      ok = ok && phase(a.in[i], kInBytes) == p0 &&
           (a.rows == 1 || stride_phase(a.in_stride[i]) == s0);
    }
    if (ok) return w;
  }
  return 1;
}

enum class RowTier { kGroup, kCta, kCluster, kStreaming };

struct RowPlan {
  RowTier tier;
  int width = 0;    // kGroup: threads per row
  int threads = 0;  // kCta / kCluster: threads per CTA
  int cluster = 0;  // kCluster: CTAs per row
  int packs = 0;    // kGroup / kCta: packs per thread
};

// Per-thread register budget of the cached tiers, in packs (16 bytes each).
constexpr int kGroupVecs = 4;         // group tier: 4 packs in flight per lane
constexpr int kWideGroupVecs = 8;     // a warp per row: 8 packs per lane (1024 fp32 / 2048 16-bit)
constexpr int kCtaVecs = 4;           // CTA tier
constexpr int kWideCtaThreads = 512;  // and one CTA of 512 x 8 packs (16384 fp32 / 32768 16-bit)
constexpr int kWideCtaVecs = 8;
constexpr int kClusterVecs = 8;  // cluster tier: 8 packs = 32 fp32 / 64 bf16 values per thread
constexpr int kClusterThreads = 256;
constexpr int kWideClusterThreads = 512;  // 16 x 512 x 8 packs: 262144 fp32 / 524288 bf16
constexpr int kStreamingThreads = 512;

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
//                                    one-CTA kernel 99%); ops that need more than 128
//                                    registers there (kWideCluster = false) use clusters.
//   sm_90+, n <= 16 CTAs x 256 x 8 packs (131072 / 262144): cluster per row, the fewest of
//                                    2/4/8/16 CTAs that hold it (16 is non-portable and
//                                    checked with cudaOccupancyMaxActiveClusters);
//           n <= 16 CTAs x 512 x 8 packs (262144 / 524288): 16 CTAs of 512 threads.
//   otherwise: streaming (two or more passes over the row, the later ones mostly from L2).
// The boundaries follow the register budget; benchmarks/results/h100/NOTES.md has the measurements.
inline RowPlan PlanRowTier(int64_t n, int vec, bool clusters, bool wide = true) {
  if (n <= int64_t{kWarpSize} * kGroupVecs * vec) {
    int width = std::max(4, vec);
    while (int64_t{width} * kGroupVecs * vec < n) width *= 2;
    return {RowTier::kGroup, width, 128, 0, kGroupVecs};
  }
  if (n <= int64_t{kWarpSize} * kWideGroupVecs * vec) {
    return {RowTier::kGroup, kWarpSize, 128, 0, kWideGroupVecs};
  }
  for (int threads : {128, 256, 512}) {
    if (n <= int64_t{threads} * kCtaVecs * vec) {
      return {RowTier::kCta, 0, threads, 0, kCtaVecs};
    }
  }
  if (wide && n <= int64_t{kWideCtaThreads} * kWideCtaVecs * vec) {
    return {RowTier::kCta, 0, kWideCtaThreads, 0, kWideCtaVecs};
  }
  if (clusters) {
    for (int cluster : {2, 4, 8, 16}) {
      if (n <= int64_t{cluster} * kClusterThreads * kClusterVecs * vec) {
        return {RowTier::kCluster, 0, kClusterThreads, cluster};
      }
    }
    if (wide && n <= int64_t{16} * kWideClusterThreads * kClusterVecs * vec) {
      return {RowTier::kCluster, 0, kWideClusterThreads, 16};
    }
  }
  return {RowTier::kStreaming, 0, kStreamingThreads, 0};
}

inline unsigned GridFor(int64_t units) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(units, INT_MAX)));
}

// Launches one cluster configuration; returns cudaErrorNotSupported (launching nothing)
// when the device cannot co-schedule such a cluster.
template <class Op, class Args, int kVec, int kThreads, int kCluster, int kVecs = kClusterVecs>
cudaError_t LaunchClusterRow(const Args& a, const Op& op, cudaStream_t stream) {
  auto kernel = ClusterRowKernel<Op, Args, kVec, kVecs, kThreads, kCluster>;
  constexpr int kMaxDevices = 64;
  static std::atomic<int> schedulable[kMaxDevices];  // 0 unknown, 1 yes, 2 no
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kCluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  const int state = device < kMaxDevices ? schedulable[device].load() : 0;
  if (state == 2) return cudaErrorNotSupported;
  if (state == 0) {
    if (kCluster > 8) {
      err = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    }
    cfg.gridDim = dim3(kCluster);
    int clusters = 0;
    if (err == cudaSuccess) err = cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg);
    if (err != cudaSuccess || clusters < 1) {
      (void)cudaGetLastError();
      if (device < kMaxDevices) schedulable[device].store(2);
      return cudaErrorNotSupported;
    }
    if (device < kMaxDevices) schedulable[device].store(1);
  }
  const int64_t max_clusters = INT_MAX / kCluster;
  cfg.gridDim = dim3(static_cast<unsigned>(kCluster * std::min(a.rows, max_clusters)));
  return cudaLaunchKernelEx(&cfg, kernel, a, op);
}

template <class Op, class Args, int kVec>
cudaError_t LaunchStreamingRow(const Args& a, const Op& op, cudaStream_t stream) {
  StreamingRowKernel<Op, Args, kVec, kStreamingThreads>
      <<<GridFor(a.rows), kStreamingThreads, 0, stream>>>(a, op);
  return cudaGetLastError();
}

template <class Op, class Args, int kWidth, int kVecs = kGroupVecs>
cudaError_t LaunchGroupRow(const Args& a, const Op& op, cudaStream_t stream) {
  constexpr int kVec = Args::kPackWidth;
  constexpr int kCtaThreads = 128;
  if constexpr (kWidth < kVec) {
    return cudaErrorInvalidValue;  // never planned: a group is at least one pack wide
  } else {
    constexpr int kRowsPerCta = kCtaThreads / kWidth;
    GroupRowKernel<Op, Args, kVec, kVecs, kWidth, kCtaThreads>
        <<<GridFor((a.rows + kRowsPerCta - 1) / kRowsPerCta), kCtaThreads, 0, stream>>>(a, op);
    return cudaGetLastError();
  }
}

template <class Op, class Args, int kThreads, int kVecs = kCtaVecs>
cudaError_t LaunchCtaRow(const Args& a, const Op& op, cudaStream_t stream) {
  constexpr int kVec = Args::kPackWidth;
  CtaRowKernel<Op, Args, kVec, kVecs, kThreads><<<GridFor(a.rows), kThreads, 0, stream>>>(a, op);
  return cudaGetLastError();
}

// Runs `op` on every row of `a` on `stream` (the caller has made the device current).
template <class Op, class Args>
cudaError_t LaunchRowOp(const Args& a, const Op& op, cudaStream_t stream) {
  if (a.rows == 0 || a.n == 0) return cudaSuccess;
  constexpr int kVec = Args::kPackWidth;
  const int vec = RowVecWidth(a);
  if constexpr (std::is_same_v<typename Args::InElem, double>) {
    // float64 exists for gradcheck and reference work, not speed: one streaming kernel.
    return vec == kVec ? LaunchStreamingRow<Op, Args, kVec>(a, op, stream)
                       : LaunchStreamingRow<Op, Args, 1>(a, op, stream);
  } else {
    if (vec != kVec) return LaunchStreamingRow<Op, Args, 1>(a, op, stream);
    DeviceInfo dev;
    cudaError_t err = GetDeviceInfo(&dev);
    if (err != cudaSuccess) return err;
    RowPlan plan = PlanRowTier(a.n, kVec, dev.clusters, OpTraits<Op>::kWideCluster);
    switch (plan.tier) {
      case RowTier::kGroup:
        switch (plan.width) {
          case 4: return LaunchGroupRow<Op, Args, 4>(a, op, stream);
          case 8: return LaunchGroupRow<Op, Args, 8>(a, op, stream);
          case 16: return LaunchGroupRow<Op, Args, 16>(a, op, stream);
          default:
            return plan.packs == kWideGroupVecs
                       ? LaunchGroupRow<Op, Args, 32, kWideGroupVecs>(a, op, stream)
                       : LaunchGroupRow<Op, Args, 32>(a, op, stream);
        }
      case RowTier::kCta:
        switch (plan.threads) {
          case 128: return LaunchCtaRow<Op, Args, 128>(a, op, stream);
          case 256: return LaunchCtaRow<Op, Args, 256>(a, op, stream);
          default:
            if constexpr (OpTraits<Op>::kWideCluster) {
              if (plan.packs == kWideCtaVecs) {
                return LaunchCtaRow<Op, Args, kWideCtaThreads, kWideCtaVecs>(a, op, stream);
              }
            }
            return LaunchCtaRow<Op, Args, 512>(a, op, stream);
        }
      case RowTier::kCluster: {
        constexpr int kT = kClusterThreads;
        if constexpr (OpTraits<Op>::kWideCluster) {
          if (plan.threads == kWideClusterThreads) {
            err = LaunchClusterRow<Op, Args, kVec, kWideClusterThreads, 16>(a, op, stream);
            if (err != cudaErrorNotSupported) return err;
            return LaunchStreamingRow<Op, Args, kVec>(a, op, stream);
          }
        }
        switch (plan.cluster) {
          case 2: err = LaunchClusterRow<Op, Args, kVec, kT, 2>(a, op, stream); break;
          case 4: err = LaunchClusterRow<Op, Args, kVec, kT, 4>(a, op, stream); break;
          case 8: err = LaunchClusterRow<Op, Args, kVec, kT, 8>(a, op, stream); break;
          default: err = LaunchClusterRow<Op, Args, kVec, kT, 16>(a, op, stream);
        }
        if (err != cudaErrorNotSupported) return err;
        return LaunchStreamingRow<Op, Args, kVec>(a, op, stream);
      }
      case RowTier::kStreaming: break;
    }
    return LaunchStreamingRow<Op, Args, kVec>(a, op, stream);
  }
}

// ---------------------------------------------------------------------------------------
// Fused parameter gradients (ops with kColumnSums): rows that the table puts on the CTA tier
// or the 4-pack group tier, that start 16-byte aligned and whose n is a multiple of the pack
// width run CtaRowSumsKernel / GroupRowSumsKernel. Others save per-row statistics for
// kernels/param_grad.h (a second read of x and dy).
//
// 16 rows per CTA: enough CTAs to fill the GPU at M·N = 2^27 for every CTA size of the tier,
// while the float partials stay at 1/16 of the rows (32 rows per CTA left half the SMs'
// thread slots empty: 70% of copy for the backward). A group runs 32 rows (groups are many).
constexpr int kFusedChunkRows = 16;
constexpr int kFusedGroupRows = 32;
constexpr int kGroupCtaThreads = 128;
constexpr int kFusedSumVecs = 2;  // packs per thread of the short CTA-tier rows (see below)

// The plan of the fused path for `a`, or a plan of tier kStreaming where it does not apply.
template <class Op, class Args>
RowPlan FusedPlan(const Args& a) {
  constexpr int kVec = Args::kPackWidth;
  const RowPlan none{RowTier::kStreaming};
  if (std::is_same_v<typename Args::InElem, double> || a.rows == 0 || a.n == 0 || a.n % kVec != 0)
    return none;
  for (int i = 0; i < Args::kNumIn; ++i) {
    if (reinterpret_cast<uintptr_t>(a.in[i]) % 16 != 0 || a.in_stride[i] % kVec != 0) return none;
  }
  for (int j = 0; j < Args::kNumOut; ++j) {
    if (reinterpret_cast<uintptr_t>(a.out[j]) % 16 != 0 || a.out_stride[j] % kVec != 0) return none;
  }
  DeviceInfo dev;
  if (GetDeviceInfo(&dev) != cudaSuccess) return none;
  const RowPlan plan = PlanRowTier(a.n, kVec, dev.clusters);
  // Where the fused path measured faster than the two-pass one (H100, bf16, backward with
  // parameter gradients, % of copy for 3 tensors): one column sum (RMSNorm) on the CTA tier
  // (N=4096: 80 against 57; 8192: 78 / 57) and on groups of 16+ lanes (N=1024: 77 / 58; with 8
  // lanes, N=256: 55 / 58); two sums (LayerNorm) on groups of 16+ lanes only (N=1024: 64 / 57;
  // on the CTA tier, N=4096: 52 / 58, N=8192: 42 / 57).
  if (plan.tier == RowTier::kCta && plan.packs == kCtaVecs && OpTraits<Op>::kColumnSums == 1)
    return plan;
  if (plan.tier == RowTier::kGroup && plan.packs == kGroupVecs && plan.width >= 16) return plan;
  return none;
}

// The number of chunk partials the fused path writes for `a`, or 0 where it does not apply.
template <class Op, class Args>
int64_t FusedColumnSumChunks(const Args& a) {
  const RowPlan plan = FusedPlan<Op>(a);
  if (plan.tier == RowTier::kCta) return (a.rows + kFusedChunkRows - 1) / kFusedChunkRows;
  if (plan.tier == RowTier::kGroup) {
    const int64_t groups = kGroupCtaThreads / plan.width;
    const int64_t per_cta = groups * kFusedGroupRows;
    return (a.rows + per_cta - 1) / per_cta * groups;
  }
  return 0;
}

template <class Op, class Args, int kWidth>
cudaError_t LaunchGroupRowSums(const Args& a, const Op& op, AccType<typename Args::InElem>* partial,
                               cudaStream_t stream) {
  constexpr int kVec = Args::kPackWidth;
  if constexpr (kWidth < kVec) {
    return cudaErrorInvalidValue;  // never planned: a group is at least one pack wide
  } else {
    constexpr int64_t kPerCta = int64_t{kGroupCtaThreads} / kWidth * kFusedGroupRows;
    GroupRowSumsKernel<Op, Args, kVec, kGroupVecs, kWidth, kGroupCtaThreads, kFusedGroupRows>
        <<<GridFor((a.rows + kPerCta - 1) / kPerCta), kGroupCtaThreads, 0, stream>>>(a, op,
                                                                                     partial);
    return cudaGetLastError();
  }
}

// Runs `op` on every row of `a` and writes its column sums as FusedColumnSumChunks(a) chunk
// partials to `partial` (OpTraits<Op>::kColumnSums x chunks x n accumulators).
template <class Op, class Args>
cudaError_t LaunchRowSumOp(const Args& a, const Op& op, AccType<typename Args::InElem>* partial,
                           cudaStream_t stream) {
  constexpr int kVec = Args::kPackWidth;
  if constexpr (std::is_same_v<typename Args::InElem, double>) {
    return cudaErrorNotSupported;
  } else {
    const RowPlan plan = FusedPlan<Op>(a);
    if (plan.tier == RowTier::kGroup) {
      switch (plan.width) {  // FusedPlan: groups of 16+ lanes
        case 16: return LaunchGroupRowSums<Op, Args, 16>(a, op, partial, stream);
        case 32: return LaunchGroupRowSums<Op, Args, 32>(a, op, partial, stream);
        default: return cudaErrorNotSupported;
      }
    }
    if constexpr (OpTraits<Op>::kColumnSums == 1) {  // FusedPlan: the CTA tier only with one sum
      if (plan.tier != RowTier::kCta) return cudaErrorNotSupported;
      const unsigned grid = GridFor((a.rows + kFusedChunkRows - 1) / kFusedChunkRows);
      // Rows of up to 256 threads x 2 packs (4096 16-bit / 2048 fp32 elements) run with two
      // packs per thread: at four, the column sums double the registers a cached pack costs
      // and fewer CTAs fit an SM (measured, bf16 rms backward with dweight: N=4096 79% of
      // copy with two packs against 73% with four; N=8192 and 16384 were faster with four:
      // 77% / 70% against 74% / 65%).
      constexpr int kSumVecs = kFusedSumVecs;
      if (a.n <= int64_t{128} * kSumVecs * kVec) {
        CtaRowSumsKernel<Op, Args, kVec, kSumVecs, 128, kFusedChunkRows>
            <<<grid, 128, 0, stream>>>(a, op, partial);
      } else if (a.n <= int64_t{256} * kSumVecs * kVec) {
        CtaRowSumsKernel<Op, Args, kVec, kSumVecs, 256, kFusedChunkRows>
            <<<grid, 256, 0, stream>>>(a, op, partial);
      } else if (a.n <= int64_t{256} * kCtaVecs * kVec) {
        CtaRowSumsKernel<Op, Args, kVec, kCtaVecs, 256, kFusedChunkRows>
            <<<grid, 256, 0, stream>>>(a, op, partial);
      } else {
        CtaRowSumsKernel<Op, Args, kVec, kCtaVecs, 512, kFusedChunkRows>
            <<<grid, 512, 0, stream>>>(a, op, partial);
      }
    } else {
      return cudaErrorNotSupported;
    }
    return cudaGetLastError();
  }
}

// Whether the packed strided path applies: inner a multiple of the pack width, at least one
// full tile of columns, every operand aligned to a pack.
template <class Args>
bool StridedPacksOk(const Args& a, int lanes, int tile_cols) {
  const uintptr_t in_bytes = sizeof(typename Args::InElem) * lanes;
  const uintptr_t out_bytes = sizeof(typename Args::OutElem) * lanes;
  bool ok = a.inner % lanes == 0 && a.inner >= tile_cols;
  for (int i = 0; i < Args::kNumIn; ++i) {
    ok = ok && reinterpret_cast<uintptr_t>(a.in[i]) % in_bytes == 0;
  }
  for (int j = 0; j < Args::kNumOut; ++j) {
    ok = ok && reinterpret_cast<uintptr_t>(a.out[j]) % out_bytes == 0;
  }
  return ok;
}

// Runs `op` over dim d of contiguous (outer, d, inner) operands. Strided rows of up to 8 x 8 = 64
// elements stay in registers (one read of the tensor): with 16-byte packs of adjacent columns
// where inner and the alignment allow (StridedPackKernel, 32 x 8 threads own a 64 x 128 fp32
// tile), else one column per thread. Longer columns are read twice, the second time mostly
// from L2 (a CTA's 32 x d tile is reused at once).
template <class Op, class Args>
cudaError_t LaunchStridedOp(const Args& a, const Op& op, cudaStream_t stream) {
  if (a.outer == 0 || a.d == 0 || a.inner == 0) return cudaSuccess;
  constexpr int kTx = 32;
  constexpr int kTy = 8;
  constexpr int kCache = 8;
  const int64_t tiles = a.outer * ((a.inner + kTx - 1) / kTx);
  if constexpr (!std::is_same_v<typename Args::InElem, double>) {
    constexpr int kLanes = Args::kPackWidth;
    if (a.d <= kTy * kCache && StridedPacksOk(a, kLanes, kTx * kLanes)) {
      const int64_t pack_tiles = a.outer * ((a.inner + kTx * kLanes - 1) / (kTx * kLanes));
      StridedPackKernel<Op, Args, kTx, kTy, kCache, kLanes>
          <<<GridFor(pack_tiles), dim3(kTx, kTy), 0, stream>>>(a, op);
      return cudaGetLastError();
    }
  }
  if (a.d <= kTy * kCache) {
    StridedKernel<Op, Args, kTx, kTy, kCache><<<GridFor(tiles), dim3(kTx, kTy), 0, stream>>>(a, op);
  } else {
    StridedKernel<Op, Args, kTx, kTy, 0><<<GridFor(tiles), dim3(kTx, kTy), 0, stream>>>(a, op);
  }
  return cudaGetLastError();
}

}  // namespace rownorm
