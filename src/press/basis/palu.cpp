// Palu (Chang et al. 2024, "Palu: Compressing KV-Cache with Low-Rank Projection",
// arXiv:2407.21118), the low-rank baseline OjaKV compares against, on the basis axis.
//
// Palu factors each kv head's key / value projection W_h [d, n_embd] ≈ L·R by a truncated SVD
// and caches the latent R·x instead of the key or value; the key is reconstructed as L·latent
// and RoPE is applied after the reconstruction (its fused kernel), the value's L is folded
// into the output projection. The span of L is the top-r left singular subspace of W_h·S:
//  - whiten=calib (default; the authors' code, compress.py → compress_model_whiten, after
//    SVD-LLM): S = chol(XᵀX) over the layer's inputs on calibration text, so the subspace is
//    the top eigenvectors of W_h XᵀX W_hᵀ = Σ_t k_t k_tᵀ, the second moment of the pre-RoPE
//    keys (values: of the values), read from the calibration file's statistics (`kvtrim
//    calibrate`, gram_k_pre / gram_v);
//  - whiten=none (the plain decomposition, S = I): the SVD of the weights alone, no
//    calibration: eigenvectors of W_h W_hᵀ.
// In kvtrim terms the latent is the coefficient vector of the key in that basis U_r: keys are
// stored as c = U_rᵀ k_pre, k_pre being the key before RoPE, and attention reads R_pos U_r c
// (SideSpec::rope, reconstructed per token in segment_attend.cpp); values as U_rᵀ v, summed in
// the latent space and lifted once (as every basis press).
//
// Options (defaults): ratio = 0.5 (fraction of each head's dimensions removed; ratio_k /
// ratio_v per side), energy = 0 (> 0: the smallest rank holding this fraction of the
// eigenvalues), whiten = calib, rope = pre (post: the same bases on the post-RoPE keys, the
// ablation that shows why Palu reconstructs before RoPE), group = 1, sinks / recent (dense
// anchors), prefill = lowrank | full, calib (the file). Where kvtrim departs from Palu, and why:
//  - group: Palu's default shares one latent among a group of 4 heads (G-LRD); kvtrim's cache
//    stores each kv head's tokens on their own, so only group = 1 (per head, the paper's
//    M-LRD) exists; another value is refused with this reason;
//  - biases (Qwen2): Palu adds the bias after the reconstruction, exactly; kvtrim's basis
//    stage has no offset, so the bias is part of what the basis approximates (whiten=calib:
//    the keys' second moment includes it; whiten=none: one more column of W_h); Gemma3's
//    per-head key norm weight scales W_h's rows (whiten=none; its RMS factor is a per-token
//    scalar, which leaves the span unchanged);
//  - the Fisher-information rank search and the latent quantization are not here: ranks follow
//    ratio / energy, and the precision axis (-ctk / -ctv) quantizes the latents.
// Maths and measurements: docs/presses-lowrank.md §Palu.
#include <map>
#include <mutex>
#include <utility>

#include "calib/calibration.h"
#include "calib/lowrank.h"
#include "core/error.h"
#include "model/model.h"
#include "ops/dequant.h"
#include "ops/nn.h"
#include "press/basis/lowrank_press.h"

