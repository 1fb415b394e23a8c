// Problem descriptions passed by value from the bindings to the launchers (host and device).
// Raw pointers, int64 sizes and strides in elements; no torch types.
#pragma once

#include <cstdint>

namespace rownorm {

// `rows` rows of `n` unit-stride elements; operand i's row r starts at in[i] + r * in_stride[i].
template <typename T, int kIn>
struct RowArgs {
  const T* in[kIn];
  int64_t in_stride[kIn];
  T* out;
  int64_t out_stride;
  int64_t rows;
  int64_t n;
  T* out2 = nullptr;  // second output of two-output ops (add_rms_norm's x + residual)
  int64_t out2_stride = 0;
};

// Contiguous (outer, d, inner) operands, reduced over d (inner > 1: the strided-dim path).
template <typename T, int kIn>
struct ColumnArgs {
  const T* in[kIn];
  T* out;
  int64_t outer;
  int64_t d;
  int64_t inner;
  T* out2 = nullptr;  // second output of two-output ops, laid out like out
};

}  // namespace rownorm
