// Problem descriptions passed by value from the bindings to the launchers (host and device).
// Raw pointers, int64 sizes and strides in elements; no torch types.
//
// A problem has kIn inputs of element type TIn and kOut outputs of element type TOut, all of
// the same shape. Both kinds of operand are first-class: the engine loads inputs and stores
// outputs in packs of kPackWidth elements, the widest that keeps a pack of either type within
// one 16-byte access (the full width of the type when TIn == TOut).
#pragma once

#include <cstdint>

namespace rownorm {

// Elements per pack of a problem moving TIn in and TOut out.
template <typename TIn, typename TOut>
constexpr int PackWidthOf() {
  return 16 / static_cast<int>(sizeof(TIn) > sizeof(TOut) ? sizeof(TIn) : sizeof(TOut));
}

// The operand types of a problem, shared by both argument layouts below: kIn inputs of TIn
// and kOut outputs of TOut, moved in packs of kPackWidth elements of each.
template <typename TIn, int kIn, typename TOut, int kOut>
struct OperandTypes {
  using InElem = TIn;
  using OutElem = TOut;
  static constexpr int kNumIn = kIn;
  static constexpr int kNumOut = kOut;
  static constexpr int kPackWidth = PackWidthOf<TIn, TOut>();
};

// `rows` rows of `n` unit-stride elements; input i's row r starts at in[i] + r * in_stride[i],
// output j's at out[j] + r * out_stride[j].
template <typename TIn, int kIn, typename TOut = TIn, int kOut = 1>
struct RowArgs : OperandTypes<TIn, kIn, TOut, kOut> {
  const TIn* in[kIn];
  int64_t in_stride[kIn];
  TOut* out[kOut];
  int64_t out_stride[kOut];
  int64_t rows;
  int64_t n;
};

// Contiguous (outer, d, inner) operands reduced over d: the strided-dim path when inner > 1,
// and every problem of the CPU rows (which make their operands contiguous first).
template <typename TIn, int kIn, typename TOut = TIn, int kOut = 1>
struct StridedArgs : OperandTypes<TIn, kIn, TOut, kOut> {
  const TIn* in[kIn];
  TOut* out[kOut];
  int64_t outer;
  int64_t d;
  int64_t inner;
};

}  // namespace rownorm
