// StiefAttention calibration driver (see stief_train.h): per layer, prepare the sequences,
// train the candidates on the pool's threads (one job per side and rank), measure the error
// surface, EigenAttention's walk and the diagnostics, checkpoint, move on.
#include "calib/stief_train.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <exception>
#include <mutex>
#include <numeric>
#include <random>

#include "calib/calibration.h"
#include "calib/lowrank.h"
#include "calib/stief_checkpoint.h"
#include "calib/stief_layer.h"
#include "calib/stief_predictor.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "core/timer.h"
#include "ops/matmul.h"

namespace kvtrim {

std::string StiefTrainConfig::describe() const {
  std::string f;
  for (double x : fracs) f += strprintf("%s%g", f.empty() ? "" : ",", x);
  // init_noise only when set, so that the checkpoints of earlier runs keep their identity
  return strprintf("ranks=%s epochs=%d patience=%d delta=%g rows=%d val=%dx%d lr=%g wd=%g "
                   "hidden=%d init=%s eig_step=%g layers=%d seed=%llu",
                   f.c_str(), max_epochs, patience, min_delta, rows, val_seqs, val_rows, lr,
                   weight_decay, hidden, warm_start ? "eigen" : "random", eig_step, layers,
                   static_cast<unsigned long long>(seed)) +
         (init_noise > 0 ? strprintf(" init_noise=%g", init_noise) : std::string());
}

namespace {

std::vector<float> projector_of(const std::vector<float>& U, int d, int r) {
  const std::vector<float> Ur = first_columns(U, d, r);
  return projector(Ur.data(), d, r);
}

// Runs fn(job) for job in [0, n) on the pool's threads (dynamic), rethrowing the first error.
void run_jobs(ThreadPool* pool, int n, const std::function<void(int)>& fn) {
  std::atomic<int> next{0};
  std::exception_ptr err;
  std::mutex mu;
  auto worker = [&](int, int) {
    for (int j; (j = next.fetch_add(1)) < n;) {
      try {
        fn(j);
      } catch (...) {
        std::lock_guard<std::mutex> lk(mu);
        if (!err) err = std::current_exception();
        next = n;
      }
    }
  };
  if (pool && pool->n_threads() > 1) {
    pool->run(worker);
  } else {
    worker(0, 1);
  }
  if (err) std::rethrow_exception(err);
}

struct LayerData {
  const LayerWeightsF32* w = nullptr;
  std::vector<LayerSeq> seqs;
  int n_train = 0;
  std::vector<std::vector<int32_t>> val_rows;  // per held-out sequence
};

struct EvalResult {
  double err = 0, cos = 0, attn_err = 0;
};

// Relative output error over the held-out rows (and, with diag, the mean token cosine and the
// attention-output error against the uncompressed layer).
EvalResult evaluate(const LayerData& ld, const LayerProjectors& p, bool diag) {
  double e2 = 0, y2 = 0, cos_sum = 0, ae2 = 0, a2 = 0;
  int64_t n_cos = 0;
  LayerTape tape, full;
  const int64_t D = ld.w->n_embd;
  for (size_t v = 0; v < ld.val_rows.size(); ++v) {
    const LayerSeq& s = ld.seqs[static_cast<size_t>(ld.n_train) + v];
    const std::vector<int32_t>& rows = ld.val_rows[v];
    double se = 0, sy = 0;
    layer_forward(*ld.w, s, p, rows, &tape, &se, &sy);
    e2 += se;
    y2 += sy;
    if (!diag) continue;
    for (size_t i = 0; i < rows.size(); ++i) {
      const float* a = tape.out.data() + static_cast<int64_t>(i) * D;
      const float* b = s.y.data() + static_cast<int64_t>(rows[i]) * D;
      double ab = 0, aa = 0, bb = 0;
      for (int64_t j = 0; j < D; ++j) {
        ab += static_cast<double>(a[j]) * b[j];
        aa += static_cast<double>(a[j]) * a[j];
        bb += static_cast<double>(b[j]) * b[j];
      }
      cos_sum += aa > 0 && bb > 0 ? ab / std::sqrt(aa * bb) : 0.0;
      ++n_cos;
    }
    double fe = 0, fy = 0;
    layer_forward(*ld.w, s, LayerProjectors{}, rows, &full, &fe, &fy);
    for (size_t i = 0; i < tape.o.size(); ++i) {
      const double d = static_cast<double>(tape.o[i]) - full.o[i];
      ae2 += d * d;
      a2 += static_cast<double>(full.o[i]) * full.o[i];
    }
  }
  EvalResult r;
  r.err = y2 > 0 ? std::sqrt(e2 / y2) : 0.0;
  r.cos = n_cos > 0 ? cos_sum / static_cast<double>(n_cos) : 0.0;
  r.attn_err = a2 > 0 ? std::sqrt(ae2 / a2) : 0.0;
  return r;
}

std::vector<int32_t> sample_rows(int64_t n, int R, std::mt19937_64& rng) {
  std::vector<int32_t> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  if (R <= 0 || R >= n) return all;
  for (int i = 0; i < R; ++i) {
    std::uniform_int_distribution<int64_t> u(i, n - 1);
    std::swap(all[static_cast<size_t>(i)], all[static_cast<size_t>(u(rng))]);
  }
  all.resize(static_cast<size_t>(R));
  std::sort(all.begin(), all.end());
  return all;
}

struct SideResult {
  std::vector<std::vector<float>> U;  // one basis (keys) or one per kv head (values), [d, d]
  double val_err = 0;
  double start_err = 0;  // held-out error of the predictors' first output (before any step)
  int epochs = 0;
  int64_t steps = 0;
  double bwd_seconds = 0;
};

// Trains the predictors of one side at rank r (keys: one shared basis; values: one per kv head,
// trained together on the same loss).
SideResult train_side(const LayerData& ld, bool keys, int r,
                      const std::vector<std::vector<float>>& feats,
                      const std::vector<std::vector<float>>& inits, const StiefTrainConfig& cfg,
                      uint64_t seed) {
  const LayerWeightsF32& w = *ld.w;
  const int d = keys ? w.dk : w.dv;
  const size_t n_pred = feats.size();
  std::vector<BasisPredictor> preds;
  for (size_t h = 0; h < n_pred; ++h)
    preds.emplace_back(d, cfg.hidden, seed + 7919 * h,
                       cfg.warm_start ? inits[h] : std::vector<float>{});
  std::vector<std::vector<float>> U(n_pred), P(n_pred);
  auto predict = [&] {
    for (size_t h = 0; h < n_pred; ++h) {
      U[h] = preds[h].predict(feats[h]);
      P[h] = projector_of(U[h], d, r);
    }
  };
  auto projs = [&] {
    LayerProjectors p;
    auto& side = keys ? p.pk : p.pv;
    for (const auto& x : P) side.push_back(x.data());
    return p;
  };
  predict();
  SideResult res;
  res.U = U;
  res.val_err = res.start_err = evaluate(ld, projs(), false).err;
  std::mt19937_64 rng(seed);
  const int64_t total = static_cast<int64_t>(cfg.max_epochs) * ld.n_train;
  int bad = 0;
  LayerTape tape;
  std::vector<float> dout, gpk;
  std::vector<std::vector<float>> gpv;
  const int64_t D = w.n_embd;
  // A numerical failure (a singular or non-finite predicted matrix) ends this candidate's
  // training with its best basis so far; the epochs it ran are recorded.
  try {
  for (int epoch = 1; epoch <= cfg.max_epochs && ld.n_train > 0; ++epoch) {
    std::vector<int> order(static_cast<size_t>(ld.n_train));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (int si : order) {
      const LayerSeq& s = ld.seqs[static_cast<size_t>(si)];
      predict();
      const std::vector<int32_t> rows = sample_rows(s.n, cfg.rows, rng);
      double e2 = 0, y2 = 0;
      const LayerProjectors p = projs();
      layer_forward(w, s, p, rows, &tape, &e2, &y2);
      const double lr = cfg.lr * 0.5 * (1.0 + std::cos(M_PI * static_cast<double>(res.steps) /
                                                      static_cast<double>(std::max<int64_t>(1, total))));
      ++res.steps;
      if (!(e2 > 0) || !(y2 > 0)) continue;
      // ε = ‖f̂ − f‖ / ‖f‖  ⇒  ∂ε/∂f̂ = (f̂ − f) / (‖f̂ − f‖·‖f‖)
      const double c = 1.0 / (std::sqrt(e2) * std::sqrt(y2));
      dout.resize(tape.out.size());
      for (size_t i = 0; i < rows.size(); ++i)
        for (int64_t j = 0; j < D; ++j) {
          const size_t o = i * static_cast<size_t>(D) + static_cast<size_t>(j);
          dout[o] = static_cast<float>(c * (tape.out[o] - s.y[static_cast<size_t>(rows[i] * D + j)]));
        }
      const double tb = now_seconds();
      gpk.clear();
      gpv.clear();
      layer_backward(w, s, p, tape, dout, keys ? &gpk : nullptr, keys ? nullptr : &gpv);
      res.bwd_seconds += now_seconds() - tb;
      bool finite = true;
      for (float g : gpk) finite = finite && std::isfinite(g);
      for (const auto& G : gpv)
        for (float g : G) finite = finite && std::isfinite(g);
      if (!finite) continue;  // a step with a non-finite gradient is skipped
      for (size_t h = 0; h < n_pred; ++h) {
        const std::vector<float> Ur = first_columns(U[h], d, r);
        preds[h].backward(projector_grad_to_basis(keys ? gpk : gpv[h], Ur.data(), d, r), r);
        preds[h].step(lr, cfg.weight_decay);
      }
    }
    predict();
    const double val = evaluate(ld, projs(), false).err;
    res.epochs = epoch;
    if (val < res.val_err - cfg.min_delta) {
      res.val_err = val;
      res.U = U;
      bad = 0;
    } else if (++bad >= cfg.patience) {
      break;
    }
  }
  } catch (const Error& e) {
    std::fprintf(stderr, "stief: %s rank %d stopped early (%s); keeping its best basis\n",
                 keys ? "keys" : "values", r, e.what());
  }
  return res;
}

// The basis of the pooled EigenAttention Gram (Σ over kv heads of G_K + G_Q): the warm start of
// the shared key basis.
std::vector<float> pooled_key_init(const Calibration& cal, int il, int dk) {
  std::vector<double> G(static_cast<size_t>(dk) * dk, 0.0);
  for (int h = 0; h < cal.n_head_kv(); ++h) {
    const HeadStats& s = cal.stats(il, h);
    for (size_t i = 0; i < G.size(); ++i) G[i] += s.gram_k[i] + s.gram_q[i];
  }
  std::vector<float> U;
  top_eigenvectors(G.data(), dk, dk, &U, nullptr);
  return U;
}

// A perturbed warm start (StiefTrainConfig::init_noise): Q of QR(U + noise·G), G [d, d] with
// standard normal entries drawn from `seed` (each entry of U moved by noise·N(0, 1)), then
// orthonormal again.
std::vector<float> perturbed_basis(const std::vector<float>& U, int d, double noise, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> g(0.0, 1.0);
  std::vector<double> A(U.begin(), U.end()), Q, R;
  for (double& a : A) a += noise * g(rng);
  qr_positive(A, d, &Q, &R);
  return std::vector<float>(Q.begin(), Q.end());
}


}  // namespace

StiefFits train_stief(const Model& model, const Calibration& cal,
                      const std::vector<std::vector<int32_t>>& seqs, const StiefTrainConfig& cfg,
                      ThreadPool* pool, const std::string& checkpoint,
                      const std::function<void(const StiefLayerReport&)>& on_layer) {
  const HParams& hp = model.hparams();
  const int dk = hp.head_dim_k, dv = hp.head_dim_v, Hk = hp.n_head_kv;
  const int64_t D = hp.n_embd;
  KVTRIM_CHECK(cal.has(BasisMethod::kEigenAttention) && cal.has_stats(),
               "StiefAttention calibration needs the EigenAttention fits and statistics of the "
               "same calibration (run with --methods all or including eigenattention)");
  KVTRIM_CHECK(cfg.val_seqs >= 1 && static_cast<int>(seqs.size()) > cfg.val_seqs,
               "StiefAttention calibration: %zu sequences for %d held out (need at least one "
               "more to train on)", seqs.size(), cfg.val_seqs);
  KVTRIM_CHECK(cfg.max_epochs >= 1 && cfg.patience >= 1 && cfg.hidden >= 1 && cfg.val_rows >= 1 &&
                   cfg.eig_step > 0 && cfg.eig_step <= 0.5 && cfg.lr > 0,
               "StiefAttention calibration: invalid settings (%s)", cfg.describe().c_str());
  KVTRIM_CHECK(std::isfinite(cfg.init_noise) && cfg.init_noise >= 0 && (cfg.warm_start || cfg.init_noise == 0),
               "StiefAttention calibration: init_noise = %g must be >= 0 and perturbs the warm start "
               "(it needs warm_start)", cfg.init_noise);
  for (const auto& s : seqs)
    KVTRIM_CHECK(!s.empty(), "StiefAttention calibration: an empty calibration sequence");
  openblas_set_num_threads(1);  // the jobs below run on the pool's threads
  const int n_layer = cfg.layers > 0 ? std::min(cfg.layers, hp.n_layer) : hp.n_layer;

  StiefFits out;
  out.dk = dk;
  out.dv = dv;
  out.n_head_kv = Hk;
  out.ranks_k = candidate_ranks(cfg.fracs, dk);
  out.ranks_v = candidate_ranks(cfg.fracs, dv);
  KVTRIM_CHECK(out.ranks_k.size() == out.ranks_v.size() && !out.ranks_k.empty(),
               "StiefAttention calibration: the rank fractions give %zu key and %zu value ranks "
               "(head dims %d, %d); choose fractions that differ by at least 1/d",
               out.ranks_k.size(), out.ranks_v.size(), dk, dv);
  const int nc = out.n_cand();

  // Layer 0's inputs: the embeddings (gemma: scaled by sqrt(n_embd)).
  std::vector<std::vector<float>> X(seqs.size());
  const std::string identity = ck_identity(model, cal, cfg, seqs);
  StiefFits resumed;
  int start = 0;
  if (load_checkpoint(checkpoint, identity, n_layer, Hk, dk, dv, D, seqs, &resumed, &X)) {
    start = resumed.n_layer();
    out.layers = std::move(resumed.layers);
    std::fprintf(stderr, "stief: resuming from %s at layer %d of %d\n", checkpoint.c_str(), start,
                 n_layer);
  } else {
    for (size_t i = 0; i < seqs.size(); ++i) {
      X[i].resize(seqs[i].size() * static_cast<size_t>(D));
      for (size_t t = 0; t < seqs[i].size(); ++t) {
        KVTRIM_CHECK(seqs[i][t] >= 0 && seqs[i][t] < hp.n_vocab, "token id %d out of range",
                     seqs[i][t]);
        get_row(model.tok_embd(), seqs[i][t], X[i].data() + t * D);
        for (int64_t j = 0; j < D; ++j) X[i][t * D + j] *= hp.embd_scale;
      }
    }
  }

  for (int il = start; il < n_layer; ++il) {
    const double tl = now_seconds();
    StiefLayerReport rep;
    rep.layer = il;
    const LayerWeightsF32 w = layer_weights_f32(model, il);
    LayerData ld;
    ld.w = &w;
    ld.n_train = static_cast<int>(seqs.size()) - cfg.val_seqs;
    ld.seqs.resize(X.size());
    run_jobs(pool, static_cast<int>(X.size()), [&](int i) {
      ld.seqs[static_cast<size_t>(i)] =
          prepare_layer_seq(model, il, w, std::move(X[static_cast<size_t>(i)]), nullptr);
    });
    for (int v = 0; v < cfg.val_seqs; ++v) {
      const int64_t n = ld.seqs[static_cast<size_t>(ld.n_train + v)].n;
      const int64_t R = std::min<int64_t>(cfg.val_rows, n);
      std::vector<int32_t> rows;
      for (int64_t i = 0; i < R; ++i) {
        const int32_t t = static_cast<int32_t>(((2 * i + 1) * n) / (2 * R));
        if (rows.empty() || t > rows.back()) rows.push_back(t);
      }
      ld.val_rows.push_back(std::move(rows));
    }
    // Predictor inputs (training sequences only) and warm starts.
    std::vector<float> kall, vh;
    std::vector<std::vector<float>> kfeat, vfeat(static_cast<size_t>(Hk));
    for (int i = 0; i < ld.n_train; ++i)
      kall.insert(kall.end(), ld.seqs[i].k.begin(), ld.seqs[i].k.end());
    kfeat.push_back(basis_features(kall.data(), static_cast<int64_t>(kall.size()) / dk, dk, dk));
    kall.clear();
    kall.shrink_to_fit();
    for (int h = 0; h < Hk; ++h) {
      vh.clear();
      for (int i = 0; i < ld.n_train; ++i) {
        const LayerSeq& s = ld.seqs[static_cast<size_t>(i)];
        for (int64_t t = 0; t < s.n; ++t)
          vh.insert(vh.end(), s.v.begin() + t * Hk * dv + h * dv, s.v.begin() + t * Hk * dv + (h + 1) * dv);
      }
      vfeat[static_cast<size_t>(h)] = basis_features(vh.data(), static_cast<int64_t>(vh.size()) / dv, dv, dv);
    }
    std::vector<std::vector<float>> kinit{pooled_key_init(cal, il, dk)}, vinit;
    for (int h = 0; h < Hk; ++h) vinit.push_back(cal.fit(BasisMethod::kEigenAttention, il, h).v.enc);
    if (cfg.init_noise > 0) {
      const uint64_t ps = cfg.seed * 7919ULL + static_cast<uint64_t>(il) * 104729ULL;
      kinit[0] = perturbed_basis(kinit[0], dk, cfg.init_noise, ps);
      for (int h = 0; h < Hk; ++h)
        vinit[static_cast<size_t>(h)] = perturbed_basis(vinit[static_cast<size_t>(h)], dv, cfg.init_noise, ps + 1 + h);
    }

    // Train: one job per (side, candidate).
    StiefLayerFit L;
    L.key.resize(static_cast<size_t>(nc));
    L.value.resize(static_cast<size_t>(nc));
    L.key_err.resize(static_cast<size_t>(nc));
    L.value_err.resize(static_cast<size_t>(nc));
    L.key_epochs.resize(static_cast<size_t>(nc));
    L.value_epochs.resize(static_cast<size_t>(nc));
    L.key_start_err.resize(static_cast<size_t>(nc));
    L.value_start_err.resize(static_cast<size_t>(nc));
    std::mutex mu;
    run_jobs(pool, 2 * nc, [&](int job) {
      const bool keys = job % 2 == 0;
      const int i = job / 2;
      const uint64_t seed = cfg.seed * 1000003ULL + static_cast<uint64_t>(il) * 131 + static_cast<uint64_t>(job);
      SideResult r = train_side(ld, keys, keys ? out.ranks_k[i] : out.ranks_v[i],
                                keys ? kfeat : vfeat, keys ? kinit : vinit, cfg, seed);
      std::lock_guard<std::mutex> lk(mu);
      rep.steps += r.steps;
      rep.backward_seconds += r.bwd_seconds;
      if (keys) {
        L.key[i] = std::move(r.U[0]);
        L.key_err[i] = r.val_err;
        L.key_start_err[i] = r.start_err;
        L.key_epochs[i] = r.epochs;
      } else {
        L.value[i] = std::move(r.U);
        L.value_err[i] = r.val_err;
        L.value_start_err[i] = r.start_err;
        L.value_epochs[i] = r.epochs;
      }
    });

    // Error surface over every (key, value) rank pair, full rank included.
    std::vector<std::vector<float>> Pk(static_cast<size_t>(nc));
    std::vector<std::vector<std::vector<float>>> Pv(static_cast<size_t>(nc));
    for (int i = 0; i < nc; ++i) {
      Pk[i] = projector_of(L.key[i], dk, out.ranks_k[i]);
      for (int h = 0; h < Hk; ++h) Pv[i].push_back(projector_of(L.value[i][h], dv, out.ranks_v[i]));
    }
    auto stief_proj = [&](int i, int j) {
      LayerProjectors p;
      if (i < nc) p.pk.push_back(Pk[i].data());
      if (j < nc)
        for (int h = 0; h < Hk; ++h) p.pv.push_back(Pv[j][h].data());
      return p;
    };
    L.surface.assign(static_cast<size_t>((nc + 1) * (nc + 1)), 0.0);
    run_jobs(pool, (nc + 1) * (nc + 1) - 1, [&](int job) {
      const int i = job / (nc + 1), j = job % (nc + 1);
      L.surface[static_cast<size_t>(job)] = evaluate(ld, stief_proj(i, j), false).err;
    });

    // EigenAttention's walk: one energy threshold τ for the layer's keys and values, per head.
    const auto eig_proj = [&](const std::vector<int>& rk, const std::vector<int>& rv,
                              std::vector<std::vector<float>>* store) {
      store->clear();
      for (int h = 0; h < Hk; ++h) {
        const HeadFit& f = cal.fit(BasisMethod::kEigenAttention, il, h);
        store->push_back(projector(f.k.enc_cols(rk[h]).data(), dk, rk[h]));
      }
      for (int h = 0; h < Hk; ++h) {
        const HeadFit& f = cal.fit(BasisMethod::kEigenAttention, il, h);
        store->push_back(projector(f.v.enc_cols(rv[h]).data(), dv, rv[h]));
      }
      LayerProjectors p;
      for (int h = 0; h < Hk; ++h) p.pk.push_back((*store)[h].data());
      for (int h = 0; h < Hk; ++h) p.pv.push_back((*store)[Hk + h].data());
      return p;
    };
    std::vector<double> taus;
    std::vector<std::pair<std::vector<int>, std::vector<int>>> walk_ranks;
    for (int s = 0;; ++s) {
      const double tau = tau_round(std::min(1.0, 0.5 + cfg.eig_step * s));
      std::vector<int> rk, rv;
      for (int h = 0; h < Hk; ++h) {
        const HeadFit& f = cal.fit(BasisMethod::kEigenAttention, il, h);
        rk.push_back(f.k.rank_for_energy(tau));
        rv.push_back(f.v.rank_for_energy(tau));
      }
      if (walk_ranks.empty() || walk_ranks.back() != std::make_pair(rk, rv)) {
        taus.push_back(tau);
        walk_ranks.emplace_back(rk, rv);
      }
      if (tau >= 1.0) break;
    }
    L.eig_tau = taus;
    L.eig_err.assign(taus.size(), 0.0);
    run_jobs(pool, static_cast<int>(taus.size()), [&](int s) {
      std::vector<std::vector<float>> store;
      L.eig_err[static_cast<size_t>(s)] =
          evaluate(ld, eig_proj(walk_ranks[s].first, walk_ranks[s].second, &store), false).err;
    });

    // Diagnostics at the candidate nearest d/2, StiefAttention vs EigenAttention.
    const int i0 = out.half_index();
    L.diag.assign(kDiagCount, 0.0);
    EvalResult es, ee;
    run_jobs(pool, 2, [&](int job) {
      if (job == 0) {
        es = evaluate(ld, stief_proj(i0, i0), true);
      } else {
        std::vector<std::vector<float>> store;
        ee = evaluate(ld, eig_proj(std::vector<int>(Hk, out.ranks_k[i0]),
                                   std::vector<int>(Hk, out.ranks_v[i0]), &store), true);
      }
    });
    L.diag[kDiagStiefOutErr] = es.err;
    L.diag[kDiagStiefOutCos] = es.cos;
    L.diag[kDiagStiefAttnErr] = es.attn_err;
    L.diag[kDiagEigenOutErr] = ee.err;
    L.diag[kDiagEigenOutCos] = ee.cos;
    L.diag[kDiagEigenAttnErr] = ee.attn_err;
    out.layers.push_back(std::move(L));

    // The uncompressed outputs feed the next layer.
    for (size_t i = 0; i < X.size(); ++i) X[i] = std::move(ld.seqs[i].y);
    if (!checkpoint.empty()) save_checkpoint(checkpoint, identity, out, X, D);
    rep.seconds = now_seconds() - tl;
    if (on_layer) on_layer(rep);
  }
  return out;
}

}  // namespace kvtrim
