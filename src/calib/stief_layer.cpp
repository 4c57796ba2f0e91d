// One decoder layer in f32, forward and backward with respect to the K/V projectors (see
// stief_layer.h). Products are row-major single-threaded sgemm calls (the trainer runs
// independent problems on the pool's threads); the attention of R query rows over the
// sequence's first n_keys keys is four sgemm calls per head forward and three backward.
#include "calib/stief_layer.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "model/arch/arch.h"
#include "ops/dequant.h"
#include "ops/matmul.h"
#include "ops/nn.h"

namespace kvtrim {

namespace {

// C[M, N] = alpha · op(A) · op(B) + beta · C, row-major.
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, A,
              static_cast<int>(lda), B, static_cast<int>(ldb), beta, C, static_cast<int>(ldc));
}

std::vector<float> dequant_matrix(const WeightView& w) {
  std::vector<float> out(static_cast<size_t>(w.n_rows * w.n_cols));
  for (int64_t r = 0; r < w.n_rows; ++r)
    dequantize_row(w.type, static_cast<const uint8_t*>(w.data) + r * w.row_bytes,
                   out.data() + r * w.n_cols, w.n_cols);
  return out;
}

std::vector<float> vec_f32(const WeightView& w) {
  if (!w.data) return {};
  const float* p = static_cast<const float*>(w.data);
  return std::vector<float>(p, p + w.n_cols * w.n_rows);
}

// y = rmsnorm(x)·w per row (w empty: no weight).
void rms_rows(const float* x, const std::vector<float>& w, float* y, int64_t rows, int64_t n,
              float eps) {
  for (int64_t i = 0; i < rows; ++i)
    rms_norm(x + i * n, w.empty() ? nullptr : w.data(), y + i * n, n, eps);
}

// dx = ∂/∂x of y = rmsnorm(x)·w given dy, per row; dx += (accumulate) when add.
void rms_rows_backward(const float* x, const std::vector<float>& w, const float* dy, float* dx,
                       int64_t rows, int64_t n, float eps, bool add) {
  for (int64_t i = 0; i < rows; ++i) {
    const float* xi = x + i * n;
    const float* dyi = dy + i * n;
    float* dxi = dx + i * n;
    double ss = 0, gx = 0;
    for (int64_t j = 0; j < n; ++j) ss += static_cast<double>(xi[j]) * xi[j];
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
    for (int64_t j = 0; j < n; ++j) gx += static_cast<double>(dyi[j]) * (w.empty() ? 1.f : w[j]) * xi[j];
    const double c = gx * r * r * r / static_cast<double>(n);
    for (int64_t j = 0; j < n; ++j) {
      const double g = static_cast<double>(dyi[j]) * (w.empty() ? 1.f : w[j]);
      const float d = static_cast<float>(r * g - xi[j] * c);
      dxi[j] = add ? dxi[j] + d : d;
    }
  }
}

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2/pi)

float act(float g, bool gelu) {
  if (gelu) return 0.5f * g * (1.f + std::tanh(kGeluC * (g + 0.044715f * g * g * g)));
  return g / (1.f + std::exp(-g));
}

float act_grad(float g, bool gelu) {
  if (gelu) {
    const float t = std::tanh(kGeluC * (g + 0.044715f * g * g * g));
    return 0.5f * (1.f + t) + 0.5f * g * (1.f - t * t) * kGeluC * (1.f + 3.f * 0.044715f * g * g);
  }
  const float s = 1.f / (1.f + std::exp(-g));
  return s * (1.f + g * (1.f - s));
}

// out[n, H*d] = in[n, H*d] with each head's d-slice times its projector (LayerProjectors:
// none, one shared, or one per head; nullptr: copied).
void project_heads(const float* in, int64_t n, int H, int d, const std::vector<const float*>& P,
                   float* out) {
  const int64_t ld = static_cast<int64_t>(H) * d;
  KVTRIM_CHECK(P.size() <= 1 || P.size() == static_cast<size_t>(H),
               "layer projectors: %zu for %d kv heads (need 0, 1 or %d)", P.size(), H, H);
  for (int h = 0; h < H; ++h) {
    const float* ph = P.empty() ? nullptr : P.size() == 1 ? P[0] : P[static_cast<size_t>(h)];
    if (!ph) {
      for (int64_t t = 0; t < n; ++t)
        std::copy_n(in + t * ld + h * d, d, out + t * ld + h * d);
    } else {
      gemm(false, false, n, d, d, 1.f, in + h * d, ld, ph, d, 0.f, out + h * d, ld);
    }
  }
}

}  // namespace

