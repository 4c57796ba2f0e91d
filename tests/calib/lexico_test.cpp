// Lexico's calibration (src/calib/lexico.h): dictionary learning recovers a planted dictionary and
// beats its own starting point, the capture's key / value reservoir holds real paired rows, the
// calibration file round-trips the dictionaries, and damaged sections are clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <random>
#include <set>

#include "calib/calibration.h"
#include "calib/capture.h"
#include "calib/lexico.h"
#include "core/error.h"
#include "kv/kv_cache.h"
#include "test_util.h"
#include "tiny_model.h"

namespace kvtrim {
namespace {

TEST(LexicoTrain, RecoversAPlantedDictionary) {
  std::mt19937 rng(4);
  const int d = 16, N = 24, s = 2;
  const int64_t n = 3000;
  const std::vector<float> Dt = test::random_dictionary(d, N, rng);
  std::vector<float> X(static_cast<size_t>(n * d), 0.f);
  std::uniform_int_distribution<int> pick(0, N - 1);
  std::normal_distribution<float> coef(0.f, 1.f);
  for (int64_t t = 0; t < n; ++t)
    for (int e = 0; e < s; ++e) {
      const int j = pick(rng);
      const float c = coef(rng);
      for (int i = 0; i < d; ++i) X[static_cast<size_t>(t * d + i)] += c * Dt[static_cast<size_t>(i) * N + j];
    }
  double e0 = 0, e1 = 0;
  train_dictionary(X.data(), n, d, N, s, 0, 1, nullptr, &e0);  // the starting point: sample rows
  const std::vector<float> D = train_dictionary(X.data(), n, d, N, s, 25, 1, nullptr, &e1);
  EXPECT_LT(e1, 0.5 * e0) << "learning must improve on its starting point";
  EXPECT_LT(e1, 0.05);
  // most planted atoms are found (|cos| > 0.95 with some learned atom)
  int found = 0;
  for (int a = 0; a < N; ++a) {
    double best = 0;
    for (int b = 0; b < N; ++b) {
      double c = 0;
      for (int i = 0; i < d; ++i) c += static_cast<double>(Dt[static_cast<size_t>(i) * N + a]) * D[static_cast<size_t>(i) * N + b];
      best = std::max(best, std::fabs(c));
    }
    found += best > 0.95 ? 1 : 0;
  }
  EXPECT_GE(found, N * 3 / 4);
  // the same seed gives the same dictionary
  EXPECT_EQ(train_dictionary(X.data(), n, d, N, s, 25, 1, nullptr, nullptr), D);
  EXPECT_THROW(train_dictionary(X.data(), 10, d, N, s, 2, 1, nullptr, nullptr), Error);  // fewer rows than atoms
}

class LexicoCalib : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(test::temp_dir("lexico_calib"));
    model_ = Model::load(test::write_tiny_model(test::tiny_spec(Arch::kLlama, 5), *dir_)).release();
  }
  static inline Model* model_ = nullptr;
  static inline std::string* dir_ = nullptr;
};

// Records every key / value row of every layer.
struct KvRowRecorder : ForwardObserver {
  int nkv = 0, dk = 0, dv = 0;
  std::vector<std::set<std::vector<float>>> pairs;  // per layer: key row ++ value row
  void on_qkv(int il, int64_t n, const float*, const float* k, const float* v, const int32_t*) override {
    if (pairs.size() <= static_cast<size_t>(il)) pairs.resize(static_cast<size_t>(il) + 1);
    for (int64_t t = 0; t < n; ++t)
      for (int h = 0; h < nkv; ++h) {
        std::vector<float> r(k + (t * nkv + h) * dk, k + (t * nkv + h + 1) * dk);
        r.insert(r.end(), v + (t * nkv + h) * dv, v + (t * nkv + h + 1) * dv);
        pairs[static_cast<size_t>(il)].insert(r);
      }
  }
};

