// StiefAttention's artefacts: rank allocation over the error surfaces and their calibration-file
// section (see stief_fits.h).
#include "calib/stief_fits.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"

namespace kvtrim {

namespace {

constexpr const char* kStiefKey = "kvtrim.calib.stief.";

std::string stief_tensor(int il, const char* what) { return "blk." + std::to_string(il) + ".stief." + what; }

}  // namespace

double tau_round(double tau) { return std::round(tau * 1e6) / 1e6; }

int StiefFits::half_index() const {
  int i0 = 0;
  for (int i = 0; i < n_cand(); ++i)
    if (std::abs(ranks_k[i] - dk / 2) < std::abs(ranks_k[i0] - dk / 2)) i0 = i;
  return i0;
}

namespace {

// max |UᵀU − I| of U [d, d] (columns orthonormal), or infinity when an entry is not finite.
double orthonormality_error(const std::vector<float>& U, int d) {
  for (float x : U)
    if (!std::isfinite(x)) return std::numeric_limits<double>::infinity();
  double m = 0;
  for (int a = 0; a < d; ++a)
    for (int b = a; b < d; ++b) {
      double s = 0;
      for (int i = 0; i < d; ++i)
        s += static_cast<double>(U[static_cast<size_t>(i) * d + a]) * U[static_cast<size_t>(i) * d + b];
      m = std::max(m, std::abs(s - (a == b ? 1.0 : 0.0)));
    }
  return m;
}

}  // namespace

void StiefFits::validate(int n_layer) const {
  const int nc = n_cand();
  KVTRIM_CHECK(nc >= 1 && ranks_v.size() == ranks_k.size(),
               "StiefAttention fits: %zu key and %zu value candidate ranks (need the same number, >= 1)",
               ranks_k.size(), ranks_v.size());
  for (int i = 0; i < nc; ++i) {
    KVTRIM_CHECK(ranks_k[i] >= 1 && ranks_k[i] < dk && (i == 0 || ranks_k[i] > ranks_k[i - 1]),
                 "StiefAttention fits: key candidate ranks must increase within [1, %d)", dk);
    KVTRIM_CHECK(ranks_v[i] >= 1 && ranks_v[i] < dv && (i == 0 || ranks_v[i] > ranks_v[i - 1]),
                 "StiefAttention fits: value candidate ranks must increase within [1, %d)", dv);
  }
  KVTRIM_CHECK(static_cast<int>(layers.size()) == n_layer,
               "StiefAttention fits cover %zu layers, the model has %d", layers.size(), n_layer);
  for (size_t il = 0; il < layers.size(); ++il) {
    const StiefLayerFit& L = layers[il];
    bool ok = L.key.size() == static_cast<size_t>(nc) && L.value.size() == static_cast<size_t>(nc) &&
              L.surface.size() == static_cast<size_t>((nc + 1) * (nc + 1)) &&
              L.eig_tau.size() == L.eig_err.size() && L.diag.size() == kDiagCount;
    for (int i = 0; ok && i < nc; ++i) {
      ok = L.key[i].size() == static_cast<size_t>(dk) * dk &&
           L.value[i].size() == static_cast<size_t>(n_head_kv);
      for (size_t h = 0; ok && h < L.value[i].size(); ++h)
        ok = L.value[i][h].size() == static_cast<size_t>(dv) * dv;
    }
    KVTRIM_CHECK(ok, "StiefAttention fits: layer %zu is mis-shaped", il);
    for (double e : L.surface)
      KVTRIM_CHECK(std::isfinite(e) && e >= 0, "StiefAttention fits: layer %zu has an error "
                   "surface entry that is negative or not finite", il);
    KVTRIM_CHECK(!L.eig_tau.empty(), "StiefAttention fits: layer %zu has no EigenAttention walk", il);
    for (size_t s = 0; s < L.eig_tau.size(); ++s)
      KVTRIM_CHECK(L.eig_tau[s] > 0 && L.eig_tau[s] <= 1 && (s == 0 || L.eig_tau[s] > L.eig_tau[s - 1]) &&
                       std::isfinite(L.eig_err[s]) && L.eig_err[s] >= 0,
                   "StiefAttention fits: layer %zu's EigenAttention walk has a threshold outside "
                   "(0, 1], not increasing, or an error that is negative or not finite", il);
    for (double x : L.diag)
      KVTRIM_CHECK(std::isfinite(x), "StiefAttention fits: layer %zu has a non-finite diagnostic", il);
    for (int i = 0; i < nc; ++i) {
      KVTRIM_CHECK(orthonormality_error(L.key[i], dk) < 1e-3,
                   "StiefAttention fits: layer %zu key basis %d is not orthonormal", il, i);
      for (size_t h = 0; h < L.value[i].size(); ++h)
        KVTRIM_CHECK(orthonormality_error(L.value[i][h], dv) < 1e-3,
                     "StiefAttention fits: layer %zu value basis %d of kv head %zu is not "
                     "orthonormal", il, i, h);
    }
  }
}

std::vector<int> candidate_ranks(const std::vector<double>& fracs, int d) {
  std::vector<int> out;
  for (double f : fracs) {
    KVTRIM_CHECK(f > 0 && f < 1, "candidate rank fraction %g must be in (0, 1)", f);
    const int r = std::clamp(static_cast<int>(std::lround(f * d)), 1, std::max(1, d - 1));
    if (r < d && std::find(out.begin(), out.end(), r) == out.end()) out.push_back(r);
  }
  std::sort(out.begin(), out.end());
  return out;
}

const char* rank_alloc_name(RankAlloc a) {
  switch (a) {
    case RankAlloc::kUniform: return "uniform";
    case RankAlloc::kPareto: return "pareto";
    case RankAlloc::kWeightedPareto: return "wpareto";
  }
  return "?";
}

RankAlloc parse_rank_alloc(const std::string& s) {
  for (RankAlloc a : {RankAlloc::kUniform, RankAlloc::kPareto, RankAlloc::kWeightedPareto})
    if (s == rank_alloc_name(a)) return a;
  fail("unknown rank allocation '%s' (use uniform, pareto or wpareto)", s.c_str());
}

std::vector<double> layer_weights(int n_layer) {
  static constexpr double kRamp[4] = {2.0, 1.75, 1.5, 1.25};
  std::vector<double> w(static_cast<size_t>(std::max(0, n_layer)), 1.0);
  for (int i = 0; i < n_layer; ++i) {
    const int from_end = std::min(i, n_layer - 1 - i);
    if (from_end < 4) w[static_cast<size_t>(i)] = kRamp[from_end];
  }
  double mean = 0;
  for (double x : w) mean += x;
  if (n_layer > 0) mean /= n_layer;
  for (double& x : w) x /= mean;
  return w;
}

namespace {

// The Pareto pick of one layer under budget eps: among pairs no other pair dominates (lower or
// equal total rank and error, one strictly), the smallest total rank with error <= eps.
LayerRankChoice pareto_pick(const StiefFits& f, int il, double eps) {
  const int n = f.n_cand() + 1;
  struct P {
    int i, j, total;
    double e;
  };
  std::vector<P> all;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) all.push_back({i, j, f.rank_k(i) + f.rank_v(j), f.surface(il, i, j)});
  LayerRankChoice best{n - 1, n - 1, f.surface(il, n - 1, n - 1)};
  int best_total = std::numeric_limits<int>::max();
  for (const P& p : all) {
    bool dominated = false;
    for (const P& o : all)
      if (o.total <= p.total && o.e <= p.e && (o.total < p.total || o.e < p.e)) {
        dominated = true;
        break;
      }
    if (dominated || p.e > eps) continue;
    if (p.total < best_total || (p.total == best_total && p.e < best.err)) {
      best = {p.i, p.j, p.e};
      best_total = p.total;
    }
  }
  return best;
}

}  // namespace

