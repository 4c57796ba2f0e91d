// StiefAttention's calibration artefacts (DESIGN.md §4.3; docs/stiefattention.md): per layer,
// the bases trained for each candidate rank (one key basis shared by the layer's kv heads, one
// value basis per kv head), the error surface E_ℓ(r_k, r_v) over every pair of candidate
// ranks (full rank included), EigenAttention's threshold walk (the paper's baseline
// procedure) and the r = d/2 diagnostics; and the rank allocation policies that read the
// surfaces at deployment (Uniform, Pareto, Weighted Pareto).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kvtrim {

class GgufFile;
class GgufWriter;

// The r = d/2 diagnostics of one layer on the held-out calibration rows (relative Frobenius
// errors against the uncompressed layer; cosine = mean over tokens of cos(f̂(x)_t, f(x)_t)).
enum StiefDiag {
  kDiagStiefOutErr, kDiagStiefOutCos, kDiagStiefAttnErr,
  kDiagEigenOutErr, kDiagEigenOutCos, kDiagEigenAttnErr,
  kDiagCount
};

struct StiefLayerFit {
  // [n_cand] bases U [dk, dk] (row-major, orthonormal columns; rank r = first r columns).
  std::vector<std::vector<float>> key;
  // [n_cand][n_head_kv] bases U [dv, dv].
  std::vector<std::vector<std::vector<float>>> value;
  // [(n_cand + 1)²] E(i, j) at key rank index i, value rank index j (index n_cand = full rank).
  std::vector<double> surface;
  // EigenAttention's walk: energy thresholds τ (increasing) and the layer error at each.
  std::vector<double> eig_tau, eig_err;
  std::vector<double> diag;  // [kDiagCount]
  // Training record per candidate (validation error at the best epoch, epochs run).
  std::vector<double> key_err, value_err;
  std::vector<int> key_epochs, value_epochs;
  // Validation error of the starting basis (before any step; the warm start or the random
  // predictor's first output). Set by train_stief only: not in the calibration file (empty
  // when read back).
  std::vector<double> key_start_err, value_start_err;
};

struct StiefFits {
  int dk = 0, dv = 0, n_head_kv = 0;
  std::vector<int> ranks_k, ranks_v;  // candidate ranks, increasing, < d; same count
  std::vector<StiefLayerFit> layers;
  int n_cand() const { return static_cast<int>(ranks_k.size()); }
  int n_layer() const { return static_cast<int>(layers.size()); }
  // Rank of key / value index i (n_cand = full rank d).
  int rank_k(int i) const { return i >= n_cand() ? dk : ranks_k[static_cast<size_t>(i)]; }
  int rank_v(int i) const { return i >= n_cand() ? dv : ranks_v[static_cast<size_t>(i)]; }
  double surface(int il, int i, int j) const {
    return layers[static_cast<size_t>(il)].surface[static_cast<size_t>(i * (n_cand() + 1) + j)];
  }
  // The candidate nearest d/2 (keys): where the diagnostics are measured.
  int half_index() const;
  // Throws Error naming the problem when shapes disagree with the fields above, or a value is
  // out of its domain (non-finite, a threshold outside (0, 1] or not increasing, a basis that
  // is not orthonormal).
  void validate(int n_layer) const;
};

// Candidate ranks for fractions of d (each round(f·d), clamped to [1, d−1], duplicates removed).
std::vector<int> candidate_ranks(const std::vector<double>& fracs, int d);

// Rank allocation at deployment (DESIGN.md §4.3).
enum class RankAlloc { kUniform, kPareto, kWeightedPareto };
const char* rank_alloc_name(RankAlloc a);  // "uniform", "pareto", "wpareto"
RankAlloc parse_rank_alloc(const std::string& s);  // throws Error listing the names

struct LayerRankChoice {
  int ik = 0, iv = 0;  // candidate indices (n_cand = full rank)
  double err = 0;      // E_ℓ at (ik, iv)
};
// Uniform: the one pair (i, j) for every layer with the smallest r_k + r_v whose mean error over
// the layers is <= eps (ties: lower mean error). Pareto: per layer, among the Pareto-optimal
// pairs (no other pair has both a lower error and a lower r_k + r_v), the smallest r_k + r_v
// with E_ℓ <= eps. Weighted Pareto: Pareto with budget eps / w_ℓ (layer_weights). A layer (or,
// for Uniform, the model) that no pair fits is kept at full rank.
std::vector<LayerRankChoice> allocate_ranks(const StiefFits& f, RankAlloc a, double eps);
// The Weighted Pareto positional prior: 2 for the first and last layer, 1.75, 1.5, 1.25 for the
// next three inward from each end, 1 elsewhere (the larger where the ramps overlap), normalised
// to mean 1.
std::vector<double> layer_weights(int n_layer);
// EigenAttention's procedure (the StiefAttention paper's baseline): per layer, the threshold is
// relaxed step by step from the most compressed (smallest τ) until the layer's error meets the
// budget: the smallest τ of the walk whose error is <= eps (1.0, the full basis, when none is).
// Thresholds are multiples of 1e-6 (tau_round), so the f32 file gives back the training's τ.
std::vector<double> eigen_thresholds(const StiefFits& f, double eps);

double tau_round(double tau);

// Calibration-file I/O (called by Calibration::save / from_gguf).
struct CalibTensor {
  std::string name;
  std::vector<int64_t> ne;
  std::vector<float> data;
};
void stief_write(const StiefFits& f, GgufWriter& w, std::vector<CalibTensor>* tensors);
bool stief_present(const GgufFile& f);
// Throws Error naming `path` for missing or mis-shaped parts.
StiefFits stief_read(const GgufFile& f, const std::string& path, int n_layer, int n_head_kv,
                     int dk, int dv);

}  // namespace kvtrim
