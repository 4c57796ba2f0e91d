// StiefAttention's optimizer does its job: on a tiny model, training lowers the held-out
// layer-output error below that of the basis it started from, (a) from a random start (the
// paper's) and (b) from EigenAttention's warm start perturbed away from it. The trainer keeps
// the best held-out epoch, the starting one included, so an optimizer that never moves the
// bases would return its start: these checks fail then (a margin below the start, not <=).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "../common/test_util.h"
#include "../common/tiny_model.h"
#include "calib/calibration.h"
#include "calib/capture.h"
#include "calib/fit.h"
#include "calib/stief_fits.h"
#include "calib/stief_train.h"
#include "core/error.h"
#include "model/model.h"

namespace kvtrim {
namespace {

// f throws an Error whose message contains `needle`.
template <typename F>
void expect_error(F f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error (expected one mentioning '" << needle << "')";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

class StiefTraining : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string dir = test::temp_dir("stief_training");
    model_ = Model::load(test::write_tiny_model(test::tiny_spec(Arch::kQwen2, 7), dir)).release();
    const HParams& hp = model_->hparams();
    seqs_ = new std::vector<std::vector<int32_t>>;
    for (int i = 0; i < 8; ++i) seqs_->push_back(test::random_tokens(32, hp.n_vocab, 300 + i));
    CalibCapture cap(*model_, 0, 1);
    run_capture(*model_, *seqs_, cap, nullptr);
    cal_ = new Calibration(model_fingerprint(*model_), hp.n_layer, hp.n_head_kv);
    cal_->set_stats(cap.stats());
    cal_->set_fits(BasisMethod::kEigenAttention, fit_all(BasisMethod::kEigenAttention, cap.stats()));
  }
  // 6 training sequences, 2 held out; layer 0; ranks d/2 and 3d/4 (8 and 12 of 16); every row of
  // a sequence per step; 20 epochs (120 steps) without early stopping. Measured (2026-11-29):
  // from a random start the held-out error falls 9-17 % (keys) and 20-37 % (values), from the
  // perturbed warm start 7-16 % and 20-29 %; the checks ask for 4 %.
  static StiefTrainConfig config() {
    StiefTrainConfig cfg;
    cfg.fracs = {0.5, 0.75};
    cfg.max_epochs = 20;
    cfg.patience = 20;
    cfg.lr = 1e-2;  // the tiny layer's objective is flat near its floor: a larger step than the default
    cfg.rows = 0;
    cfg.val_seqs = 2;
    cfg.val_rows = 32;
    cfg.hidden = 16;
    cfg.eig_step = 0.1;
    cfg.layers = 1;
    return cfg;
  }
  static StiefFits train(const StiefTrainConfig& cfg) { return train_stief(*model_, *cal_, *seqs_, cfg, nullptr, ""); }

  static Model* model_;
  static Calibration* cal_;
  static std::vector<std::vector<int32_t>>* seqs_;
};
Model* StiefTraining::model_ = nullptr;
Calibration* StiefTraining::cal_ = nullptr;
std::vector<std::vector<int32_t>>* StiefTraining::seqs_ = nullptr;

// Every candidate of both sides ends at least `gain` (relative) below its starting error; the
// reported best errors are the surface's (measured again on the held-out rows) and the starting
// errors are real layer errors.
void expect_trained(const StiefFits& f, double gain, const char* what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(f.n_layer(), 1);
  const StiefLayerFit& L = f.layers[0];
  const int nc = f.n_cand();
  ASSERT_EQ(L.key_start_err.size(), static_cast<size_t>(nc));
  ASSERT_EQ(L.value_start_err.size(), static_cast<size_t>(nc));
  for (int i = 0; i < nc; ++i) {
    EXPECT_GT(L.key_start_err[i], 0.0);
    EXPECT_GT(L.value_start_err[i], 0.0);
    EXPECT_LT(L.key_err[i], (1.0 - gain) * L.key_start_err[i]) << "keys, rank " << f.ranks_k[i];
    EXPECT_LT(L.value_err[i], (1.0 - gain) * L.value_start_err[i]) << "values, rank " << f.ranks_v[i];
    EXPECT_NEAR(L.key_err[i], f.surface(0, i, nc), 1e-9);
    EXPECT_NEAR(L.value_err[i], f.surface(0, nc, i), 1e-9);
    std::printf("  %s rank %d/%d: keys %.4f -> %.4f, values %.4f -> %.4f\n", what, f.ranks_k[i], f.dk,
                L.key_start_err[i], L.key_err[i], L.value_start_err[i], L.value_err[i]);
  }
}

TEST_F(StiefTraining, LowersTheHeldOutErrorFromARandomStart) {
  StiefTrainConfig cfg = config();
  cfg.warm_start = false;
  const StiefFits random = train(cfg);
  expect_trained(random, 0.04, "random start");
  // the random start is a worse start than EigenAttention's bases
  const StiefFits warm = train(config());
  for (int i = 0; i < random.n_cand(); ++i) {
    EXPECT_GT(random.layers[0].key_start_err[i], warm.layers[0].key_start_err[i]);
    EXPECT_GT(random.layers[0].value_start_err[i], warm.layers[0].value_start_err[i]);
  }
}

TEST_F(StiefTraining, LowersTheHeldOutErrorFromAPerturbedWarmStart) {
  const StiefFits warm = train(config());
  StiefTrainConfig cfg = config();
  cfg.init_noise = 0.5;
  const StiefFits perturbed = train(cfg);
  for (int i = 0; i < warm.n_cand(); ++i) {  // the perturbation did move the start away
    EXPECT_GT(perturbed.layers[0].key_start_err[i], 1.04 * warm.layers[0].key_start_err[i]);
    EXPECT_GT(perturbed.layers[0].value_start_err[i], 1.04 * warm.layers[0].value_start_err[i]);
  }
  expect_trained(perturbed, 0.04, "perturbed warm start");
  // the unperturbed warm start never ends above its start (the best epoch, start included)
  for (int i = 0; i < warm.n_cand(); ++i) {
    EXPECT_LE(warm.layers[0].key_err[i], warm.layers[0].key_start_err[i]);
    EXPECT_LE(warm.layers[0].value_err[i], warm.layers[0].value_start_err[i]);
  }
}

TEST_F(StiefTraining, InitNoiseNeedsAWarmStart) {
  StiefTrainConfig cfg = config();
  cfg.warm_start = false;
  cfg.init_noise = 0.3;
  expect_error([&] { train(cfg); }, "init_noise");
  cfg.warm_start = true;
  cfg.init_noise = -1;
  expect_error([&] { train(cfg); }, "init_noise");
}

}  // namespace
}  // namespace kvtrim
