// Pack<T, N>: N consecutive elements moved with one vector memory instruction.
//
// alignas(sizeof(T) * N) makes a Pack<float, 4> or Pack<__nv_bfloat16, 8> a single 16-byte
// load or store. The caller guarantees the address is aligned to sizeof(Pack); planning
// (RowVecWidth in plan.h) picks N so that this holds for every row of every operand.
//
// A pack of 4 bytes or more is held as raw 32-bit words and converted element by element on
// access: kept as __nv_bfloat16 values, the compiler spends a register per element (the bf16
// cluster kernels needed far more registers than fp16; benchmarks/results/h100/NOTES.md §2).
#pragma once

#include <cstring>

#include "kernels/common/types.cuh"

namespace rownorm {

template <typename T>
ROWNORM_HOST_DEVICE AccType<T> BitsToAcc(uint32_t bits);  // low sizeof(T) bytes hold a T
template <>
ROWNORM_HOST_DEVICE float BitsToAcc<float>(uint32_t bits) {
  float f;
  memcpy(&f, &bits, 4);
  return f;
}
template <>
ROWNORM_HOST_DEVICE float BitsToAcc<__nv_bfloat16>(uint32_t bits) {
  return BitsToAcc<float>(bits << 16);  // bf16 is the high half of an fp32
}
template <>
ROWNORM_HOST_DEVICE float BitsToAcc<__half>(uint32_t bits) {
  __half_raw raw;
  raw.x = static_cast<unsigned short>(bits);
  return __half2float(__half(raw));
}

template <typename T>
ROWNORM_HOST_DEVICE uint32_t AccToBits(AccType<T> a) {
  const T t = FromAcc<T>(a);
  uint32_t bits = 0;
  memcpy(&bits, &t, sizeof(T));
  return bits;
}

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  static_assert(N >= 1 && (N & (N - 1)) == 0, "pack width must be a power of two");
  static_assert(sizeof(T) * N <= 16, "a pack is at most 16 bytes (one vector access)");
  static constexpr bool kWords = sizeof(T) * N >= 4 && sizeof(T) <= 4;
  static constexpr int kPerWord = kWords ? 4 / sizeof(T) : 1;
  static constexpr int kNumWords = kWords ? sizeof(T) * N / 4 : 1;
  struct alignas(sizeof(T) * N) Words {
    uint32_t w[kNumWords];
  };
  struct alignas(sizeof(T) * N) Elems {
    T v[N];
  };
  std::conditional_t<kWords, Words, Elems> d;

  // Word packs are stored with an explicit st.global.v4/v2: through C++ (struct copy, or even
  // a uint4 store) the compiler split the fp32 stores into 4-byte st.global (seen in the PTX),
  // which quadrupled the L2 store transactions and made the CTA and cluster tiers L2-bound far
  // below copy bandwidth (benchmarks/results/h100/NOTES.md §1-2). Every output of the engine
  // goes through this Store; keep it that way.
  ROWNORM_DEVICE void Load(const T* p) {
    if constexpr (kWords && kNumWords == 4) {
      const uint4 u = *reinterpret_cast<const uint4*>(p);
      d.w[0] = u.x, d.w[1] = u.y, d.w[2] = u.z, d.w[3] = u.w;
    } else if constexpr (kWords && kNumWords == 2) {
      const uint2 u = *reinterpret_cast<const uint2*>(p);
      d.w[0] = u.x, d.w[1] = u.y;
    } else {
      d = *reinterpret_cast<const decltype(d)*>(p);
    }
  }
  ROWNORM_DEVICE void Store(T* p) const {
    if constexpr (kWords && kNumWords == 4) {
      asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(d.w[0]), "r"(d.w[1]),
                   "r"(d.w[2]), "r"(d.w[3])
                   : "memory");
    } else if constexpr (kWords && kNumWords == 2) {
      asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(p), "r"(d.w[0]), "r"(d.w[1])
                   : "memory");
    } else {
      *reinterpret_cast<decltype(d)*>(p) = d;
    }
  }

  ROWNORM_DEVICE AccType<T> Get(int i) const {
    if constexpr (kWords) {
      constexpr int kBits = 8 * sizeof(T);
      const uint32_t word = d.w[i / kPerWord];
      const int shift = (i % kPerWord) * kBits;
      return BitsToAcc<T>(kBits == 32 ? word : (word >> shift) & ((1u << (kBits & 31)) - 1));
    } else {
      return ToAcc(d.v[i]);
    }
  }

  // Every element = a (a's bits in every word).
  ROWNORM_DEVICE void Fill(AccType<T> a) {
    if constexpr (kWords) {
      uint32_t word = AccToBits<T>(a);
#pragma unroll
      for (int s = 1; s < kPerWord; ++s) word |= word << (s * 8 * sizeof(T));
#pragma unroll
      for (int w = 0; w < kNumWords; ++w) d.w[w] = word;
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) d.v[i] = FromAcc<T>(a);
    }
  }

  ROWNORM_DEVICE void Set(int i, AccType<T> a) {
    if constexpr (kWords) {
      constexpr int kBits = 8 * sizeof(T);
      const int shift = (i % kPerWord) * kBits;
      uint32_t& word = d.w[i / kPerWord];
      if constexpr (kBits == 32) {
        word = AccToBits<T>(a);
      } else {
        const uint32_t mask = ((1u << kBits) - 1) << shift;
        word = (word & ~mask) | (AccToBits<T>(a) << shift);
      }
    } else {
      d.v[i] = FromAcc<T>(a);
    }
  }
};

