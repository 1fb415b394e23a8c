// Reading and writing one operand of a problem (args.h) as it is stored: the row views go
// through these for every address, load and store, so that a mixed problem's narrowed operands
// (Narrowing: a bf16 x beside a float32 residual) are moved in their own type and held as the
// problem's register type. For a problem without narrowed operands each is the plain access
// (pointer arithmetic in elements, Pack::Load / Pack::Store), so those kernels compile as
// before.
#pragma once

#include <cstdint>

#include <type_traits>

#include "kernels/common/args.h"
#include "kernels/common/types.cuh"
#if defined(__CUDACC__)
#include "kernels/common/pack.cuh"
#endif

namespace rownorm {

// Input i's pointer `elems` elements past p (p: input i's, as the TIn array holds it).
template <class Args>
ROWNORM_HOST_DEVICE const typename Args::InElem* InOffset(const typename Args::InElem* p, int i,
                                                          int64_t elems) {
  if constexpr (Args::kMixed) {
    return reinterpret_cast<const typename Args::InElem*>(reinterpret_cast<const char*>(p) +
                                                          elems * Args::InBytes(i));
  } else {
    return p + elems;
  }
}

// Output j's pointer `elems` elements past p.
template <class Args>
ROWNORM_HOST_DEVICE typename Args::OutElem* OutOffset(typename Args::OutElem* p, int j,
                                                      int64_t elems) {
  if constexpr (Args::kMixed) {
    return reinterpret_cast<typename Args::OutElem*>(reinterpret_cast<char*>(p) +
                                                     elems * Args::OutBytes(j));
  } else {
    return p + elems;
  }
}

// Input i's element at p, in the register type.
template <class Args>
ROWNORM_HOST_DEVICE typename Args::InElem LoadInScalar(const typename Args::InElem* p, int i) {
  using TIn = typename Args::InElem;
  if constexpr (Args::kMixed) {
    if (Args::NarrowIn(i)) {
      return static_cast<TIn>(ToAcc(*reinterpret_cast<const typename Args::Narrow*>(p)));
    }
  }
  return *p;
}

// Output J's element at p: v (in the accumulator type of the output's storage type) rounded once
// to that type.
template <class Args, int J, typename V>
ROWNORM_HOST_DEVICE void StoreOutScalar(typename Args::OutElem* p, V v) {
  using TOut = typename Args::OutElem;
  if constexpr (Args::kMixed && Args::NarrowOut(J)) {
    using N = typename Args::Narrow;
    *reinterpret_cast<N*>(p) = FromAcc<N>(static_cast<AccType<N>>(v));
  } else {
    *p = FromAcc<TOut>(static_cast<AccType<TOut>>(v));
  }
}

#if defined(__CUDACC__)
// Input i's pack at p into `dst` (the register type; a narrowed input converted, exactly).
template <class Args, int kVec>
ROWNORM_DEVICE void LoadInPack(const typename Args::InElem* p, int i,
                               Pack<typename Args::InElem, kVec>& dst) {
  if constexpr (Args::kMixed) {
    if (Args::NarrowIn(i)) {
      Pack<typename Args::Narrow, kVec> q;
      q.Load(reinterpret_cast<const typename Args::Narrow*>(p));
#pragma unroll
      for (int e = 0; e < kVec; ++e) dst.Set(e, q.Get(e));
      return;
    }
  }
  dst.Load(p);
}

// Output J's pack at p: value(e) for e < kVec, rounded once to the output's storage type.
template <class Args, int J, int kVec, class Value>
ROWNORM_DEVICE void StoreOutPack(typename Args::OutElem* p, Value value) {
  using S = std::conditional_t<Args::kMixed && Args::NarrowOut(J), typename Args::Narrow,
                               typename Args::OutElem>;
  Pack<S, kVec> o;
#pragma unroll
  for (int e = 0; e < kVec; ++e) o.Set(e, static_cast<AccType<S>>(value(e)));
  o.Store(reinterpret_cast<S*>(p));
}
#endif  // __CUDACC__

}  // namespace rownorm
