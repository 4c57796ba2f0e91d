// SPARK: query-aware unstructured pruning of key channels, per token, with recovery of the pruned
// ones at attention time (the cache's per-token channel axis; DESIGN.md §4.2).
// Paper: Liao et al. 2025, "SPARK: Query-Aware Unstructured Sparsity with Recoverable KV Cache
// Channel Pruning" (papers/spark.txt); authors' code: Xnhyacinth/SparK,
// kvpress0/presses/adathink_press.py. Where they differ, both are options; the default is the
// code's (it produced the paper's tables):
//
//  saliency of channel c of token t (window = the last W post-RoPE queries of the KV group):
//    code  (default): w_tc = k_tc² · ‖Q̄[:, c]‖₂, Q̄ = the window's queries averaged over the group;
//    paper:           w_tc = |q̄_c| · |k_tc|, q̄ = their mean over the window.
//  channels kept per token (variant):
//    ratio (default): the top T of the token's saliencies, T from `ratio` (λ) and `count`;
//    p (SPARK-p):     the fewest channels whose saliency sum exceeds p (0.99) of the token's
//                     total (a variable count per token);
//    g (SPARK-g):     g = 4 or 5 groups. grouping=code (default, what the code does): a token is
//                     put in a group by how many channels SPARK-p would keep for it (n ≤ 0.25d,
//                     0.5d, 0.75d, else for g = 4; 0.2d … 0.8d for g = 5) and keeps int(r·d)
//                     channels, r = (0.25, 0.5, 0.75, 1.0) / (0.1, 0.3, 0.5, 0.7, 0.9);
//                     grouping=paper (the text): the token's channels sorted by saliency are cut
//                     into g equal segments and segment i loses the fraction r_i of its channels
//                     (the least salient), with the paper's pruning ratios (0.25 … 1.0) /
//                     (0.1 … 0.9).
//  recovery of a pruned key channel at attention time (sign(k_tc) is stored, one bit):
//    degenerate (default): k̃_tc = sign · F(μ_t) / ‖q‖_c where μ_t = the mean saliency of the
//                     token's pruned channels, F = sqrt for the code's metric (k̃² ‖q‖ = μ) and the
//                     identity for the paper's (|q̄| |k̃| = μ);
//    gaussian / exponential: each pruned (t, c) draws its own saliency from N(μ_t, σ_t²)
//                     (negative draws clamp to 0) / Exp(mean μ_t), the draw a seeded hash of
//                     (seed, μ_t, σ_t, c): the same at every step, nothing stored per coordinate.
//                     μ_t, σ_t (recovery_stats):
//      all (default): the mean and (population) standard deviation of the saliencies of all d
//                     channels of the token, Appendix A.2 eqs. 12–13 and the code's normal_attn /
//                     exponential_attn (scores.mean / scores.std over the channel axis; torch's
//                     std is the n−1 one, a factor sqrt(d/(d−1)) we do not copy);
//      pruned:        over the token's pruned channels only (eq. 11's set; kvtrim's first
//                     version, kept as an option).
//                     The code additionally rank-matches its draws to the saliency order and caps
//                     them at the kept threshold; not reproduced (it needs each pruned channel's
//                     rank at read time). Without it `all` draws fills far above the pruned
//                     entries (SmolLM2, λ = 0.8: PPL 20.6 -> 1176, docs/results/spark_think §3b):
//                     `pruned` is the working choice.
//    zero:            pruned channels read 0 (the ablation; no sign bits, no fill).
//  values (optional, value_ratio > 0; Appendix D): per token, the top channels by |v_tc|; the
//    pruned ones (value_recovery):
//      zero (default): are removed, i.e. read 0 (Appendix D: "pruned channels are removed from the
//                     cache", no value recovery);
//      mean:          read the token's mean pruned value (one float per token; kvtrim's first
//                     version, kept as an option).
// Hyper-parameters (defaults): ratio = 0.5, window = 32, saliency = code, variant = ratio,
// p = 0.99, groups = 4, grouping = code, recovery = degenerate, recovery_stats = all, seed = 0,
// value_ratio = 0, value_recovery = zero, count = code, query_aware = false (true: the
// question's queries are the window). Tokens appended later (decode) stay dense, as in the paper
// (prefill pruning).
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/thread_pool.h"
#include "press/channel/channel_common.h"

