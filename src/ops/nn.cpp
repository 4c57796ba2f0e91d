// Elementwise / row kernels of the forward pass (nn.h): Highway SIMD compiled per ISA and
// dispatched at run time, plus the scalar references (namespace ref, double accumulation).
// exp / tanh use Highway's contrib/math polynomials (max error a few ulp), so the SIMD
// results match the references to ~1e-6 relative.

#include "ops/nn.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL
#endif
// These kernels have no SSE4 path (it takes the scalar one), beside what the build disables.
#ifndef KVTRIM_HWY_DISABLED
#define KVTRIM_HWY_DISABLED 0
#endif
#undef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SSE4 | KVTRIM_HWY_DISABLED)

// foreach_target.h must precede highway.h (it re-includes this file once per target) and
// -inl.h headers follow highway.h; include sorting would break that.
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/nn.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace kvtrim {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

float SumSq(const float* x, int64_t n) {
  const DF df;
  const int64_t nl = static_cast<int64_t>(hn::Lanes(df));
  auto a0 = hn::Zero(df), a1 = hn::Zero(df);
  int64_t i = 0;
  for (; i + 2 * nl <= n; i += 2 * nl) {
    const auto v0 = hn::LoadU(df, x + i), v1 = hn::LoadU(df, x + i + nl);
    a0 = hn::MulAdd(v0, v0, a0);
    a1 = hn::MulAdd(v1, v1, a1);
  }
  for (; i + nl <= n; i += nl) {
    const auto v = hn::LoadU(df, x + i);
    a0 = hn::MulAdd(v, v, a0);
  }
  float s = hn::GetLane(hn::SumOfLanes(df, hn::Add(a0, a1)));
  for (; i < n; ++i) s += x[i] * x[i];
  return s;
}

float Dot(const float* a, const float* b, int64_t n) {
  const DF df;
  const int64_t nl = static_cast<int64_t>(hn::Lanes(df));
  auto a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
  int64_t i = 0;
  for (; i + 4 * nl <= n; i += 4 * nl) {
    a0 = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), a0);
    a1 = hn::MulAdd(hn::LoadU(df, a + i + nl), hn::LoadU(df, b + i + nl), a1);
    a2 = hn::MulAdd(hn::LoadU(df, a + i + 2 * nl), hn::LoadU(df, b + i + 2 * nl), a2);
    a3 = hn::MulAdd(hn::LoadU(df, a + i + 3 * nl), hn::LoadU(df, b + i + 3 * nl), a3);
  }
  for (; i + nl <= n; i += nl) a0 = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), a0);
  float s = hn::GetLane(hn::SumOfLanes(df, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y[i] = x[i] * s * (w ? w[i] : 1) + (b ? b[i] : 0) - shift * s * (w ? w[i] : 1)
void ScaleRow(const float* x, const float* w, const float* b, float* y, int64_t n, float shift,
              float s) {
  const DF df;
  const int64_t nl = static_cast<int64_t>(hn::Lanes(df));
  const auto vs = hn::Set(df, s), vsh = hn::Set(df, shift);
  int64_t i = 0;
  for (; i + nl <= n; i += nl) {
    auto v = hn::Mul(hn::Sub(hn::LoadU(df, x + i), vsh), vs);
    if (w) v = hn::Mul(v, hn::LoadU(df, w + i));
    if (b) v = hn::Add(v, hn::LoadU(df, b + i));
    hn::StoreU(v, df, y + i);
  }
  for (; i < n; ++i) {
    float v = (x[i] - shift) * s;
    if (w) v *= w[i];
    if (b) v += b[i];
    y[i] = v;
  }
}

float MaxOf(const float* x, int64_t n) {
  const DF df;
  const int64_t nl = static_cast<int64_t>(hn::Lanes(df));
  float m = -INFINITY;
  int64_t i = 0;
  if (n >= nl) {
    auto vm = hn::LoadU(df, x);
    for (i = nl; i + nl <= n; i += nl) vm = hn::Max(vm, hn::LoadU(df, x + i));
    m = hn::GetLane(hn::MaxOfLanes(df, vm));
  }
  for (; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

// x[i] = exp(x[i] - mx); returns the sum.
float ExpSub(float* x, int64_t n, float mx) {
  const DF df;
  const int64_t nl = static_cast<int64_t>(hn::Lanes(df));
  const auto vm = hn::Set(df, mx);
  auto acc = hn::Zero(df);
  int64_t i = 0;
  for (; i + nl <= n; i += nl) {
    const auto e = hn::Exp(df, hn::Sub(hn::LoadU(df, x + i), vm));
    hn::StoreU(e, df, x + i);
    acc = hn::Add(acc, e);
  }
  float s = hn::GetLane(hn::SumOfLanes(df, acc));
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    s += x[i];
  }
  return s;
}

// The activations compute every element with the vector formula, the last partial vector
// through a padded copy, so an element's result does not depend on where it falls in the array
// (the forward pass splits a chunk's rows over the pool; a scalar tail with std::exp would give
// the rows at the end of a split other last bits than the same rows elsewhere).
template <class Body>
HWY_INLINE void act_rows(const float* g, const float* u, float* y, int64_t n, Body body) {
  const DF df;
  const int64_t nl = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + nl <= n; i += nl) hn::StoreU(body(hn::LoadU(df, g + i), hn::LoadU(df, u + i)), df, y + i);
  if (i < n) {
    constexpr int64_t kMaxLanes = 64;  // (any x86 vector of floats fits)
    alignas(64) float tg[kMaxLanes] = {}, tu[kMaxLanes] = {}, ty[kMaxLanes];
    const int64_t rest = n - i;
    std::copy_n(g + i, rest, tg);
    std::copy_n(u + i, rest, tu);
    hn::StoreU(body(hn::LoadU(df, tg), hn::LoadU(df, tu)), df, ty);
    std::copy_n(ty, rest, y + i);
  }
}

void Swiglu(const float* g, const float* u, float* y, int64_t n) {
  const DF df;
  const auto one = hn::Set(df, 1.0f);
  act_rows(g, u, y, n, [&](auto vg, auto vu) {
    const auto sig = hn::Div(one, hn::Add(one, hn::Exp(df, hn::Neg(vg))));
    return hn::Mul(hn::Mul(vg, sig), vu);
  });
}

void GegluTanh(const float* g, const float* u, float* y, int64_t n) {
  constexpr float kC = 0.7978845608028654f;  // sqrt(2 / pi)
  constexpr float kA = 0.044715f;
  const DF df;
  const auto half = hn::Set(df, 0.5f), one = hn::Set(df, 1.0f), c = hn::Set(df, kC),
             a = hn::Set(df, kA);
  act_rows(g, u, y, n, [&](auto vg, auto vu) {
    const auto inner = hn::Mul(c, hn::MulAdd(hn::Mul(a, vg), hn::Mul(vg, vg), vg));
    const auto gel = hn::Mul(hn::Mul(half, vg), hn::Add(one, hn::Tanh(df, inner)));
    return hn::Mul(gel, vu);
  });
}

void Add(float* y, const float* x, int64_t n) {
  const DF df;
  const int64_t nl = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + nl <= n; i += nl)
    hn::StoreU(hn::Add(hn::LoadU(df, y + i), hn::LoadU(df, x + i)), df, y + i);
  for (; i < n; ++i) y[i] += x[i];
}

void Axpy(float* y, float a, const float* x, int64_t n) {
  const DF df;
  const int64_t nl = static_cast<int64_t>(hn::Lanes(df));
  const auto va = hn::Set(df, a);
  int64_t i = 0;
  for (; i + 2 * nl <= n; i += 2 * nl) {
    hn::StoreU(hn::MulAdd(va, hn::LoadU(df, x + i), hn::LoadU(df, y + i)), df, y + i);
    hn::StoreU(hn::MulAdd(va, hn::LoadU(df, x + i + nl), hn::LoadU(df, y + i + nl)), df,
               y + i + nl);
  }
  for (; i + nl <= n; i += nl)
    hn::StoreU(hn::MulAdd(va, hn::LoadU(df, x + i), hn::LoadU(df, y + i)), df, y + i);
  for (; i < n; ++i) y[i] += a * x[i];
}

}  // namespace HWY_NAMESPACE
}  // namespace kvtrim
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvtrim {

HWY_EXPORT(SumSq);
HWY_EXPORT(Dot);
HWY_EXPORT(ScaleRow);
HWY_EXPORT(MaxOf);
HWY_EXPORT(ExpSub);
HWY_EXPORT(Swiglu);
HWY_EXPORT(GegluTanh);
HWY_EXPORT(Add);
HWY_EXPORT(Axpy);

void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps) {
  const float ss = HWY_DYNAMIC_DISPATCH(SumSq)(x, n);
  const float s = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  HWY_DYNAMIC_DISPATCH(ScaleRow)(x, w, nullptr, y, n, 0.0f, s);
}

