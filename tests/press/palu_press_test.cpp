// Palu (press/basis/palu.cpp) on tiny models: whiten=none bases against a brute-force
// eigen-decomposition (Jacobi, written here) of each kv head's W_h W_hᵀ (+ the bias column on
// qwen2, the key-norm weight on gemma3); whiten=calib bases = the PCA of the capture's pre-RoPE
// keys (RoPE undone with the reference rope, basis_test_util.h tiny_stats) and values; keys carry the layer's RoPE spec
// (rope=post: none); full rank is lossless; composition with snapkv; every mistake an Error.
#include <gtest/gtest.h>

#include <cmath>

#include "basis_test_util.h"
#include "model/model.h"
#include "ops/nn.h"

namespace kvtrim {
namespace {

constexpr int kPaluTokens = 40;

class PaluPress : public test::PressFixture {};

// Eigenvalues (decreasing) and unit eigenvectors (columns of V [d, d]) of a symmetric A [d, d]
// by cyclic Jacobi rotations.
void jacobi(std::vector<double> A, int d, std::vector<double>* eig, std::vector<double>* V) {
  V->assign(static_cast<size_t>(d * d), 0.0);
  for (int i = 0; i < d; ++i) (*V)[i * d + i] = 1;
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0;
    for (int p = 0; p < d; ++p)
      for (int q = p + 1; q < d; ++q) off += A[p * d + q] * A[p * d + q];
    if (off < 1e-22) break;
    for (int p = 0; p < d; ++p)
      for (int q = p + 1; q < d; ++q) {
        if (std::fabs(A[p * d + q]) < 1e-300) continue;
        const double th = 0.5 * std::atan2(2 * A[p * d + q], A[q * d + q] - A[p * d + p]);
        const double c = std::cos(th), s = std::sin(th);
        for (int k = 0; k < d; ++k) {  // A ← Jᵀ A J
          const double akp = A[k * d + p], akq = A[k * d + q];
          A[k * d + p] = c * akp - s * akq;
          A[k * d + q] = s * akp + c * akq;
        }
        for (int k = 0; k < d; ++k) {
          const double apk = A[p * d + k], aqk = A[q * d + k];
          A[p * d + k] = c * apk - s * aqk;
          A[q * d + k] = s * apk + c * aqk;
        }
        for (int k = 0; k < d; ++k) {
          const double vkp = (*V)[k * d + p], vkq = (*V)[k * d + q];
          (*V)[k * d + p] = c * vkp - s * vkq;
          (*V)[k * d + q] = s * vkp + c * vkq;
        }
      }
  }
  std::vector<int> order(static_cast<size_t>(d));
  for (int i = 0; i < d; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int a, int b) { return A[a * d + a] > A[b * d + b]; });
  std::vector<double> W(static_cast<size_t>(d * d));
  eig->resize(static_cast<size_t>(d));
  for (int j = 0; j < d; ++j) {
    (*eig)[j] = A[order[j] * d + order[j]];
    for (int i = 0; i < d; ++i) W[i * d + j] = (*V)[i * d + order[j]];
  }
  *V = W;
}

// Expects U [d, r] to span the top r eigenvectors of G: each column ±(the brute-force
// eigenvector), which is unique here (the tiny models' spectra have no repeated eigenvalues).
void expect_top_eigvecs(const std::vector<double>& G, int d, const std::vector<float>& U, int r, const std::string& what) {
  std::vector<double> eig, V;
  jacobi(G, d, &eig, &V);
  ASSERT_EQ(U.size(), static_cast<size_t>(d * r)) << what;
  for (int j = 0; j < r; ++j) {
    ASSERT_GT(eig[j] - eig[j + 1 < d ? j + 1 : j], j + 1 < d ? 1e-9 * eig[0] : -1.0) << what << ": repeated eigenvalue";
    double dot = 0;
    for (int i = 0; i < d; ++i) dot += U[i * r + j] * V[i * d + j];
    EXPECT_NEAR(std::fabs(dot), 1.0, 1e-4) << what << " column " << j;
  }
}

std::vector<float> dequant_rows(const WeightView& w, int64_t r0, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n * w.n_cols));
  for (int64_t r = 0; r < n; ++r)
    dequantize_row(w.type, static_cast<const uint8_t*>(w.data) + (r0 + r) * w.row_bytes, out.data() + r * w.n_cols,
                   w.n_cols);
  return out;
}

