// ExpectedAttention: keeps the tokens that FUTURE queries are expected to attend to, from the
// statistics of the observed queries and the average RoPE rotation of the next positions.
// Paper: Devoto et al. 2025, "Expected Attention: KV cache compression by estimating attention
// from future queries distribution" (arXiv:2510.00636); as kvpress's expected_attention_press.py:
//   1. the last `window` captured queries of the layer (excluding positions < sinks) are
//      un-rotated to pre-RoPE queries; per query head: mean mu and covariance S (population);
//   2. R = the mean over the next n_future positions p = n_past .. n_past+n_future-1 of the
//      RoPE rotation R(p) (per rotary pair: mean cos, mean sin); mu' = R mu, S' = R S Rᵀ;
//   3. z(t) = scale · mu'·k_t + (cov ? scale²/2 · k_tᵀ S' k_t : 0) (kvpress: /√d and /(2d));
//      softmax over the head's stored tokens except sinks, mean over the group's query heads;
//   4. vnorm: score = (score + epsilon) · ‖v_t‖;
//   5. the first `sinks` positions score +inf.
// Query-aware (query_aware=true): the statistics come from the question's queries.
// Hyper-parameters (defaults): ratio = 0.5, budget = 0, window = 128 (queries for the
// statistics; kvpress uses the whole prompt), n_future = 512, sinks = 4, cov = true,
// vnorm = true, epsilon = 0, query_aware = false.
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/ggml_type.h"
#include "ops/matmul.h"
#include "ops/nn.h"
#include "press/press.h"

namespace kvtrim {

namespace {

class ExpectedAttentionPress : public ScorerPress {
 public:
  ExpectedAttentionPress(Budget b, int64_t window, int64_t n_future, int64_t sinks, bool cov, bool vnorm, double eps,
                         bool query_aware)
      : ScorerPress(b), window_(window), n_future_(n_future), sinks_(sinks), cov_(cov), vnorm_(vnorm), eps_(eps),
        query_aware_(query_aware) {}
  std::string name() const override { return "expected_attention"; }
  PressNeeds needs() const override {
    PressNeeds n;
    if (query_aware_) n.question = true;
    else n.window = window_;
    return n;
  }
  void score_layer(const PressContext& ctx, int il, std::vector<std::vector<float>>* scores) const override;