namespace kvtrim {

namespace {

enum class Saliency { kCode, kPaper };
enum class Variant { kRatio, kTopP, kGroups };
enum class Grouping { kCode, kPaper };
enum class Recovery { kDegenerate, kGaussian, kExponential, kZero };
enum class RecoveryStats { kAll, kPruned };  // the channels μ_t, σ_t of a sampled recovery run over
enum class ValueRecovery { kZero, kMean };

struct SparkOptions {
  double ratio = 0.5;
  int64_t window = 32;
  Saliency saliency = Saliency::kCode;
  Variant variant = Variant::kRatio;
  double p = 0.99;
  int groups = 4;
  Grouping grouping = Grouping::kCode;
  Recovery recovery = Recovery::kDegenerate;
  RecoveryStats recovery_stats = RecoveryStats::kAll;
  uint32_t seed = 0;
  double value_ratio = 0;
  ValueRecovery value_recovery = ValueRecovery::kZero;
  channel::CountRule count = channel::CountRule::kCode;
  bool query_aware = false;
  IndexLayout index = IndexLayout::kAuto;
};

// The per-token channel choice of one side: sal [d] -> kept channels (increasing).
class TokenChooser {
 public:
  TokenChooser(const SparkOptions& o, int d) : o_(o), d_(d), fixed_(channel::kept_channels(o.ratio, d, o.count)) {}
  // Fixed count (0 = variable).
  int fixed() const { return o_.variant == Variant::kRatio ? fixed_ : 0; }
  void choose(const float* sal, std::vector<int32_t>* kept) {
    order_.resize(static_cast<size_t>(d_));
    for (int c = 0; c < d_; ++c) order_[static_cast<size_t>(c)] = c;
    // decreasing saliency, ties to the lower index (a total order: any selection agrees with a
    // stable sort)
    const auto before = [sal](int32_t a, int32_t b) { return sal[a] > sal[b] || (sal[a] == sal[b] && a < b); };
    kept->clear();
    if (o_.variant == Variant::kRatio) {  // only the top T are needed, in any order
      std::nth_element(order_.begin(), order_.begin() + (fixed_ - 1), order_.end(), before);
      kept->assign(order_.begin(), order_.begin() + fixed_);
      std::sort(kept->begin(), kept->end());
      return;
    }
    std::sort(order_.begin(), order_.end(), before);
    if (o_.variant == Variant::kGroups && o_.grouping == Grouping::kPaper) {
      static const double r4[] = {0.25, 0.5, 0.75, 1.0}, r5[] = {0.1, 0.3, 0.5, 0.7, 0.9};
      const double* r = o_.groups == 4 ? r4 : r5;
      for (int gi = 0; gi < o_.groups; ++gi) {
        const int a = gi * d_ / o_.groups, b = (gi + 1) * d_ / o_.groups, len = b - a;
        const int keep = len - static_cast<int>(r[gi] * len);
        for (int j = 0; j < keep; ++j) kept->push_back(order_[static_cast<size_t>(a + j)]);
      }
      if (kept->empty()) kept->push_back(order_[0]);
    } else {
      int k = fixed_;
      if (o_.variant != Variant::kRatio) k = o_.variant == Variant::kTopP ? top_p_count(sal) : group_count(sal);
      kept->assign(order_.begin(), order_.begin() + k);
    }
    std::sort(kept->begin(), kept->end());
  }

