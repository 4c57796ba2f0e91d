// StiefAttention calibration (DESIGN.md §4.3; docs/stiefattention.md): layer by layer, the
// uncompressed inputs of N whole calibration sequences are pushed through the f32 decoder layer
// (stief_layer.h); for each candidate rank a key predictor (one basis shared by the layer's kv
// heads) and value predictors (one basis per kv head) are trained by AdamW on the relative
// layer-output error, keys and values independently; then the error surface over all rank
// pairs, EigenAttention's threshold walk and the r = d/2 diagnostics are measured on held-out
// sequences. The layer's uncompressed outputs become the next layer's inputs. A checkpoint
// file after each layer lets an interrupted calibration resume where it stopped.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "calib/stief_fits.h"

namespace kvtrim {

class Calibration;
class Model;
class ThreadPool;

struct StiefTrainConfig {
  std::vector<double> fracs = {0.5, 0.6, 0.7, 0.8, 0.9};  // candidate ranks / d (paper: 5, 50-90 %)
  int max_epochs = 6;       // passes over the training sequences (paper: 50)
  int patience = 5;         // epochs without improvement before stopping (paper: 5)
  double min_delta = 1e-4;  // an improvement is a validation error lower by more than this
  int rows = 64;            // query rows per step (0 = every position of the sequence)
  int val_seqs = 4;         // sequences held out (early stopping, surfaces, diagnostics)
  int val_rows = 128;       // rows of each held-out sequence (evenly spaced)
  double lr = 5e-3, weight_decay = 1e-2;  // AdamW (paper: lr 5e-3), cosine-annealed to 0
  int hidden = 128;         // predictor width
  bool warm_start = true;   // start from EigenAttention's bases (false: random, the paper's)
  // > 0: perturb the warm start, U0 = Q of QR(U_eigen + init_noise·G), G standard normal (tests:
  // a start the optimizer must improve on; needs warm_start)
  double init_noise = 0;
  double eig_step = 0.01;   // EigenAttention's threshold step
  int layers = 0;           // > 0: only the first `layers` layers (tests, quick runs)
  uint64_t seed = 42;
  // A short text of the fields that change the result (the checkpoint must match it).
  std::string describe() const;
};

struct StiefLayerReport {
  int layer = 0;
  double seconds = 0, backward_seconds = 0;  // wall time of the layer; of its backward passes
  int64_t steps = 0;                         // optimizer steps over all candidates
};

// Trains every layer (cal: EigenAttention fits and statistics of the same model, for the warm
// start and the baseline walk). seqs: calibration token sequences (each from position 0);
// the last cfg.val_seqs are held out. checkpoint: a file written after each layer and read at
// start when it matches the model and configuration ("" = none); removed by the caller once
// the calibration file is saved. on_layer (may be empty) is called after each layer.
StiefFits train_stief(const Model& model, const Calibration& cal,
                      const std::vector<std::vector<int32_t>>& seqs, const StiefTrainConfig& cfg,
                      ThreadPool* pool, const std::string& checkpoint,
                      const std::function<void(const StiefLayerReport&)>& on_layer = {});

}  // namespace kvtrim
