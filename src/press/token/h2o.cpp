// H2O / observed attention: keeps the "heavy hitters", the tokens that received the most
// attention during the forward passes seen so far (prefill, and decode steps if any).
// Paper: Zhang et al. 2023, "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of
// Large Language Models" (arXiv:2306.14048); scoring as kvpress's observed_attention_press.py:
// score(t) = (attention t received, summed over every query that saw it) / (number of those
// queries), averaged over the kv head's group of query heads. The session's observer
// accumulates it layer by layer from the captured queries (one head's attention rows of one
// chunk at a time: never the n x n matrix of every layer), see engine/press_runner.h.
// Optionally (H2O's recent window) the last `recent` tokens and the first `sinks` are kept.
// Hyper-parameters (defaults): ratio = 0.5, budget = 0, recent = 0, sinks = 0.
#include <algorithm>

#include "press/press.h"

namespace kvtrim {

namespace {

class H2OPress : public ScorerPress {
 public:
  H2OPress(Budget b, int64_t recent, int64_t sinks, std::string name)
      : ScorerPress(b), recent_(recent), sinks_(sinks), name_(std::move(name)) {}
  std::string name() const override { return name_; }
  PressNeeds needs() const override {
    PressNeeds n;
    n.cum_attn = true;
    return n;
  }
  void score_layer(const PressContext& ctx, int il, std::vector<std::vector<float>>* scores) const override {
    const float g = static_cast<float>(ctx.group());
    for (int ih = 0; ih < ctx.n_head_kv(); ++ih) {
      const std::vector<float> a = ctx.token_stat(TokenStat::kCumAttn, il, ih, name_.c_str());
      const std::vector<float> c = ctx.token_stat(TokenStat::kCumCount, il, ih, name_.c_str());
      auto& sc = (*scores)[static_cast<size_t>(ih)];
      sc.resize(a.size());
      for (size_t t = 0; t < a.size(); ++t) sc[t] = a[t] / (g * std::max(c[t], 1.f));
      protect_sinks_recent(&sc, sinks_, recent_);
    }
  }

 private:
  int64_t recent_, sinks_;
  std::string name_;
};

}  // namespace

PressInfo h2o_press_info() {
  PressInfo i;
  i.name = "h2o";
  i.description = "keep the heavy hitters: highest mean attention received so far (kvpress observed_attention)";
  i.paper = "Zhang et al. 2023, H2O: Heavy-Hitter Oracle for Efficient Generative Inference of LLMs (arXiv:2306.14048)";
  i.options = budget_options();
  i.options.push_back({"recent", "0", "most recent tokens always kept (H2O's recent window)"});
  i.options.push_back({"sinks", "0", "initial tokens always kept"});
  i.axis = PressAxis::kToken;
  i.make = [](const PressArgs& a) -> std::unique_ptr<Press> {
    return std::make_unique<H2OPress>(a.get_budget(), a.get_int_min("recent", 0), a.get_int_min("sinks", 0), "h2o");
  };
  return i;
}

}  // namespace kvtrim
