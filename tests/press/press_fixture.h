// Shared fixture for the press tests: a tiny llama model with f32 weights and an f32 cache
// (exact storage), a capture-everything observer, and brute-force helpers written
// independently of src/press (naive softmax attention from the captured q/k).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/press_runner.h"
#include "engine/session.h"
#include "test_util.h"
#include "tiny_model.h"

namespace kvtrim::test {

// Records every layer's q [n, n_head, d] and k [n, n_head_kv, d], v, pos.
struct CaptureAll : ForwardObserver {
  std::vector<std::vector<float>> q, k, v;
  std::vector<int32_t> pos;
  void on_qkv(int il, int64_t n, const float* qq, const float* kk, const float* vv, const int32_t* p) override {
    if (q.size() <= static_cast<size_t>(il)) q.resize(il + 1), k.resize(il + 1), v.resize(il + 1);
    q[il].insert(q[il].end(), qq, qq + n * n_head * d);
    k[il].insert(k[il].end(), kk, kk + n * n_head_kv * d);
    v[il].insert(v[il].end(), vv, vv + n * n_head_kv * d);
    if (il == 0) pos.insert(pos.end(), p, p + n);
  }
  const float* qrow(int il, int64_t i, int h) const { return q[il].data() + (i * n_head + h) * d; }
  const float* krow(int il, int64_t t, int ih) const { return k[il].data() + (t * n_head_kv + ih) * d; }
  const float* vrow(int il, int64_t t, int ih) const { return v[il].data() + (t * n_head_kv + ih) * d; }
  int n_head = 0, n_head_kv = 0, d = 0;
};

class PressFixture : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (model_) return;
    dir_ = new std::string(temp_dir("press"));
    TinyModelSpec spec = tiny_spec(Arch::kLlama, 7);
    spec.n_layer = 3;
    spec.t_embd = spec.t_attn = spec.t_v = spec.t_ffn = spec.t_down = spec.t_output = GgmlType::F32;
    model_ = Model::load(write_tiny_model(spec, *dir_)).release();
  }
  static void TearDownTestSuite() {}
  static std::vector<int32_t> tokens(int n, int salt = 0) { return tiny_tokens(n, salt); }
  static SessionParams params(int n_batch = 16) {
    SessionParams p;
    p.n_ctx = 256;
    p.n_threads = 1;
    p.n_batch = n_batch;
    p.kv_dtype = KvDtype::kF32;
    return p;
  }
  // Runs the prompt through a fresh cache capturing all q/k/v.
  static CaptureAll capture(const std::vector<int32_t>& prompt) {
    const HParams& hp = model_->hparams();
    CaptureAll c;
    c.n_head = hp.n_head;
    c.n_head_kv = hp.n_head_kv;
    c.d = hp.head_dim_k;
    auto cache = make_kv_cache([&] {
      auto cfg = model_->cache_config(256);
      cfg.dtype = KvDtype::kF32;
      return cfg;
    }());
    std::vector<float> logits(static_cast<size_t>(hp.n_vocab));
    model_->forward(prompt.data(), static_cast<int64_t>(prompt.size()), 0, *cache, logits.data(), false, nullptr, &c);
    return c;
  }
  // A session with `spec` installed and the prompt prefilled (not compressed).
  static std::unique_ptr<Session> prefilled(const std::string& spec, const std::vector<int32_t>& prompt,
                                            int n_batch = 16) {
    auto s = std::make_unique<Session>(*model_, params(n_batch));
    s->set_press(make_press(spec));
    s->prefill(prompt);
    return s;
  }
  // The plan of the session's press over its cache (nothing applied).
  static CompressionPlan plan_of(const Session& s) {
    PressContext ctx(s.cache(), model_->hparams(), s.observations(), nullptr);
    return s.press()->plan(ctx);
  }
  // The same with the model set on the context (presses that read weights or a calibration).
  static CompressionPlan plan_with_model(const Session& s) {
    PressContext ctx(s.cache(), model_->hparams(), s.observations(), nullptr);
    ctx.set_model(model_);
    return s.press()->plan(ctx);
  }
  static inline Model* model_ = nullptr;
  static inline std::string* dir_ = nullptr;
};

// Softmax attention of query row i, query head h, over keys 0..n_keys-1 with causal mask by
// position (pos), from captured tensors of layer il: probs [n_keys].
inline std::vector<double> bf_attention(const CaptureAll& c, const HParams& hp, int il, int64_t i, int h,
                                        int64_t n_keys) {
  const int g = hp.n_head / hp.n_head_kv;
  std::vector<double> s(static_cast<size_t>(n_keys), 0.0);
  double mx = -1e300;
  for (int64_t t = 0; t < n_keys; ++t) {
    if (c.pos[t] > c.pos[i]) continue;
    double dot = 0;
    for (int j = 0; j < c.d; ++j) dot += double(c.qrow(il, i, h)[j]) * c.krow(il, t, h / g)[j];
    s[t] = dot * hp.attn_scale;
    mx = std::max(mx, s[t]);
  }
  double z = 0;
  for (int64_t t = 0; t < n_keys; ++t) {
    s[t] = c.pos[t] > c.pos[i] ? 0.0 : std::exp(s[t] - mx);
    z += s[t];
  }
  for (auto& x : s) x /= z;
  return s;
}
// Indices of the k largest (ties: lower index), sorted increasing.
inline std::vector<int32_t> bf_topk(const std::vector<double>& s, int64_t k) {
  std::vector<int32_t> idx(s.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return s[a] > s[b]; });
  idx.resize(static_cast<size_t>(std::min<int64_t>(k, static_cast<int64_t>(s.size()))));
  std::sort(idx.begin(), idx.end());
  return idx;
}
// The indices a plan keeps for a head of n tokens.
inline std::vector<int32_t> kept(const HeadPlan& h, int64_t n) {
  if (!h.keep_all) return h.keep;
  std::vector<int32_t> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  return all;
}

}  // namespace kvtrim::test

namespace kvtrim::test {
// f() must throw an Error whose message contains `needle`.
template <class F>
void expect_error(F f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing: " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}
// The plan's kept set for a head is a valid top-k of the brute-force scores: k tokens, and no
// dropped token scores more than a kept one (beyond a float tolerance: ties may go either way).
inline void expect_topk(const std::vector<double>& bf, const std::vector<int32_t>& keep, int64_t k,
                        const std::string& what) {
  ASSERT_EQ(static_cast<int64_t>(keep.size()), k) << what;
  std::vector<char> in(bf.size(), 0);
  for (int32_t t : keep) in[t] = 1;
  double min_kept = 1e300, max_dropped = -1e300;
  for (size_t t = 0; t < bf.size(); ++t) (in[t] ? min_kept : max_dropped) = in[t] ? std::min(min_kept, bf[t]) : std::max(max_dropped, bf[t]);
  EXPECT_GE(min_kept, max_dropped - 1e-5 * std::max(1.0, std::abs(max_dropped))) << what;
  // And in the common case of no near-ties, exactly the brute-force set.
  if (min_kept > max_dropped + 1e-4) {
    EXPECT_EQ(keep, bf_topk(bf, k)) << what;
  }
}
}  // namespace kvtrim::test