#if defined(__CUDACC__)
// L2 eviction priorities (sm_80+). A row's input loaded with evict_last and set back to
// evict_normal once the row is stored (CachedRow::LoadWithPolicy, ReleaseInput0) streams 2-3%
// faster on the H200 (plan.h's KeepsRowInputInL2); likely because the L2 then evicts the
// written rows' lines first, while the read ones wait (not profiled). Left at evict_last, the
// lines would crowd out the next kernel's data. The policy of a load: evict_last where `keep`,
// else evict_normal, a plain load's priority. Not volatile: a kernel's loads share one value.
ROWNORM_DEVICE uint64_t L2EvictionPolicy(bool keep) {
  uint64_t last, normal;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(last));
  asm("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(normal));
  return keep ? last : normal;
}
// p, whose loads the compiler issues with `policy` (ld.global.L2::cache_hint).
template <typename T>
ROWNORM_DEVICE const T* WithL2Policy(const T* p, uint64_t policy) {
  return static_cast<const T*>(__nv_associate_access_property(p, policy));
}
// Sets the 128-byte L2 line that holds p back to evict_normal.
ROWNORM_DEVICE void ReleaseL2Line(const void* p) {
  asm volatile("applypriority.global.L2::evict_normal [%0], 128;" ::"l"(
                   reinterpret_cast<uintptr_t>(p) & ~uintptr_t{127})
               : "memory");
}
#endif  // __CUDACC__

// The Pack<T, N> of words at p, where p is aligned to sizeof(T) but not to sizeof(Pack):
// 4-byte loads, and for 16-bit T at 2 bytes past a word one more word and byte permutes. Where
// p's alignment is the same for a whole row (a row's parameters at the columns of its packs),
// so is every branch. Reads only the 4-byte words that hold the pack's bytes. (The two
// 16-byte loads around the pack, shifted into place, held more registers: 41 more kernels held
// to 64 registers spilled; benchmarks/results/h100/NOTES.md §43.)
template <typename T, int N>
ROWNORM_DEVICE Pack<T, N> LoadPackUnaligned(const T* p) {
  using P = Pack<T, N>;
  static_assert(P::kWords, "unaligned loads move whole words");
  constexpr int kW = P::kNumWords;
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  const uint32_t* words = reinterpret_cast<const uint32_t*>(at & ~uintptr_t{3});
  P out;
  if (sizeof(T) == 4 || (at & 3) == 0) {
#pragma unroll
    for (int i = 0; i < kW; ++i) out.d.w[i] = words[i];
  } else {  // 16-bit T two bytes into a word: the high half of word i, the low of word i + 1
    uint32_t q[kW + 1];
#pragma unroll
    for (int i = 0; i <= kW; ++i) q[i] = words[i];
#pragma unroll
    for (int i = 0; i < kW; ++i) out.d.w[i] = __byte_perm(q[i], q[i + 1], 0x5432u);
  }
  return out;
}

