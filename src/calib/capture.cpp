// Streamed calibration statistics (see capture.h). Per forward chunk of n tokens, each Gram
// is one f32 BLAS syrk over the chunk's rows (an [n, d] strided view of the layer's q/k/v),
// then added into the f64 total: the f32 error is that of one chunk, not of the whole run.
#include "calib/capture.h"

#include <cblas.h>

#include <algorithm>

#include "core/error.h"
#include "kv/kv_cache.h"
#include "ops/dequant.h"

namespace kvtrim {

namespace {

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// tmp[d, d] = Aᵀ A + beta·tmp for A [n, d] with row stride lda (upper triangle only).
void syrk_f32(const float* a, int64_t n, int d, int64_t lda, float beta, float* tmp) {
  cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, d, static_cast<int>(n), 1.f, a,
              static_cast<int>(lda), beta, tmp, d);
}

// g[d, d] += symmetric f32 tmp (upper triangle valid).
void add_sym(const float* tmp, int d, std::vector<double>& g) {
  for (int i = 0; i < d; ++i) {
    for (int j = i; j < d; ++j) {
      const double x = tmp[i * d + j];
      g[static_cast<size_t>(i) * d + j] += x;
      if (j != i) g[static_cast<size_t>(j) * d + i] += x;
    }
  }
}

void add_sum(const float* a, int64_t n, int d, int64_t lda, std::vector<double>& s) {
  for (int64_t t = 0; t < n; ++t)
    for (int j = 0; j < d; ++j) s[j] += a[t * lda + j];
}

}  // namespace

CalibCapture::CalibCapture(const Model& model, int layer_io_rows, uint64_t seed, int kv_rows)
    : model_(model), layer_io_rows_(layer_io_rows), seed_(seed), kv_rows_(kv_rows) {
  KVTRIM_CHECK(kv_rows >= 0, "key/value sample rows must be >= 0 (got %d)", kv_rows);
  const HParams& hp = model.hparams();
  KVTRIM_CHECK(layer_io_rows >= 0, "layer io rows must be >= 0 (got %d)", layer_io_rows);
  n_layer_ = hp.n_layer;
  n_head_ = hp.n_head;
  n_head_kv_ = hp.n_head_kv;
  dk_ = hp.head_dim_k;
  dv_ = hp.head_dim_v;
  n_embd_ = hp.n_embd;
  const size_t kk = static_cast<size_t>(dk_) * dk_, vv = static_cast<size_t>(dv_) * dv_;
  stats_.resize(static_cast<size_t>(n_layer_) * n_head_kv_);
  for (HeadStats& s : stats_) {
    s.n_group = n_head_ / n_head_kv_;
    s.gram_k.assign(kk, 0);
    s.gram_q.assign(kk, 0);
    s.gram_k_pre.assign(kk, 0);
    s.gram_q_pre.assign(kk, 0);
    s.gram_v.assign(vv, 0);
    s.sum_k.assign(dk_, 0);
    s.sum_k_pre.assign(dk_, 0);
    s.sum_v.assign(dv_, 0);
  }
  if (layer_io_rows_ > 0) {
    io_.resize(n_layer_);
    io_seen_.assign(n_layer_, 0);
    io_rng_.resize(n_layer_);
    for (int il = 0; il < n_layer_; ++il) {
      io_[il].n_embd = n_embd_;
      uint64_t st = seed_ ^ (0x1000193ULL * static_cast<uint64_t>(il + 1));
      io_rng_[il] = splitmix64(st);
    }
  }
  tmp_.resize(std::max(kk, vv));
  if (kv_rows_ > 0) {
    kr_.resize(n_layer_);
    vr_.resize(n_layer_);
    kv_seen_.assign(n_layer_, 0);
    kv_rng_.resize(n_layer_);
    for (int il = 0; il < n_layer_; ++il) {
      uint64_t st = seed_ ^ (0x2545f4914f6cdd1dULL * static_cast<uint64_t>(il + 1));
      kv_rng_[il] = splitmix64(st);
    }
  }
}

