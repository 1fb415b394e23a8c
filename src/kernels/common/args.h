// Problem descriptions passed by value from the bindings to the launchers (host and device).
// Raw pointers, int64 sizes and strides in elements; no torch types.
//
// A problem has kIn inputs of element type TIn and kOut outputs of element type TOut, all of
// the same shape. Both kinds of operand are first-class: the engine loads inputs and stores
// outputs in packs of kPackWidth elements, the widest that keeps a pack of either type within
// one 16-byte access (the full width of the type when TIn == TOut).
//
// A mixed problem (Narrowing<N, in_mask, out_mask>) stores the inputs and outputs whose bit is
// set as N, a narrower type (bf16 x beside a float32 residual): the engine moves them in packs
// of kPackWidth N-elements and holds them in registers as TIn / TOut (exact for a 16-bit N in
// float32), so an op body sees one accumulator type. Their pointers travel in the TIn / TOut
// arrays and are read only through the byte offsets InBytes / OutBytes give (row_views.cuh).
#pragma once

#include <cstdint>
#include <type_traits>

namespace rownorm {

// Elements per pack of a problem moving TIn in and TOut out.
template <typename TIn, typename TOut>
constexpr int PackWidthOf() {
  return 16 / static_cast<int>(sizeof(TIn) > sizeof(TOut) ? sizeof(TIn) : sizeof(TOut));
}

// Which operands of a problem are stored as N (bit i of kInMask: input i; of kOutMask: output
// j); NoNarrowing: none. kCopy: output 1 is output 0 again in its own type, written by the
// same stores (the residual stream's backward: d_r in float32 and x's gradient in 16 bits).
template <typename N, unsigned kInMask, unsigned kOutMask, bool kCopy = false>
struct Narrowing {
  using Narrow = N;
  static constexpr unsigned kIn = kInMask;
  static constexpr unsigned kOut = kOutMask;
  static constexpr bool kOut1CopiesOut0 = kCopy;
};
using NoNarrowing = Narrowing<void, 0, 0>;

template <class Narrowed, typename T, bool kMixed>
struct NarrowerThan : std::true_type {};
template <class Narrowed, typename T>
struct NarrowerThan<Narrowed, T, true>
    : std::bool_constant<sizeof(typename Narrowed::Narrow) < sizeof(T)> {};

// The operand types of a problem, shared by both argument layouts below: kIn inputs of TIn
// and kOut outputs of TOut (those Narrowed marks stored as its Narrow), moved in packs of
// kPackWidth elements of each.
template <typename TIn, int kIn, typename TOut, int kOut, class Narrowed = NoNarrowing>
struct OperandTypes {
  using InElem = TIn;
  using OutElem = TOut;
  using Narrowings = Narrowed;
  using Narrow = typename Narrowed::Narrow;
  static constexpr int kNumIn = kIn;
  static constexpr int kNumOut = kOut;
  static constexpr int kPackWidth = PackWidthOf<TIn, TOut>();
  static constexpr bool kMixed = Narrowed::kIn != 0 || Narrowed::kOut != 0;
  static constexpr bool kOut1CopiesOut0 = Narrowed::kOut1CopiesOut0;
  static_assert(!kOut1CopiesOut0 || (kMixed && kOut == 2), "a copy is a mixed problem's output 1");
  static_assert(NarrowerThan<Narrowed, TIn, kMixed>::value, "a narrowed operand is narrower");

  static constexpr bool NarrowIn(int i) { return (Narrowed::kIn >> i) & 1u; }
  static constexpr bool NarrowOut(int j) { return (Narrowed::kOut >> j) & 1u; }
  // Bytes of one element of input i / output j in memory.
  static constexpr int InBytes(int i) {
    if constexpr (kMixed) {
      if (NarrowIn(i)) return sizeof(Narrow);
    }
    return sizeof(TIn);
  }
  static constexpr int OutBytes(int j) {
    if constexpr (kMixed) {
      if (NarrowOut(j)) return sizeof(Narrow);
    }
    return sizeof(TOut);
  }
};

// `rows` rows of `n` unit-stride elements; input i's row r starts at in[i] + r * in_stride[i],
// output j's at out[j] + r * out_stride[j].
template <typename TIn, int kIn, typename TOut = TIn, int kOut = 1, class Narrowed = NoNarrowing>
struct RowArgs : OperandTypes<TIn, kIn, TOut, kOut, Narrowed> {
  const TIn* in[kIn];
  int64_t in_stride[kIn];
  TOut* out[kOut];
  int64_t out_stride[kOut];
  int64_t rows;
  int64_t n;
  // Whether the group tier and the CTAs of up to 256 threads load input 0 with L2's evict_last
  // priority, for the ops of OpTraits::kKeepsInputInL2 (tier_kernels.cuh): the plan's
  // RowPlan::l2_keep, set at launch (dispatch.cuh's WithL2Keep).
  bool keep_input0_in_l2 = false;
};

// Contiguous (outer, d, inner) operands reduced over d: the strided-dim path when inner > 1,
// and every problem of the CPU rows (which make their operands contiguous first).
template <typename TIn, int kIn, typename TOut = TIn, int kOut = 1, class Narrowed = NoNarrowing>
struct StridedArgs : OperandTypes<TIn, kIn, TOut, kOut, Narrowed> {
  const TIn* in[kIn];
  TOut* out[kOut];
  int64_t outer;
  int64_t d;
  int64_t inner;
  // Whether the staged strided kernel (StridedPrefetchKernel) copies the inputs under L2's
  // evict_last priority and sets each tile's lines back once the tile is stored: the plan's
  // StridedPlan::l2_keep, set at launch (dispatch.cuh's WithStridedL2Keep).
  bool keep_inputs_in_l2 = false;
};

}  // namespace rownorm
