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
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/common/types.cuh"

namespace rownorm {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

// A message of the streamed arguments.
template <typename... Args>
std::string StrCat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

// A check of user input: throws std::runtime_error, which torch raises as a RuntimeError whose
// message is exactly the arguments ("<op>: <argument> must be <expected>, got <given>", as the
// fakes in python/rownorm/ops.py say it). STD_TORCH_CHECK would prefix the C++ function's name
// and the build machine's path of the source file.
#define ROWNORM_CHECK(cond, ...)                                           \
  do {                                                                     \
    if (!(cond)) throw std::runtime_error(::rownorm::StrCat(__VA_ARGS__)); \
  } while (false)

// torch's dtype names without the "torch." (float32, float8_e4m3fn, complex32, uint16), indexed
// by the value of ScalarType: c10's order, which the serialization format fixes.
// clang-format off
inline constexpr const char* kDtypeNames[] = {
    "uint8", "int8", "int16", "int32", "int64", "float16",  // 0-5
    "float32", "float64", "complex32", "complex64", "complex128", "bool",  // 6-11
    "qint8", "quint8", "qint32", "bfloat16", "quint4x2", "quint2x4",  // 12-17
    "bits1x8", "bits2x4", "bits4x2", "bits8", "bits16", "float8_e5m2",  // 18-23
    "float8_e4m3fn", "float8_e5m2fnuz", "float8_e4m3fnuz", "uint16", "uint32", "uint64",  // 24-29
    "uint1", "uint2", "uint3", "uint4", "uint5", "uint6",  // 30-35
    "uint7", "int1", "int2", "int3", "int4", "int5",  // 36-41
    "int6", "int7", "float8_e8m0fnu", "float4_e2m1fn_x2", "bcomplex32",  // 42-46
};
// clang-format on

// The name of a dtype given by its ScalarType value (`code`) or enumerator.
inline std::string DtypeName(int32_t code) {
  constexpr int32_t kKnown = sizeof(kDtypeNames) / sizeof(kDtypeNames[0]);
  return code >= 0 && code < kKnown ? kDtypeNames[code] : "dtype #" + std::to_string(code);
}
inline std::string DtypeName(ScalarType t) { return DtypeName(static_cast<int32_t>(t)); }

// t's dtype as its ScalarType value, read through the C shim (whose dtype codes are those
// values): Tensor::scalar_type() throws for the dtypes the stable ABI has no enumerator for
// (bits8, int4, ...), where a check must still name the dtype it rejects.
inline int32_t DtypeCode(const Tensor& t) {
  int32_t code = 0;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_dtype(t.get(), &code));
  return code;
}

inline std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}
inline std::string ShapeString(const Tensor& t) {
  return ShapeString(std::vector<int64_t>(t.sizes().begin(), t.sizes().end()));
}

inline void CheckFloating(const char* op, const char* name, const Tensor& t) {
  const int32_t code = DtypeCode(t);
  ROWNORM_CHECK(code == aoti_torch_dtype_float32() || code == aoti_torch_dtype_float64() ||
                    code == aoti_torch_dtype_float16() || code == aoti_torch_dtype_bfloat16(),
                op, ": ", name, " must be float32, float16, bfloat16 or float64, got ",
                DtypeName(code));
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
// shape; `stream`: another dtype `other` may have (add_rms_norm's float32 residual stream beside
// a 16-bit x: ResidualStreamDtype), named in the message.
inline void CheckLike(const char* op, const char* name, const Tensor& other, const char* x_name,
                      const Tensor& x, std::optional<ScalarType> stream = std::nullopt) {
  ROWNORM_CHECK(other.device() == x.device(), op, ": ", name, " must be on ", x_name, "'s device (",
                DeviceString(x), "), got ", DeviceString(other));
  const bool streamed = stream.has_value() && DtypeCode(other) == static_cast<int32_t>(*stream);
  ROWNORM_CHECK(DtypeCode(other) == DtypeCode(x) || streamed, op, ": ", name, " must have ", x_name,
                "'s dtype ", DtypeName(DtypeCode(x)),
                stream.has_value()
                    ? std::string(" or ") + DtypeName(*stream) + " (a float32 residual stream)"
                    : std::string(),
                ", got ", DtypeName(DtypeCode(other)));
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