// Brute force of whiten=none: G = diag(w) (W_h W_hᵀ + b bᵀ) diag(w) of kv head ih's rows.
std::vector<double> weight_gram(const WeightView& W, const WeightView& b, const WeightView& norm, int ih, int d) {
  const std::vector<float> rows = dequant_rows(W, static_cast<int64_t>(ih) * d, d);
  const int64_t n = W.n_cols;
  std::vector<double> G(static_cast<size_t>(d * d));
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < d; ++j) {
      double g = 0;
      for (int64_t c = 0; c < n; ++c) g += double(rows[i * n + c]) * rows[j * n + c];
      if (b.data) g += double(static_cast<const float*>(b.data)[ih * d + i]) * static_cast<const float*>(b.data)[ih * d + j];
      if (norm.data) g *= double(static_cast<const float*>(norm.data)[i]) * static_cast<const float*>(norm.data)[j];
      G[i * d + j] = g;
    }
  return G;
}

TEST_F(PaluPress, WeightBasesAreTheTopSingularVectorsOfEachHeadsProjection) {
  for (Arch arch : {Arch::kLlama, Arch::kQwen2, Arch::kGemma3}) {
    SCOPED_TRACE(arch_name(arch));
    const std::string dir = test::temp_dir("palu");
    test::TinyModelSpec spec = test::tiny_spec(arch, 11);
    spec.n_layer = 2;
    auto model = Model::load(test::write_tiny_model(spec, dir));
    const HParams& hp = model->hparams();
    for (const char* opts : {"ratio=0.25", "energy=0.8", "ratio=0.5,rope=post"}) {
      SCOPED_TRACE(opts);
      SessionParams sp = params();
      Session s(*model, sp);
      s.set_press(make_press(std::string("palu:whiten=none,prefill=full,") + opts));
      s.prefill(tokens(kPaluTokens));
      PressContext ctx(s.cache(), hp, s.observations(), nullptr);
      ctx.set_model(model.get());
      const CompressionPlan p = s.press()->plan(ctx);
      for (int il = 0; il < hp.n_layer; ++il)
        for (int ih = 0; ih < hp.n_head_kv; ++ih) {
          const LayerWeights& lw = model->layers()[static_cast<size_t>(il)];
          const HeadPlan& h = p.at(il, ih);
          const int dk = hp.head_dim_k, dv = hp.head_dim_v;
          const std::vector<double> gk = weight_gram(lw.wk, lw.bk, lw.k_norm, ih, dk);
          const std::vector<double> gv = weight_gram(lw.wv, lw.bv, WeightView{}, ih, dv);
          int rk = LowRankPress::rank_for_removed_ratio(std::string(opts) == "ratio=0.25" ? 0.25 : 0.5, dk);
          int rv = LowRankPress::rank_for_removed_ratio(std::string(opts) == "ratio=0.25" ? 0.25 : 0.5, dv);
          if (std::string(opts) == "energy=0.8") {  // smallest rank holding 80 % of the eigenvalues
            auto energy_rank = [](const std::vector<double>& G, int d) {
              std::vector<double> e, V;
              jacobi(G, d, &e, &V);
              double tot = 0, acc = 0;
              for (double x : e) tot += x;
              for (int r = 1; r <= d; ++r)
                if ((acc += e[r - 1]) >= 0.8 * tot) return r;
              return d;
            };
            rk = energy_rank(gk, dk);
            rv = energy_rank(gv, dv);
          }
          ASSERT_EQ(h.key.rank, rk);
          ASSERT_EQ(h.value.rank, rv);
          expect_top_eigvecs(gk, dk, h.key.basis, rk, "keys");
          expect_top_eigvecs(gv, dv, h.value.basis, rv, "values");
          if (std::string(opts).find("rope=post") != std::string::npos) {
            EXPECT_FALSE(h.key.rope.has_value());
          } else {
            ASSERT_TRUE(h.key.rope.has_value());
            EXPECT_TRUE(*h.key.rope == layer_rope(hp, il, hp.n_ctx_train));
          }
          EXPECT_FALSE(h.value.rope.has_value());
        }
      s.compress();  // the cache takes the plan
      EXPECT_GE(s.cache().head_layout(0, 0).current_epoch, 0);
    }
  }
}

