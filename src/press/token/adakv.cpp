// AdaKV: head-adaptive budgets. Wraps a scoring press (snapkv, tova, knorm, ...): within each
// layer, the tokens kept are the top of ONE ranking over all the layer's kv heads, so heads
// whose attention is concentrated give budget to heads whose attention is spread; a floor
// keeps at least alpha_safeguard of each head's own budget.
// Paper: Feng et al. 2024, "Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget Allocation
// for Efficient LLM Inference" (arXiv:2407.11550); as kvpress's adakv_press.py:
//   per head: k_h = the inner press's keep count; its top int(k_h · alpha_safeguard) tokens are
//   protected; the layer keeps its sum_h k_h best (protected first, then by score) tokens over
//   all heads. Ties: lower head, then earlier token.
// Syntax: adakv(snapkv:ratio=0.5,window=32):alpha_safeguard=0.2, or adakv:press=snapkv.
// Hyper-parameters (defaults): alpha_safeguard = 0.2 (in [0, 1]); the budget is the inner press's.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "press/press.h"

namespace kvtrim {

namespace {

class AdaKVPress : public Press {
 public:
  AdaKVPress(std::unique_ptr<Press> inner, double alpha) : alpha_(alpha) {
    scorer_.reset(dynamic_cast<ScorerPress*>(inner.get()));
    KVTRIM_CHECK(scorer_ != nullptr, "press 'adakv' wraps a scoring press (snapkv, pyramidkv, tova, h2o, knorm, ...), not '%s'",
                 inner->spec().c_str());
    inner.release();
  }
  std::string name() const override { return "adakv"; }
  PressNeeds needs() const override { return scorer_->needs(); }
  CompressionPlan plan(const PressContext& ctx) const override {
    CompressionPlan p(ctx.n_layer(), ctx.n_head_kv());
    const int nkv = ctx.n_head_kv();
    std::vector<std::vector<float>> scores;
    for (int il = 0; il < ctx.n_layer(); ++il) {
      std::vector<int64_t> n(static_cast<size_t>(nkv)), k(static_cast<size_t>(nkv));
      int64_t total = 0, keep_total = 0;
      for (int ih = 0; ih < nkv; ++ih) {
        n[static_cast<size_t>(ih)] = ctx.n_tokens(il, ih);
        k[static_cast<size_t>(ih)] = scorer_->keep_count(ctx, il, n[static_cast<size_t>(ih)]);
        total += n[static_cast<size_t>(ih)];
        keep_total += k[static_cast<size_t>(ih)];
      }
      if (keep_total >= total) continue;
      scores.assign(static_cast<size_t>(nkv), {});
      scorer_->score_layer(ctx, il, &scores);
      // Candidates (protected, score, head, token).
      struct Cand {
        bool prot;
        float score;
        int32_t head, tok;
      };
      std::vector<Cand> cands;
      cands.reserve(static_cast<size_t>(total));
      for (int ih = 0; ih < nkv; ++ih) {
        const auto& sc = scores[static_cast<size_t>(ih)];
        KVTRIM_CHECK(static_cast<int64_t>(sc.size()) == n[static_cast<size_t>(ih)], "adakv: inner press returned %zu scores for %lld tokens",
                     sc.size(), static_cast<long long>(n[static_cast<size_t>(ih)]));
        // kvpress 0.5.5: int(n_kept · alpha), at least 1 when alpha > 0 and the head keeps any
        int64_t n_safe = static_cast<int64_t>(static_cast<double>(k[static_cast<size_t>(ih)]) * alpha_);
        if (alpha_ > 0 && k[static_cast<size_t>(ih)] > 0) n_safe = std::max<int64_t>(1, n_safe);
        std::vector<int32_t> safe = top_k_indices(sc, n_safe);
        std::vector<char> is_safe(sc.size(), 0);
        for (int32_t t : safe) is_safe[static_cast<size_t>(t)] = 1;
        for (size_t t = 0; t < sc.size(); ++t)
          cands.push_back({is_safe[t] != 0, sc[t], ih, static_cast<int32_t>(t)});
      }
      auto better = [](const Cand& a, const Cand& b) {
        if (a.prot != b.prot) return a.prot;
        const bool na = std::isnan(a.score), nb = std::isnan(b.score);
        if (na != nb) return nb;
        if (!na && a.score != b.score) return a.score > b.score;
        if (a.head != b.head) return a.head < b.head;
        return a.tok < b.tok;
      };
      std::nth_element(cands.begin(), cands.begin() + keep_total, cands.end(), better);
      std::vector<std::vector<int32_t>> keep(static_cast<size_t>(nkv));
      for (int64_t i = 0; i < keep_total; ++i) keep[static_cast<size_t>(cands[static_cast<size_t>(i)].head)].push_back(cands[static_cast<size_t>(i)].tok);
      for (int ih = 0; ih < nkv; ++ih) {
        auto& kv = keep[static_cast<size_t>(ih)];
        HeadPlan& hp = p.at(il, ih);
        if (static_cast<int64_t>(kv.size()) >= n[static_cast<size_t>(ih)]) continue;  // keep_all
        if (kv.empty()) kv.push_back(static_cast<int32_t>(top_k_indices(scores[static_cast<size_t>(ih)], 1)[0]));  // never empty
        std::sort(kv.begin(), kv.end());
        hp.keep_all = false;
        hp.keep = std::move(kv);
      }
    }
    return p;
  }

 private:
  std::unique_ptr<ScorerPress> scorer_;
  double alpha_;
};

}  // namespace

PressInfo adakv_press_info() {
  PressInfo i;
  i.name = "adakv";
  i.wrapper = true;
  i.description = "head-adaptive budgets: one top-k over all kv heads of a layer, floor alpha_safeguard per head";
  i.paper = "Feng et al. 2024, Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget Allocation (arXiv:2407.11550)";
  i.options = {{"alpha_safeguard", "0.2", "each head keeps at least this fraction of its own budget, in [0, 1]"}};
  i.axis = PressAxis::kToken;
  i.make = [](const PressArgs& a) -> std::unique_ptr<Press> {
    const double alpha = a.get_double_in("alpha_safeguard", 0, 1, true);
    return std::make_unique<AdaKVPress>(a.take_inner(), alpha);
  };
  return i;
}

}  // namespace kvtrim