 private:
  // SPARK-p: the first prefix of the sorted saliencies whose sum exceeds p of the total (as the
  // code: cumsum > p·total, first index + 1; a token with no saliency keeps its top channel).
  int top_p_count(const float* sal) const {
    double total = 0;
    for (int c = 0; c < d_; ++c) total += sal[c];
    double cum = 0;
    for (int j = 0; j < d_; ++j) {
      cum += sal[order_[static_cast<size_t>(j)]];
      if (cum > o_.p * total) return j + 1;
    }
    return 1;
  }
  // SPARK-g as the code does it: the group from SPARK-p's first index above the threshold.
  int group_count(const float* sal) const {
    const int idx = top_p_count(sal) - 1;
    static const double b4[] = {0.25, 0.5, 0.75}, k4[] = {0.25, 0.5, 0.75, 1.0};
    static const double b5[] = {0.2, 0.4, 0.6, 0.8}, k5[] = {0.1, 0.3, 0.5, 0.7, 0.9};
    const double* bounds = o_.groups == 4 ? b4 : b5;
    const double* keep = o_.groups == 4 ? k4 : k5;
    int g = 0;
    while (g < o_.groups - 1 && idx > static_cast<int>(bounds[g] * d_)) ++g;
    return std::clamp(static_cast<int>(keep[g] * d_), 1, d_);
  }

  const SparkOptions& o_;
  int d_, fixed_;
  std::vector<int32_t> order_;
};

class SparkPress : public Press {
 public:
  explicit SparkPress(SparkOptions o) : o_(o) {}
  std::string name() const override { return "spark"; }
  PressNeeds needs() const override {
    return prunes_keys() ? channel::window_needs(o_.query_aware, o_.window) : PressNeeds{};
  }
  CompressionPlan plan(const PressContext& ctx) const override {
    CompressionPlan plan(ctx.n_layer(), ctx.n_head_kv());
    if (!prunes_keys() && o_.value_ratio <= 0) return plan;
    std::vector<ObservedQueries> q(static_cast<size_t>(ctx.n_layer()));
    if (prunes_keys())
      for (int il = 0; il < ctx.n_layer(); ++il)
        q[static_cast<size_t>(il)] = channel::observed_queries(ctx, il, o_.query_aware, o_.window, "spark");
    // (layer, kv head) pairs are independent: spread over the pool
    const int64_t n_pairs = static_cast<int64_t>(ctx.n_layer()) * ctx.n_head_kv();
    const auto run = [&](int64_t b, int64_t e) {
      HeadData hd;
      for (int64_t i = b; i < e; ++i) {
        const int il = static_cast<int>(i / ctx.n_head_kv()), ih = static_cast<int>(i % ctx.n_head_kv());
        ctx.read_head(il, ih, &hd, prunes_keys(), o_.value_ratio > 0);
        if (hd.n == 0) continue;
        HeadPlan& hp = plan.at(il, ih);
        if (prunes_keys()) plan_keys(ctx, q[static_cast<size_t>(il)], ih, hd, &hp.key);
        if (o_.value_ratio > 0) plan_values(ctx, hd, &hp.value);
      }
    };
    for_range(ctx.pool(), n_pairs, 1, run);
    return plan;
  }

 private:
  bool prunes_keys() const {
    return o_.variant != Variant::kRatio || o_.ratio > 0;
  }