namespace kvtrim {

namespace {

// Left singular vectors (all d, by decreasing singular value) and squared singular values of
// one kv head's projection rows W_h [d, n_embd] (rows ih·d ..), extended by the bias column and
// scaled by the per-head norm weight: eigenvectors of diag(w) (W_h W_hᵀ + b bᵀ) diag(w).
struct HeadSvd {
  std::vector<float> U;     // [d, d]
  std::vector<double> eig;  // [d]
};

HeadSvd weight_svd(const WeightView& W, const WeightView& bias, const WeightView& norm, int ih, int d) {
  const int64_t n = W.n_cols;
  KVTRIM_CHECK(W.data && W.n_rows >= static_cast<int64_t>(ih + 1) * d,
               "press 'palu': a projection holds %lld rows, kv head %d needs rows up to %lld",
               static_cast<long long>(W.n_rows), ih, static_cast<long long>(ih + 1) * d);
  std::vector<float> rows(static_cast<size_t>(d) * static_cast<size_t>(n));
  for (int i = 0; i < d; ++i)
    dequantize_row(W.type, static_cast<const uint8_t*>(W.data) + static_cast<size_t>(ih * d + i) * W.row_bytes,
                   rows.data() + static_cast<size_t>(i) * n, n);
  const float* b = bias.data ? static_cast<const float*>(bias.data) + static_cast<size_t>(ih) * d : nullptr;
  const float* w = norm.data ? static_cast<const float*>(norm.data) : nullptr;
  std::vector<double> G(static_cast<size_t>(d) * d);
  for (int i = 0; i < d; ++i)
    for (int j = i; j < d; ++j) {
      double g = dot(rows.data() + static_cast<size_t>(i) * n, rows.data() + static_cast<size_t>(j) * n, n);
      if (b) g += static_cast<double>(b[i]) * b[j];
      if (w) g *= static_cast<double>(w[i]) * w[j];
      G[static_cast<size_t>(i) * d + j] = G[static_cast<size_t>(j) * d + i] = g;
    }
  HeadSvd out;
  top_eigenvectors(G.data(), d, d, &out.U, &out.eig);
  return out;
}

// Rank of a side: the ratio's, or the smallest holding `energy` of the squared singular values.
int side_rank(const std::vector<double>& eig, double ratio, double energy) {
  const int d = static_cast<int>(eig.size());
  if (energy <= 0) return LowRankPress::rank_for_removed_ratio(ratio, d);
  double total = 0;
  for (double e : eig) total += std::max(0.0, e);
  double acc = 0;
  for (int r = 1; r <= d; ++r) {
    acc += std::max(0.0, eig[static_cast<size_t>(r - 1)]);
    if (acc >= energy * total) return r;
  }
  return d;
}

// The same from a calibration's Gram matrix G [d, d] (f64).
HeadSvd gram_eig(const std::vector<double>& G, int d, const char* what, int il, int ih) {
  KVTRIM_CHECK(G.size() == static_cast<size_t>(d) * d,
               "press 'palu': the calibration's %s statistics of layer %d kv head %d hold %zu values, "
               "expected %d x %d",
               what, il, ih, G.size(), d, d);
  HeadSvd out;
  top_eigenvectors(G.data(), d, d, &out.U, &out.eig);
  return out;
}

class PaluPress : public LowRankPress {
 public:
  PaluPress(LowRankConfig cfg, bool pre_rope, bool whiten)
      : LowRankPress(std::move(cfg)), pre_rope_(pre_rope), whiten_(whiten) {}

 protected:
  bool chooses_bases() const override { return true; }
  bool needs_calibration() const override { return whiten_; }

  void choose_bases(const PressContext& ctx, const Calibration* cal, int il, int ih,
                    ChosenBases* out) const override {
    std::pair<HeadSvd, HeadSvd> w;
    const std::pair<HeadSvd, HeadSvd>* sp = &w;
    if (whiten_) {
      KVTRIM_ASSERT(cal);
      KVTRIM_CHECK(cal->has_stats(),
                   "press 'palu': the calibration file holds no key / value statistics (whiten=calib "
                   "needs them): rerun kvtrim calibrate, or use whiten=none");
      const HeadStats& st = cal->stats(il, ih);
      w = {gram_eig(st.gram_k_pre, ctx.head_dim_k(), "pre-RoPE key", il, ih),
           gram_eig(st.gram_v, ctx.head_dim_v(), "value", il, ih)};
    } else {
      const Model* m = ctx.model();
      KVTRIM_CHECK(m, "press 'palu': no model weights in this context (whiten=none takes its bases "
                      "from the key / value projections)");
      sp = &svd(*m, il, ih);
    }
    const std::pair<HeadSvd, HeadSvd>& s = *sp;
    const LowRankConfig& c = config();
    out->rk = side_rank(s.first.eig, c.ratio_k >= 0 ? c.ratio_k : c.ratio, c.energy);
    out->rv = side_rank(s.second.eig, c.ratio_v >= 0 ? c.ratio_v : c.ratio, c.energy);
    out->ek = first_columns(s.first.U, ctx.head_dim_k(), out->rk);
    out->ev = first_columns(s.second.U, ctx.head_dim_v(), out->rv);
  }

