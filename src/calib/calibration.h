// Calibration artefacts (DESIGN.md §2 "calib", §4.3, §4.5): per (layer, kv head) statistics
// streamed from a model run over calibration text, the low-rank bases fitted from them
// (K-SVD, EigenAttention, KQ-SVD, StaticPCA; SWAN's full rotations), and the versioned file that carries both with
// the model's fingerprint. Presses (src/press/basis/) load a Calibration and truncate its
// fits to the rank they need; `kvtrim calibrate` produces the file.
//
// Conventions. d = head_dim_k for keys, head_dim_v for values. A SideFit holds a full set of
// d directions sorted by decreasing energy, so any rank r <= d is its first r columns:
//   coefficients  c = E_rᵀ x           (E_r = enc_cols(r), [d, r] row-major)
//   keys:   score  q·k ≈ (q·D_r)·c      (D_r = dec_cols(r); D = E for orthonormal fits)
//   values: output o ≈ (Σ a c)·D_rᵀ
// Orthonormal fits (K-SVD, EigenAttention, StaticPCA, and KQ-SVD never) have dec empty and
// EᵀE = I. KQ-SVD is oblique: the best rank-r approximation of the score matrix Q·Kᵀ (keys) and
// of V·W_O (values) under the calibration statistics, so its encoder and decoder differ.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace kvtrim {

class GgufFile;

class Model;
struct StiefFits;
struct LexicoDicts;

enum class BasisMethod { kKSvd, kEigenAttention, kKqSvd, kStaticPca, kSwan };
// "ksvd", "eigenattention", "kqsvd", "staticpca", "swan"
const char* basis_method_name(BasisMethod m);
// Parses a name above; throws Error listing the valid names otherwise.
BasisMethod parse_basis_method(const std::string& name);
std::vector<BasisMethod> all_basis_methods();

// One side (keys or values) of one (layer, kv head).
struct SideFit {
  int d = 0;
  std::vector<float> enc;      // [d, d] row-major; column j = j-th direction
  std::vector<float> dec;      // [d, d] row-major; empty = same as enc (orthonormal fit)
  std::vector<double> energy;  // [d] energy of each direction (eigenvalue / σ²), decreasing, >= 0
  bool orthonormal() const { return dec.empty(); }
  // Smallest r in [1, d] whose directions hold >= frac of the total energy (frac in (0, 1]).
  int rank_for_energy(double frac) const;
  // First r columns (1 <= r <= d) as a row-major [d, r] matrix.
  std::vector<float> enc_cols(int r) const;
  std::vector<float> dec_cols(int r) const;  // = enc_cols(r) for orthonormal fits
};

// Rank kept for a target KV ratio: ratio = kept fraction of a head's dimensions, as the KV
// ratio of DESIGN.md §4.3 ((r_k + r_v) / (2·d_h) with r_k = r_v), so ratio 0.5 keeps d/2
// directions. r = round(ratio·d) clamped to [1, d]; throws Error unless ratio is in (0, 1].
int rank_for_ratio(double ratio, int d);

struct HeadFit {
  SideFit k, v;
};

// Streamed statistics of one (layer, kv head) over the calibration tokens (f64 sums; a Gram
// matrix G = Σ_t x_t x_tᵀ is [d, d] row-major). Queries of the kv head's GQA group are summed
// into one Gram (every query head of the group, every token).
struct HeadStats {
  int64_t n_tokens = 0;          // tokens accumulated (queries: n_tokens per query head)
  int n_group = 0;               // query heads per kv head
  std::vector<double> gram_k, gram_q, gram_v;          // post-RoPE keys / queries, values
  std::vector<double> gram_k_pre, gram_q_pre;          // pre-RoPE keys / queries
  std::vector<double> sum_k, sum_v, sum_k_pre;         // [d] sums (means = sum / n_tokens)
  std::vector<double> gram_vo;  // [dv, dv] Σ_h W_O^h W_O^hᵀ over the group (KQ-SVD values);
                                // W_O^h [dv, n_embd] = head h's columns of W_O, transposed
};

// A deterministic uniform sample (seeded reservoir) of token rows of one layer's residual
// stream: the layer's input and its output for the same tokens (StiefAttention's layer
// objective, DESIGN.md §4.3).
struct LayerIoSample {
  int n_rows = 0, n_embd = 0;
  std::vector<float> x_in, x_out;  // [n_rows, n_embd] each
};