void layer_norm(const float* x, const float* w, const float* b, float* y, int64_t n, float eps) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += x[i];
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  double var = 0.0;
  for (int64_t i = 0; i < n; ++i) var += static_cast<double>(x[i] - mean) * (x[i] - mean);
  const float s = static_cast<float>(1.0 / std::sqrt(var / static_cast<double>(n) + eps));
  HWY_DYNAMIC_DISPATCH(ScaleRow)(x, w, b, y, n, mean, s);
}

float exp_sub_sum(float* x, int64_t n, float m) {
  return n > 0 ? HWY_DYNAMIC_DISPATCH(ExpSub)(x, n, m) : 0.0f;
}

float max_of(const float* x, int64_t n) {
  return n > 0 ? HWY_DYNAMIC_DISPATCH(MaxOf)(x, n) : -INFINITY;
}

void softmax(float* x, int64_t n) {
  if (n <= 0) return;
  const float mx = HWY_DYNAMIC_DISPATCH(MaxOf)(x, n);
  const float sum = HWY_DYNAMIC_DISPATCH(ExpSub)(x, n, mx);
  HWY_DYNAMIC_DISPATCH(ScaleRow)(x, nullptr, nullptr, x, n, 0.0f, 1.0f / sum);
}

void swiglu(const float* g, const float* u, float* y, int64_t n) {
  HWY_DYNAMIC_DISPATCH(Swiglu)(g, u, y, n);
}
void geglu_tanh(const float* g, const float* u, float* y, int64_t n) {
  HWY_DYNAMIC_DISPATCH(GegluTanh)(g, u, y, n);
}
void add(float* y, const float* x, int64_t n) {
  HWY_DYNAMIC_DISPATCH(Add)(y, x, n);
}
void scale(float* y, float s, int64_t n) {
  HWY_DYNAMIC_DISPATCH(ScaleRow)(y, nullptr, nullptr, y, n, 0.0f, s);
}
float dot(const float* a, const float* b, int64_t n) {
  return HWY_DYNAMIC_DISPATCH(Dot)(a, b, n);
}
void axpy(float* y, float a, const float* x, int64_t n) {
  HWY_DYNAMIC_DISPATCH(Axpy)(y, a, x, n);
}