TEST_F(PaluPress, WhitenedBasesAreThePcaOfThePreRopeKeysAndTheValues) {
  auto cal = test::tiny_calibration(*model_, capture(test::calib_tokens()));
  test::CalibrationScope scope(cal);
  auto s = prefilled("palu:ratio=0.3,prefill=full", tokens(kPaluTokens));
  const CompressionPlan p = plan_with_model(*s);
  const int d = model_->hparams().head_dim_k;
  for (int il = 0; il < p.n_layer; ++il)
    for (int ih = 0; ih < p.n_head_kv; ++ih) {
      const HeadPlan& h = p.at(il, ih);
      const int r = LowRankPress::rank_for_removed_ratio(0.3, d);
      ASSERT_EQ(h.key.rank, r);
      expect_top_eigvecs(cal->stats(il, ih).gram_k_pre, d, h.key.basis, r, "pre-RoPE keys");
      expect_top_eigvecs(cal->stats(il, ih).gram_v, d, h.value.basis, r, "values");
      ASSERT_TRUE(h.key.rope.has_value());
    }
}

TEST_F(PaluPress, FullRankIsLosslessAndTheLowRankCacheIsSmaller) {
  test::CalibrationScope scope(test::tiny_calibration(*model_, capture(test::calib_tokens())));
  const auto prompt = tokens(kPaluTokens);
  Session ref(*model_, params());
  const std::vector<float> l0 = ref.prefill(prompt);
  const std::vector<float> l1 = ref.decode(9);
  for (const char* spec : {"palu:ratio=0", "palu:ratio=0,whiten=none", "palu:ratio=0,prefill=full,sinks=2"}) {
    SCOPED_TRACE(spec);
    Session s(*model_, params());
    s.set_press(make_press(spec));
    const std::vector<float> a = s.prefill(prompt);
    s.compress();
    const std::vector<float> b = s.decode(9);
    for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], l0[i], 1e-3 * std::max(1.f, std::fabs(l0[i])));
    for (size_t i = 0; i < b.size(); ++i) ASSERT_NEAR(b[i], l1[i], 1e-3 * std::max(1.f, std::fabs(l1[i])));
    EXPECT_GE(s.cache().head_layout(0, 0).current_epoch, 0);
  }
  // rank 4 of 16 on both sides, alone and after snapkv: the bytes multiply
  Session a(*model_, params()), b(*model_, params()), e(*model_, params());
  a.set_press(make_press("palu:ratio=0.75"));
  b.set_press(make_press("snapkv:ratio=0.5+palu:ratio=0.75"));
  a.prefill(prompt);
  b.prefill(prompt);
  e.prefill(prompt);
  a.compress();
  b.compress();
  const KvBytes ka = a.cache().bytes(), kb = b.cache().bytes(), ke = e.cache().bytes();
  EXPECT_EQ(ka.keys * 4, ke.keys);
  EXPECT_EQ(ka.values * 4, ke.values);
  EXPECT_LT(kb.keys, ka.keys);
  EXPECT_LT(kb.values, ka.values);
}

TEST_F(PaluPress, ClearErrors) {
  auto msg = [](const std::string& spec) {
    return test::error_of([&] {
      Session s(*model_, params());
      s.set_press(make_press(spec));
      s.prefill(tokens(kPaluTokens));
      s.compress();
    });
  };
  EXPECT_NE(msg("palu:group=4").find("group=4 is not supported"), std::string::npos) << msg("palu:group=4");
  EXPECT_NE(msg("palu:rope=mid").find("rope"), std::string::npos);
  EXPECT_NE(msg("palu:whiten=pca").find("whiten"), std::string::npos);
  EXPECT_NE(msg("palu:hybrid=0.1").find("hybrid"), std::string::npos) << msg("palu:hybrid=0.1");
  // whiten=calib with a calibration that has no statistics
  auto bare = test::tiny_calibration(*model_, capture(test::calib_tokens()));
  bare->set_stats({});
  test::CalibrationScope scope(bare);
  EXPECT_NE(msg("palu").find("no key / value statistics"), std::string::npos) << msg("palu");
  EXPECT_EQ(msg("palu:whiten=none"), "");
}

}  // namespace
}  // namespace kvtrim
