// StiefAttention (arXiv "Don't be so Stief! Learning KV Cache low-rank approximation over the
// Stiefel manifold"; DESIGN.md §4.3; docs/stiefattention.md) and EigenAttention under an error
// budget (the paper's baseline procedure). Both are basis-axis presses on LowRankPress: they
// only choose each layer's ranks and bases; storage, anchors and attention are shared.
//   stiefattention  bases learned against the decoder-layer output (`kvtrim calibrate --stief`),
//                   one key basis per layer shared by its kv heads, one value basis per kv head,
//                   per-layer ranks from the stored error surfaces under a budget eps:
//                   alloc = uniform | pareto | wpareto (default, the paper's); or fixed ranks
//                   with ratio (a trained candidate).
//   eigenattention:eps=E  per layer, the smallest energy threshold of EigenAttention's walk
//                   whose measured layer-output error is <= E (the StiefAttention paper's
//                   EigenAttention procedure), so the two compare at equal budgets.
#include <algorithm>
#include <cmath>
#include <mutex>

#include "calib/lowrank.h"
#include "calib/stief_fits.h"
#include "core/error.h"
#include "core/log.h"
#include "press/basis/lowrank_press.h"

namespace kvtrim {

namespace {

std::vector<float> identity(int d) {
  std::vector<float> I(static_cast<size_t>(d) * d, 0.f);
  for (int i = 0; i < d; ++i) I[static_cast<size_t>(i) * d + i] = 1.f;
  return I;
}

class StiefAttentionPress : public LowRankPress {
 public:
  StiefAttentionPress(LowRankConfig cfg, double eps, RankAlloc alloc)
      : LowRankPress(std::move(cfg)), eps_(eps), alloc_(alloc) {}

 protected:
  bool chooses_bases() const override { return true; }
  void choose_bases(const PressContext& ctx, const Calibration* calp, int il, int ih,
                    ChosenBases* out) const override {
    KVTRIM_ASSERT(calp);
    const StiefFits& f = calp->stief();
    KVTRIM_CHECK(f.n_head_kv == ctx.n_head_kv() && f.dk == ctx.head_dim_k() && f.dv == ctx.head_dim_v(),
                 "press '%s': the calibration's StiefAttention bases do not match the model's heads",
                 config().name.c_str());
    const int nc = f.n_cand();
    int ik = nc, iv = nc;
    const LowRankConfig& c = config();
    if (c.ratio >= 0 || c.ratio_k >= 0 || c.ratio_v >= 0) {
      ik = candidate_index(f.ranks_k, f.dk, c.ratio_k >= 0 ? c.ratio_k : c.ratio, "keys");
      iv = candidate_index(f.ranks_v, f.dv, c.ratio_v >= 0 ? c.ratio_v : c.ratio, "values");
    } else {
      const LayerRankChoice ch = allocation(f)[static_cast<size_t>(il)];
      ik = ch.ik;
      iv = ch.iv;
    }
    if (ik == nc && iv == nc) return;  // the layer stays uncompressed (rk = rv = 0)
    const StiefLayerFit& L = f.layers[static_cast<size_t>(il)];
    out->rk = f.rank_k(ik);
    out->rv = f.rank_v(iv);
    out->ek = ik < nc ? first_columns(L.key[static_cast<size_t>(ik)], f.dk, out->rk) : identity(f.dk);
    out->ev = iv < nc ? first_columns(L.value[static_cast<size_t>(iv)][static_cast<size_t>(ih)], f.dv, out->rv)
                      : identity(f.dv);
  }

 private:
  // The allocation over the calibration's surfaces, computed once per calibration.
  std::vector<LayerRankChoice> allocation(const StiefFits& f) const {
    std::lock_guard<std::mutex> lk(mu_);
    if (alloc_of_ != &f) {
      alloc_cache_ = allocate_ranks(f, alloc_, eps_);
      alloc_of_ = &f;
      // The chosen ranks and the paper's nominal KV ratio (r_k + r_v) / 2d (bases excluded;
      // what the cache holds is measured by bytes()).
      std::string ranks;
      double nominal = 0;
      for (const LayerRankChoice& c : alloc_cache_) {
        ranks += strprintf("%s%d/%d", ranks.empty() ? "" : " ", f.rank_k(c.ik), f.rank_v(c.iv));
        nominal += (static_cast<double>(f.rank_k(c.ik)) + f.rank_v(c.iv)) / (f.dk + f.dv);
      }
      nominal /= std::max<size_t>(1, alloc_cache_.size());
      KVTRIM_LOG_INFO("%s: eps=%g alloc=%s: ranks k/v per layer %s; nominal KV ratio %.3f",
                      config().name.c_str(), eps_, rank_alloc_name(alloc_), ranks.c_str(), nominal);
    }
    return alloc_cache_;
  }
  // The candidate whose rank is the ratio's (-1 or no removal: full rank).
  int candidate_index(const std::vector<int>& ranks, int d, double ratio, const char* side) const {
    if (ratio < 0 || ratio == 0) return static_cast<int>(ranks.size());
    const int r = rank_for_removed_ratio(ratio, d);
    for (size_t i = 0; i < ranks.size(); ++i)
      if (ranks[i] == r) return static_cast<int>(i);
    std::string list;
    for (int x : ranks) list += (list.empty() ? "" : ", ") + std::to_string(x);
    fail("press '%s': ratio %g keeps rank %d of the %s, which was not trained (trained ranks of "
         "d = %d: %s; or use eps)",
         config().name.c_str(), ratio, r, side, d, list.c_str());
  }
  double eps_;
  RankAlloc alloc_;
  mutable std::mutex mu_;
  mutable const StiefFits* alloc_of_ = nullptr;
  mutable std::vector<LayerRankChoice> alloc_cache_;
};

class EigenBudgetPress : public LowRankPress {
 public:
  EigenBudgetPress(LowRankConfig cfg, double eps) : LowRankPress(std::move(cfg)), eps_(eps) {}

