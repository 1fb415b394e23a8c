// Element types and their compute types, shared by the CUDA kernels and the CPU kernels.
//
// Storage types are float, double, __half and __nv_bfloat16 (never a torch type: the kernels
// do not depend on torch). Every op accumulates in AccType<T>: float for the 16- and 32-bit
// types, double for double. Conversions are __host__ __device__ so the CPU kernels share them.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define ROWNORM_HOST_DEVICE __host__ __device__ __forceinline__
#define ROWNORM_DEVICE __device__ __forceinline__
#else
#define ROWNORM_HOST_DEVICE inline
#define ROWNORM_DEVICE inline
#endif

namespace rownorm {

template <typename T>
struct AccTypeOf {
  using type = float;
};
template <>
struct AccTypeOf<double> {
  using type = double;
};
template <typename T>
using AccType = typename AccTypeOf<T>::type;

template <typename T>
ROWNORM_HOST_DEVICE AccType<T> ToAcc(T v) {
  return static_cast<AccType<T>>(v);
}
template <>
ROWNORM_HOST_DEVICE float ToAcc<__half>(__half v) {
  return __half2float(v);
}
template <>
ROWNORM_HOST_DEVICE float ToAcc<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T>
ROWNORM_HOST_DEVICE T FromAcc(AccType<T> v) {
  return static_cast<T>(v);
}
template <>
ROWNORM_HOST_DEVICE __half FromAcc<__half>(float v) {
  return __float2half_rn(v);
}
template <>
ROWNORM_HOST_DEVICE __nv_bfloat16 FromAcc<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// IEEE-exact math on the accumulator type (no fast-math approximations: the ops must match
// PyTorch's results to within rounding).
ROWNORM_HOST_DEVICE float Sqrt(float v) { return sqrtf(v); }
ROWNORM_HOST_DEVICE double Sqrt(double v) { return sqrt(v); }
ROWNORM_HOST_DEVICE float Max(float a, float b) { return fmaxf(a, b); }
ROWNORM_HOST_DEVICE double Max(double a, double b) { return fmax(a, b); }
ROWNORM_HOST_DEVICE float Abs(float v) { return fabsf(v); }
ROWNORM_HOST_DEVICE double Abs(double v) { return fabs(v); }
ROWNORM_HOST_DEVICE float Exp(float v) { return expf(v); }
ROWNORM_HOST_DEVICE double Exp(double v) { return exp(v); }
ROWNORM_HOST_DEVICE float Exp2(float v) { return exp2f(v); }
ROWNORM_HOST_DEVICE double Exp2(double v) { return exp2(v); }
ROWNORM_HOST_DEVICE float Log(float v) { return logf(v); }
ROWNORM_HOST_DEVICE double Log(double v) { return log(v); }
// a·b rounded on its own, never contracted into a neighbouring FMA: where a product is
// subtracted from an equal rounded product (LayerNorm's g − mean(g) on a row of one element)
// the difference is then exactly 0 rather than the product's rounding error.
ROWNORM_HOST_DEVICE float MulRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
ROWNORM_HOST_DEVICE double MulRn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

// sign(v) in {-1, 0, 1} (0 for ±0), the derivative of |v| that torch uses.
template <typename A>
ROWNORM_HOST_DEVICE A Sign(A v) {
  return static_cast<A>((v > A(0)) - (v < A(0)));
}

// v rounded to the storage type T and back: what a torch expression computed in T holds.
template <typename T, typename A>
ROWNORM_HOST_DEVICE A RoundTo(A v) {
  return static_cast<A>(ToAcc(FromAcc<T>(static_cast<AccType<T>>(v))));
}

// Element `col` of an optional per-column parameter (weight, bias) in the compute type A, or
// `absent` when the parameter was not given.
template <typename A, typename W>
ROWNORM_HOST_DEVICE A Param(const W* p, int64_t col, A absent) {
  return p != nullptr ? static_cast<A>(ToAcc(p[col])) : absent;
}

// Passed to an op body that supports fused column sums when the tier does not accumulate any.
struct NoColumnSums {};

// A fixed-size array of accumulators: the value type of multi-statistic reductions (for
// example (Σx², Σx·dy) in one pass, sharing one barrier).
template <typename T, int K>
struct Array {
  T v[K];
  ROWNORM_HOST_DEVICE T& operator[](int i) { return v[i]; }
  ROWNORM_HOST_DEVICE const T& operator[](int i) const { return v[i]; }
};

}  // namespace rownorm