std::vector<LayerRankChoice> allocate_ranks(const StiefFits& f, RankAlloc a, double eps) {
  KVTRIM_CHECK(eps >= 0 && std::isfinite(eps), "error budget eps = %g must be >= 0", eps);
  const int L = f.n_layer(), n = f.n_cand() + 1;
  std::vector<LayerRankChoice> out(static_cast<size_t>(L));
  if (a == RankAlloc::kUniform) {
    int bi = n - 1, bj = n - 1, best_total = std::numeric_limits<int>::max();
    double best_mean = std::numeric_limits<double>::infinity();
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        double mean = 0;
        for (int il = 0; il < L; ++il) mean += f.surface(il, i, j);
        mean /= std::max(1, L);
        const int total = f.rank_k(i) + f.rank_v(j);
        if (mean > eps) continue;
        if (total < best_total || (total == best_total && mean < best_mean)) {
          bi = i, bj = j, best_total = total, best_mean = mean;
        }
      }
    for (int il = 0; il < L; ++il) out[static_cast<size_t>(il)] = {bi, bj, f.surface(il, bi, bj)};
    return out;
  }
  const std::vector<double> w = a == RankAlloc::kWeightedPareto ? layer_weights(L)
                                                                 : std::vector<double>(L, 1.0);
  for (int il = 0; il < L; ++il) out[static_cast<size_t>(il)] = pareto_pick(f, il, eps / w[il]);
  return out;
}

