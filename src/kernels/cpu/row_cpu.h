// The CPU row: the op bodies of src/kernels/*.cuh run on the CPU through this view, with
// float64 accumulation for every dtype, so CPU and CUDA results come from one formula.
//
// Operands are contiguous (outer, d, inner) tensors reduced over d (StridedArgs); RunRowsCpu
// processes rows [begin, end) of the outer * inner rows (row r = (r / inner, r % inner)) so the
// caller can split the work across threads. One thread owns the whole row, so AllReduce is the
// identity.
#pragma once

#include <cstdint>

#include "kernels/common/args.h"
#include "kernels/common/operands.cuh"
#include "kernels/common/row_ops.h"
#include "kernels/common/types.cuh"

namespace rownorm {

template <class Args>
class CpuRow : public RowOps<CpuRow<Args>, double> {
 public:
  using TIn = typename Args::InElem;
  using TOut = typename Args::OutElem;
  using Acc = double;
  static constexpr int kIn = Args::kNumIn;
  static constexpr int kOut = Args::kNumOut;
  static constexpr bool kCached = false;

  CpuRow(const Args& a, int64_t r) : d_(a.d), inner_(a.inner), index_(r) {
    const int64_t base = (r / a.inner) * a.d * a.inner + r % a.inner;
    for (int i = 0; i < kIn; ++i) in_[i] = InOffset<Args>(a.in[i], i, base);
    for (int j = 0; j < kOut; ++j) out_[j] = OutOffset<Args>(a.out[j], j, base);
  }

  int64_t Size() const { return d_; }
  int64_t Index() const { return index_; }
  bool Valid() const { return true; }
  bool Leader() const { return true; }
  Acc First() const { return static_cast<Acc>(ToAcc(in_[0][0])); }

  // Primitives of RowOps.
  template <typename Op, typename V>
  V AllReduce(V v, Op) {
    return v;
  }
  template <typename G>
  void ForEachValue(G g) const {
    Acc x[kIn];
    for (int64_t k = 0; k < d_; ++k) {
      for (int i = 0; i < kIn; ++i) {
        x[i] =
            static_cast<Acc>(ToAcc(LoadInScalar<Args>(InOffset<Args>(in_[i], i, k * inner_), i)));
      }
      g(static_cast<const Acc*>(x), k);
    }
  }
  template <int J, typename F>
  void StoreTo(F f) {
    static_assert(J >= 0 && J < kOut, "the op has no such output");
    static_assert(J != 1 || !Args::kOut1CopiesOut0, "output 1 is written with output 0");
    ForEachValue([&](const Acc* x, int64_t k) {
      const Acc v = f(x, k);
      StoreOutScalar<Args, J>(OutOffset<Args>(out_[J], J, k * inner_), v);
      if constexpr (J == 0 && Args::kOut1CopiesOut0) {
        StoreOutScalar<Args, 1>(OutOffset<Args>(out_[1], 1, k * inner_), v);
      }
    });
  }

 private:
  int64_t d_;
  int64_t inner_;
  int64_t index_;
  const TIn* in_[kIn];
  TOut* out_[kOut];
};

template <class Op, class Args>
void RunRowsCpu(const Args& a, const Op& op, int64_t begin, int64_t end) {
  for (int64_t r = begin; r < end; ++r) {
    CpuRow<Args> row(a, r);
    op(row);
  }
}

}  // namespace rownorm