// v[0..kN) stored at p: where `aligned` (p aligned to the packs of at most 16 bytes that
// hold them), with Pack::Store's vector stores, else one element at a time. The fused kernels'
// partial sums: stored one element at a time where they could go 16 bytes at a time, they
// took 8x the L2 sectors (ncu, h200/NOTES.md §40).
template <typename T, int kN>
ROWNORM_DEVICE void StoreValues(T* p, const T (&v)[kN], bool aligned) {
  constexpr int kW = kN * sizeof(T) > 16 ? 16 / static_cast<int>(sizeof(T)) : kN;
  if (aligned) {
#pragma unroll
    for (int h = 0; h < kN / kW; ++h) {
      Pack<T, kW> q;
#pragma unroll
      for (int e = 0; e < kW; ++e) q.Set(e, v[h * kW + e]);
      q.Store(p + h * kW);
    }
  } else {
#pragma unroll
    for (int e = 0; e < kN; ++e) p[e] = v[e];
  }
}

// The widest pack width (in elements, <= 16 bytes) for element size `elem_size`.
constexpr int MaxPackWidth(int elem_size) { return 16 / elem_size; }

#if defined(__CUDACC__)
// Asynchronous 16-byte copies from global into shared memory (cp.async, sm_80+), with which
// a kernel keeps later rows' or tiles' packs in flight while it reduces and stores the current
// one. A thread reads back only the packs it copied itself, so waiting for its own copies is
// enough: no barrier. Copies are counted in groups: CommitAsyncCopies closes the group of the
// copies issued since the last one (an empty group counts too), WaitAsyncCopies<k> returns
// once at most k of this thread's groups are still in flight. The copies bypass L1 (.cg: rows
// are read once), but with kCacheL1 (.ca: data that other rows on the SM read again, such as
// per-column parameters).
// Packs of 4 or 8 bytes (half a pack: the strided fused backward's) are copied through L1 (.ca):
// .cg takes only 16.
template <bool kCacheL1 = false, typename T, int N>
ROWNORM_DEVICE void CopyPackAsync(Pack<T, N>* shared_dst, const T* global_src) {
  constexpr int kBytes = sizeof(Pack<T, N>);
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async copies 4, 8 or 16 bytes");
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(shared_dst));
  if constexpr (kBytes < 16) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(dst), "l"(global_src),
                 "n"(kBytes)
                 : "memory");
  } else if constexpr (kCacheL1) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(global_src)
                 : "memory");
  } else {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(global_src)
                 : "memory");
  }
}
// The same copy of a 16-byte pack (through L2 only, .cg) or of a half pack (.ca) under the L2
// eviction `policy` (L2EvictionPolicy).
template <typename T, int N>
ROWNORM_DEVICE void CopyPackAsync(Pack<T, N>* shared_dst, const T* global_src, uint64_t policy) {
  constexpr int kBytes = sizeof(Pack<T, N>);
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async copies 4, 8 or 16 bytes");
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(shared_dst));
  if constexpr (kBytes < 16) {
    asm volatile("cp.async.ca.shared.global.L2::cache_hint [%0], [%1], %2, %3;" ::"r"(dst),
                 "l"(global_src), "n"(kBytes), "l"(policy)
                 : "memory");
  } else {
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(dst),
                 "l"(global_src), "l"(policy)
                 : "memory");
  }
}
// Brings the line holding `p` into L1 (and L2), without waiting: for small data that a kernel
// reads later, at the start of a unit whose packs are staged in shared memory.
ROWNORM_DEVICE void PrefetchL1(const void* p) { asm volatile("prefetch.global.L1 [%0];" ::"l"(p)); }
ROWNORM_DEVICE void CommitAsyncCopies() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int kPending>
ROWNORM_DEVICE void WaitAsyncCopies() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// The kernel's dynamic shared memory (the size is the launch's), 16-byte aligned.
ROWNORM_DEVICE unsigned char* DynamicSharedMemory() {
  extern __shared__ __align__(16) unsigned char rownorm_dynamic_shared[];
  return rownorm_dynamic_shared;
}
#endif  // __CUDACC__

}  // namespace rownorm