 private:
  int64_t window_, n_future_, sinks_;
  bool cov_, vnorm_;
  double eps_;
  bool query_aware_;
};

void ExpectedAttentionPress::score_layer(const PressContext& ctx, int il, std::vector<std::vector<float>>* scores) const {
  const HParams& hp = ctx.hparams();
  const ObservedQueries all = query_aware_ ? ctx.queries(il, true, "expected_attention")
                                           : last_queries(ctx.queries(il, false, "expected_attention"), window_);
  const int n_head = ctx.n_head(), g = ctx.group();
  const int d = ctx.head_dim_k();
  const size_t du = static_cast<size_t>(d);
  const RopeSpec rs = layer_rope(hp, il, ctx.cache().config().n_ctx);
  const int n_rot = hp.n_rot > 0 ? hp.n_rot : d;
  const float scale = hp.attn_scale > 0 ? hp.attn_scale : 1.f / std::sqrt(static_cast<float>(d));

  // 1. Pre-RoPE queries (un-rotate at their positions), sinks excluded.
  std::vector<int64_t> rows;
  for (int64_t i = 0; i < all.n; ++i)
    if (all.pos[static_cast<size_t>(i)] >= sinks_) rows.push_back(i);
  if (rows.empty())
    for (int64_t i = 0; i < all.n; ++i) rows.push_back(i);
  const size_t nq = rows.size();
  std::vector<double> pre(nq * static_cast<size_t>(n_head) * du);
  std::vector<float> tmp(du);
  for (size_t r = 0; r < nq; ++r)
    for (int h = 0; h < n_head; ++h) {
      std::copy_n(all.query(rows[r], h, n_head, d), du, tmp.data());
      rope(tmp.data(), rs, all.pos[static_cast<size_t>(rows[r])], /*inverse=*/true);
      for (size_t c = 0; c < du; ++c) pre[(r * static_cast<size_t>(n_head) + static_cast<size_t>(h)) * du + c] = tmp[c];
    }
  // 2. Mean rotation over the future positions: per rotary pair, mean cos / mean sin (times the
  // rotation's magnitude, YaRN's mscale: 1 for most models).
  const int half = n_rot / 2;
  const double mscale = rope_mscale(rs);
  std::vector<double> cbar(static_cast<size_t>(half), 0.0), sbar(static_cast<size_t>(half), 0.0);
  const int64_t p0 = ctx.n_past();
  for (int i = 0; i < half; ++i) {
    const double inv = rope_omega(rs, i);
    double cs = 0, ss = 0;
    for (int64_t p = p0; p < p0 + n_future_; ++p) {
      cs += std::cos(static_cast<double>(p) * inv);
      ss += std::sin(static_cast<double>(p) * inv);
    }
    cbar[static_cast<size_t>(i)] = mscale * cs / static_cast<double>(n_future_);
    sbar[static_cast<size_t>(i)] = mscale * ss / static_cast<double>(n_future_);
  }
  // R as a dense d x d matrix (identity beyond n_rot).
  std::vector<double> R(du * du, 0.0);
  for (size_t c = 0; c < du; ++c) R[c * du + c] = 1.0;
  for (int i = 0; i < half; ++i) {
    const size_t i0 = hp.rope_neox ? static_cast<size_t>(i) : static_cast<size_t>(2 * i);
    const size_t i1 = hp.rope_neox ? static_cast<size_t>(i + half) : static_cast<size_t>(2 * i + 1);
    const double c = cbar[static_cast<size_t>(i)], s = sbar[static_cast<size_t>(i)];
    R[i0 * du + i0] = c;
    R[i0 * du + i1] = -s;
    R[i1 * du + i0] = s;
    R[i1 * du + i1] = c;
  }

  const float inf = std::numeric_limits<float>::infinity();
  HeadData hd;
  // Per query head: mu (double), then S and the token scores as sgemm products in f32:
  //   S = Xcᵀ·Xc / nq with Xc the centred pre-RoPE queries (W = Xcᵀ [d, nq], x = Xcᵀ);
  //   [K·Sr | K·mu'] = K · [Sr ; mu'ᵀ]ᵀ (W = [Sr ; mu'ᵀ] [d + 1, d], x = K), then
  //   z_t = scale · (K·mu')_t + scale²/2 · Σ_a k_ta (K·Sr)_ta.
  std::vector<double> mu(du), mur(du), S(du * du), RS(du * du), Sr(du * du), z;
  std::vector<float> xct, sf(du * du), wz((du + 1) * du), kz;
  for (int ih = 0; ih < ctx.n_head_kv(); ++ih) {
    ctx.read_head(il, ih, &hd, true, vnorm_);
    const int64_t n = hd.n;
    auto& sc = (*scores)[static_cast<size_t>(ih)];
    sc.assign(static_cast<size_t>(n), 0.f);
    int64_t first = 0;  // tokens at positions < sinks are protected
    while (first < n && hd.pos[static_cast<size_t>(first)] < sinks_) ++first;
    z.assign(static_cast<size_t>(n), 0.0);
    for (int gi = 0; gi < g; ++gi) {
      const size_t h = static_cast<size_t>(ih * g + gi);
      std::fill(mu.begin(), mu.end(), 0.0);
      for (size_t r = 0; r < nq; ++r)
        for (size_t c = 0; c < du; ++c) mu[c] += pre[(r * static_cast<size_t>(n_head) + h) * du + c];
      for (auto& x : mu) x /= static_cast<double>(std::max<size_t>(nq, 1));
      for (size_t a = 0; a < du; ++a) {
        double acc = 0;
        for (size_t b = 0; b < du; ++b) acc += R[a * du + b] * mu[b];
        mur[a] = acc;
      }
      if (cov_) {
        xct.resize(du * nq);
        for (size_t r = 0; r < nq; ++r) {
          const double* x = pre.data() + (r * static_cast<size_t>(n_head) + h) * du;
          for (size_t a = 0; a < du; ++a) xct[a * nq + r] = static_cast<float>(x[a] - mu[a]);
        }
        std::fill(sf.begin(), sf.end(), 0.f);
        if (nq > 0) {
          const WeightView xw{GgmlType::F32, xct.data(), d, static_cast<int64_t>(nq), nq * sizeof(float)};
          matmul(xw, xct.data(), d, sf.data(), ctx.pool());  // [d, d] = Xcᵀ·Xc
        }
        for (size_t i = 0; i < du * du; ++i) S[i] = static_cast<double>(sf[i]) / static_cast<double>(std::max<size_t>(nq, 1));
        // Sr = R S Rᵀ (d³, double)
        for (size_t a = 0; a < du; ++a)
          for (size_t b = 0; b < du; ++b) {
            double acc = 0;
            for (size_t c = 0; c < du; ++c) acc += R[a * du + c] * S[c * du + b];
            RS[a * du + b] = acc;
          }
        for (size_t a = 0; a < du; ++a)
          for (size_t b = 0; b < du; ++b) {
            double acc = 0;
            for (size_t c = 0; c < du; ++c) acc += RS[a * du + c] * R[b * du + c];
            Sr[a * du + b] = acc;
          }
      }
      // W rows 0..d-1: Sr (symmetric, so its rows are its columns; zero without cov), row d: mu'.
      const size_t rows = cov_ ? du + 1 : 1;
      for (size_t a = 0; a < du; ++a) {
        if (cov_)
          for (size_t b = 0; b < du; ++b) wz[a * du + b] = static_cast<float>(Sr[a * du + b]);
        wz[(rows - 1) * du + a] = static_cast<float>(mur[a]);
      }
      const int64_t m = n - first;
      if (m <= 0) continue;
      kz.resize(static_cast<size_t>(m) * rows);
      const WeightView ww{GgmlType::F32, wz.data(), static_cast<int64_t>(rows), d, du * sizeof(float)};
      matmul(ww, hd.k.data() + static_cast<size_t>(first) * du, m, kz.data(), ctx.pool());
      double mx = -INFINITY;
      for (int64_t t = first; t < n; ++t) {
        const float* k = hd.k.data() + static_cast<size_t>(t) * du;
        const float* y = kz.data() + static_cast<size_t>(t - first) * rows;
        double s = static_cast<double>(y[rows - 1]) * scale;
        if (cov_) {
          double quad = 0;
          for (size_t a = 0; a < du; ++a) quad += static_cast<double>(k[a]) * y[a];
          s += static_cast<double>(scale) * scale / 2.0 * quad;
        }
        z[static_cast<size_t>(t)] = s;
        mx = std::max(mx, s);
      }
      double sum = 0;
      for (int64_t t = first; t < n; ++t) sum += std::exp(z[static_cast<size_t>(t)] - mx);
      for (int64_t t = first; t < n; ++t)
        sc[static_cast<size_t>(t)] += static_cast<float>(std::exp(z[static_cast<size_t>(t)] - mx) / sum / g);
    }
    if (vnorm_) {
      const size_t dv = static_cast<size_t>(ctx.head_dim_v());
      for (int64_t t = first; t < n; ++t) {
        double ss = 0;
        for (size_t c = 0; c < dv; ++c) ss += static_cast<double>(hd.v[static_cast<size_t>(t) * dv + c]) * hd.v[static_cast<size_t>(t) * dv + c];
        sc[static_cast<size_t>(t)] = static_cast<float>((sc[static_cast<size_t>(t)] + eps_) * std::sqrt(ss));
      }
    }
    for (int64_t t = 0; t < first; ++t) sc[static_cast<size_t>(t)] = inf;
  }
}

}  // namespace

PressInfo expected_attention_press_info() {
  PressInfo i;
  i.name = "expected_attention";
  i.description = "keep what future queries are expected to attend to (query statistics + mean RoPE of future positions)";
  i.paper = "Devoto et al. 2025, Expected Attention: KV cache compression by estimating attention from future queries distribution (arXiv:2510.00636)";
  i.options = budget_options();
  i.options.push_back({"window", "128", "captured queries the statistics are computed from"});
  i.options.push_back({"n_future", "512", "future positions whose RoPE rotation is averaged"});
  i.options.push_back({"sinks", "4", "initial positions always kept (and left out of the statistics)"});
  i.options.push_back({"cov", "true", "include the query covariance term"});
  i.options.push_back({"vnorm", "true", "multiply scores by the value norm"});
  i.options.push_back({"epsilon", "0", "added to scores before the value-norm rescaling"});
  i.options.push_back(query_aware_option());
  i.axis = PressAxis::kToken;
  i.make = [](const PressArgs& a) -> std::unique_ptr<Press> {
    return std::make_unique<ExpectedAttentionPress>(a.get_budget(), a.get_int_min("window", 1), a.get_int_min("n_future", 1),
                                                    a.get_int_min("sinks", 0), a.get_bool("cov"), a.get_bool("vnorm"),
                                                    a.get_double("epsilon"), a.get_bool("query_aware"));
  };
  return i;
}

}  // namespace kvtrim
