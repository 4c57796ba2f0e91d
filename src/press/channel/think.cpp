// ThinK: query-driven structured pruning of key channels. Each (layer, KV head) keeps one set of
// key channels for all of its tokens; the pruned channels are not stored (the cache's per-head
// channel subset: real bytes, where kvpress's ThinKPress zeroes them and keeps the shape).
// Paper: Xu et al. 2024, "ThinK: Thinner Key Cache by Query-Driven Pruning" (arXiv:2407.21018);
// scoring as kvpress's think_press.py (reviewed by ThinK's first author):
//   score_c = mean_w mean_g (q_wgc²) · mean_t (k_tc²)
// over the last `window` post-RoPE queries w of the KV head's group g and the head's (viewed)
// tokens t; the lowest-scoring channels are pruned (ties: the higher index is pruned).
// Hyper-parameters (defaults): ratio = 0.5 (λ, fraction of key channels pruned), window = 32,
// count = code (keep d − int(λ·d); paper: ⌊(1−λ)·d⌋), query_aware = false (true: the question's
// queries replace the window).
// Keys only; values and tokens are untouched. Appended tokens (decode) stay dense.
#include <cmath>

#include "core/error.h"
#include "press/channel/channel_common.h"

namespace kvtrim {

namespace {

class ThinKPress : public Press {
 public:
  ThinKPress(double ratio, int64_t window, channel::CountRule rule, bool query_aware)
      : ratio_(ratio), window_(window), rule_(rule), query_aware_(query_aware) {}
  std::string name() const override { return "think"; }
  PressNeeds needs() const override { return channel::window_needs(query_aware_, window_); }
  CompressionPlan plan(const PressContext& ctx) const override {
    CompressionPlan plan(ctx.n_layer(), ctx.n_head_kv());
    const int d = ctx.head_dim_k();
    const int keep = channel::kept_channels(ratio_, d, rule_);
    if (ratio_ <= 0 || keep >= d) return plan;
    HeadData hd;
    std::vector<float> score(static_cast<size_t>(d));
    std::vector<int32_t> order, kept;
    for (int il = 0; il < ctx.n_layer(); ++il) {
      const ObservedQueries q = channel::observed_queries(ctx, il, query_aware_, window_, "think");
      for (int ih = 0; ih < ctx.n_head_kv(); ++ih) {
        ctx.read_head(il, ih, &hd, true, false);
        if (hd.n == 0) continue;
        const channel::WindowStats ws = channel::window_stats(q, ih, ctx.group(), ctx.n_head(), d);
        std::vector<double> ksq(static_cast<size_t>(d), 0.0);
        for (int64_t t = 0; t < hd.n; ++t) {
          const float* k = hd.k.data() + t * d;
          for (int c = 0; c < d; ++c) ksq[static_cast<size_t>(c)] += static_cast<double>(k[c]) * k[c];
        }
        for (int c = 0; c < d; ++c)
          score[static_cast<size_t>(c)] = static_cast<float>(ws.sq_mean[static_cast<size_t>(c)] *
                                                             (ksq[static_cast<size_t>(c)] / static_cast<double>(hd.n)));
        HeadPlan& hp = plan.at(il, ih);
        kept.resize(static_cast<size_t>(keep));
        channel::top_channels(score.data(), d, keep, &order, kept.data());
        hp.key.channels = ChannelSubset{std::vector<uint16_t>(kept.begin(), kept.end())};
      }
    }
    return plan;
  }

 private:
  double ratio_;
  int64_t window_;
  channel::CountRule rule_;
  bool query_aware_;
};

}  // namespace

PressInfo think_press_info() {
  PressInfo i;
  i.name = "think";
  i.description = "prune the same key channels for every token of a head (query-driven, structured)";
  i.paper = "Xu et al. 2024, ThinK: Thinner Key Cache by Query-Driven Pruning (arXiv:2407.21018)";
  i.options = {{"ratio", "0.5", "fraction of key channels pruned per head (lambda), in [0, 1)"},
               {"window", "32", "observation window: the last W queries of the context"},
               channel::count_rule_option(), query_aware_option()};
  i.axis = PressAxis::kChannel;
  i.make = [](const PressArgs& a) -> std::unique_ptr<Press> {
    return std::make_unique<ThinKPress>(a.get_double_in("ratio", 0.0, 1.0, false), a.get_int_min("window", 1),
                                        channel::parse_count_rule(a), a.get_bool("query_aware"));
  };
  return i;
}

}  // namespace kvtrim