  void plan_keys(const PressContext& ctx, const ObservedQueries& q, int ih, const HeadData& hd,
                 SideSpec* sp) const {
    TokenChannels ch;
    TokenRows* out = &sp->rows;
    ch.index = o_.index;
    const int d = ctx.head_dim_k();
    const channel::WindowStats ws = channel::window_stats(q, ih, ctx.group(), ctx.n_head(), d);
    const bool code = o_.saliency == Saliency::kCode;
    const std::vector<double>& qn = code ? ws.mean_l2 : ws.mean_abs;
    TokenChooser chooser(o_, d);
    ch.topk = chooser.fixed();
    const bool rec = o_.recovery != Recovery::kZero;
    if (rec) {
      KeyRecovery& r = ch.recovery.emplace();
      r.scale.resize(static_cast<size_t>(d));
      for (int c = 0; c < d; ++c) {
        const double x = qn[static_cast<size_t>(c)];
        r.scale[static_cast<size_t>(c)] =
            x > 0 ? static_cast<float>(code ? 1.0 / std::sqrt(x) : 1.0 / x) : 0.f;
      }
      if (o_.recovery != Recovery::kDegenerate) {
        r.dist = o_.recovery == Recovery::kGaussian ? RecoveryDist::kGaussian
                                                    : RecoveryDist::kExponential;
        r.seed = o_.seed;
        r.sqrt = code;
      }
    }
    sp->channels = std::move(ch);
    std::vector<float> sal(static_cast<size_t>(d));
    std::vector<int32_t> kept;
    std::vector<char> in(static_cast<size_t>(d));
    for (int64_t t = 0; t < hd.n; ++t) {
      const float* k = hd.k.data() + t * d;
      for (int c = 0; c < d; ++c) {
        const double qc = qn[static_cast<size_t>(c)];
        sal[static_cast<size_t>(c)] = static_cast<float>(code ? static_cast<double>(k[c]) * k[c] * qc : std::abs(k[c]) * qc);
      }
      chooser.choose(sal.data(), &kept);
      out->channels.insert(out->channels.end(), kept.begin(), kept.end());
      if (chooser.fixed() == 0) out->counts.push_back(static_cast<int32_t>(kept.size()));
      if (!rec) continue;
      // The statistics of the saliencies: the pruned ones (degenerate; sampled with
      // recovery_stats=pruned) or all d of the token (sampled, recovery_stats=all: eqs. 12–13).
      const bool all = o_.recovery != Recovery::kDegenerate && o_.recovery_stats == RecoveryStats::kAll;
      std::fill(in.begin(), in.end(), 0);
      if (!all)
        for (int32_t c : kept) in[static_cast<size_t>(c)] = 1;
      double sum = 0, sq = 0;
      int np = 0;
      for (int c = 0; c < d; ++c) {
        if (in[static_cast<size_t>(c)]) continue;
        sum += sal[static_cast<size_t>(c)];
        sq += static_cast<double>(sal[static_cast<size_t>(c)]) * sal[static_cast<size_t>(c)];
        ++np;
      }
      const double mu = np ? sum / np : 0.0;
      const double sd = np ? std::sqrt(std::max(0.0, sq / np - mu * mu)) : 0.0;
      if (o_.recovery == Recovery::kDegenerate) {
        out->fill.push_back(static_cast<float>(code ? std::sqrt(mu) : mu));
      } else {
        out->fill.push_back(static_cast<float>(mu));
        if (o_.recovery == Recovery::kGaussian) out->spread.push_back(static_cast<float>(sd));
      }
    }
  }

  void plan_values(const PressContext& ctx, const HeadData& hd, SideSpec* sp) const {
    const int d = ctx.head_dim_v();
    const int T = channel::kept_channels(o_.value_ratio, d, o_.count);
    TokenChannels ch;
    ch.index = o_.index;
    ch.topk = T;
    ch.fill = o_.value_recovery != ValueRecovery::kZero;
    sp->channels = std::move(ch);
    TokenRows* out = &sp->rows;
    std::vector<float> mag(static_cast<size_t>(d));
    std::vector<int32_t> order, kept(static_cast<size_t>(T));
    std::vector<char> in(static_cast<size_t>(d));
    for (int64_t t = 0; t < hd.n; ++t) {
      const float* v = hd.v.data() + t * d;
      for (int c = 0; c < d; ++c) mag[static_cast<size_t>(c)] = std::abs(v[c]);
      channel::top_channels(mag.data(), d, T, &order, kept.data());
      out->channels.insert(out->channels.end(), kept.begin(), kept.end());
      if (o_.value_recovery == ValueRecovery::kZero) continue;  // removed: no fill, the cache reads 0
      std::fill(in.begin(), in.end(), 0);
      for (int32_t c : kept) in[static_cast<size_t>(c)] = 1;
      double sum = 0;
      for (int c = 0; c < d; ++c)
        if (!in[static_cast<size_t>(c)]) sum += v[c];
      out->fill.push_back(T < d ? static_cast<float>(sum / (d - T)) : 0.f);
    }
  }