std::vector<double> eigen_thresholds(const StiefFits& f, double eps) {
  std::vector<double> out;
  for (const StiefLayerFit& L : f.layers) {
    double tau = 1.0;
    for (size_t s = 0; s < L.eig_tau.size(); ++s)
      if (L.eig_err[s] <= eps) {
        tau = L.eig_tau[s];
        break;
      }
    out.push_back(tau);
  }
  return out;
}

void stief_write(const StiefFits& f, GgufWriter& w, std::vector<CalibTensor>* ts) {
  f.validate(f.n_layer());
  w.set_u32(std::string(kStiefKey) + "n_cand", static_cast<uint32_t>(f.n_cand()));
  w.set_array_i32(std::string(kStiefKey) + "ranks_k", std::vector<int32_t>(f.ranks_k.begin(), f.ranks_k.end()));
  w.set_array_i32(std::string(kStiefKey) + "ranks_v", std::vector<int32_t>(f.ranks_v.begin(), f.ranks_v.end()));
  const int nc = f.n_cand(), H = f.n_head_kv;
  auto flt = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
  for (int il = 0; il < f.n_layer(); ++il) {
    const StiefLayerFit& L = f.layers[static_cast<size_t>(il)];
    CalibTensor k{stief_tensor(il, "k"), {f.dk, f.dk, nc}, {}}, v{stief_tensor(il, "v"), {f.dv, f.dv, H, nc}, {}};
    for (int i = 0; i < nc; ++i) {
      k.data.insert(k.data.end(), L.key[i].begin(), L.key[i].end());
      for (int h = 0; h < H; ++h) v.data.insert(v.data.end(), L.value[i][h].begin(), L.value[i][h].end());
    }
    ts->push_back(std::move(k));
    ts->push_back(std::move(v));
    ts->push_back({stief_tensor(il, "surface"), {nc + 1, nc + 1}, flt(L.surface)});
    std::vector<float> walk;
    for (size_t s = 0; s < L.eig_tau.size(); ++s) {
      walk.push_back(static_cast<float>(L.eig_tau[s]));
      walk.push_back(static_cast<float>(L.eig_err[s]));
    }
    if (!walk.empty()) ts->push_back({stief_tensor(il, "eig_walk"), {2, static_cast<int64_t>(L.eig_tau.size())}, walk});
    ts->push_back({stief_tensor(il, "diag"), {kDiagCount}, flt(L.diag)});
    std::vector<float> train;
    for (int i = 0; i < nc; ++i) {
      train.push_back(static_cast<float>(i < static_cast<int>(L.key_err.size()) ? L.key_err[i] : -1));
      train.push_back(static_cast<float>(i < static_cast<int>(L.value_err.size()) ? L.value_err[i] : -1));
      train.push_back(static_cast<float>(i < static_cast<int>(L.key_epochs.size()) ? L.key_epochs[i] : -1));
      train.push_back(static_cast<float>(i < static_cast<int>(L.value_epochs.size()) ? L.value_epochs[i] : -1));
    }
    ts->push_back({stief_tensor(il, "train"), {4, nc}, train});
  }
}

bool stief_present(const GgufFile& f) {
  return f.get_int(std::string(kStiefKey) + "n_cand", 0) > 0;
}