TEST_F(LexicoCalib, ReservoirHoldsPairedRowsAndTheFileRoundTrips) {
  const HParams& hp = model_->hparams();
  std::vector<int32_t> toks;
  for (int i = 0; i < 200; ++i) toks.push_back((i * 29 + 3) % 250);
  const auto seqs = cut_sequences(toks, 4, 50, -1);
  CalibCapture cap(*model_, 0, 42, 120);
  run_capture(*model_, seqs, cap, nullptr);
  KvRowRecorder rec;
  rec.nkv = hp.n_head_kv;
  rec.dk = hp.head_dim_k;
  rec.dv = hp.head_dim_v;
  {
    auto cfg = model_->cache_config(64);
    cfg.dtype = KvDtype::kF32;
    auto cache = make_kv_cache(cfg);
    std::vector<float> logits(static_cast<size_t>(hp.n_vocab));
    for (const auto& sq : seqs) {
      cache->clear();
      model_->forward(sq.data(), static_cast<int64_t>(sq.size()), 0, *cache, logits.data(), false, nullptr, &rec);
    }
  }
  ASSERT_EQ(cap.key_rows().size(), static_cast<size_t>(hp.n_layer));
  for (int il = 0; il < hp.n_layer; ++il) {
    const auto& K = cap.key_rows()[static_cast<size_t>(il)];
    const auto& V = cap.value_rows()[static_cast<size_t>(il)];
    ASSERT_EQ(K.size(), static_cast<size_t>(120 * hp.head_dim_k)) << "400 rows offered, 120 kept";
    ASSERT_EQ(V.size(), static_cast<size_t>(120 * hp.head_dim_v));
    std::set<std::vector<float>> distinct;
    for (int r = 0; r < 120; ++r) {
      std::vector<float> row(K.begin() + r * hp.head_dim_k, K.begin() + (r + 1) * hp.head_dim_k);
      row.insert(row.end(), V.begin() + r * hp.head_dim_v, V.begin() + (r + 1) * hp.head_dim_v);
      EXPECT_TRUE(rec.pairs[static_cast<size_t>(il)].count(row)) << "layer " << il << " row " << r;
      distinct.insert(row);
    }
    EXPECT_GT(distinct.size(), 100u) << "a sample, not one row repeated";
  }
  LexicoTrainOptions o;
  o.n_atoms = 40;
  o.iters = 3;
  auto dicts = std::make_shared<LexicoDicts>(
      train_lexico(cap.key_rows(), cap.value_rows(), hp.head_dim_k, hp.head_dim_v, o, nullptr));
  EXPECT_EQ(dicts->sparsity_k, 4);  // max(4, 16 / 8)
  Calibration c(model_fingerprint(*model_), hp.n_layer, hp.n_head_kv);
  c.set_lexico(dicts);
  const std::string path = *dir_ + "/lex.kvcalib";
  c.save(path);
  const Calibration back = Calibration::load(path, model_);
  ASSERT_TRUE(back.has_lexico());
  EXPECT_EQ(back.lexico().n_atoms, 40);
  EXPECT_EQ(back.lexico().k, dicts->k);
  EXPECT_EQ(back.lexico().v, dicts->v);
  EXPECT_EQ(back.lexico().sparsity_v, dicts->sparsity_v);
  for (int il = 0; il < hp.n_layer; ++il) {
    EXPECT_EQ(back.lexico().k_err[static_cast<size_t>(il)], static_cast<double>(static_cast<float>(dicts->k_err[static_cast<size_t>(il)])));
    EXPECT_GE(dicts->k_err[static_cast<size_t>(il)], 0.0);
    EXPECT_LT(dicts->k_err[static_cast<size_t>(il)], 1.0);
  }
  // a file without the section says which command adds it
  Calibration none(model_fingerprint(*model_), hp.n_layer, hp.n_head_kv);
  try {
    none.lexico();
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kvtrim calibrate --lexico"), std::string::npos);
  }
  // dictionaries that are not unit norm, or of another shape, are refused
  auto bad = std::make_shared<LexicoDicts>(*dicts);
  for (int i = 0; i < hp.head_dim_k; ++i) bad->k[0][static_cast<size_t>(i) * 40] *= 3.f;  // atom 0
  EXPECT_THROW(c.set_lexico(bad), Error);
  auto shape = std::make_shared<LexicoDicts>(*dicts);
  shape->v.pop_back();
  EXPECT_THROW(c.set_lexico(shape), Error);
}

}  // namespace
}  // namespace kvtrim
