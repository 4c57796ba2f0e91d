// StiefAttention's calibration checkpoint (docs/stiefattention.md, step 7): after each layer the
// finished layers' fits and the next layer's inputs are written to one file, so that an
// interrupted calibration resumes at the next layer; a checkpoint is used only when its identity
// (model, configuration, sequences, EigenAttention fits and statistics) matches.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "calib/stief_fits.h"

namespace kvtrim {

class Calibration;
class Model;
struct StiefTrainConfig;

// Everything the result depends on: the model, the configuration, the sequences (lengths and
// token ids) and the calibration's EigenAttention fits and statistics (warm start, walk).
std::string ck_identity(const Model& model, const Calibration& cal, const StiefTrainConfig& cfg,
                        const std::vector<std::vector<int32_t>>& seqs);
// Writes the fits of the finished layers and the next layer's inputs X [seq][n_tok * n_embd].
void save_checkpoint(const std::string& path, const std::string& identity, const StiefFits& f,
                     const std::vector<std::vector<float>>& X, int64_t n_embd);
// Loads a matching checkpoint into *f and *X; false when there is none or it does not match
// (a mismatch is reported and the run starts over).
bool load_checkpoint(const std::string& path, const std::string& identity, int n_layer,
                     int n_head_kv, int dk, int dv, int64_t n_embd,
                     const std::vector<std::vector<int32_t>>& seqs, StiefFits* f,
                     std::vector<std::vector<float>>* X);

}  // namespace kvtrim
