// Low-rank (basis-axis) presses (DESIGN.md §3 "basis", §4.3 baselines, §4.5 OjaKV): every
// token is kept, keys and values are stored as coefficients in a rank-r basis per (layer,
// kv head), some tokens stay full-rank anchors. One implementation serves the four static
// calibration baselines (ksvd, eigenattention, kqsvd, staticpca: the calibration file's fit,
// truncated) and OjaKV (the EigenAttention fit adapted online by Oja's rule). The maths,
// options and defaults are in docs/presses-lowrank.md; the registrations (and each method's
// paper) are in static_bases.cpp and ojakv.cpp.
//
// When a head is compressed:
//   prefill=lowrank (default): plan_after_append, after each forward call appended a layer's
//     tokens and before attention reads them (the prefill's own attention reads the
//     compressed cache, as the papers' main experiments do);
//   prefill=full (OjaKV-PF): plan(), i.e. Session::compress() after the prefill.
// Each plan of a head encodes the tokens it still holds full-rank, except its anchors, in a
// new basis epoch. Anchors: the first `sinks` tokens, the last `recent` tokens, and the
// `hybrid` fraction of all the head's tokens with the largest query-weighted residual error
// (OjaKV §5.1), chosen among the tokens still full-rank. Heads that need no anchors and keep
// a fixed basis are planned once with appends_dense = false (later appends are encoded at
// once); OjaKV (and static presses with anchors) use appends_dense = true and the session's
// periodic plan_decode (every T decode steps) to encode the buffered tokens.
#pragma once
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "calib/calibration.h"
#include "press/calibration_source.h"
#include "press/press.h"

namespace kvtrim {

struct LowRankConfig {
  std::string name;                              // registry name (messages)
  BasisMethod method = BasisMethod::kStaticPca;  // the calibration fit used (OjaKV: EigenAttention)
  bool oja = false;                              // OjaKV: Oja updates of the basis
  double ratio =
      0.5;  // fraction of each head's K/V dimensions removed: r = max(1, round(d (1 - ratio)))
  double ratio_k = -1, ratio_v = -1;  // >= 0: per-side ratio replacing `ratio` for keys / values
  double energy = 0;  // > 0: rank = smallest holding this energy fraction (overrides ratio)
  std::string calib;  // calibration file ("" = <model gguf path minus .gguf>.kvcalib)
  bool prefill_lowrank = true;  // false: compress after prefill (prefill=full, OjaKV-PF)
  int64_t sinks = 0, recent = 0;
  double hybrid = 0;         // fraction of tokens kept full-rank by error-weighted top-k
  int64_t window = 32;       // w: queries of the error score
  int interval = 32;         // T: decode steps between updates (OjaKV; static with anchors)
  bool init_prompt = false;  // OjaKV init=prompt: PCA of the prompt instead of the calibration
  double eta = 0.1, eta_decode = 0.01;  // OjaKV learning rates (prefill, decode)
  int pool = 4;                         // p: average pooling of the Oja samples
  bool norm_spectral = true;  // Oja step on C / λ_max(C) (norm=spectral) or on C (norm=none)
  bool has_anchors() const { return sinks > 0 || recent > 0 || hybrid > 0; }
};

// The basis presses' common options and their parsing (defaults differ per press).
struct LowRankDefaults {
  const char* sinks = "0";
  const char* recent = "0";
  const char* hybrid = "0";
};
std::vector<PressOption> lowrank_options(const LowRankDefaults& d, bool oja);
// ratio_unset_ok: `ratio` may be -1 ("not given": a subclass chooses the ranks another way).
// error_anchors = false: a press without the error-scored anchors (Palu, whose keys the score
// cannot see): the options hybrid and w are not declared and keep their defaults.
LowRankConfig parse_lowrank_config(const PressArgs& a, BasisMethod method, bool oja,
                                   bool ratio_unset_ok = false, bool error_anchors = true);

class LowRankPress : public Press {
 public:
  explicit LowRankPress(LowRankConfig cfg);
  std::string name() const override { return cfg_.name; }
  const LowRankConfig& config() const { return cfg_; }
  PressNeeds needs() const override;
  CompressionPlan plan(const PressContext& ctx) const override;
  int decode_interval() const override;
  CompressionPlan plan_decode(const PressContext& ctx) const override;
  bool plans_after_append() const override { return cfg_.prefill_lowrank; }
  CompressionPlan plan_after_append(const PressContext& ctx, int il) const override;

  // The calibration this press uses for ctx's model (loaded once, checked against the model).
  // Throws Error when it is missing (naming the `kvtrim calibrate` command) or for another model.
  std::shared_ptr<const Calibration> calibration(const PressContext& ctx) const;
  std::string calibration_id(const Model& model) const override {
    return needs_calibration() ? cal_.identity(model) : "";
  }
  // Rank kept of a side of dimension d for the ratio option.
  static int rank_for_removed_ratio(double ratio, int d);

 protected:
  // Ranks and bases of a head seen for the first time, when a subclass chooses them itself
  // (StiefAttention's rank allocation, EigenAttention's error budget; chooses_bases() = true):
  // out->rk = out->rv = 0 leaves the head uncompressed (it is then not even read).
  struct ChosenBases {
    int rk = 0, rv = 0;
    std::vector<float> ek, ev;  // [d, r] orthonormal encoders
  };
  // cal: the calibration, null when needs_calibration() is false.
  virtual bool chooses_bases() const { return false; }
  virtual void choose_bases(const PressContext& ctx, const Calibration* cal, int il, int ih,
                            ChosenBases* out) const {}
  // False where the bases come from elsewhere (OjaKV init=prompt: the prompt; Palu whiten=none:
  // the model's weights).
  virtual bool needs_calibration() const { return !(cfg_.oja && cfg_.init_prompt); }
  // Set: the key bases describe layer il's keys before RoPE (plan.h SideSpec::rope).
  virtual std::optional<RopeSpec> key_rope(const PressContext& ctx, int il) const {
    return std::nullopt;
  }

 private:
  enum class Phase { kCompress, kAppend, kDecode };
  void plan_layer(const PressContext& ctx, int il, Phase phase, CompressionPlan* out) const;

  LowRankConfig cfg_;
  CalibrationSource cal_;
};

// EigenAttention under an error budget eps (stiefattention.cpp): per layer, the smallest energy
// threshold of the calibration's EigenAttention walk whose layer-output error is <= eps.
std::unique_ptr<Press> make_eigen_budget_press(LowRankConfig cfg, double eps);

// Query-weighted residual error of OjaKV §5.1 for tokens k [n, d] (post-RoPE) at positions pos
// [n] under a basis encoder E [d, r] / decoder D [d, r] (D empty: D = E): residual
// r_t = k_t − D Eᵀ k_t, e_t = (1 / |W_t|) Σ_{h in group, q in W_t} |q_h · r_t| / √d over the
// window queries that can see token t (causal, and within the layer's sliding window when
// window > 0); 0 when none can. q: [n_q, n_head, d] with positions q_pos; heads h of the
// group ih·g .. ih·g + g − 1.
std::vector<float> residual_error_scores(const float* k, const int32_t* pos, int64_t n, int d,
                                         const float* E, const float* D, int r,
                                         const ObservedQueries& q, int n_head, int ih, int g,
                                         int sliding_window);

}  // namespace kvtrim
