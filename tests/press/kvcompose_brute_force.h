// KVCompose's independent brute force, shared by kvcompose_test.cpp (hand-made shapes through a
// real cache) and kvcompose_tiny_test.cpp (a tiny random model through a session): the fixture
// (keys, values, queries, W_O), the options, and the kept index sets computed naively in double
// from the 4-D attention tensor, aggregated, sorted and picked as the paper writes them.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "press/press.h"
#include "press/token/kvcompose.h"
#include "press/token/kvcompose_core.h"

namespace kvtrim::kvcompose_test {
// ---------------------------------------------------------------------------------------
// A tiny random "model": keys, values, queries, W_O.

struct Fixture {
  int L = 3, H = 2, G = 2, d = 8, dv = 8, n_embd = 12;
  int N = 14;               // context tokens, positions 0..N-1
  int M_aware = 4;          // question tokens, positions N..N+M-1
  std::vector<int> window;  // per layer
  float scale = 0;
  // k[l][h][c][d], v[l][h][c][dv], qctx[l][m][hq][d] (positions m), qtask[l][m][hq][d],
  // ktask[l][m][h][d]: the question's own keys (positions N + m)
  std::vector<float> k, v, qctx, qtask, ktask;
  std::vector<std::vector<float>> wo;  // [l] [n_embd, H*G*dv] row-major
  int Hq() const { return H * G; }
  float& K(int l, int h, int c, int i) {
    return k[((static_cast<size_t>(l) * H + h) * N + c) * d + i];
  }
  float& V(int l, int h, int c, int i) {
    return v[((static_cast<size_t>(l) * H + h) * N + c) * dv + i];
  }

  Fixture() = default;
  explicit Fixture(uint32_t seed, bool sliding) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    window.assign(static_cast<size_t>(L), 0);
    if (sliding) window[1] = 6;
    scale = 0.9f / std::sqrt(static_cast<float>(d));
    auto fill = [&](std::vector<float>* x, size_t n, float sd) {
      x->resize(n);
      for (auto& e : *x) e = sd * nd(rng);
    };
    fill(&k, static_cast<size_t>(L * H * N * d), 1.5f);
    fill(&v, static_cast<size_t>(L * H * N * dv), 1.f);
    // value norms spread over ~1-10x so the weights matter
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h)
        for (int c = 0; c < N; ++c) {
          const float s = 0.3f + 2.5f * std::fabs(nd(rng));
          for (int i = 0; i < dv; ++i) V(l, h, c, i) *= s;
        }
    fill(&qctx, static_cast<size_t>(L * N * Hq() * d), 1.5f);
    fill(&qtask, static_cast<size_t>(L * M_aware * Hq() * d), 1.5f);
    fill(&ktask, static_cast<size_t>(L * M_aware * H * d), 1.5f);
    wo.resize(static_cast<size_t>(L));
    for (auto& w : wo) fill(&w, static_cast<size_t>(n_embd * Hq() * dv), 1.f);
  }
};

// ---------------------------------------------------------------------------------------
// The brute force (double precision, straight from the paper).

struct Opt {
  std::string agg_task = "max", agg_group = "mean", agg_head = "mean", weight = "none";
  bool mean_heads = true, structured = true, aware = false;
  bool question_keys = true;          // aware: the question's own keys in the softmax denominator
  std::string budget_kind = "ratio";  // ratio | budget | total
  double ratio = 0.5;
  int64_t amount = 0;
  std::string spec() const {
    std::ostringstream s;
    s << "kvcompose:";
    if (budget_kind == "ratio")
      s << "ratio=" << ratio;
    else
      s << budget_kind << "=" << amount;
    s << ",agg_task=" << agg_task << ",agg_group=" << agg_group << ",agg_head=" << agg_head
      << ",weight=" << weight << ",mean_heads=" << (mean_heads ? 1 : 0)
      << ",mode=" << (structured ? "structured" : "unstructured")
      << ",task=" << (aware ? "aware" : "causal") << ",question_keys=" << (question_keys ? 1 : 0);
    return s.str();
  }
};

// log Σ exp(scale · q·k) of each question query head over the question's keys it sees (what
// the observer records as ObservedQueries::self_lse), straight from the definition.
inline std::vector<float> question_self_lse(const Fixture& f, int l) {
  const int M = f.M_aware, Hq = f.Hq();
  std::vector<float> out;
  for (int m = 0; m < M; ++m)
    for (int hq = 0; hq < Hq; ++hq) {
      std::vector<double> x;
      for (int j = 0; j <= m; ++j) {
        if (f.window[l] != 0 && m - j >= f.window[l]) continue;
        double dot = 0;
        const float* q = &f.qtask[((static_cast<size_t>(l) * M + m) * Hq + hq) * f.d];
        const float* k = &f.ktask[((static_cast<size_t>(l) * M + j) * f.H + hq / f.G) * f.d];
        for (int i = 0; i < f.d; ++i) dot += static_cast<double>(q[i]) * k[i];
        x.push_back(dot * f.scale);
      }
      const double mx = *std::max_element(x.begin(), x.end());
      double z = 0;
      for (double v : x) z += std::exp(v - mx);
      out.push_back(static_cast<float>(mx + std::log(z)));
    }
  return out;
}