// Identifies the model a calibration belongs to. Two models match iff every field is equal.
struct ModelFingerprint {
  std::string arch, name;
  int n_layer = 0, n_head = 0, n_head_kv = 0, head_dim_k = 0, head_dim_v = 0, n_embd = 0;
  uint64_t weights_hash = 0;  // hash of the attention weight tensors' bytes (types, shapes, data)
  std::string describe() const;
  bool operator==(const ModelFingerprint& o) const = default;
};
ModelFingerprint model_fingerprint(const Model& model);

class Calibration {
 public:
  // Version 2 added StiefAttention's section (src/calib/stief_fits.h), version 3 Lexico's
  // dictionaries (src/calib/lexico.h); version 1 and 2 files load.
  static constexpr int kFormatVersion = 3;
  static constexpr int kOldestFormatVersion = 1;

  Calibration() = default;
  Calibration(ModelFingerprint fp, int n_layer, int n_head_kv);

  // Reads a calibration file. Throws Error naming the file and the problem for a missing,
  // truncated or damaged file, another format version, or (model != nullptr) a file made
  // for another model (the message shows both fingerprints).
  static Calibration load(const std::string& path, const Model* model = nullptr);
  // The same checks over an opened GGUF file (GgufFile::from_memory: the fuzz target);
  // messages name f.path(). verify_checksum = false is for the fuzz target only (so that
  // mutated tensors reach the checks behind the checksum).
  static Calibration from_gguf(const GgufFile& f, const Model* model = nullptr, bool verify_checksum = true);
  // Writes atomically (temporary file, then rename).
  void save(const std::string& path) const;

  // Throws the same error as load(path, &model) when the file was made for another model
  // (lets a tool check a file before loading the model, then match it once loaded).
  void check_model(const Model& model, const std::string& path) const;

  const ModelFingerprint& fingerprint() const { return fp_; }
  // The stored checksum of the tensor data of the file this was loaded from (16 hex digits, as
  // written by save()); "" for a calibration made in memory. Identifies the fits an evaluation
  // used (eval configs: a recalibration at the same path is another config).
  const std::string& checksum() const { return checksum_; }
  int n_layer() const { return n_layer_; }
  int n_head_kv() const { return n_head_kv_; }

  bool has(BasisMethod m) const { return fits_.count(m) != 0; }
  // Throws Error if the file holds no fit for m (naming the methods it has).
  const HeadFit& fit(BasisMethod m, int il, int ih) const;
  void set_fits(BasisMethod m, std::vector<HeadFit> fits);  // [n_layer * n_head_kv]

  bool has_stats() const { return !stats_.empty(); }
  const HeadStats& stats(int il, int ih) const;
  void set_stats(std::vector<HeadStats> stats);  // [n_layer * n_head_kv]

  bool has_layer_io() const { return !layer_io_.empty(); }
  const LayerIoSample& layer_io(int il) const;    // throws Error if the file holds none
  void set_layer_io(std::vector<LayerIoSample> io);  // [n_layer] (empty: none)

  std::vector<BasisMethod> methods() const;  // the methods with fits, in enum order

  // StiefAttention's bases, error surfaces and EigenAttention walk (`kvtrim calibrate --stief`).
  bool has_stief() const { return stief_ != nullptr; }
  // Throws Error naming the `kvtrim calibrate --stief` command when the file holds none.
  const StiefFits& stief() const;
  void set_stief(std::shared_ptr<const StiefFits> s);

  // Lexico's per-layer dictionaries (`kvtrim calibrate --lexico`).
  bool has_lexico() const { return lexico_ != nullptr; }
  // Throws Error naming the `kvtrim calibrate --lexico` command when the file holds none.
  const LexicoDicts& lexico() const;
  void set_lexico(std::shared_ptr<const LexicoDicts> d);

  // Free-form provenance: calibration text, sequences x length, kvtrim version, date.
  std::map<std::string, std::string> meta;

 private:
  ModelFingerprint fp_;
  std::string checksum_;
  int n_layer_ = 0, n_head_kv_ = 0;
  std::map<BasisMethod, std::vector<HeadFit>> fits_;
  std::vector<HeadStats> stats_;
  std::vector<LayerIoSample> layer_io_;
  std::shared_ptr<const StiefFits> stief_;
  std::shared_ptr<const LexicoDicts> lexico_;
};

}  // namespace kvtrim
