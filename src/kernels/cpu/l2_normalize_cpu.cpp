#include "kernels/cpu/l2_normalize_cpu.h"

#include <cmath>

#include "kernels/common/instantiate.cuh"
#include "kernels/common/types.cuh"

namespace rownorm {
namespace {

template <typename T>
double Load(const T* p) {
  return static_cast<double>(ToAcc(*p));
}

template <typename T>
void Put(T* p, double v) {
  *p = FromAcc<T>(static_cast<AccType<T>>(v));
}

}  // namespace

template <typename T>
void L2NormalizeFwdCpu(const StridedArgs<T, 1>& a, double eps, int64_t begin, int64_t end) {
  for (int64_t r = begin; r < end; ++r) {
    const int64_t base = (r / a.inner) * a.d * a.inner + r % a.inner;
    const T* x = a.in[0] + base;
    T* y = a.out[0] + base;
    double ss = 0;
    for (int64_t k = 0; k < a.d; ++k) ss += Load(x + k * a.inner) * Load(x + k * a.inner);
    const double inv = 1.0 / std::fmax(std::sqrt(ss), eps);
    for (int64_t k = 0; k < a.d; ++k) Put(y + k * a.inner, Load(x + k * a.inner) * inv);
  }
}

template <typename T>
void L2NormalizeBwdCpu(const StridedArgs<T, 2>& a, double eps, int64_t begin, int64_t end) {
  for (int64_t r = begin; r < end; ++r) {
    const int64_t base = (r / a.inner) * a.d * a.inner + r % a.inner;
    const T* x = a.in[0] + base;
    const T* dy = a.in[1] + base;
    T* dx = a.out[0] + base;
    double ss = 0;
    double dot = 0;
    for (int64_t k = 0; k < a.d; ++k) {
      const double xv = Load(x + k * a.inner);
      ss += xv * xv;
      dot += xv * Load(dy + k * a.inner);
    }
    const double norm = std::sqrt(ss);
    const bool clamped = norm < eps;
    const double inv = 1.0 / (clamped ? eps : norm);
    const double coef = clamped ? 0.0 : dot * inv * inv * inv;
    for (int64_t k = 0; k < a.d; ++k) {
      Put(dx + k * a.inner, Load(dy + k * a.inner) * inv - Load(x + k * a.inner) * coef);
    }
  }
}

#define ROWNORM_INSTANTIATE(T)                                                            \
  template void L2NormalizeFwdCpu<T>(const StridedArgs<T, 1>&, double, int64_t, int64_t); \
  template void L2NormalizeBwdCpu<T>(const StridedArgs<T, 2>&, double, int64_t, int64_t);
ROWNORM_FOR_EACH_FLOAT_TYPE(ROWNORM_INSTANTIATE)
#undef ROWNORM_INSTANTIATE

}  // namespace rownorm