void CalibCapture::on_qk_pre_rope(int il, int64_t n, const float* q, const float* k) {
  const int g = n_head_ / n_head_kv_;
  const int64_t ldq = static_cast<int64_t>(n_head_) * dk_,
                ldk = static_cast<int64_t>(n_head_kv_) * dk_;
  for (int ih = 0; ih < n_head_kv_; ++ih) {
    HeadStats& s = stats_[static_cast<size_t>(il) * n_head_kv_ + ih];
    syrk_f32(k + ih * dk_, n, dk_, ldk, 0.f, tmp_.data());
    add_sym(tmp_.data(), dk_, s.gram_k_pre);
    add_sum(k + ih * dk_, n, dk_, ldk, s.sum_k_pre);
    for (int h = 0; h < g; ++h)
      syrk_f32(q + (ih * g + h) * dk_, n, dk_, ldq, h == 0 ? 0.f : 1.f, tmp_.data());
    add_sym(tmp_.data(), dk_, s.gram_q_pre);
  }
}

void CalibCapture::on_qkv(int il, int64_t n, const float* q, const float* k, const float* v,
                          const int32_t*) {
  const int g = n_head_ / n_head_kv_;
  const int64_t ldq = static_cast<int64_t>(n_head_) * dk_,
                ldk = static_cast<int64_t>(n_head_kv_) * dk_,
                ldv = static_cast<int64_t>(n_head_kv_) * dv_;
  for (int ih = 0; ih < n_head_kv_; ++ih) {
    HeadStats& s = stats_[static_cast<size_t>(il) * n_head_kv_ + ih];
    syrk_f32(k + ih * dk_, n, dk_, ldk, 0.f, tmp_.data());
    add_sym(tmp_.data(), dk_, s.gram_k);
    add_sum(k + ih * dk_, n, dk_, ldk, s.sum_k);
    for (int h = 0; h < g; ++h)
      syrk_f32(q + (ih * g + h) * dk_, n, dk_, ldq, h == 0 ? 0.f : 1.f, tmp_.data());
    add_sym(tmp_.data(), dk_, s.gram_q);
    syrk_f32(v + ih * dv_, n, dv_, ldv, 0.f, tmp_.data());
    add_sym(tmp_.data(), dv_, s.gram_v);
    add_sum(v + ih * dv_, n, dv_, ldv, s.sum_v);
    s.n_tokens += n;
  }
  if (kv_rows_ <= 0) return;
  // Reservoir sampling (Algorithm R) over the layer's (token, kv head) rows, keys and values paired.
  std::vector<float>& K = kr_[il];
  std::vector<float>& V = vr_[il];
  for (int64_t t = 0; t < n; ++t)
    for (int ih = 0; ih < n_head_kv_; ++ih) {
      const int64_t seen = kv_seen_[il]++;
      int64_t slot = -1;
      if (seen < kv_rows_) {
        slot = seen;
        K.resize(static_cast<size_t>(seen + 1) * dk_);
        V.resize(static_cast<size_t>(seen + 1) * dv_);
      } else {
        const uint64_t j = splitmix64(kv_rng_[il]) % static_cast<uint64_t>(seen + 1);
        if (j < static_cast<uint64_t>(kv_rows_)) slot = static_cast<int64_t>(j);
      }
      if (slot < 0) continue;
      const float* kr = k + t * ldk + ih * dk_;
      const float* vr = v + t * ldv + ih * dv_;
      std::copy(kr, kr + dk_, K.begin() + slot * dk_);
      std::copy(vr, vr + dv_, V.begin() + slot * dv_);
    }
}

void CalibCapture::on_layer_io(int il, int64_t n, const float* x_in, const float* x_out) {
  if (layer_io_rows_ <= 0) return;
  // Reservoir sampling (Algorithm R): after t rows, each has probability R/t of being held.
  LayerIoSample& s = io_[il];
  const size_t e = static_cast<size_t>(n_embd_);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t seen = io_seen_[il]++;
    int64_t slot = -1;
    if (seen < layer_io_rows_) {
      slot = seen;
      s.x_in.resize((seen + 1) * e);
      s.x_out.resize((seen + 1) * e);
      s.n_rows = static_cast<int>(seen + 1);
    } else {
      const uint64_t j = splitmix64(io_rng_[il]) % static_cast<uint64_t>(seen + 1);
      if (j < static_cast<uint64_t>(layer_io_rows_)) slot = static_cast<int64_t>(j);
    }
    if (slot < 0) continue;
    std::copy(x_in + t * e, x_in + (t + 1) * e, s.x_in.begin() + slot * e);
    std::copy(x_out + t * e, x_out + (t + 1) * e, s.x_out.begin() + slot * e);
  }
}

