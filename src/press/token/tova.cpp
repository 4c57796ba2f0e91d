// TOVA: keeps the tokens the LAST query attends to, its attention averaged over all query
// heads of the layer (one ranking shared by every kv head).
// Paper: Oren et al. 2024, "Transformers are Multi-State RNNs" (TOVA, arXiv:2401.06104);
// as kvpress's tova_press.py: softmax(scale · q_last·k) over the stored tokens the last query
// sees, mean over the layer's n_head query heads; the last query's own token (positions >=
// its position) scores 2 (above any attention weight: always kept). If a composition left the kv heads of a layer with different
// tokens, the mean is taken over each kv head's own group instead.
// Query-aware (query_aware=true): the question's last query.
// Hyper-parameters (defaults): ratio = 0.5, budget = 0, query_aware = false.
#include <algorithm>
#include <limits>

#include "press/press.h"

namespace kvtrim {

namespace {

class TovaPress : public ScorerPress {
 public:
  TovaPress(Budget b, bool query_aware) : ScorerPress(b), query_aware_(query_aware) {}
  std::string name() const override { return "tova"; }
  PressNeeds needs() const override {
    PressNeeds n;
    if (query_aware_) n.question = true;
    else n.window = 1;
    return n;
  }
  void score_layer(const PressContext& ctx, int il, std::vector<std::vector<float>>* scores) const override {
    const ObservedQueries q = last_queries(ctx.queries(il, query_aware_, "tova"), 1);
    const int g = ctx.group(), nkv = ctx.n_head_kv();
    std::vector<HeadData> heads(static_cast<size_t>(nkv));
    bool same = true;
    for (int ih = 0; ih < nkv; ++ih) {
      ctx.read_head(il, ih, &heads[static_cast<size_t>(ih)], true, false);
      if (heads[static_cast<size_t>(ih)].idx != heads[0].idx) same = false;
    }
    std::vector<float> probs;
    std::vector<std::vector<float>> group_sum(static_cast<size_t>(nkv));
    for (int ih = 0; ih < nkv; ++ih) {
      const HeadData& hd = heads[static_cast<size_t>(ih)];
      attention_probs(ctx, il, ih, hd, q, &probs);
      auto& s = group_sum[static_cast<size_t>(ih)];
      s.assign(static_cast<size_t>(hd.n), 0.f);
      for (int gi = 0; gi < g; ++gi)
        for (int64_t t = 0; t < hd.n; ++t) s[static_cast<size_t>(t)] += probs[static_cast<size_t>(gi * hd.n + t)];
    }
    for (int ih = 0; ih < nkv; ++ih) {
      const HeadData& hd = heads[static_cast<size_t>(ih)];
      auto& sc = (*scores)[static_cast<size_t>(ih)];
      sc.assign(static_cast<size_t>(hd.n), 0.f);
      if (same) {
        for (int jh = 0; jh < nkv; ++jh)
          for (int64_t t = 0; t < hd.n; ++t) sc[static_cast<size_t>(t)] += group_sum[static_cast<size_t>(jh)][static_cast<size_t>(t)];
        for (auto& x : sc) x /= static_cast<float>(g * nkv);
      } else {
        for (int64_t t = 0; t < hd.n; ++t) sc[static_cast<size_t>(t)] = group_sum[static_cast<size_t>(ih)][static_cast<size_t>(t)] / static_cast<float>(g);
      }
      if (!query_aware_ && q.n > 0)
        for (int64_t t = 0; t < hd.n; ++t)
          if (hd.pos[static_cast<size_t>(t)] >= q.pos[0]) sc[static_cast<size_t>(t)] = 2.f;
    }
  }

 private:
  bool query_aware_;
};

}  // namespace

PressInfo tova_press_info() {
  PressInfo i;
  i.name = "tova";
  i.description = "keep what the last query attends to (averaged over all query heads)";
  i.paper = "Oren et al. 2024, Transformers are Multi-State RNNs (TOVA, arXiv:2401.06104)";
  i.options = budget_options();
  i.options.push_back(query_aware_option());
  i.axis = PressAxis::kToken;
  i.make = [](const PressArgs& a) -> std::unique_ptr<Press> {
    return std::make_unique<TovaPress>(a.get_budget(), a.get_bool("query_aware"));
  };
  return i;
}

}  // namespace kvtrim