namespace ref {

void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const double s = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(x[i] * s * (w ? w[i] : 1.0f));
}

float max_of(const float* x, int64_t n) {
  return n > 0 ? HWY_DYNAMIC_DISPATCH(MaxOf)(x, n) : -INFINITY;
}

void softmax(float* x, int64_t n) {
  if (n <= 0) return;
  double mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, static_cast<double>(x[i]));
  double sum = 0.0;
  std::vector<double> e(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) sum += e[static_cast<size_t>(i)] = std::exp(x[i] - mx);
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(e[static_cast<size_t>(i)] / sum);
}

void swiglu(const float* g, const float* u, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double v = g[i];
    y[i] = static_cast<float>(v / (1.0 + std::exp(-v)) * u[i]);
  }
}

void geglu_tanh(const float* g, const float* u, float* y, int64_t n) {
  const double c = std::sqrt(2.0 / M_PI);
  for (int64_t i = 0; i < n; ++i) {
    const double v = g[i];
    y[i] = static_cast<float>(0.5 * v * (1.0 + std::tanh(c * (v + 0.044715 * v * v * v))) * u[i]);
  }
}

float dot(const float* a, const float* b, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return static_cast<float>(s);
}

}  // namespace ref

}  // namespace kvtrim
#endif  // HWY_ONCE