// keep[l][h] = set of kept token indices
using KeepSets = std::vector<std::vector<std::set<int>>>;

inline KeepSets brute_force(Fixture& f, const Opt& o) {
  const int L = f.L, H = f.H, G = f.G, Hq = f.Hq(), N = f.N;
  const int M = o.aware ? f.M_aware : N;
  auto qv = [&](int l, int m, int hq) -> const float* {
    return o.aware ? &f.qtask[((static_cast<size_t>(l) * M + m) * Hq + hq) * f.d]
                   : &f.qctx[((static_cast<size_t>(l) * M + m) * Hq + hq) * f.d];
  };
  auto qpos = [&](int m) { return o.aware ? N + m : m; };
  const int n_past = N;
  // A[l][hq][c][m] (eq. 3)
  std::vector<double> A(static_cast<size_t>(L) * Hq * N * M, 0.0);
  auto a_at = [&](int l, int hq, int c, int m) -> double& {
    return A[((static_cast<size_t>(l) * Hq + hq) * N + c) * M + m];
  };
  for (int l = 0; l < L; ++l)
    for (int hq = 0; hq < Hq; ++hq)
      for (int m = 0; m < M; ++m) {
        const int h = hq / G;
        std::vector<double> logit(static_cast<size_t>(N), 0.0);
        std::vector<bool> vis(static_cast<size_t>(N), false);
        double mx = -1e300;
        for (int c = 0; c < N; ++c) {
          vis[c] = c <= qpos(m) && (f.window[l] == 0 || qpos(m) - c < f.window[l]);
          if (!vis[c]) continue;
          double dot = 0;
          for (int i = 0; i < f.d; ++i)
            dot += static_cast<double>(qv(l, m, hq)[i]) * f.K(l, h, c, i);
          logit[c] = dot * f.scale;
          mx = std::max(mx, logit[c]);
        }
        // the question's own keys it sees (positions N .. N + m): in the denominator only
        std::vector<double> own;
        if (o.aware && o.question_keys)
          for (int j = 0; j <= m; ++j) {
            if (f.window[l] != 0 && m - j >= f.window[l]) continue;
            double dot = 0;
            const float* kj = &f.ktask[((static_cast<size_t>(l) * M + j) * H + h) * f.d];
            for (int i = 0; i < f.d; ++i) dot += static_cast<double>(qv(l, m, hq)[i]) * kj[i];
            own.push_back(dot * f.scale);
            mx = std::max(mx, own.back());
          }
        double z = 0;
        for (int c = 0; c < N; ++c)
          if (vis[c]) z += std::exp(logit[c] - mx);
        for (double x : own) z += std::exp(x - mx);
        for (int c = 0; c < N; ++c) a_at(l, hq, c, m) = vis[c] ? std::exp(logit[c] - mx) / z : 0.0;
      }
  // eq. 14, weights, eq. 15, eq. 16
  std::vector<std::vector<std::vector<double>>> S(
      static_cast<size_t>(L), std::vector<std::vector<double>>(static_cast<size_t>(H)));
  for (int l = 0; l < L; ++l) {
    std::vector<std::vector<double>> sg(static_cast<size_t>(H),
                                        std::vector<double>(static_cast<size_t>(N)));
    for (int h = 0; h < H; ++h)
      for (int c = 0; c < N; ++c) {
        std::vector<double> per_g;
        for (int g = 0; g < G; ++g) {
          const int hq = h * G + g;
          double t = o.agg_task == "max" ? -1e300 : 0.0;
          for (int m = 0; m < M; ++m)
            t = o.agg_task == "max" ? std::max(t, a_at(l, hq, c, m)) : t + a_at(l, hq, c, m) / M;
          double w = 1;
          if (o.weight == "vnorm") {
            double n2 = 0;
            for (int i = 0; i < f.dv; ++i)
              n2 += static_cast<double>(f.V(l, h, c, i)) * f.V(l, h, c, i);
            w = std::sqrt(n2);
          } else if (o.weight == "vonorm") {  // ‖W_O^(hq) v‖, W_O^(hq) = columns hq*dv.. of wo
            double n2 = 0;
            for (int r = 0; r < f.n_embd; ++r) {
              double y = 0;
              for (int i = 0; i < f.dv; ++i)
                y += static_cast<double>(
                         f.wo[l][static_cast<size_t>(r) * Hq * f.dv + hq * f.dv + i]) *
                     f.V(l, h, c, i);
              n2 += y * y;
            }
            w = std::sqrt(n2);
          }
          per_g.push_back(t * w);
        }
        double r = o.agg_group == "max" ? *std::max_element(per_g.begin(), per_g.end()) : 0.0;
        if (o.agg_group == "mean") {
          for (double x : per_g) r += x / G;
        }
        sg[h][c] = r;
      }
    for (int h = 0; h < H; ++h) {
      S[l][h].resize(static_cast<size_t>(N));
      for (int c = 0; c < N; ++c) {
        double mean = 0;
        for (int i = 0; i < H; ++i) mean += sg[i][c] / H;
        S[l][h][c] = sg[h][c] + (o.mean_heads ? mean : 0.0);
      }
    }
  }
  // candidates: a sliding layer's tokens no future query sees are dropped
  auto live = [&](int l, int c) { return f.window[l] == 0 || c > n_past - f.window[l]; };
  int64_t b_total;
  if (o.budget_kind == "ratio")
    b_total = static_cast<int64_t>((1.0 - o.ratio) * static_cast<double>(L * N));
  else if (o.budget_kind == "budget")
    b_total = o.amount * L;
  else
    b_total = o.amount;
  KeepSets keep(static_cast<size_t>(L), std::vector<std::set<int>>(static_cast<size_t>(H)));
  if (o.structured) {
    // eq. 17: idx per head; eq. 18-19: I[l][k]
    std::vector<std::vector<std::vector<int>>> idx(static_cast<size_t>(L));
    struct P {
      double I;
      int l, k;
    };
    std::vector<P> pool;
    for (int l = 0; l < L; ++l) {
      for (int h = 0; h < H; ++h) {
        std::vector<int> ix;
        for (int c = 0; c < N; ++c)
          if (live(l, c)) ix.push_back(c);
        std::sort(ix.begin(), ix.end(), [&](int a, int b) {
          return S[l][h][a] != S[l][h][b] ? S[l][h][a] > S[l][h][b] : a < b;
        });
        idx[l].push_back(ix);
      }
      for (size_t k = 0; k < idx[l][0].size(); ++k) {
        double I = o.agg_head == "max" ? -1e300 : 0.0;
        for (int h = 0; h < H; ++h) {
          const double s = S[l][h][idx[l][h][k]];
          I = o.agg_head == "max" ? std::max(I, s) : I + s / H;
        }
        pool.push_back({I, l, static_cast<int>(k)});
      }
    }
    // eq. 22 with each layer's rank 0 forced (a head never goes empty)
    std::vector<int> n_l(static_cast<size_t>(L), 0);
    std::vector<P> rest;
    for (const P& p : pool) {
      if (p.k == 0)
        ++n_l[p.l];
      else
        rest.push_back(p);
    }
    std::sort(rest.begin(), rest.end(), [](const P& a, const P& b) {
      if (a.I != b.I) return a.I > b.I;
      return a.l != b.l ? a.l < b.l : a.k < b.k;
    });
    const int64_t take = std::clamp<int64_t>(b_total - L, 0, static_cast<int64_t>(rest.size()));
    for (int64_t i = 0; i < take; ++i) ++n_l[rest[i].l];
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h)
        for (int k = 0; k < n_l[l]; ++k) keep[l][h].insert(idx[l][h][k]);  // eqs. 23-24
  } else {
    struct P {
      double s;
      int l, h, c;
    };
    std::vector<P> rest;
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h) {
        int best = -1;
        for (int c = 0; c < N; ++c)
          if (live(l, c) && (best < 0 || S[l][h][c] > S[l][h][best])) best = c;
        keep[l][h].insert(best);
        for (int c = 0; c < N; ++c)
          if (live(l, c) && c != best) rest.push_back({S[l][h][c], l, h, c});
      }
    std::sort(rest.begin(), rest.end(), [](const P& a, const P& b) {
      if (a.s != b.s) return a.s > b.s;
      if (a.l != b.l) return a.l < b.l;
      return a.h != b.h ? a.h < b.h : a.c < b.c;
    });
    const int64_t take =
        std::clamp<int64_t>(b_total * H - L * H, 0, static_cast<int64_t>(rest.size()));
    for (int64_t i = 0; i < take; ++i) keep[rest[i].l][rest[i].h].insert(rest[i].c);
  }
  return keep;
}

inline void ensure_registered() {
  if (!find_press("kvcompose")) register_press(kvcompose_press_info());
}

inline std::string dump(const KeepSets& k) {
  std::ostringstream s;
  for (size_t l = 0; l < k.size(); ++l)
    for (size_t h = 0; h < k[l].size(); ++h) {
      s << "l" << l << "h" << h << ":";
      for (int c : k[l][h]) s << " " << c;
      s << "\n";
    }
  return s.str();
}

}  // namespace kvtrim::kvcompose_test