LayerWeightsF32 layer_weights_f32(const Model& model, int il) {
  const HParams& hp = model.hparams();
  KVTRIM_CHECK(il >= 0 && il < hp.n_layer, "layer %d out of range (the model has %d)", il,
               hp.n_layer);
  // The layer objective recomputes the decoder layer here; what it does not model is refused.
  KVTRIM_CHECK(hp.n_expert == 0, "StiefAttention's layer objective does not model a mixture-of-experts FFN (%s); "
               "calibrate the other low-rank presses instead", arch_name(hp.arch));
  KVTRIM_CHECK(hp.attn_softcap == 0, "StiefAttention's layer objective does not model attention soft-capping (%s)",
               arch_name(hp.arch));
  const LayerWeights& lw = model.layers()[static_cast<size_t>(il)];
  LayerWeightsF32 w;
  w.n_embd = hp.n_embd;
  w.n_ff = hp.n_ff;
  w.n_head = hp.n_head;
  w.n_head_kv = hp.n_head_kv;
  w.dk = hp.head_dim_k;
  w.dv = hp.head_dim_v;
  w.norm_eps = hp.norm_eps;
  w.attn_scale = hp.attn_scale;
  w.window = hp.sliding_window.empty() ? 0 : hp.sliding_window[static_cast<size_t>(il)];
  w.gelu = arch_info(hp.arch).ffn_act == FfnAct::kGeluTanh;
  w.wo = dequant_matrix(lw.wo);
  w.gate = dequant_matrix(lw.ffn_gate);
  w.up = dequant_matrix(lw.ffn_up);
  w.down = dequant_matrix(lw.ffn_down);
  w.ffn_norm = vec_f32(lw.ffn_norm);
  w.post_attn_norm = vec_f32(lw.post_attn_norm);
  w.post_ffn_norm = vec_f32(lw.post_ffn_norm);
  return w;
}

LayerSeq prepare_layer_seq(const Model& model, int il, const LayerWeightsF32& w,
                           std::vector<float> x, ThreadPool* pool) {
  const HParams& hp = model.hparams();
  const LayerWeights& lw = model.layers()[static_cast<size_t>(il)];
  const int64_t D = hp.n_embd;
  KVTRIM_CHECK(!x.empty() && x.size() % static_cast<size_t>(D) == 0,
               "layer input of %zu values is not a whole number of %lld-wide rows", x.size(),
               static_cast<long long>(D));
  LayerSeq s;
  s.n = static_cast<int64_t>(x.size()) / D;
  KVTRIM_CHECK(s.n <= hp.n_ctx_train, "a calibration sequence of %lld tokens exceeds the model's "
               "context limit of %d", static_cast<long long>(s.n), hp.n_ctx_train);
  s.x = std::move(x);
  const int64_t nq = static_cast<int64_t>(hp.n_head) * hp.head_dim_k;
  const int64_t nk = static_cast<int64_t>(hp.n_head_kv) * hp.head_dim_k;
  const int64_t nv = static_cast<int64_t>(hp.n_head_kv) * hp.head_dim_v;
  std::vector<float> h(s.x.size());
  for (int64_t t = 0; t < s.n; ++t)
    rms_norm(s.x.data() + t * D, static_cast<const float*>(lw.attn_norm.data),
             h.data() + t * D, D, hp.norm_eps);
  s.q.resize(static_cast<size_t>(s.n * nq));
  s.k.resize(static_cast<size_t>(s.n * nk));
  s.v.resize(static_cast<size_t>(s.n * nv));
  matmul(lw.wq, h.data(), s.n, s.q.data(), pool);
  matmul(lw.wk, h.data(), s.n, s.k.data(), pool);
  matmul(lw.wv, h.data(), s.n, s.v.data(), pool);
  auto add_bias = [&](const WeightView& b, std::vector<float>& y, int64_t width) {
    if (!b.data) return;
    const float* bp = static_cast<const float*>(b.data);
    for (int64_t t = 0; t < s.n; ++t)
      for (int64_t i = 0; i < width; ++i) y[static_cast<size_t>(t * width + i)] += bp[i];
  };
  add_bias(lw.bq, s.q, nq);
  add_bias(lw.bk, s.k, nk);
  add_bias(lw.bv, s.v, nv);
  const int dk = hp.head_dim_k;
  const RopeSpec rs = layer_rope(hp, il, s.n);
  for (int64_t t = 0; t < s.n; ++t) {
    for (int hh = 0; hh < hp.n_head; ++hh) {
      float* qh = s.q.data() + t * nq + hh * dk;
      if (lw.q_norm.data) rms_norm(qh, static_cast<const float*>(lw.q_norm.data), qh, dk, hp.norm_eps);
      rope(qh, rs, static_cast<int32_t>(t));
    }
    for (int hh = 0; hh < hp.n_head_kv; ++hh) {
      float* kh = s.k.data() + t * nk + hh * dk;
      if (lw.k_norm.data) rms_norm(kh, static_cast<const float*>(lw.k_norm.data), kh, dk, hp.norm_eps);
      rope(kh, rs, static_cast<int32_t>(t));
    }
  }
  // The uncompressed output, in row blocks (the attention tape grows with rows x keys); s.y stays
  // empty meanwhile, so layer_forward has no target to compare with.
  std::vector<float> y(s.x.size());
  constexpr int64_t kBlock = 128;
  LayerTape tape;
  for (int64_t r0 = 0; r0 < s.n; r0 += kBlock) {
    std::vector<int32_t> rows;
    for (int64_t t = r0; t < std::min(s.n, r0 + kBlock); ++t) rows.push_back(static_cast<int32_t>(t));
    double e2 = 0, y2 = 0;
    layer_forward(w, s, LayerProjectors{}, rows, &tape, &e2, &y2);
    std::copy(tape.out.begin(), tape.out.end(), y.begin() + r0 * D);
  }
  s.y = std::move(y);
  return s;
}

