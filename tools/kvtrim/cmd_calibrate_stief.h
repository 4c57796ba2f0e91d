// kvtrim calibrate --stief: StiefAttention's options and training step (cmd_calibrate_stief.cpp).
#pragma once
#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "calib/calibration.h"
#include "core/thread_pool.h"
#include "model/model.h"

namespace kvtrim::cli {

struct StiefCliOptions {
  bool enabled = false;
  int64_t seqs = 32;
  int64_t seq_len = 512;
  int epochs = 6;
  int rows = 64;
  int val_rows = 128;
  double eig_step = 0.01;
  std::string init = "eigen";
};

void add_stief_options(CLI::App* c, StiefCliOptions& o);
// Throws Error when --stief is given without the fits it needs.
void check_stief_options(const StiefCliOptions& o, const std::vector<BasisMethod>& methods);
// Trains on sequences cut from the end of `tokens` (warning when they overlap the first
// capture_tokens, the statistics' tokens) and stores the result in cal; prints the diagnostics.
void run_stief(const Model& model, Calibration& cal, const std::vector<int32_t>& tokens,
               int32_t bos, int64_t capture_tokens, const StiefCliOptions& o, ThreadPool& pool,
               const std::string& out);
// Removes the checkpoint once the calibration file holding the result is written.
void remove_stief_checkpoint(const std::string& out);

}  // namespace kvtrim::cli
