#include "press/channel/channel_common.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace kvtrim::channel {

WindowStats window_stats(const ObservedQueries& q, int ih, int group, int n_head, int d) {
  WindowStats s;
  const size_t D = static_cast<size_t>(d);
  s.sq_mean.assign(D, 0.0);
  s.mean_l2.assign(D, 0.0);
  s.mean_abs.assign(D, 0.0);
  std::vector<double> gm(D), mean(D, 0.0);
  for (int64_t w = 0; w < q.n; ++w) {
    std::fill(gm.begin(), gm.end(), 0.0);
    for (int g = 0; g < group; ++g) {
      const float* row = q.query(w, ih * group + g, n_head, d);
      for (size_t c = 0; c < D; ++c) {
        gm[c] += row[c];
        s.sq_mean[c] += static_cast<double>(row[c]) * row[c];
      }
    }
    for (size_t c = 0; c < D; ++c) {
      gm[c] /= group;
      s.mean_l2[c] += gm[c] * gm[c];
      mean[c] += gm[c];
    }
  }
  const double nq = static_cast<double>(std::max<int64_t>(q.n, 1));
  for (size_t c = 0; c < D; ++c) {
    s.sq_mean[c] /= nq * group;
    s.mean_l2[c] = std::sqrt(s.mean_l2[c]);
    s.mean_abs[c] = std::abs(mean[c] / nq);
  }
  return s;
}

ObservedQueries observed_queries(const PressContext& ctx, int il, bool query_aware, int64_t window, const char* who) {
  return query_aware ? ctx.queries(il, true, who) : last_queries(ctx.queries(il, false, who), window);
}

PressNeeds window_needs(bool query_aware, int64_t window) {
  PressNeeds n;
  if (query_aware) {
    n.question = true;
  } else {
    n.window = window;
  }
  return n;
}

int kept_channels(double ratio, int d, CountRule rule) {
  int k = rule == CountRule::kCode ? d - static_cast<int>(ratio * d)
                                   : static_cast<int>(std::floor((1.0 - ratio) * d));
  return std::clamp(k, 1, d);
}

CountRule parse_count_rule(const PressArgs& a) {
  const std::string v = a.get_string("count");
  KVTRIM_CHECK(v == "code" || v == "paper", "press '%s': option 'count' = '%s' must be code or paper",
               a.press().c_str(), v.c_str());
  return v == "code" ? CountRule::kCode : CountRule::kPaper;
}

PressOption count_rule_option() {
  return {"count", "code",
          "channels kept for a ratio: code = d - int(ratio*d) (the authors' code, kvpress), paper = "
          "floor((1-ratio)*d)"};
}

void top_channels(const float* s, int d, int k, std::vector<int32_t>* order, int32_t* out) {
  order->resize(static_cast<size_t>(d));
  std::iota(order->begin(), order->end(), 0);
  std::stable_sort(order->begin(), order->end(), [s](int32_t a, int32_t b) { return s[a] > s[b]; });
  std::copy(order->begin(), order->begin() + k, out);
  std::sort(out, out + k);
}

}  // namespace kvtrim::channel