void layer_forward(const LayerWeightsF32& w, const LayerSeq& s, const LayerProjectors& p,
                   const std::vector<int32_t>& rows, LayerTape* tape, double* err2,
                   double* ref2) {
  KVTRIM_CHECK(!rows.empty(), "layer_forward: no rows");
  for (size_t i = 0; i < rows.size(); ++i)
    KVTRIM_CHECK(rows[i] >= 0 && rows[i] < s.n && (i == 0 || rows[i] > rows[i - 1]),
                 "layer_forward: rows must be increasing positions below %lld",
                 static_cast<long long>(s.n));
  const int64_t R = static_cast<int64_t>(rows.size()), D = w.n_embd, F = w.n_ff;
  const int H = w.n_head, Hk = w.n_head_kv, dk = w.dk, dv = w.dv, g = H / Hk;
  const int64_t nq = static_cast<int64_t>(H) * dk, nk = static_cast<int64_t>(Hk) * dk,
                nv = static_cast<int64_t>(Hk) * dv, no = static_cast<int64_t>(H) * dv;
  LayerTape& T = *tape;
  T.rows = rows;
  T.n_keys = rows.back() + 1;
  const int64_t L = T.n_keys;
  T.kh.resize(static_cast<size_t>(L * nk));
  T.vh.resize(static_cast<size_t>(L * nv));
  project_heads(s.k.data(), L, Hk, dk, p.pk, T.kh.data());
  project_heads(s.v.data(), L, Hk, dv, p.pv, T.vh.data());
  T.qr.resize(static_cast<size_t>(R * nq));
  for (int64_t i = 0; i < R; ++i)
    std::copy_n(s.q.data() + rows[static_cast<size_t>(i)] * nq, nq, T.qr.data() + i * nq);
  T.att.assign(static_cast<size_t>(H * R * L), 0.f);
  T.o.assign(static_cast<size_t>(R * no), 0.f);
  for (int hq = 0; hq < H; ++hq) {
    const int hk = hq / g;
    float* A = T.att.data() + static_cast<int64_t>(hq) * R * L;
    gemm(false, true, R, L, dk, w.attn_scale, T.qr.data() + hq * dk, nq, T.kh.data() + hk * dk,
         nk, 0.f, A, L);
    for (int64_t i = 0; i < R; ++i) {
      const int64_t t = rows[static_cast<size_t>(i)];
      const int64_t t0 = w.window > 0 ? std::max<int64_t>(0, t - w.window + 1) : 0;
      float* a = A + i * L;
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t j = t0; j <= t; ++j) mx = std::max(mx, a[j]);
      double sum = 0;
      for (int64_t j = t0; j <= t; ++j) sum += (a[j] = std::exp(a[j] - mx));
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t j = 0; j < L; ++j) a[j] = (j >= t0 && j <= t) ? a[j] * inv : 0.f;
    }
    gemm(false, false, R, dv, L, 1.f, A, L, T.vh.data() + hk * dv, nv, 0.f, T.o.data() + hq * dv,
         no);
  }
  T.a.resize(static_cast<size_t>(R * D));
  gemm(false, true, R, D, no, 1.f, T.o.data(), no, w.wo.data(), no, 0.f, T.a.data(), D);
  T.x1.resize(static_cast<size_t>(R * D));
  if (!w.post_attn_norm.empty()) {
    rms_rows(T.a.data(), w.post_attn_norm, T.x1.data(), R, D, w.norm_eps);
  } else {
    T.x1 = T.a;
  }
  for (int64_t i = 0; i < R; ++i) {
    const float* xr = s.x.data() + rows[static_cast<size_t>(i)] * D;
    for (int64_t j = 0; j < D; ++j) T.x1[static_cast<size_t>(i * D + j)] += xr[j];
  }
  T.h2.resize(static_cast<size_t>(R * D));
  rms_rows(T.x1.data(), w.ffn_norm, T.h2.data(), R, D, w.norm_eps);
  T.g.resize(static_cast<size_t>(R * F));
  T.u.resize(static_cast<size_t>(R * F));
  gemm(false, true, R, F, D, 1.f, T.h2.data(), D, w.gate.data(), D, 0.f, T.g.data(), F);
  gemm(false, true, R, F, D, 1.f, T.h2.data(), D, w.up.data(), D, 0.f, T.u.data(), F);
  T.m.resize(static_cast<size_t>(R * F));
  for (size_t i = 0; i < T.m.size(); ++i) T.m[i] = act(T.g[i], w.gelu) * T.u[i];
  T.dn.resize(static_cast<size_t>(R * D));
  gemm(false, true, R, D, F, 1.f, T.m.data(), F, w.down.data(), F, 0.f, T.dn.data(), D);
  T.out.resize(static_cast<size_t>(R * D));
  if (!w.post_ffn_norm.empty()) {
    rms_rows(T.dn.data(), w.post_ffn_norm, T.out.data(), R, D, w.norm_eps);
  } else {
    T.out = T.dn;
  }
  double e2 = 0, y2 = 0;
  for (int64_t i = 0; i < R; ++i) {
    const float* yr = s.y.empty() ? nullptr : s.y.data() + rows[static_cast<size_t>(i)] * D;
    for (int64_t j = 0; j < D; ++j) {
      float& o = T.out[static_cast<size_t>(i * D + j)];
      o += T.x1[static_cast<size_t>(i * D + j)];
      if (yr) {
        const double d = static_cast<double>(o) - yr[j];
        e2 += d * d;
        y2 += static_cast<double>(yr[j]) * yr[j];
      }
    }
  }
  *err2 = e2;
  *ref2 = y2;
}