  std::optional<RopeSpec> key_rope(const PressContext& ctx, int il) const override {
    if (!pre_rope_ || ctx.hparams().n_rot <= 0) return std::nullopt;
    return layer_rope(ctx.hparams(), il, ctx.cache().config().n_ctx);
  }

 private:
  // The (key, value) SVD of layer il's kv head ih, computed once per model.
  const std::pair<HeadSvd, HeadSvd>& svd(const Model& m, int il, int ih) const {
    std::lock_guard<std::mutex> lk(mu_);
    if (of_ != &m) {
      cache_.clear();
      of_ = &m;
    }
    auto it = cache_.find({il, ih});
    if (it != cache_.end()) return it->second;
    const HParams& hp = m.hparams();
    KVTRIM_CHECK(il >= 0 && il < static_cast<int>(m.layers().size()), "press 'palu': layer %d out of range", il);
    const LayerWeights& lw = m.layers()[static_cast<size_t>(il)];
    std::pair<HeadSvd, HeadSvd> s{weight_svd(lw.wk, lw.bk, lw.k_norm, ih, hp.head_dim_k),
                                  weight_svd(lw.wv, lw.bv, WeightView{}, ih, hp.head_dim_v)};
    return cache_.emplace(std::make_pair(il, ih), std::move(s)).first->second;
  }

  bool pre_rope_, whiten_;
  mutable std::mutex mu_;
  mutable const Model* of_ = nullptr;
  mutable std::map<std::pair<int, int>, std::pair<HeadSvd, HeadSvd>> cache_;
};

}  // namespace

PressInfo palu_press_info() {
  PressInfo i;
  i.name = "palu";
  i.description =
      "low-rank K/V in the top singular vectors of each kv head's key / value projection, whitened "
      "by the calibration inputs (whiten=none: the weights alone); keys cached before RoPE and "
      "reconstructed per token";
  i.paper =
      "Chang et al. 2024, Palu: Compressing KV-Cache with Low-Rank Projection (arXiv:2407.21118), "
      "per-head decomposition (M-LRD)";
  i.options.clear();
  for (PressOption& o : lowrank_options(LowRankDefaults{}, false))
    if (o.name != "hybrid" && o.name != "w") i.options.push_back(std::move(o));
  for (PressOption& o : i.options) {
    if (o.name == "energy")
      o.help = "> 0: rank = smallest holding this fraction of the decomposition's eigenvalues "
               "(overrides ratio)";
    if (o.name == "calib") o.help = "calibration file of whiten=calib (default: <model>.kvcalib)";
  }
  i.options.push_back({"whiten", "calib",
                       "calib: SVD of W·chol(XᵀX) over calibration inputs, i.e. the keys' / values' "
                       "second moment (the authors' code); none: SVD of the weights alone (no "
                       "calibration file)"});
  i.options.push_back({"rope", "pre",
                       "pre: keys cached before RoPE and reconstructed per token (Palu); post: the same "
                       "bases on the post-RoPE keys (ablation)"});
  i.options.push_back({"group", "1",
                       "kv heads per latent: only 1 (Palu's M-LRD); kvtrim stores each kv head on its own"});
  i.axis = PressAxis::kBasis;
  i.make = [](const PressArgs& a) -> std::unique_ptr<Press> {
    const int64_t group = a.get_int_min("group", 1);
    KVTRIM_CHECK(group == 1,
                 "press 'palu': group=%lld is not supported: a latent shared by several kv heads (Palu's "
                 "G-LRD / J-LRD) needs a cache segment spanning heads, and kvtrim stores each kv head "
                 "on its own; use group=1 (M-LRD)",
                 static_cast<long long>(group));
    const bool pre = a.get_choice<bool>("rope", {{"pre", true}, {"post", false}});
    const bool whiten = a.get_choice<bool>("whiten", {{"calib", true}, {"none", false}});
    LowRankConfig c = parse_lowrank_config(a, BasisMethod::kKSvd, false, false, /*error_anchors=*/false);
    return std::make_unique<PaluPress>(std::move(c), pre, whiten);
  };
  return i;
}

}  // namespace kvtrim
