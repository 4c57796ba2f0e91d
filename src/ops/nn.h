// Elementwise / row kernels of the transformer forward pass. Each has a scalar reference in
// namespace ref that the optimized version is tested against.
#pragma once
#include <cstdint>

#include "ops/rope.h"  // (rope moved there; kept visible to nn.h users)

namespace kvtrim {

// y = x / sqrt(mean(x²) + eps) * w   (w may be nullptr: no weight). x, y, w: [n]. y may alias x.
void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps);
// y = (x - mean) / sqrt(var + eps) * w + b (w, b may be nullptr).
void layer_norm(const float* x, const float* w, const float* b, float* y, int64_t n, float eps);
// x[i] = exp(x[i] - m) in place; returns the sum (the inner step of an online softmax).
float exp_sub_sum(float* x, int64_t n, float m);
// max of x[0..n) (-inf for n = 0).
float max_of(const float* x, int64_t n);
// In-place numerically stable softmax over x[n]; returns nothing.
void softmax(float* x, int64_t n);
// y[i] = silu(g[i]) * u[i]  (SwiGLU), y may alias g or u.
void swiglu(const float* g, const float* u, float* y, int64_t n);
// y[i] = gelu_tanh(g[i]) * u[i]  (GeGLU with the tanh approximation).
void geglu_tanh(const float* g, const float* u, float* y, int64_t n);
// y += x
void add(float* y, const float* x, int64_t n);
// y *= s
void scale(float* y, float s, int64_t n);
// dot product
float dot(const float* a, const float* b, int64_t n);
// y += a * x
void axpy(float* y, float a, const float* x, int64_t n);

namespace ref {
void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps);
void softmax(float* x, int64_t n);
void swiglu(const float* g, const float* u, float* y, int64_t n);
void geglu_tanh(const float* g, const float* u, float* y, int64_t n);
float dot(const float* a, const float* b, int64_t n);
}  // namespace ref

}  // namespace kvtrim