void layer_backward(const LayerWeightsF32& w, const LayerSeq& s, const LayerProjectors& p,
                    const LayerTape& T, const std::vector<float>& dout,
                    std::vector<float>* gpk, std::vector<std::vector<float>>* gpv) {
  const int64_t R = static_cast<int64_t>(T.rows.size()), D = w.n_embd, F = w.n_ff,
                L = T.n_keys;
  const int H = w.n_head, Hk = w.n_head_kv, dk = w.dk, dv = w.dv, g = H / Hk;
  const int64_t nq = static_cast<int64_t>(H) * dk, nk = static_cast<int64_t>(Hk) * dk,
                nv = static_cast<int64_t>(Hk) * dv, no = static_cast<int64_t>(H) * dv;
  KVTRIM_CHECK(dout.size() == static_cast<size_t>(R * D), "layer_backward: dout is mis-sized");
  KVTRIM_CHECK(!gpk || p.pk.size() <= 1,
               "layer_backward: the key gradient is for a shared key projector (or none)");
  // MLP branch: out = x1 + post_ffn(dn), dn = W_down · (act(g)·u).
  std::vector<float> ddn(static_cast<size_t>(R * D));
  if (!w.post_ffn_norm.empty()) {
    rms_rows_backward(T.dn.data(), w.post_ffn_norm, dout.data(), ddn.data(), R, D, w.norm_eps, false);
  } else {
    ddn = dout;
  }
  std::vector<float> dm(static_cast<size_t>(R * F));
  gemm(false, false, R, F, D, 1.f, ddn.data(), D, w.down.data(), F, 0.f, dm.data(), F);
  std::vector<float> dg(static_cast<size_t>(R * F)), du(static_cast<size_t>(R * F));
  for (size_t i = 0; i < dm.size(); ++i) {
    dg[i] = dm[i] * T.u[i] * act_grad(T.g[i], w.gelu);
    du[i] = dm[i] * act(T.g[i], w.gelu);
  }
  std::vector<float> dh2(static_cast<size_t>(R * D));
  gemm(false, false, R, D, F, 1.f, dg.data(), F, w.gate.data(), D, 0.f, dh2.data(), D);
  gemm(false, false, R, D, F, 1.f, du.data(), F, w.up.data(), D, 1.f, dh2.data(), D);
  std::vector<float> dx1 = dout;
  rms_rows_backward(T.x1.data(), w.ffn_norm, dh2.data(), dx1.data(), R, D, w.norm_eps, true);
  // Attention branch: x1 = x + post_attn(a), a = W_O · o.
  std::vector<float> da(static_cast<size_t>(R * D));
  if (!w.post_attn_norm.empty()) {
    rms_rows_backward(T.a.data(), w.post_attn_norm, dx1.data(), da.data(), R, D, w.norm_eps, false);
  } else {
    da = dx1;
  }
  std::vector<float> dO(static_cast<size_t>(R * no));
  gemm(false, false, R, no, D, 1.f, da.data(), D, w.wo.data(), no, 0.f, dO.data(), no);
  std::vector<float> dkh, dvh;
  if (gpk) dkh.assign(static_cast<size_t>(L * nk), 0.f);
  if (gpv) dvh.assign(static_cast<size_t>(L * nv), 0.f);
  std::vector<float> dA(static_cast<size_t>(R * L));
  for (int hq = 0; hq < H; ++hq) {
    const int hk = hq / g;
    const float* A = T.att.data() + static_cast<int64_t>(hq) * R * L;
    if (gpv)  // dV̂ += Aᵀ · dO_h
      gemm(true, false, L, dv, R, 1.f, A, L, dO.data() + hq * dv, no, 1.f, dvh.data() + hk * dv, nv);
    if (gpk) {
      // dA = dO_h · V̂ᵀ; dS = A ⊙ (dA − rowsum(A ⊙ dA)); dK̂ += scale · dSᵀ · Q_h
      gemm(false, true, R, L, dv, 1.f, dO.data() + hq * dv, no, T.vh.data() + hk * dv, nv, 0.f,
           dA.data(), L);
      for (int64_t i = 0; i < R; ++i) {
        const float* a = A + i * L;
        float* d = dA.data() + i * L;
        double dot = 0;
        for (int64_t j = 0; j < L; ++j) dot += static_cast<double>(a[j]) * d[j];
        const float fd = static_cast<float>(dot);
        for (int64_t j = 0; j < L; ++j) d[j] = a[j] * (d[j] - fd);
      }
      gemm(true, false, L, dk, R, w.attn_scale, dA.data(), L, T.qr.data() + hq * dk, nq, 1.f,
           dkh.data() + hk * dk, nk);
    }
  }
  // K̂_h = K_h · P  ⇒  ∂/∂P += K_hᵀ · dK̂_h (shared P: summed over kv heads).
  if (gpk) {
    gpk->resize(static_cast<size_t>(dk) * dk, 0.f);
    for (int hk = 0; hk < Hk; ++hk)
      gemm(true, false, dk, dk, L, 1.f, s.k.data() + hk * dk, nk, dkh.data() + hk * dk, nk, 1.f,
           gpk->data(), dk);
  }
  if (gpv) {
    gpv->resize(static_cast<size_t>(Hk));
    for (int hk = 0; hk < Hk; ++hk) {
      auto& G = (*gpv)[static_cast<size_t>(hk)];
      G.resize(static_cast<size_t>(dv) * dv, 0.f);
      gemm(true, false, dv, dv, L, 1.f, s.v.data() + hk * dv, nv, dvh.data() + hk * dv, nv, 1.f,
           G.data(), dv);
    }
  }
}

std::vector<float> projector(const float* U, int d, int r) {
  std::vector<float> P(static_cast<size_t>(d) * d);
  gemm(false, true, d, d, r, 1.f, U, r, U, r, 0.f, P.data(), d);
  return P;
}

std::vector<float> projector_grad_to_basis(const std::vector<float>& gP, const float* U, int d,
                                           int r) {
  std::vector<float> S(static_cast<size_t>(d) * d);
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < d; ++j)
      S[static_cast<size_t>(i) * d + j] =
          gP[static_cast<size_t>(i) * d + j] + gP[static_cast<size_t>(j) * d + i];
  std::vector<float> gU(static_cast<size_t>(d) * r);
  gemm(false, false, d, r, d, 1.f, S.data(), d, U, r, 0.f, gU.data(), r);
  return gU;
}

}  // namespace kvtrim