StiefFits stief_read(const GgufFile& f, const std::string& path, int n_layer, int n_head_kv,
                     int dk, int dv) {
  StiefFits s;
  s.dk = dk;
  s.dv = dv;
  s.n_head_kv = n_head_kv;
  const int64_t nc = f.get_int(std::string(kStiefKey) + "n_cand");
  KVTRIM_CHECK(nc >= 1 && nc <= std::max(dk, dv), "calibration file '%s': StiefAttention has "
               "%lld candidate ranks", path.c_str(), static_cast<long long>(nc));
  for (const GgufValue& v : f.get_array(std::string(kStiefKey) + "ranks_k").values)
    s.ranks_k.push_back(static_cast<int>(v.as_int()));
  for (const GgufValue& v : f.get_array(std::string(kStiefKey) + "ranks_v").values)
    s.ranks_v.push_back(static_cast<int>(v.as_int()));
  KVTRIM_CHECK(static_cast<int64_t>(s.ranks_k.size()) == nc, "calibration file '%s': StiefAttention "
               "lists %zu key ranks for %lld candidates", path.c_str(), s.ranks_k.size(),
               static_cast<long long>(nc));
  auto get = [&](const std::string& name, const std::vector<int64_t>& ne, bool required) -> const float* {
    const GgufTensor* t = f.find_tensor(name);
    if (!t && !required) return nullptr;
    KVTRIM_CHECK(t, "calibration file '%s' is incomplete: missing tensor '%s'", path.c_str(), name.c_str());
    KVTRIM_CHECK(t->type == GgmlType::F32 && t->ne == ne,
                 "calibration file '%s': tensor '%s' is mis-shaped", path.c_str(), name.c_str());
    return reinterpret_cast<const float*>(t->data);
  };
  const int n = static_cast<int>(nc);
  s.layers.resize(static_cast<size_t>(n_layer));
  for (int il = 0; il < n_layer; ++il) {
    StiefLayerFit& L = s.layers[static_cast<size_t>(il)];
    const float* k = get(stief_tensor(il, "k"), {dk, dk, nc}, true);
    const float* v = get(stief_tensor(il, "v"), {dv, dv, n_head_kv, nc}, true);
    const size_t kk = static_cast<size_t>(dk) * dk, vv = static_cast<size_t>(dv) * dv;
    L.key.resize(static_cast<size_t>(n));
    L.value.resize(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      L.key[i].assign(k + i * kk, k + (i + 1) * kk);
      for (int h = 0; h < n_head_kv; ++h) {
        const float* p = v + (static_cast<size_t>(i) * n_head_kv + h) * vv;
        L.value[i].emplace_back(p, p + vv);
      }
    }
    const float* sf = get(stief_tensor(il, "surface"), {nc + 1, nc + 1}, true);
    L.surface.assign(sf, sf + (n + 1) * (n + 1));
    {
      const GgufTensor* t = f.find_tensor(stief_tensor(il, "eig_walk"));
      KVTRIM_CHECK(t, "calibration file '%s' is incomplete: missing tensor '%s'", path.c_str(),
                   stief_tensor(il, "eig_walk").c_str());
      KVTRIM_CHECK(t->ne.size() == 2 && t->ne[0] == 2 && t->ne[1] >= 1 && t->ne[1] <= 100000,
                   "calibration file '%s': tensor '%s' is mis-shaped", path.c_str(), stief_tensor(il, "eig_walk").c_str());
      const float* w = get(stief_tensor(il, "eig_walk"), t->ne, true);
      for (int64_t i = 0; i < t->ne[1]; ++i) {
        L.eig_tau.push_back(tau_round(w[2 * i]));
        L.eig_err.push_back(w[2 * i + 1]);
      }
    }
    const float* dg = get(stief_tensor(il, "diag"), {kDiagCount}, true);
    L.diag.assign(dg, dg + kDiagCount);
    if (const float* tr = get(stief_tensor(il, "train"), {4, nc}, false)) {
      auto epochs = [&](float x) {
        KVTRIM_CHECK(std::isfinite(x) && x >= -1 && x <= 1e6, "calibration file '%s': tensor "
                     "'%s' holds an epoch count out of range", path.c_str(), stief_tensor(il, "train").c_str());
        return static_cast<int>(x);
      };
      for (int i = 0; i < n; ++i) {
        L.key_err.push_back(tr[4 * i]);
        L.value_err.push_back(tr[4 * i + 1]);
        L.key_epochs.push_back(epochs(tr[4 * i + 2]));
        L.value_epochs.push_back(epochs(tr[4 * i + 3]));
      }
    }
  }
  try {
    s.validate(n_layer);
  } catch (const Error& e) {
    fail("calibration file '%s': %s", path.c_str(), e.what());
  }
  return s;
}

}  // namespace kvtrim
