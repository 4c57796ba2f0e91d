// StreamingLLM: keeps the first `sinks` tokens (attention sinks) and the most recent ones.
// Paper: Xiao et al. 2023, "Efficient Streaming Language Models with Attention Sinks"
// (arXiv:2309.17453); as kvpress's streaming_llm_press.py: a head keeping k tokens keeps its
// first min(sinks, k) stored tokens and its last k - min(sinks, k). Positions are not re-rotated
// (kept tokens keep their original positions, as in kvpress without KeyRerotationPress).
// Hyper-parameters (defaults): ratio = 0.5, budget = 0, sinks = 4.
#include "press/press.h"

namespace kvtrim {

namespace {

class StreamingLLMPress : public ScorerPress {
 public:
  StreamingLLMPress(Budget b, int64_t sinks) : ScorerPress(b), sinks_(sinks) {}
  std::string name() const override { return "streamingllm"; }
  void score_layer(const PressContext& ctx, int il, std::vector<std::vector<float>>* scores) const override {
    for (int ih = 0; ih < ctx.n_head_kv(); ++ih) {
      auto& sc = (*scores)[static_cast<size_t>(ih)];
      const int64_t n = ctx.n_tokens(il, ih);
      sc.resize(static_cast<size_t>(n));
      for (int64_t t = 0; t < n; ++t) sc[static_cast<size_t>(t)] = static_cast<float>(t);  // later = more recent
      protect_sinks_recent(&sc, sinks_, 0);
    }
  }

 private:
  int64_t sinks_;
};

}  // namespace

PressInfo streamingllm_press_info() {
  PressInfo i;
  i.name = "streamingllm";
  i.description = "keep the first `sinks` tokens and the most recent ones";
  i.paper = "Xiao et al. 2023, Efficient Streaming Language Models with Attention Sinks (arXiv:2309.17453)";
  i.options = budget_options();
  i.options.push_back({"sinks", "4", "initial tokens always kept (attention sinks)"});
  i.axis = PressAxis::kToken;
  i.make = [](const PressArgs& a) -> std::unique_ptr<Press> {
    return std::make_unique<StreamingLLMPress>(a.get_budget(), a.get_int_min("sinks", 0));
  };
  return i;
}

}  // namespace kvtrim