 protected:
  bool chooses_bases() const override { return true; }
  void choose_bases(const PressContext& ctx, const Calibration* calp, int il, int ih,
                    ChosenBases* out) const override {
    KVTRIM_ASSERT(calp);
    const Calibration& cal = *calp;
    const double tau = thresholds(cal)[static_cast<size_t>(il)];
    const HeadFit& f = cal.fit(BasisMethod::kEigenAttention, il, ih);
    out->rk = f.k.rank_for_energy(tau);
    out->rv = f.v.rank_for_energy(tau);
    if (out->rk == f.k.d && out->rv == f.v.d) {
      out->rk = out->rv = 0;  // the full basis: leave the head uncompressed
      return;
    }
    out->ek = f.k.enc_cols(out->rk);
    out->ev = f.v.enc_cols(out->rv);
  }

 private:
  // Per-layer thresholds, computed (and logged with the paper's nominal KV ratio) once.
  std::vector<double> thresholds(const Calibration& cal) const {
    std::lock_guard<std::mutex> lk(mu_);
    if (tau_of_ != &cal) {
      taus_ = eigen_thresholds(cal.stief(), eps_);
      tau_of_ = &cal;
      std::string list;
      double nominal = 0;
      for (size_t il = 0; il < taus_.size(); ++il) {
        list += strprintf("%s%.2f", list.empty() ? "" : " ", taus_[il]);
        for (int h = 0; h < cal.n_head_kv(); ++h) {
          const HeadFit& f = cal.fit(BasisMethod::kEigenAttention, static_cast<int>(il), h);
          nominal += (static_cast<double>(f.k.rank_for_energy(taus_[il])) + f.v.rank_for_energy(taus_[il])) /
                     (f.k.d + f.v.d);
        }
      }
      nominal /= std::max<size_t>(1, taus_.size() * static_cast<size_t>(cal.n_head_kv()));
      KVTRIM_LOG_INFO("%s: eps=%g: energy thresholds per layer %s; nominal KV ratio %.3f",
                      config().name.c_str(), eps_, list.c_str(), nominal);
    }
    return taus_;
  }
  double eps_;
  mutable std::mutex mu_;
  mutable const Calibration* tau_of_ = nullptr;
  mutable std::vector<double> taus_;
};

}  // namespace

std::unique_ptr<Press> make_eigen_budget_press(LowRankConfig cfg, double eps) {
  return std::make_unique<EigenBudgetPress>(std::move(cfg), eps);
}

PressInfo stiefattention_press_info() {
  PressInfo i;
  i.name = "stiefattention";
  i.description =
      "low-rank K/V: bases learned against the decoder-layer output, per-layer ranks from error "
      "surfaces under a budget eps (kvtrim calibrate --stief)";
  i.paper =
      "StiefAttention: Don't be so Stief! Learning KV Cache low-rank approximation over the "
      "Stiefel manifold (DESIGN.md section 4.3)";
  i.options = {
      {"eps", "0.05",
       "error budget: per layer, the relative decoder-layer output error allowed (the paper's "
       "epsilon)"},
      {"alloc", "wpareto",
       "rank allocation under eps: uniform (one rank pair for all layers, mean error <= eps), "
       "pareto (per layer) or wpareto (Weighted Pareto: tighter budgets at the first and last "
       "four layers; the paper's default)"},
  };
  for (PressOption o : lowrank_options(LowRankDefaults{}, false)) {
    if (o.name == "energy") o.help = "not used by stiefattention (must stay 0)";
    if (o.name == "ratio") {
      o.default_value = "-1";
      o.help = "-1 = use eps; in [0, 1): fixed ranks for every layer, a trained candidate "
               "(r = round(d (1 - ratio)))";
    }
    i.options.push_back(o);
  }
  i.axis = PressAxis::kBasis;
  i.per_layer_budget = true;  // ranks per layer under eps (with ratio = -1, the default)
  // fixed ranks must be trained candidates (the tests' fits train 4, 8, 12 of 16); eps = 1 lets
  // every layer take the smallest pair
  i.test_easy = "stiefattention:ratio=0.5";
  i.test_hard = "stiefattention:eps=1";
  i.make = [](const PressArgs& a) -> std::unique_ptr<Press> {
    LowRankConfig c = parse_lowrank_config(a, BasisMethod::kEigenAttention, false, true);
    KVTRIM_CHECK(c.energy == 0, "press 'stiefattention': option 'energy' does not apply (use eps)");
    const double eps = a.get_double_in("eps", 0, 1e9, true);
    const RankAlloc alloc = parse_rank_alloc(a.get_string("alloc"));
    return std::make_unique<StiefAttentionPress>(std::move(c), eps, alloc);
  };
  return i;
}

}  // namespace kvtrim
