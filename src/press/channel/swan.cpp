// SWAN: an offline orthogonal rotation per (layer, KV head), then per-token magnitude top-k of
// the rotated keys and values, with a dense buffer of the most recent tokens; attention runs on
// the sparse rotated cache directly (DESIGN.md §4.1, docs/presses-swan.md).
// Paper: "SWAN: Sparse Winnowed Attention" (papers/swan.txt), Algorithm 1.
//
// How it maps onto the cache (DESIGN.md §3): one epoch per head with
//   keys:   basis P_QK (a full d×d rotation) -> per-token top-k_K by |k̂| (by magnitude) -> f16/fp8
//   values: basis P_VO                       -> per-token top-k_V by |v̂|                -> f16/fp8
//   buffer: the newest b tokens stay dense; each appended token enters the buffer and the oldest
//           leaves it, pruned, into the sparse store (the cache does this itself at every append).
// The query is rotated once per segment and step (q̂ = q·P_QK, d² per query head: the paper's
// run-time projection); value sums are accumulated in the rotated space and rotated back once
// per segment ((Σ a v̂)·P_VOᵀ: what the paper folds into W_O, the same arithmetic).
//
// Projections (`proj`): calib (default; the calibration file's `swan` fit: P_QK = eigenvectors of
// G_Q + G_K, P_VO = eigenvectors of G_V + Σ_h W_O^h W_O^hᵀ, the right singular vectors of the
// paper's S_QK and S_VO), and the paper's ablations (Appendix A.7): random (right singular
// vectors of 4096 Gaussian vectors, seeded), layer-shuffle (each layer takes another layer's
// matrices, a seeded permutation), head-shuffle (within each layer, a seeded permutation of its
// KV heads' matrices; a model with one KV head per layer cannot shuffle), swap (P_QK <-> P_VO),
// plus identity (no rotation: magnitude top-k of the raw vectors).
//
// Options (defaults): ratio = 0.5 (fraction of each token's coordinates pruned: k_active =
// round(d·(1 − ratio)), the paper's retention 1 − ratio), k / kv = key / value k_active (0 = from
// ratio; kv = 0 takes the keys' count), buffer = 128, values = f16 (the precision of the stored
// non-zero entries, keys and values: f16 or fp8), proj = calib, seed = 0, calib = the default
// file, prefill = after (the plan is applied once the prompt is prefilled, whose attention is
// dense; throughout: every layer starts its epoch after the first forward call, so the
// prompt's attention reads the pruned cache). Retention 1 (ratio 0, or k = d) rotates without
// pruning.
#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "calib/fit.h"
#include "calib/lowrank.h"
#include "core/error.h"
#include "press/calibration_source.h"
#include "press/channel/channel_common.h"

namespace kvtrim {

namespace {

enum class Proj { kCalib, kRandom, kLayerShuffle, kHeadShuffle, kSwap, kIdentity };

struct SwanOptions {
  double ratio = 0.5;
  int64_t k = 0, kv = 0;
  int64_t buffer = 128;
  KvDtype values = KvDtype::kF16;
  Proj proj = Proj::kCalib;
  uint32_t seed = 0;
  std::string calib;
  bool throughout = false;  // prefill=throughout: the epoch starts with the first forward call
  IndexLayout index = IndexLayout::kAuto;
};

// A seeded permutation of [0, n) (std::mt19937 + Fisher-Yates, portable across libraries).
std::vector<int> permutation(int n, uint32_t seed) {
  std::vector<int> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  std::mt19937 rng(seed);
  for (int i = n - 1; i > 0; --i) {
    const int j = static_cast<int>(rng() % static_cast<uint32_t>(i + 1));
    std::swap(p[static_cast<size_t>(i)], p[static_cast<size_t>(j)]);
  }
  return p;
}

// Right singular vectors of a [4096, d] matrix of N(0, 1) entries (the paper's random ablation),
// from a seeded stream: a Haar-random rotation, [d, d] row-major, one direction per column.
std::vector<float> random_rotation(int d, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n01(0.0, 1.0);
  std::vector<double> G(static_cast<size_t>(d) * d, 0.0);
  std::vector<double> x(static_cast<size_t>(d));
  for (int r = 0; r < 4096; ++r) {
    for (double& v : x) v = n01(rng);
    for (int a = 0; a < d; ++a)
      for (int b = 0; b < d; ++b) G[static_cast<size_t>(a) * d + b] += x[a] * x[b];
  }
  std::vector<float> U;
  top_eigenvectors(G.data(), d, d, &U, nullptr);
  return U;
}

class SwanPress : public Press {
 public:
  explicit SwanPress(SwanOptions o) : o_(std::move(o)), cal_("swan", o_.calib) {}
  std::string name() const override { return "swan"; }
  std::string calibration_id(const Model& model) const override {
    return o_.proj == Proj::kIdentity || o_.proj == Proj::kRandom ? "" : cal_.identity(model);
  }

