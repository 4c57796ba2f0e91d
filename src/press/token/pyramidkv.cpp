// PyramidKV: SnapKV scoring with per-layer budgets that shrink from the first layer to the
// last (a pyramid), the same total as SnapKV at the same ratio.
// Paper: Cai et al. 2024, "PyramidKV: Dynamic KV Cache Compression based on Pyramidal
// Information Funneling" (arXiv:2406.02069); budgets as kvpress's pyramidkv_press.py:
//   n = tokens of the head, W = window, L = layers, r = ratio (an absolute budget B is
//   read as r = 1 - B/n);
//   cap = W + n·(1-r); min = (cap - W)/beta; max = 2·(cap - W) - min;
//   if max >= n - W: max = n - W, min = 2·(cap - W) - max;
//   if not (n >= max >= min >= W): every layer keeps round(n·(1-r)) (SnapKV);
//   else layer il keeps round(max - il·(max - min)/(L - 1)).
// Hyper-parameters (defaults): ratio = 0.5, budget = 0, window = 32, kernel = 5, pool = max,
// query_aware = false (as snapkv), beta = 20 (pyramid steepness, >= 1).
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "press/token/snapkv.h"

namespace kvtrim {

namespace {

class PyramidKVPress : public SnapKVPress {
 public:
  PyramidKVPress(const SnapKVPress& base, double beta) : SnapKVPress(base), beta_(beta) {}
  std::string name() const override { return "pyramidkv"; }
  int64_t keep_count(const PressContext& ctx, int il, int64_t n_tok) const override {
    if (n_tok <= 0) return 0;
    const Budget& b = effective_budget(ctx);
    const double n = static_cast<double>(n_tok);
    const double r = b.n_keep > 0 ? std::max(0.0, 1.0 - static_cast<double>(b.n_keep) / n) : b.ratio;
    if (r <= 0) return n_tok;
    const double w = static_cast<double>(window());
    const double cap = w + n * (1 - r);
    double mn = (cap - w) / beta_;
    double mx = (cap - w) * 2 - mn;
    if (mx >= n - w) {
      mx = n - w;
      mn = (cap - w) * 2 - mx;
    }
    int64_t k;
    const int n_layer = ctx.n_layer();
    // kvpress rounds with Python's round(): halves to even (std::nearbyint in the default
    // rounding mode), not away from zero: a 49-token head at ratio 0.5 keeps 24, not 25.
    if (!(n >= mx && mx >= mn && mn >= w) || n_layer < 2) {
      k = static_cast<int64_t>(std::nearbyint(n * (1 - r)));
    } else {
      const double steps = (mx - mn) / static_cast<double>(n_layer - 1);
      k = static_cast<int64_t>(std::nearbyint(mx - static_cast<double>(il) * steps));
    }
    return std::clamp<int64_t>(k, 1, n_tok);
  }

 private:
  double beta_;
};

}  // namespace

PressInfo pyramidkv_press_info() {
  PressInfo i;
  i.name = "pyramidkv";
  i.description = "SnapKV scores with per-layer budgets decreasing pyramid-style (more in lower layers)";
  i.paper = "Cai et al. 2024, PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information Funneling (arXiv:2406.02069)";
  i.options = snapkv_press_options();
  i.options.push_back({"beta", "20", "pyramid steepness (>= 1): first layer keeps ~2x-1/beta, last ~1/beta of the mean"});
  i.axis = PressAxis::kToken;
  i.per_layer_budget = true;  // a pyramid of counts over layers
  i.make = [](const PressArgs& a) -> std::unique_ptr<Press> {
    auto base = make_snapkv_from_args(a);
    const double beta = a.get_double("beta");
    KVTRIM_CHECK(beta >= 1, "press '%s': option 'beta' = %g must be >= 1", a.press().c_str(), beta);
    return std::make_unique<PyramidKVPress>(*base, beta);
  };
  return i;
}

}  // namespace kvtrim