std::vector<HeadStats> CalibCapture::stats() const {
  std::vector<HeadStats> out = stats_;
  for (int il = 0; il < n_layer_; ++il) {
    auto vo = gram_vo_layer(model_, il);
    for (int ih = 0; ih < n_head_kv_; ++ih)
      out[static_cast<size_t>(il) * n_head_kv_ + ih].gram_vo = std::move(vo[ih]);
  }
  return out;
}

std::vector<LayerIoSample> CalibCapture::layer_io() const {
  return io_;
}

int64_t CalibCapture::n_tokens() const {
  return stats_.empty() ? 0 : stats_[0].n_tokens;
}

std::vector<std::vector<double>> gram_vo_layer(const Model& model, int il) {
  const HParams& hp = model.hparams();
  const WeightView& wo = model.layers().at(il).wo;
  const int dv = hp.head_dim_v, g = hp.n_head / hp.n_head_kv;
  const int64_t cols = static_cast<int64_t>(hp.n_head) * dv;
  KVTRIM_CHECK(wo.n_cols == cols,
               "layer %d: attn_output has %lld columns, expected n_head*head_dim_v = %lld", il,
               static_cast<long long>(wo.n_cols), static_cast<long long>(cols));
  std::vector<float> w(static_cast<size_t>(wo.n_rows * cols));
  for (int64_t r = 0; r < wo.n_rows; ++r)
    dequantize_row(wo.type, static_cast<const uint8_t*>(wo.data) + r * wo.row_bytes,
                   w.data() + r * cols, cols);
  std::vector<std::vector<double>> out(hp.n_head_kv,
                                       std::vector<double>(static_cast<size_t>(dv) * dv, 0.0));
  std::vector<float> tmp(static_cast<size_t>(dv) * dv);
  for (int ih = 0; ih < hp.n_head_kv; ++ih) {
    // W_O^h W_O^hᵀ = Σ_rows w[row, h·dv + i] w[row, h·dv + j]: a syrk over the rows of W_O.
    for (int h = 0; h < g; ++h)
      syrk_f32(w.data() + (ih * g + h) * dv, wo.n_rows, dv, cols, h == 0 ? 0.f : 1.f, tmp.data());
    add_sym(tmp.data(), dv, out[ih]);
  }
  return out;
}

void run_capture(const Model& model, const std::vector<std::vector<int32_t>>& seqs,
                 CalibCapture& cap, ThreadPool* pool,
                 const std::function<void(int64_t, int64_t)>& progress) {
  int64_t max_len = 1;
  for (const auto& s : seqs) max_len = std::max<int64_t>(max_len, static_cast<int64_t>(s.size()));
  KVTRIM_CHECK(max_len <= model.hparams().n_ctx_train,
               "calibration sequences of %lld tokens exceed the model's context limit of %d tokens",
               static_cast<long long>(max_len), model.hparams().n_ctx_train);
  KvCacheConfig cfg = model.cache_config(max_len);
  cfg.dtype = KvDtype::kF32;
  auto cache = make_kv_cache(cfg);
  std::vector<float> logits(static_cast<size_t>(model.hparams().n_vocab));
  const int64_t total = static_cast<int64_t>(seqs.size());
  for (int64_t i = 0; i < total; ++i) {
    const auto& s = seqs[i];
    if (s.empty()) continue;
    cache->clear();
    model.forward(s.data(), static_cast<int64_t>(s.size()), 0, *cache, logits.data(), false, pool,
                  &cap);
    if (progress) progress(i + 1, total);
  }
}

std::vector<std::vector<int32_t>> cut_sequences(const std::vector<int32_t>& tokens, int64_t n_seqs,
                                                int64_t seq_len, int32_t bos) {
  KVTRIM_CHECK(n_seqs > 0 && seq_len > 1,
               "need at least one sequence of at least 2 tokens (got %lld x %lld)",
               static_cast<long long>(n_seqs), static_cast<long long>(seq_len));
  std::vector<std::vector<int32_t>> out;
  for (int64_t i = 0; i < n_seqs && (i + 1) * seq_len <= static_cast<int64_t>(tokens.size()); ++i) {
    std::vector<int32_t> s(tokens.begin() + i * seq_len, tokens.begin() + (i + 1) * seq_len);
    if (bos >= 0) s[0] = bos;
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace kvtrim