  CompressionPlan plan(const PressContext& ctx) const override {
    CompressionPlan out(ctx.n_layer(), ctx.n_head_kv());
    for (int il = 0; il < ctx.n_layer(); ++il) plan_layer(ctx, il, &out);
    return out;
  }
  // prefill=throughout: after the first forward call appended a layer's tokens, before its
  // attention reads them, the layer's heads start the SWAN epoch; later appends go through the
  // cache's buffer (so the prompt's own attention reads the pruned cache, as decode does).
  bool plans_after_append() const override { return o_.throughout; }
  CompressionPlan plan_after_append(const PressContext& ctx, int il) const override {
    CompressionPlan out(ctx.n_layer(), ctx.n_head_kv());
    KVTRIM_CHECK(il >= 0 && il < ctx.n_layer(), "press 'swan': layer %d out of range", il);
    if (ctx.cache().head_layout(il, 0).current_epoch < 0) plan_layer(ctx, il, &out);
    return out;
  }

 private:
  void plan_layer(const PressContext& ctx, int il, CompressionPlan* out) const {
    const int nl = ctx.n_layer(), nkv = ctx.n_head_kv();
    const int dk = ctx.head_dim_k(), dv = ctx.head_dim_v();
    const int tk = active(o_.k, dk), tv = active(o_.kv > 0 ? o_.kv : o_.k, dv);
    KVTRIM_CHECK(o_.proj != Proj::kSwap || dk == dv,
                 "press 'swan': proj=swap needs keys and values of one head size (here %d and %d)", dk, dv);
    const std::vector<HeadFit>* fits = o_.proj == Proj::kIdentity || o_.proj == Proj::kRandom ? nullptr : &swan_fits(ctx);
    const std::vector<int> lperm = permutation(nl, o_.seed);
    const std::vector<int> hperm = permutation(nkv, o_.seed ^ (0x9e3779b9u * static_cast<uint32_t>(il + 1)));
    for (int ih = 0; ih < nkv; ++ih) {
      HeadPlan& hp = out->at(il, ih);
      std::vector<float> pk, pv;  // [d, d] rotations (empty: none)
      switch (o_.proj) {
        case Proj::kIdentity:
          break;
        case Proj::kRandom: {
          const uint64_t s = (uint64_t{o_.seed} << 32) ^ static_cast<uint64_t>(il * nkv + ih) * 2;
          pk = random_rotation(dk, s);
          pv = random_rotation(dv, s + 1);
          break;
        }
        case Proj::kCalib:
        case Proj::kLayerShuffle:
        case Proj::kHeadShuffle:
        case Proj::kSwap: {
          const int jl = o_.proj == Proj::kLayerShuffle ? lperm[static_cast<size_t>(il)] : il;
          const int jh = o_.proj == Proj::kHeadShuffle ? hperm[static_cast<size_t>(ih)] : ih;
          const HeadFit& f = (*fits)[static_cast<size_t>(jl * nkv + jh)];
          pk = (o_.proj == Proj::kSwap ? f.v : f.k).enc_cols(dk);
          pv = (o_.proj == Proj::kSwap ? f.k : f.v).enc_cols(dv);
          break;
        }
      }
      side(&hp.key, dk, tk, std::move(pk));
      side(&hp.value, dv, tv, std::move(pv));
      hp.buffer = hp.has_epoch() ? o_.buffer : 0;  // identity at retention 1: nothing to do
    }
  }

