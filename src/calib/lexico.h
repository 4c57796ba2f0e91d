// Lexico's dictionaries (Kim et al. 2024, "Lexico: Extreme KV Cache Compression via Sparse Coding
// over Universal Dictionaries"; DESIGN.md §4.1, docs/presses-lexico.md): per layer, one
// dictionary of N unit-norm atoms for the post-RoPE keys and one for the values, shared by the
// layer's KV heads and learned offline from a sample of their rows; at run time each token is
// coded by orthogonal matching pursuit over them (kv/sparse_code.h).
//
// Learning (our choice, stated in the docs: the paper trains its dictionaries by gradient steps on
// the reconstruction error of OMP codes; we alternate the same OMP codes with the closed-form
// least-squares dictionary update, the Method of Optimal Directions, Engan et al. 1999):
//   D_0 = N distinct sample rows (seeded), normalised;
//   repeat `iters` times: C = OMP_s(X; D) (s = the training sparsity), D = X Cᵀ (C Cᵀ + λI)⁻¹,
//   atoms no row used are replaced by the worst-represented rows, every atom normalised.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "calib/stief_fits.h"  // CalibTensor

namespace kvtrim {

class GgufFile;
class GgufWriter;
class ThreadPool;

struct LexicoDicts {
  int dk = 0, dv = 0, n_atoms = 0;
  int sparsity_k = 0, sparsity_v = 0;  // the training sparsity of each side
  std::vector<std::vector<float>> k, v;  // [n_layer] dictionaries [d, N] row-major, unit-norm columns
  // Relative error Σ‖x − D c‖² / Σ‖x‖² of the training rows at the training sparsity, per layer.
  std::vector<double> k_err, v_err;
  int n_layer() const { return static_cast<int>(k.size()); }
  // Throws Error naming the problem for shapes that disagree, atoms that are not unit norm (1e-3)
  // or not finite, or errors outside [0, 1].
  void validate(int n_layer) const;
};

struct LexicoTrainOptions {
  int n_atoms = 1024;
  int sparsity = 0;  // 0: max(4, d / 8) per side
  int iters = 8;
  uint64_t seed = 42;
};

// One dictionary [d, N] from the rows of X [n, d] (n >= N). rel_err (optional): the final codes'
// relative error.
std::vector<float> train_dictionary(const float* X, int64_t n, int d, int n_atoms, int sparsity,
                                    int iters, uint64_t seed, ThreadPool* pool, double* rel_err);

// Both sides of every layer from per-layer samples k [n_layer][n, dk], v [n_layer][n, dv].
LexicoDicts train_lexico(const std::vector<std::vector<float>>& k_rows,
                         const std::vector<std::vector<float>>& v_rows, int dk, int dv,
                         const LexicoTrainOptions& o, ThreadPool* pool,
                         const std::function<void(int64_t, int64_t)>& progress = {});

// Calibration-file I/O (called by Calibration::save / from_gguf).
void lexico_write(const LexicoDicts& d, GgufWriter& w, std::vector<CalibTensor>* tensors);
bool lexico_present(const GgufFile& f);
// Throws Error naming `path` for missing or mis-shaped parts.
LexicoDicts lexico_read(const GgufFile& f, const std::string& path, int n_layer, int dk, int dv);

}  // namespace kvtrim