  SparkOptions o_;
};


}  // namespace

PressInfo spark_press_info() {
  PressInfo i;
  i.name = "spark";
  i.description = "prune each token's least salient key channels and recover them at attention time";
  i.paper = "Liao et al. 2025, SPARK: Query-Aware Unstructured Sparsity with Recoverable KV Cache Channel Pruning";
  i.options = {{"ratio", "0.5", "fraction of key channels pruned per token (lambda), in [0, 1) (variant=ratio)"},
               {"window", "32", "observation window: the last W queries of the context"},
               {"saliency", "code", "code: k^2 * ||Q_window[:,c]||_2 (authors' code); paper: |mean q_c| * |k|"},
               {"variant", "ratio", "ratio (fixed T per token), p (SPARK-p: saliency mass p), g (SPARK-g)"},
               {"p", "0.99", "SPARK-p / SPARK-g: the saliency fraction a token's kept channels reach"},
               {"groups", "4", "SPARK-g: 4 or 5 groups"},
               {"grouping", "code", "SPARK-g: code (token grouped by its SPARK-p count) or paper (sorted segments)"},
               {"recovery", "degenerate", "pruned key channels read: degenerate (mean), gaussian, exponential, zero"},
               {"recovery_stats", "all",
                "gaussian / exponential: mean and deviation over all (the paper's eqs. 12-13, the code) "
                "or pruned channels of the token"},
               {"seed", "0", "seed of the gaussian / exponential draws"},
               {"value_ratio", "0", "fraction of value channels pruned per token by magnitude (0 = keys only)"},
               {"value_recovery", "zero",
                "pruned value channels read: zero (removed, as the paper) or mean (the token's mean pruned value)"},
               {"index", "auto", "kept channels: list (a uint8 index per kept channel), bitmask (d/8 bytes per token), "
                                 "auto (the smaller)"},
               channel::count_rule_option(), query_aware_option()};
  i.axis = PressAxis::kChannel;
  i.make = [](const PressArgs& a) -> std::unique_ptr<Press> {
    SparkOptions o;
    o.ratio = a.get_double_in("ratio", 0.0, 1.0, false);
    o.window = a.get_int_min("window", 1);
    o.saliency = a.get_choice<Saliency>("saliency", {{"code", Saliency::kCode}, {"paper", Saliency::kPaper}});
    o.variant = a.get_choice<Variant>("variant", {{"ratio", Variant::kRatio}, {"p", Variant::kTopP}, {"g", Variant::kGroups}});
    o.p = a.get_double_in("p", 0.0, 1.0, true);
    KVTRIM_CHECK(o.p > 0, "press 'spark': option 'p' = %g must be in (0, 1]", o.p);
    o.groups = static_cast<int>(a.get_int("groups"));
    KVTRIM_CHECK(o.groups == 4 || o.groups == 5, "press 'spark': option 'groups' = %d must be 4 or 5 (the paper's)",
                 o.groups);
    o.grouping = a.get_choice<Grouping>("grouping", {{"code", Grouping::kCode}, {"paper", Grouping::kPaper}});
    o.recovery = a.get_choice<Recovery>("recovery", {{"degenerate", Recovery::kDegenerate}, {"gaussian", Recovery::kGaussian},
                                                {"exponential", Recovery::kExponential}, {"zero", Recovery::kZero}});
    o.recovery_stats =
        a.get_choice<RecoveryStats>("recovery_stats", {{"all", RecoveryStats::kAll}, {"pruned", RecoveryStats::kPruned}});
    o.seed = a.get_uint32("seed");
    o.value_ratio = a.get_double_in("value_ratio", 0.0, 1.0, false);
    o.value_recovery =
        a.get_choice<ValueRecovery>("value_recovery", {{"zero", ValueRecovery::kZero}, {"mean", ValueRecovery::kMean}});
    o.count = channel::parse_count_rule(a);
    o.query_aware = a.get_bool("query_aware");
    o.index = a.get_choice<IndexLayout>("index", {{"auto", IndexLayout::kAuto},
                                                 {"list", IndexLayout::kList},
                                                 {"bitmask", IndexLayout::kBitmask}});
    return std::make_unique<SparkPress>(o);
  };
  return i;
}

}  // namespace kvtrim
