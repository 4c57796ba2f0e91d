// The low-rank presses' shared implementation (see lowrank_press.h and
// docs/presses-lowrank.md): options, the calibration file (loaded once per press, checked
// against the model), rank selection, the Oja updates of OjaKV and the anchors (sinks, recent
// window, error-weighted top-k).
#include "press/basis/lowrank_press.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>

#include "calib/lowrank.h"
#include "core/error.h"
#include "model/gguf.h"

namespace kvtrim {

namespace {

using MatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapCF = Eigen::Map<const MatF>;

// Rows `rows` of X [n, d] as a new [rows.size(), d] matrix.
std::vector<float> gather_rows(const std::vector<float>& X, int d,
                               const std::vector<int32_t>& rows) {
  std::vector<float> out(rows.size() * static_cast<size_t>(d));
  for (size_t j = 0; j < rows.size(); ++j)
    std::copy_n(X.data() + static_cast<size_t>(rows[j]) * static_cast<size_t>(d), d,
                out.data() + j * static_cast<size_t>(d));
  return out;
}

// Top-r principal directions of the rows of X [n, d] (uncentred, as the calibration fits) and
// the eigenvalues of XᵀX (decreasing).
void prompt_pca(const std::vector<float>& X, int64_t n, int d, int r, std::vector<float>* U,
                std::vector<double>* eig) {
  std::vector<double> G(static_cast<size_t>(d) * static_cast<size_t>(d), 0.0);
  if (n > 0) {
    const MapCF Xm(X.data(), n, d);
    const Eigen::MatrixXd Gm = (Xm.transpose() * Xm).cast<double>();
    for (int a = 0; a < d; ++a)
      for (int b = 0; b < d; ++b)
        G[static_cast<size_t>(a) * static_cast<size_t>(d) + static_cast<size_t>(b)] = Gm(a, b);
  }
  top_eigenvectors(G.data(), d, r, U, eig);
}

// Scales the rows of X [n, d] so that C = XᵀX / n has largest eigenvalue 1 (no-op for X = 0).
void normalize_spectral(std::vector<float>* X, int d) {
  const int64_t n = static_cast<int64_t>(X->size()) / d;
  if (n == 0) return;
  const MapCF Xm(X->data(), n, d);
  const Eigen::MatrixXd C = (Xm.transpose() * Xm).cast<double>() / static_cast<double>(n);
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> es(C, Eigen::EigenvaluesOnly);
  const double lmax =
      es.eigenvalues().size() > 0 ? es.eigenvalues()(es.eigenvalues().size() - 1) : 0.0;
  if (!(lmax > 0) || !std::isfinite(lmax)) return;
  const float s = static_cast<float>(1.0 / std::sqrt(lmax));
  for (float& x : *X) x *= s;
}

int rank_for_eigen_energy(const std::vector<double>& eig, double frac) {
  double total = 0;
  for (double e : eig) total += std::max(0.0, e);
  if (total <= 0) return 1;
  double acc = 0;
  for (size_t r = 0; r < eig.size(); ++r) {
    acc += std::max(0.0, eig[r]);
    if (acc >= frac * total * (1 - 1e-12)) return static_cast<int>(r) + 1;
  }
  return static_cast<int>(eig.size());
}

}  // namespace


// ---------------------------------------------------------------------------------------
// Options

std::vector<PressOption> lowrank_options(const LowRankDefaults& d, bool oja) {
  std::vector<PressOption> o = {
      {"ratio", "0.5",
       "fraction of each head's K/V dimensions removed, in [0, 1): rank r = max(1, round(d (1 - "
       "ratio)))"},
      {"ratio_k", "-1", "keys' own ratio (>= 0 replaces ratio for the keys; -1 = ratio)"},
      {"ratio_v", "-1", "values' own ratio (>= 0 replaces ratio for the values; -1 = ratio)"},
      {"energy", "0", "> 0: rank = smallest holding this fraction of the energy (overrides ratio)"},
      {"calib", "", "calibration file (default: <model>.kvcalib next to the model's .gguf)"},
      {"prefill", "lowrank",
       "lowrank: compress during prefill (its attention reads the compressed cache); full: "
       "compress after prefill (OjaKV-PF)"},
      {"sinks", d.sinks, "first tokens kept full-rank"},
      {"recent", d.recent, "most recent tokens kept full-rank"},
      {"hybrid", d.hybrid,
       "fraction of tokens kept full-rank: the largest query-weighted residual errors"},
      {"w", "32", "queries (the last w) of the residual error score"},
      {"t", "32",
       oja ? "decode steps between Oja updates (the buffer size)"
           : "decode steps between re-encodings of the dense buffer (only with anchors)"},
  };
  if (oja) {
    o.push_back({"init", "calib",
                 "initial bases: calib (EigenAttention fit) or prompt (PCA of the prompt)"});
    o.push_back({"eta", "0.1", "Oja learning rate of the prefill update"});
    o.push_back({"eta_decode", "0.01", "Oja learning rate of the decode updates"});
    o.push_back({"pool", "4", "average pooling size p of the Oja samples"});
    o.push_back({"norm", "spectral",
                 "Oja step on C / lambda_max(C) (spectral: eta bounds the rotation, stable for "
                 "any key scale) or on C as written (none)"});
  }
  return o;
}

LowRankConfig parse_lowrank_config(const PressArgs& a, BasisMethod method, bool oja,
                                   bool ratio_unset_ok, bool error_anchors) {
  LowRankConfig c;
  c.name = a.press();
  c.method = method;
  c.oja = oja;
  c.ratio = a.get_double_in("ratio", ratio_unset_ok ? -1 : 0, 1, false);
  KVTRIM_CHECK(c.ratio == -1 || c.ratio >= 0, "press '%s': option 'ratio' must be -1 or in [0, 1)",
               c.name.c_str());
  c.ratio_k = a.get_double_in("ratio_k", -1, 1, false);
  c.ratio_v = a.get_double_in("ratio_v", -1, 1, false);
  KVTRIM_CHECK(c.ratio_k == -1 || c.ratio_k >= 0, "press '%s': option 'ratio_k' must be -1 or in [0, 1)", c.name.c_str());
  KVTRIM_CHECK(c.ratio_v == -1 || c.ratio_v >= 0, "press '%s': option 'ratio_v' must be -1 or in [0, 1)", c.name.c_str());
  c.energy = a.get_double_in("energy", 0, 1, true);
  c.calib = a.get_string("calib");
  const std::string pf = a.get_string("prefill");
  KVTRIM_CHECK(pf == "lowrank" || pf == "full",
               "press '%s': option 'prefill' = '%s' must be lowrank or full", c.name.c_str(),
               pf.c_str());
  c.prefill_lowrank = pf == "lowrank";
  c.sinks = a.get_int_min("sinks", 0);
  c.recent = a.get_int_min("recent", 0);
  if (error_anchors) {
    c.hybrid = a.get_double_in("hybrid", 0, 1, false);
    c.window = a.get_int_min("w", 1);
  }
  c.interval = static_cast<int>(std::min<int64_t>(a.get_int_min("t", 1), 1 << 30));
  if (oja) {
    const std::string init = a.get_string("init");
    KVTRIM_CHECK(init == "calib" || init == "prompt",
                 "press '%s': option 'init' = '%s' must be calib or prompt", c.name.c_str(),
                 init.c_str());
    c.init_prompt = init == "prompt";
    c.eta = a.get_double_in("eta", 0, 100, true);
    KVTRIM_CHECK(c.eta > 0, "press '%s': option 'eta' must be > 0", c.name.c_str());
    c.eta_decode = a.get_double_in("eta_decode", 0, 100, true);
    c.pool = static_cast<int>(std::min<int64_t>(a.get_int_min("pool", 1), 1 << 20));
    const std::string norm = a.get_string("norm");
    KVTRIM_CHECK(norm == "spectral" || norm == "none",
                 "press '%s': option 'norm' = '%s' must be spectral or none", c.name.c_str(),
                 norm.c_str());
    c.norm_spectral = norm == "spectral";
  }
  return c;
}

// ---------------------------------------------------------------------------------------
// Error score (OjaKV §5.1)

std::vector<float> residual_error_scores(const float* k, const int32_t* pos, int64_t n, int d,
                                         const float* E, const float* D, int r,
                                         const ObservedQueries& q, int n_head, int ih, int g,
                                         int sliding_window) {
  std::vector<float> out(static_cast<size_t>(n), 0.f);
  if (n == 0 || q.n == 0) return out;
  const MapCF K(k, n, d), Em(E, d, r), Dm(D ? D : E, d, r);
  const MatF R = K - (K * Em) * Dm.transpose();  // r_t = k_t − D Eᵀ k_t   [n, d]
  // The group's window queries as rows [g * n_q, d] (row gi * n_q + i).
  MatF Q(static_cast<Eigen::Index>(g) * q.n, d);
  for (int gi = 0; gi < g; ++gi)
    for (int64_t i = 0; i < q.n; ++i)
      Q.row(static_cast<Eigen::Index>(gi) * q.n + i) =
          Eigen::Map<const Eigen::RowVectorXf>(q.query(i, ih * g + gi, n_head, d), d);
  const MatF S = R * Q.transpose();  // [n, g * n_q]
  const double inv_sqrt_d = 1.0 / std::sqrt(static_cast<double>(d));
  for (int64_t t = 0; t < n; ++t) {
    double acc = 0;
    int64_t cnt = 0;
    for (int64_t i = 0; i < q.n; ++i) {
      const int32_t qp = q.pos[static_cast<size_t>(i)];
      if (pos[t] > qp || (sliding_window > 0 && qp - pos[t] >= sliding_window)) continue;
      for (int gi = 0; gi < g; ++gi)
        acc += std::abs(static_cast<double>(S(t, static_cast<Eigen::Index>(gi) * q.n + i)));
      cnt += g;
    }
    out[static_cast<size_t>(t)] =
        cnt > 0 ? static_cast<float>(acc * inv_sqrt_d / static_cast<double>(cnt)) : 0.f;
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// LowRankPress

LowRankPress::LowRankPress(LowRankConfig cfg) : cfg_(std::move(cfg)), cal_(cfg_.name, cfg_.calib) {}

int LowRankPress::rank_for_removed_ratio(double ratio, int d) {
  const int r = static_cast<int>(std::lround(static_cast<double>(d) * (1.0 - ratio)));
  return std::clamp(r, 1, d);
}

PressNeeds LowRankPress::needs() const {
  PressNeeds n;
  if (cfg_.hybrid > 0) n.window = cfg_.window;
  return n;
}

int LowRankPress::decode_interval() const {
  return cfg_.oja || cfg_.has_anchors() ? cfg_.interval : 0;
}

std::shared_ptr<const Calibration> LowRankPress::calibration(const PressContext& ctx) const {
  return cal_.get(ctx);
}

CompressionPlan LowRankPress::plan(const PressContext& ctx) const {
  CompressionPlan out(ctx.n_layer(), ctx.n_head_kv());
  for (int il = 0; il < ctx.n_layer(); ++il) plan_layer(ctx, il, Phase::kCompress, &out);
  return out;
}

CompressionPlan LowRankPress::plan_decode(const PressContext& ctx) const {
  CompressionPlan out(ctx.n_layer(), ctx.n_head_kv());
  for (int il = 0; il < ctx.n_layer(); ++il) plan_layer(ctx, il, Phase::kDecode, &out);
  return out;
}

CompressionPlan LowRankPress::plan_after_append(const PressContext& ctx, int il) const {
  CompressionPlan out(ctx.n_layer(), ctx.n_head_kv());
  KVTRIM_CHECK(il >= 0 && il < ctx.n_layer(), "press '%s': layer %d out of range",
               cfg_.name.c_str(), il);
  plan_layer(ctx, il, Phase::kAppend, &out);
  return out;
}

void LowRankPress::plan_layer(const PressContext& ctx, int il, Phase phase,
                              CompressionPlan* out) const {
  const int nkv = ctx.n_head_kv(), g = ctx.group();
  const int dk = ctx.head_dim_k(), dv = ctx.head_dim_v();
  const int sw = il < static_cast<int>(ctx.hparams().sliding_window.size())
                     ? ctx.hparams().sliding_window[static_cast<size_t>(il)]
                     : 0;
  struct Work {
    HeadData hd;
    KvCache::HeadLayout lay;
    std::vector<int32_t> epoch;  // per viewed token
    // With a basis, hd.k / hd.v hold only the dense tokens' rows: row_of[j] = the row of
    // viewed token j (-1: not read). Empty: hd.k / hd.v hold every token (row j = token j).
    std::vector<int32_t> row_of;
    std::vector<int32_t> rows(const std::vector<int32_t>& tokens) const {
      if (row_of.empty()) return tokens;
      std::vector<int32_t> r(tokens.size());
      for (size_t i = 0; i < tokens.size(); ++i)
        r[i] = row_of[static_cast<size_t>(tokens[i])];
      return r;
    }
    bool has_basis = false;
    bool custom = false;  // ranks and bases chosen by the subclass (choose_bases)
    bool skip = false;    // left uncompressed by the subclass
    int rk = 0, rv = 0;
    std::vector<float> ek, ev, dek, dev;  // encoders / decoders [d, r]
    std::vector<double> eig_k, eig_v;     // init=prompt eigenvalues (energy ranks)
  };
  std::vector<Work> w(static_cast<size_t>(nkv));
  bool any_first = false;
  std::shared_ptr<const Calibration> cal;
  for (int ih = 0; ih < nkv; ++ih) {
    Work& h = w[static_cast<size_t>(ih)];
    h.lay = ctx.cache().head_layout(il, ih);
    h.has_basis = h.lay.current_epoch >= 0;
    // A subclass choosing bases itself: before any read, so a head it leaves uncompressed costs
    // nothing at each plan.
    if (!h.has_basis && chooses_bases()) {
      if (!cal && needs_calibration()) cal = calibration(ctx);
      ChosenBases cb;
      choose_bases(ctx, cal.get(), il, ih, &cb);
      h.custom = true;
      h.skip = cb.rk == 0 || cb.rv == 0;
      if (h.skip) continue;
      KVTRIM_CHECK(cb.rk <= dk && cb.rv <= dv &&
                       cb.ek.size() == static_cast<size_t>(dk) * cb.rk &&
                       cb.ev.size() == static_cast<size_t>(dv) * cb.rv,
                   "press '%s': layer %d kv head %d: mis-shaped bases", cfg_.name.c_str(), il, ih);
      h.rk = cb.rk;
      h.rv = cb.rv;
      h.ek = std::move(cb.ek);
      h.ev = std::move(cb.ev);
    }
    // Once a head has a basis, only its dense tokens (buffer, anchors) are sampled or scored:
    // read every position but reconstruct only those (a full read costs U·c per stored token,
    // every plan_decode).
    ctx.read_head(il, ih, &h.hd, !h.has_basis, !h.has_basis);
    h.epoch.resize(static_cast<size_t>(h.hd.n));
    for (int64_t j = 0; j < h.hd.n; ++j)
      h.epoch[static_cast<size_t>(j)] =
          h.lay.epoch[static_cast<size_t>(h.hd.idx[static_cast<size_t>(j)])];
    if (h.has_basis) {
      std::vector<int32_t> dense;
      h.row_of.assign(static_cast<size_t>(h.hd.n), -1);
      for (int64_t j = 0; j < h.hd.n; ++j)
        if (h.epoch[static_cast<size_t>(j)] < 0) {
          h.row_of[static_cast<size_t>(j)] = static_cast<int32_t>(dense.size());
          dense.push_back(static_cast<int32_t>(j));
        }
      ctx.read_head_rows(il, ih, dense, &h.hd.k, &h.hd.v);
      KVTRIM_CHECK(!h.lay.basis_k.empty() && !h.lay.basis_v.empty(),
                   "press '%s': layer %d kv head %d already holds a channel epoch or a one-sided "
                   "basis from another "
                   "press (feature-axis presses do not compose with each other)",
                   cfg_.name.c_str(), il, ih);
      h.rk = h.lay.rank_k;
      h.rv = h.lay.rank_v;
      h.ek = h.lay.basis_k;
      h.ev = h.lay.basis_v;
      h.dek = h.lay.decoder_k;
      h.dev = h.lay.decoder_v;
    } else if (h.hd.n > 0) {
      any_first = true;
    }
  }

  // Initial bases of the heads seen for the first time.
  if (any_first) {
    if (!cal && needs_calibration()) cal = calibration(ctx);
    const BasisMethod m = cfg_.oja ? BasisMethod::kEigenAttention : cfg_.method;
    // Ranks: ratio, or energy (per head; OjaKV: the largest over the layer's heads, paper A.3).
    for (int ih = 0; ih < nkv; ++ih) {
      Work& h = w[static_cast<size_t>(ih)];
      if (h.has_basis || h.hd.n == 0 || h.custom) continue;
      if (cfg_.oja && cfg_.init_prompt) {
        prompt_pca(h.hd.k, h.hd.n, dk, dk, &h.ek, &h.eig_k);
        prompt_pca(h.hd.v, h.hd.n, dv, dv, &h.ev, &h.eig_v);
      }
      if (cfg_.energy > 0) {
        if (cal) {
          const HeadFit& f = cal->fit(m, il, ih);
          h.rk = f.k.rank_for_energy(cfg_.energy);
          h.rv = f.v.rank_for_energy(cfg_.energy);
        } else {
          h.rk = rank_for_eigen_energy(h.eig_k, cfg_.energy);
          h.rv = rank_for_eigen_energy(h.eig_v, cfg_.energy);
        }
      } else {
        h.rk = rank_for_removed_ratio(cfg_.ratio_k >= 0 ? cfg_.ratio_k : cfg_.ratio, dk);
        h.rv = rank_for_removed_ratio(cfg_.ratio_v >= 0 ? cfg_.ratio_v : cfg_.ratio, dv);
      }
    }
    if (cfg_.oja && cfg_.energy > 0) {
      int mk = 0, mv = 0;
      for (const Work& h : w)
        if (!h.has_basis && h.hd.n > 0) mk = std::max(mk, h.rk), mv = std::max(mv, h.rv);
      for (Work& h : w)
        if (!h.has_basis && h.hd.n > 0) h.rk = mk, h.rv = mv;
    }
    for (int ih = 0; ih < nkv; ++ih) {
      Work& h = w[static_cast<size_t>(ih)];
      if (h.has_basis || h.hd.n == 0 || h.custom) continue;
      if (cfg_.oja && cfg_.init_prompt) {
        // The prompt's own principal directions, first r of them.
        h.ek = first_columns(h.ek, dk, h.rk);
        h.ev = first_columns(h.ev, dv, h.rv);
      } else {
        const HeadFit& f = cal->fit(m, il, ih);
        KVTRIM_CHECK(f.k.d == dk && f.v.d == dv,
                     "press '%s': the calibration's fit of layer %d kv head %d has head dims "
                     "%d/%d, the model %d/%d",
                     cfg_.name.c_str(), il, ih, f.k.d, f.v.d, dk, dv);
        h.ek = f.k.enc_cols(h.rk);
        h.ev = f.v.enc_cols(h.rv);
        if (!f.k.orthonormal()) h.dek = f.k.dec_cols(h.rk);
        if (!f.v.orthonormal()) h.dev = f.v.dec_cols(h.rv);
      }
    }
  }

  for (int ih = 0; ih < nkv; ++ih) {
    Work& h = w[static_cast<size_t>(ih)];
    const int64_t n = h.hd.n;
    if (n == 0 || h.skip) continue;
    // A static basis without anchors encodes every append at once: nothing left to plan.
    if (h.has_basis && !cfg_.oja && !h.lay.appends_dense) continue;
    std::vector<int32_t> dense;
    for (int64_t j = 0; j < n; ++j)
      if (h.epoch[static_cast<size_t>(j)] < 0) dense.push_back(static_cast<int32_t>(j));

    if (cfg_.oja) {
      // Samples of the Oja step: every full-rank token the first time (the prompt: Algorithm 1
      // lines 2-5), else the tokens appended since the last plan (the chunk / decode buffer).
      std::vector<int32_t> samples;
      double eta = cfg_.eta;
      if (!h.has_basis) {
        samples = dense;
      } else {
        int32_t from = ctx.new_from();
        if (from < 0)
          from = phase == Phase::kDecode ? ctx.n_past() - cfg_.interval
                                         : std::numeric_limits<int32_t>::max();
        for (int32_t j : dense)
          if (h.hd.pos[static_cast<size_t>(j)] >= from) samples.push_back(j);
        if (phase == Phase::kDecode) eta = cfg_.eta_decode;
      }
      if (h.has_basis && samples.empty()) continue;  // nothing new: keep the current epoch
      if (!samples.empty()) {
        const std::vector<int32_t> rs = h.rows(samples);
        const std::vector<float> xk = gather_rows(h.hd.k, dk, rs),
                                 xv = gather_rows(h.hd.v, dv, rs);
        const int64_t ns = static_cast<int64_t>(samples.size());
        std::vector<float> pk = avg_pool_rows(xk.data(), ns, dk, cfg_.pool);
        std::vector<float> pv = avg_pool_rows(xv.data(), ns, dv, cfg_.pool);
        if (cfg_.norm_spectral) {
          normalize_spectral(&pk, dk);
          normalize_spectral(&pv, dv);
        }
        oja_update(h.ek.data(), dk, h.rk, pk.data(), static_cast<int64_t>(pk.size()) / dk, eta);
        oja_update(h.ev.data(), dv, h.rv, pv.data(), static_cast<int64_t>(pv.size()) / dv, eta);
      }
    }

    // Anchors among the tokens still full-rank.
    std::vector<char> anchor(static_cast<size_t>(n), 0), is_dense(static_cast<size_t>(n), 0);
    for (int32_t j : dense) is_dense[static_cast<size_t>(j)] = 1;
    for (int64_t j = 0; j < std::min<int64_t>(cfg_.sinks, n); ++j)
      if (is_dense[static_cast<size_t>(j)]) anchor[static_cast<size_t>(j)] = 1;
    for (int64_t j = std::max<int64_t>(0, n - cfg_.recent); j < n; ++j)
      if (is_dense[static_cast<size_t>(j)]) anchor[static_cast<size_t>(j)] = 1;
    const int64_t k_err = std::llround(cfg_.hybrid * static_cast<double>(n));
    if (k_err > 0) {
      std::vector<int32_t> cand;
      for (int32_t j : dense)
        if (!anchor[static_cast<size_t>(j)]) cand.push_back(j);
      if (!cand.empty()) {
        const ObservedQueries q =
            last_queries(ctx.queries(il, false, cfg_.name.c_str()), cfg_.window);
        const std::vector<float> kc = gather_rows(h.hd.k, dk, h.rows(cand));
        std::vector<int32_t> pc(cand.size());
        for (size_t j = 0; j < cand.size(); ++j) pc[j] = h.hd.pos[static_cast<size_t>(cand[j])];
        const std::vector<float> sc = residual_error_scores(
            kc.data(), pc.data(), static_cast<int64_t>(cand.size()), dk, h.ek.data(),
            h.dek.empty() ? nullptr : h.dek.data(), h.rk, q, ctx.n_head(), ih, g, sw);
        for (int32_t c : top_k_indices(sc, k_err))
          anchor[static_cast<size_t>(cand[static_cast<size_t>(c)])] = 1;
      }
    }
    int64_t n_encode = 0;
    for (int32_t j : dense) n_encode += anchor[static_cast<size_t>(j)] ? 0 : 1;
    // A fixed basis with nothing new to encode: no new epoch (it would only cost a basis copy).
    if (h.has_basis && !cfg_.oja && n_encode == 0) continue;

    HeadPlan& p = out->at(il, ih);
    p.keep_all = true;
    p.key.rank = h.rk;
    p.value.rank = h.rv;
    p.key.basis = h.ek;
    p.value.basis = h.ev;
    p.key.decoder = h.dek;
    p.value.decoder = h.dev;
    p.key.rope = key_rope(ctx, il);
    p.appends_dense = cfg_.oja || cfg_.has_anchors();
    for (int64_t j = 0; j < n; ++j)
      if (anchor[static_cast<size_t>(j)]) p.anchors.push_back(static_cast<int32_t>(j));
  }
}

}  // namespace kvtrim
