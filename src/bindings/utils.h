// Shared helpers of the bindings: argument checks with messages naming the argument, the
// row view of a tensor, dtype dispatch, the current CUDA stream and launch-error checks.
// Only the LibTorch stable ABI is used here (torch/csrc/stable, torch/headeronly).
#pragma once

#include <cuda_runtime_api.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/common/types.cuh"

namespace rownorm {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

#define ROWNORM_CHECK(cond, ...) STD_TORCH_CHECK(cond, __VA_ARGS__)

inline std::string DtypeName(ScalarType t) {
  switch (t) {
    case ScalarType::Float: return "float32";
    case ScalarType::Double: return "float64";
    case ScalarType::Half: return "float16";
    case ScalarType::BFloat16: return "bfloat16";
    case ScalarType::Long: return "int64";
    case ScalarType::Int: return "int32";
    case ScalarType::Short: return "int16";
    case ScalarType::Char: return "int8";
    case ScalarType::Byte: return "uint8";
    case ScalarType::Bool: return "bool";
    case ScalarType::ComplexFloat: return "complex64";
    case ScalarType::ComplexDouble: return "complex128";
    default: return "dtype #" + std::to_string(static_cast<int>(t));
  }
}

inline std::string ShapeString(const Tensor& t) {
  std::string s = "(";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + (t.dim() == 1 ? ",)" : ")");
}

inline void CheckFloating(const char* op, const char* name, const Tensor& t) {
  const ScalarType st = t.scalar_type();
  ROWNORM_CHECK(st == ScalarType::Float || st == ScalarType::Double || st == ScalarType::Half ||
                    st == ScalarType::BFloat16,
                op, ": ", name, " must be float32, float16, bfloat16 or float64, got ",
                DtypeName(st));
}

// Checks the tensor a row op reduces (named `name`: x, or the y / r a backward op reads) and
// dim; returns dim wrapped to [0, x.dim()).
inline int64_t CheckRowwiseInput(const char* op, const char* name, const Tensor& x, int64_t dim) {
  CheckFloating(op, name, x);
  ROWNORM_CHECK(x.dim() >= 1, op, ": ", name,
                " must have at least one dimension, got a 0-d tensor");
  ROWNORM_CHECK(dim >= -x.dim() && dim < x.dim(), op, ": dim must be in [", -x.dim(), ", ",
                x.dim() - 1, "] for a ", x.dim(), "-d ", name, ", got ", dim);
  return dim < 0 ? dim + x.dim() : dim;
}

inline void CheckEps(const char* op, double eps) {
  ROWNORM_CHECK(eps >= 0, op, ": eps must be >= 0, got ", eps);
}

// "cpu" / "cuda:0", as torch prints a device.
inline std::string DeviceString(const Tensor& t) {
  return t.is_cuda() ? "cuda:" + std::to_string(t.get_device_index()) : "cpu";
}

// `other` (named `name`) must be on the device of x (named `x_name`) and have its dtype and
// shape.
inline void CheckLike(const char* op, const char* name, const Tensor& other, const char* x_name,
                      const Tensor& x) {
  ROWNORM_CHECK(other.device() == x.device(), op, ": ", name, " must be on ", x_name, "'s device (",
                DeviceString(x), "), got ", DeviceString(other));
  ROWNORM_CHECK(other.scalar_type() == x.scalar_type(), op, ": ", name, " must have ", x_name,
                "'s dtype ", DtypeName(x.scalar_type()), ", got ", DtypeName(other.scalar_type()));
  bool same = other.dim() == x.dim();
  for (int64_t i = 0; same && i < x.dim(); ++i) same = other.size(i) == x.size(i);
  ROWNORM_CHECK(same, op, ": ", name, " must have ", x_name, "'s shape ", ShapeString(x), ", got ",
                ShapeString(other));
}

// A tensor seen as `rows` rows of `n` unit-stride elements, row r at offset r * row_stride,
// rows in the row-major order of the other dims (the order of a contiguous output).
struct RowView {
  bool ok = false;
  int64_t rows = 0;
  int64_t n = 0;
  int64_t row_stride = 0;
};

inline RowView TryRowView(const Tensor& t, int64_t dim) {
  RowView v;
  v.n = t.size(dim);
  for (int64_t i = dim + 1; i < t.dim(); ++i) {
    if (t.size(i) != 1) return v;  // dim is not innermost: the strided-dim path
  }
  if (v.n > 1 && t.stride(dim) != 1) return v;
  v.rows = 1;
  int64_t prev = -1;  // innermost non-trivial other dim seen so far (walking outward)
  for (int64_t i = dim - 1; i >= 0; --i) {
    v.rows *= t.size(i);
    if (t.size(i) == 1) continue;
    if (prev < 0) {
      v.row_stride = t.stride(i);
    } else if (t.stride(i) != t.stride(prev) * t.size(prev)) {
      return v;  // the other dims do not collapse into one uniformly strided row index
    }
    prev = i;
  }
  if (prev < 0) v.row_stride = v.n;
  v.ok = true;
  return v;
}

inline Tensor Contiguous(const Tensor& t) {
  return t.is_contiguous() ? t : torch::stable::contiguous(t);
}

// (outer, d, inner) sizes of a reduction over `dim` of a contiguous tensor.
struct StridedShape {
  int64_t outer = 1;
  int64_t d = 1;
  int64_t inner = 1;
};

inline StridedShape StridedShapeOf(const Tensor& t, int64_t dim) {
  StridedShape s;
  for (int64_t i = 0; i < dim; ++i) s.outer *= t.size(i);
  s.d = t.size(dim);
  for (int64_t i = dim + 1; i < t.dim(); ++i) s.inner *= t.size(i);
  return s;
}

// Calls f(T{}) with T the kernel element type of `st` (float, double, __half, __nv_bfloat16).
template <typename F>
void DispatchFloating(ScalarType st, F&& f) {
  switch (st) {
    case ScalarType::Float: f(float{}); break;
    case ScalarType::Double: f(double{}); break;
    case ScalarType::Half: f(__half{}); break;
    case ScalarType::BFloat16: f(__nv_bfloat16{}); break;
    default: ROWNORM_CHECK(false, "rownorm: unsupported dtype ", DtypeName(st));
  }
}

template <typename T>
const T* ConstPtr(const Tensor& t) {
  return static_cast<const T*>(t.data_ptr());
}
template <typename T>
T* MutPtr(const Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

inline cudaStream_t CurrentCudaStream(const Tensor& t) {
  void* stream = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(t.get_device_index(), &stream));
  return static_cast<cudaStream_t>(stream);
}

inline void CheckLaunch(const char* op, cudaError_t err) {
  ROWNORM_CHECK(err == cudaSuccess, op, ": CUDA kernel launch failed: ", cudaGetErrorString(err));
}

// Planning reads the device's attributes (once per device).
inline void CheckPlan(const char* op, cudaError_t err) {
  ROWNORM_CHECK(err == cudaSuccess, op,
                ": reading the CUDA device's attributes failed: ", cudaGetErrorString(err));
}

// ROWNORM_LOG_PLAN=1 (read once per process): every launch writes the plan it runs to stderr,
// one line `rownorm: <op>: rows=<rows> n=<n> <plan as key=value words>`. The C++ side writes
// to stderr directly: a launch inside a compiled graph has no Python frame to log through.
inline bool PlanLogEnabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("ROWNORM_LOG_PLAN");
    return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
  }();
  return enabled;
}

// `describe()` (a std::string) is only evaluated when the log is on.
template <class Describe>
void LogPlan(const char* op, int64_t rows, int64_t n, Describe describe) {
  if (!PlanLogEnabled()) return;
  const std::string plan = describe();
  std::fprintf(stderr, "rownorm: %s: rows=%lld n=%lld %s\n", op, static_cast<long long>(rows),
               static_cast<long long>(n), plan.c_str());
}

// Splits rows [0, rows) over torch's intra-op threads, about kGrainElems elements per task.
template <typename F>
void ParallelRows(int64_t rows, int64_t row_len, F&& f) {
  constexpr int64_t kGrainElems = 1 << 15;
  const int64_t grain = row_len > 0 ? std::max<int64_t>(1, kGrainElems / row_len) : rows;
  torch::stable::parallel_for(0, rows, grain, f);
}

}  // namespace rownorm
