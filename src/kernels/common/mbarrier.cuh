// Shared-memory barriers (mbarrier, sm_90+) and the asynchronous transfers that complete on
// them: bulk copies from global memory (cp.async.bulk, the TMA unit: one thread copies a whole
// contiguous slice, with no per-thread address registers) and stores into another CTA of the
// cluster (st.async, distributed shared memory).
//
// A barrier here counts one arrival per phase (ExpectBytes, by the thread that announces the
// transfers) and the bytes announced: its phase completes once that arrival has come and every
// byte has landed, in either order. WaitBarrier(bar, parity) returns once the phase of that
// parity has completed (phases alternate 0, 1, 0, ... from InitBarrier on), and the bytes are
// then visible to the waiting thread.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/common/types.cuh"

namespace rownorm {

#if defined(__CUDACC__)

ROWNORM_DEVICE unsigned SharedAddress(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

ROWNORM_DEVICE void InitBarrier(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(SharedAddress(bar)) : "memory");
  // visible to the async proxy and to the cluster's other CTAs, which complete transfers on it
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// The announcing thread's arrival on `bar`, with `bytes` to land in the current phase.
ROWNORM_DEVICE void ExpectBytes(uint64_t* bar, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(SharedAddress(bar)),
               "r"(bytes)
               : "memory");
#endif
}

ROWNORM_DEVICE void WaitBarrier(uint64_t* bar, unsigned parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(SharedAddress(bar)), "r"(parity)
        : "memory");
  } while (done == 0);
#endif
}

// `bytes` (a multiple of 16; both addresses 16-byte aligned) from global `src` to this CTA's
// shared `dst`, completing on `bar`.
ROWNORM_DEVICE void CopyBulkAsync(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(SharedAddress(dst)),
      "l"(src), "r"(bytes), "r"(SharedAddress(bar))
      : "memory");
#endif
}

// A hint to bring `bytes` (a multiple of 16) of global memory at `src` (16-byte aligned) into
// L2, issued by one thread, holding no registers or shared memory (the TMA unit).
ROWNORM_DEVICE void PrefetchBulkL2(const void* src, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
#endif
}

// The value `v` (a multiple of 4 bytes) into `dst` of CTA `rank` of the cluster, completing
// on that CTA's `bar` (`dst` and `bar` are this CTA's addresses of the same variables).
template <typename V>
ROWNORM_DEVICE void StoreToPeer(V* dst, const V& v, uint64_t* bar, unsigned rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  static_assert(sizeof(V) % 4 == 0, "values travel as 32-bit words");
  constexpr int kWords = sizeof(V) / 4;
  uint32_t w[kWords];
  memcpy(w, &v, sizeof(V));
  unsigned remote_bar = 0;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(remote_bar)
               : "r"(SharedAddress(bar)), "r"(rank));
#pragma unroll
  for (int i = 0; i < kWords; ++i) {
    unsigned remote = 0;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                 : "=r"(remote)
                 : "r"(SharedAddress(reinterpret_cast<uint32_t*>(dst) + i)), "r"(rank));
    asm volatile(
        "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(remote),
        "r"(w[i]), "r"(remote_bar)
        : "memory");
  }
#endif
}

// All threads of the CTA: this CTA's arrival at the cluster barrier, without ordering memory
// (a barrier that InitBarrier's fence made visible is what it publishes), and the wait for
// every CTA's arrival.
ROWNORM_DEVICE void ClusterArriveRelaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
}
ROWNORM_DEVICE void ClusterWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
#endif
}

#endif  // __CUDACC__

}  // namespace rownorm