  // k_active of a side of width d: `k` when given, else round(d (1 − ratio)), in [1, d].
  int active(int64_t k, int d) const {
    if (k > 0) {
      KVTRIM_CHECK(k <= d, "press 'swan': k_active %lld is more than the head size %d",
                   static_cast<long long>(k), d);
      return static_cast<int>(k);
    }
    return std::clamp(static_cast<int>(std::lround(d * (1.0 - o_.ratio))), 1, d);
  }
  void side(SideSpec* sp, int d, int t, std::vector<float> rot) const {
    if (!rot.empty()) {
      sp->rank = d;
      sp->basis = std::move(rot);
    }
    if (t < d) {
      sp->channels = MagnitudeChannels{.topk = t, .index = o_.index};
    }
    if (sp->set()) sp->dtype = o_.values;
  }
  // The calibration's swan fits ([n_layer * n_head_kv]); fitted from its statistics when the
  // file predates the swan method.
  const std::vector<HeadFit>& swan_fits(const PressContext& ctx) const {
    std::shared_ptr<const Calibration> cal = cal_.get(ctx);
    std::lock_guard<std::mutex> lk(mu_);
    if (fits_src_ != cal.get()) {
      fits_.clear();
      if (cal->has(BasisMethod::kSwan)) {
        for (int il = 0; il < cal->n_layer(); ++il)
          for (int ih = 0; ih < cal->n_head_kv(); ++ih) fits_.push_back(cal->fit(BasisMethod::kSwan, il, ih));
      } else {
        KVTRIM_CHECK(cal->has_stats(),
                     "press 'swan': the calibration file holds neither a swan fit nor the statistics to "
                     "fit one; recreate it with kvtrim calibrate");
        for (int il = 0; il < cal->n_layer(); ++il)
          for (int ih = 0; ih < cal->n_head_kv(); ++ih) fits_.push_back(fit_head(BasisMethod::kSwan, cal->stats(il, ih)));
      }
      fits_src_ = cal.get();
      cal_hold_ = std::move(cal);
    }
    return fits_;
  }

  SwanOptions o_;
  CalibrationSource cal_;
  mutable std::mutex mu_;
  mutable std::vector<HeadFit> fits_;
  mutable const Calibration* fits_src_ = nullptr;
  mutable std::shared_ptr<const Calibration> cal_hold_;  // keeps fits_src_ alive
};

}  // namespace

PressInfo swan_press_info() {
  PressInfo i;
  i.name = "swan";
  i.description = "rotate K/V offline (calibrated), keep each token's top-k coordinates by magnitude, dense recent buffer";
  i.paper = "SWAN: Sparse Winnowed Attention (papers/swan.txt), Algorithm 1";
  i.options = {
      {"ratio", "0.5", "fraction of each token's rotated coordinates pruned, in [0, 1) (retention = 1 - ratio)"},
      {"k", "0", "keys' k_active (coordinates kept per token; 0 = round(d (1 - ratio)))"},
      {"kv", "0", "values' k_active (0 = the keys' count)"},
      {"buffer", "128", "b: the newest b tokens stay dense (0 = every token pruned)"},
      {"values", "f16", "precision of the stored non-zero entries (keys and values): f16 or fp8"},
      {"proj", "calib", "rotations: calib, or the ablations random, layer-shuffle, head-shuffle, swap, identity"},
      {"seed", "0", "seed of the random / shuffled projections"},
      {"calib", "", "calibration file (default: <model>.kvcalib next to the model's .gguf)"},
      {"index", "auto", "kept coordinates: list (a uint8 index per entry, the paper's layout), bitmask (d/8 bytes "
                        "per row), auto (the smaller)"},
      {"prefill", "after", "after: prune once the prompt is prefilled (its attention is dense); throughout: from the "
                           "first forward call on (the prompt's attention reads the pruned cache)"}};
  i.axis = PressAxis::kChannel;  // every token kept, fewer coordinates stored per token
  i.make = [](const PressArgs& a) -> std::unique_ptr<Press> {
    SwanOptions o;
    o.ratio = a.get_double_in("ratio", 0.0, 1.0, false);
    o.k = a.get_int_min("k", 0);
    o.kv = a.get_int_min("kv", 0);
    o.buffer = a.get_int_min("buffer", 0);
    o.values = a.get_choice<KvDtype>("values", {{"f16", KvDtype::kF16}, {"fp8", KvDtype::kFP8}});
    o.proj = a.get_choice<Proj>("proj", {{"calib", Proj::kCalib},
                                         {"random", Proj::kRandom},
                                         {"layer-shuffle", Proj::kLayerShuffle},
                                         {"head-shuffle", Proj::kHeadShuffle},
                                         {"swap", Proj::kSwap},
                                         {"identity", Proj::kIdentity}});
    o.seed = a.get_uint32("seed");
    o.calib = a.get_string("calib");
    o.index = a.get_choice<IndexLayout>("index", {{"auto", IndexLayout::kAuto},
                                                   {"list", IndexLayout::kList},
                                                   {"bitmask", IndexLayout::kBitmask}});
    o.throughout = a.get_choice<bool>("prefill", {{"after", false}, {"throughout", true}});
    return std::make_unique<SwanPress>(o);
  };
  return i;
}

}  // namespace kvtrim
