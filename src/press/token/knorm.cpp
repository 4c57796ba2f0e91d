// Knorm: keeps the tokens whose keys have the SMALLEST L2 norm (a low key norm correlates
// with high attention). Paper: Devoto et al. 2024, "A Simple and Effective L2 Norm-Based
// Strategy for KV Cache Compression" (arXiv:2406.11430); kvpress knorm_press.py
// (score = -‖k‖). Query-agnostic, needs no observation.
// Hyper-parameters (defaults): ratio = 0.5, budget = 0.
#include <cmath>

#include "press/press.h"

namespace kvtrim {

namespace {

class KnormPress : public ScorerPress {
 public:
  explicit KnormPress(Budget b) : ScorerPress(b) {}
  std::string name() const override { return "knorm"; }
  void score_layer(const PressContext& ctx, int il, std::vector<std::vector<float>>* scores) const override {
    const size_t d = static_cast<size_t>(ctx.head_dim_k());
    HeadData hd;
    for (int ih = 0; ih < ctx.n_head_kv(); ++ih) {
      ctx.read_head(il, ih, &hd, true, false);
      auto& sc = (*scores)[static_cast<size_t>(ih)];
      sc.resize(static_cast<size_t>(hd.n));
      for (size_t t = 0; t < static_cast<size_t>(hd.n); ++t) {
        double ss = 0;
        for (size_t c = 0; c < d; ++c) ss += static_cast<double>(hd.k[t * d + c]) * hd.k[t * d + c];
        sc[t] = -static_cast<float>(std::sqrt(ss));
      }
    }
  }
};

}  // namespace

PressInfo knorm_press_info() {
  PressInfo i;
  i.name = "knorm";
  i.description = "keep the tokens with the smallest key L2 norm";
  i.paper = "Devoto et al. 2024, A Simple and Effective L2 Norm-Based Strategy for KV Cache Compression (arXiv:2406.11430)";
  i.options = budget_options();
  i.axis = PressAxis::kToken;
  i.make = [](const PressArgs& a) -> std::unique_ptr<Press> { return std::make_unique<KnormPress>(a.get_budget()); };
  return i;
}

}  // namespace kvtrim
