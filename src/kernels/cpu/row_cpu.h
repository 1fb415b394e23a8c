// The CPU row: the op bodies of src/kernels/*.cuh run on the CPU through this view, with
// float64 accumulation for every dtype, so CPU and CUDA results come from one formula.
//
// Operands are contiguous (outer, d, inner) tensors reduced over d; RunRowsCpu processes rows
// [begin, end) of the outer * inner rows (row r = (r / inner, r % inner)) so the caller can
// split the work across threads.
#pragma once

#include <cstdint>
#include <utility>

#include "kernels/common/args.h"
#include "kernels/common/types.cuh"

namespace rownorm {

template <typename T, int kIn>
class CpuRow {
 public:
  using Acc = double;
  static constexpr bool kCached = false;

  CpuRow(const ColumnArgs<T, kIn>& a, int64_t r) : d_(a.d), inner_(a.inner), index_(r) {
    const int64_t base = (r / a.inner) * a.d * a.inner + r % a.inner;
    for (int i = 0; i < kIn; ++i) in_[i] = a.in[i] + base;
    out_ = a.out + base;
    out2_ = a.out2 != nullptr ? a.out2 + base : nullptr;
  }

  int64_t Size() const { return d_; }
  int64_t Index() const { return index_; }
  bool Leader() const { return true; }

  template <typename Op, typename F>
  auto Reduce(Op op, F f) {
    using V = decltype(f(std::declval<const Acc*>(), int64_t{}));
    V acc = Op::template Identity<V>();
    Acc x[kIn];
    for (int64_t k = 0; k < d_; ++k) {
      Load(k, x);
      acc = op(acc, f(x, k));
    }
    return acc;
  }

  template <typename F>
  void Store(F f) {
    StoreTo(out_, f);
  }
  template <typename F>
  void Store2(F f) {
    StoreTo(out2_, f);
  }

 private:
  void Load(int64_t k, Acc (&x)[kIn]) const {
    for (int i = 0; i < kIn; ++i) x[i] = static_cast<Acc>(ToAcc(in_[i][k * inner_]));
  }

  template <typename F>
  void StoreTo(T* out, F f) {
    Acc x[kIn];
    for (int64_t k = 0; k < d_; ++k) {
      Load(k, x);
      out[k * inner_] = FromAcc<T>(static_cast<AccType<T>>(f(x, k)));
    }
  }

  int64_t d_;
  int64_t inner_;
  int64_t index_;
  const T* in_[kIn];
  T* out_;
  T* out2_;
};

template <class Op>
void RunRowsCpu(const ColumnArgs<typename Op::Elem, Op::kIn>& a, const Op& op, int64_t begin,
                int64_t end) {
  for (int64_t r = begin; r < end; ++r) {
    CpuRow<typename Op::Elem, Op::kIn> row(a, r);
    op(row);
  }
}

}  // namespace rownorm
