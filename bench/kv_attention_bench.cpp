// Decode-step attention over the KV cache (DESIGN.md §7): the compressed cache (token
// eviction applied with a plan that keeps a different random subset in every kv head, f16)
// against the uncompressed cache, measured in the same run and interleaved iteration by
// iteration (dense call, then compressed call), so machine noise hits both alike.
//
//   build/kv/bench/kvtrim_bench_kernels --benchmark_filter=KvAttn --benchmark_min_time=0.5
//
// KvAttnEvict/<model>/ctx:<n>/keep:<f>/threads:<t>: one query token (n_q = 1) at position
// ctx - 1 attending over ctx stored positions, kept fraction f (0.5 = compression ratio 0.5,
// 0.25 = ratio 0.75). Counters (medians over the iterations): dense_us, comp_us, ratio =
// comp_us / dense_us (targets: <= 0.6 at keep 0.5, <= 0.35 at keep 0.25), comp_GBps = KV bytes
// read per second by the compressed call (dense_GBps: by the dense call). The reported time is
// the compressed call's.
// MemRead/threads:<t>: the machine's streaming read bandwidth in the same run (read_GBps, best
// of 5 passes over 256 MiB: core/bandwidth.h), the roofline of the *_GBps counters.
// KvAttnDtype/<model>/ctx:<n>/<dtype>_vs_f16/threads:1: the same with equal tokens (no
// eviction), dtype storage against f16 (ratio = dtype_us / f16_us).
// KvAttnChannel/<model>/ctx:<n>/<spark|think|swan>:<λ>/threads:1: the channel axis (ratio target:
// <= 1.2 x kv_bytes_ratio): SPARK's per-token keys with recovery, ThinK's per-head key subset,
// SWAN's per-token top-k by magnitude on keys and values (no rotation, no buffer: the pruned
// store alone).
// KvAttnBasis/<model>/ctx:<n>/keepdims:0.5/threads:<t>: the basis axis (DESIGN.md §7, low-rank
// methods): every (layer, kv head) gets its own random orthonormal basis with
// rank_k = rank_v = head_dim / 2 and every token is encoded (f16 coefficients); the same
// interleaved pair against the dense f16 cache. kv_bytes_ratio is measured by bytes() and
// includes the bases and per-head positions (target: ratio <= 0.6).
//
// Shapes (one attention layer; query heads / kv heads, head dim): SmolLM2-135M 9/3 x 64,
// Qwen2.5-1.5B 12/2 x 128, Gemma3-270M 4/1 x 256. Each cache holds several layers and the
// benchmark walks them in turn so the working set (~128 MiB dense) is read from memory, as
// in a real decode step over all layers, rather than from cache.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/bandwidth.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "kv/kv_cache.h"

namespace kvtrim {
namespace {

struct ModelShape {
  const char* name;
  int n_head, n_head_kv, head_dim;
};
constexpr ModelShape kShapes[] = {
    {"smollm2", 9, 3, 64}, {"qwen2.5-1.5b", 12, 2, 128}, {"gemma3-270m", 4, 1, 256}};
constexpr size_t kWorkingSet = size_t{128} << 20;  // dense bytes walked per benchmark

// Layers needed so that the dense cache holds about kWorkingSet bytes.
int n_layers_for(const ModelShape& s, int64_t ctx, KvDtype t) {
  const size_t es = t == KvDtype::kF32 ? 4 : t == KvDtype::kQ8 ? 1 : 2;
  const size_t layer = static_cast<size_t>(ctx) * s.n_head_kv * 2 * s.head_dim * es;
  return static_cast<int>(std::clamp<size_t>(kWorkingSet / layer, 1, 64));
}

std::unique_ptr<KvCache> build_cache(const ModelShape& s, int64_t ctx, KvDtype t, int n_layer) {
  KvCacheConfig cfg;
  cfg.n_layer = n_layer;
  cfg.n_head_kv = s.n_head_kv;
  cfg.head_dim_k = cfg.head_dim_v = s.head_dim;
  cfg.n_ctx = ctx;
  cfg.dtype = t;
  auto c = make_kv_cache(cfg);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  const int64_t chunk = 512;
  std::vector<float> k(static_cast<size_t>(chunk * s.n_head_kv * s.head_dim));  // [chunk, nkv, hd]
  std::vector<float> v(k.size());
  std::vector<int32_t> pos(static_cast<size_t>(chunk));
  for (float& x : k) x = nd(rng);
  for (float& x : v) x = nd(rng);
  for (int64_t i = 0; i < ctx; i += chunk) {
    const int64_t m = std::min(chunk, ctx - i);
    for (int64_t j = 0; j < m; ++j) pos[j] = static_cast<int32_t>(i + j);
    for (int il = 0; il < n_layer; ++il) c->append(il, m, k.data(), v.data(), pos.data());
  }
  c->advance(static_cast<int32_t>(ctx));
  return c;
}

// Keeps round(keep * ctx) tokens per (layer, kv head), a different random subset in each.
void evict(KvCache& c, double keep, uint32_t seed) {
  const KvCacheConfig& cfg = c.config();
  CompressionPlan plan(cfg.n_layer, cfg.n_head_kv);
  std::mt19937 rng(seed);
  for (int il = 0; il < cfg.n_layer; ++il) {
    for (int ih = 0; ih < cfg.n_head_kv; ++ih) {
      const int64_t n = c.n_tokens(il, ih);
      std::vector<int32_t> all(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) all[i] = static_cast<int32_t>(i);
      HeadPlan& hp = plan.at(il, ih);
      hp.keep_all = false;
      std::sample(all.begin(), all.end(), std::back_inserter(hp.keep),
                  static_cast<size_t>(std::llround(keep * static_cast<double>(n))), rng);
    }
  }
  c.apply(plan);
}

// A random [d, r] row-major matrix with orthonormal columns (Gram-Schmidt, twice).
std::vector<float> random_basis(int d, int r, std::mt19937& rng) {
  std::normal_distribution<double> nd;
  std::vector<double> a(static_cast<size_t>(d) * r);
  for (double& x : a) x = nd(rng);
  for (int j = 0; j < r; ++j) {
    for (int pass = 0; pass < 2; ++pass) {
      for (int c = 0; c < j; ++c) {
        double dot = 0;
        for (int i = 0; i < d; ++i) dot += a[i * r + j] * a[i * r + c];
        for (int i = 0; i < d; ++i) a[i * r + j] -= dot * a[i * r + c];
      }
    }
    double nrm = 0;
    for (int i = 0; i < d; ++i) nrm += a[i * r + j] * a[i * r + j];
    for (int i = 0; i < d; ++i) a[i * r + j] /= std::sqrt(nrm);
  }
  return std::vector<float>(a.begin(), a.end());
}

// Encodes every token of every (layer, kv head) in its own random orthonormal basis of rank
// round(keepdims * head_dim) on both sides.
void low_rank(KvCache& c, double keepdims, uint32_t seed) {
  const KvCacheConfig& cfg = c.config();
  CompressionPlan plan(cfg.n_layer, cfg.n_head_kv);
  std::mt19937 rng(seed);
  const int rk = static_cast<int>(std::lround(keepdims * cfg.head_dim_k));
  const int rv = static_cast<int>(std::lround(keepdims * cfg.head_dim_v));
  for (int il = 0; il < cfg.n_layer; ++il) {
    for (int ih = 0; ih < cfg.n_head_kv; ++ih) {
      HeadPlan& hp = plan.at(il, ih);
      hp.key.rank = rk;
      hp.key.basis = random_basis(cfg.head_dim_k, rk, rng);
      hp.value.rank = rv;
      hp.value.basis = random_basis(cfg.head_dim_v, rv, rng);
    }
  }
  c.apply(plan);
}

// The channel axis: per-token top-T key channels by magnitude with SPARK's degenerate recovery
// (one sign bit per pruned channel, one fill per token), or one per-head subset (ThinK), on every
// (layer, kv head); T = head_dim − int(λ · head_dim). Values untouched.
void channel_prune(KvCache& c, double lambda, bool per_token) {
  const KvCacheConfig& cfg = c.config();
  if (lambda < 0) {  // SWAN's store: the cache keeps each token's top-T by magnitude, both sides
    const int T = cfg.head_dim_k - static_cast<int>(-lambda * cfg.head_dim_k);
    CompressionPlan plan(cfg.n_layer, cfg.n_head_kv);
    for (int il = 0; il < cfg.n_layer; ++il)
      for (int ih = 0; ih < cfg.n_head_kv; ++ih)
        for (ChannelStage* ch : {&plan.at(il, ih).key.channels, &plan.at(il, ih).value.channels})
          *ch = MagnitudeChannels{.topk = T};
    c.apply(plan);
    return;
  }
  const int d = cfg.head_dim_k, T = d - static_cast<int>(lambda * d);
  CompressionPlan plan(cfg.n_layer, cfg.n_head_kv);
  std::vector<float> k;
  std::vector<int32_t> order(static_cast<size_t>(d));
  for (int il = 0; il < cfg.n_layer; ++il) {
    for (int ih = 0; ih < cfg.n_head_kv; ++ih) {
      SideSpec& sp = plan.at(il, ih).key;
      if (!per_token) {
        ChannelSubset sub;
        for (int j = 0; j < T; ++j) sub.channels.push_back(static_cast<uint16_t>(j * d / T));
        sp.channels = std::move(sub);
        continue;
      }
      c.read_head(il, ih, &k, nullptr, nullptr);
      const int64_t n = static_cast<int64_t>(k.size()) / d;
      KeyRecovery rec{.scale = std::vector<float>(static_cast<size_t>(d), 1.f)};
      sp.channels = TokenChannels{.topk = T, .recovery = std::move(rec)};
      TokenRows& ch = sp.rows;
      for (int64_t t = 0; t < n; ++t) {
        const float* x = k.data() + t * d;
        for (int j = 0; j < d; ++j) order[static_cast<size_t>(j)] = j;
        std::partial_sort(order.begin(), order.begin() + T, order.end(),
                          [x](int32_t a, int32_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
        std::sort(order.begin(), order.begin() + T);
        ch.channels.insert(ch.channels.end(), order.begin(), order.begin() + T);
        double pruned = 0;
        for (int j = T; j < d; ++j) pruned += x[order[static_cast<size_t>(j)]] * x[order[static_cast<size_t>(j)]];
        ch.fill.push_back(static_cast<float>(std::sqrt(pruned / std::max(1, d - T))));
      }
    }
  }
  c.apply(plan);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// Times `base` and `test` attention calls alternately, one layer per iteration; reports the
// test call's time and the medians / ratio as counters.
void run_pair(benchmark::State& state, const ModelShape& s, const KvCache& base,
              const KvCache& test, int n_threads) {
  ThreadPool pool(n_threads);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<float> q(static_cast<size_t>(s.n_head * s.head_dim));  // [1, n_head, head_dim]
  for (float& x : q) x = nd(rng);
  std::vector<float> out(q.size());  // [1, n_head, head_dim]
  const int32_t q_pos = base.n_past() - 1;
  AttnParams p;
  p.n_head = s.n_head;
  p.scale = 1.f / std::sqrt(static_cast<float>(s.head_dim));
  const int n_layer = base.config().n_layer;
  std::vector<double> t_base, t_test;
  int il = 0;
  using clock = std::chrono::steady_clock;
  for (auto _ : state) {
    const auto t0 = clock::now();
    base.attend(il, 1, q.data(), &q_pos, p, out.data(), &pool);
    const auto t1 = clock::now();
    test.attend(il, 1, q.data(), &q_pos, p, out.data(), &pool);
    const auto t2 = clock::now();
    benchmark::DoNotOptimize(out.data());
    const double db = std::chrono::duration<double>(t1 - t0).count();
    const double dt = std::chrono::duration<double>(t2 - t1).count();
    t_base.push_back(db);
    t_test.push_back(dt);
    state.SetIterationTime(dt);
    il = (il + 1) % n_layer;
  }
  const double mb = median(t_base), mt = median(t_test);
  const KvBytes bt = test.bytes();
  state.counters["dense_us"] = mb * 1e6;
  state.counters["comp_us"] = mt * 1e6;
  state.counters["ratio"] = mb > 0 ? mt / mb : 0;
  state.counters["comp_GBps"] = mt > 0 ? static_cast<double>(bt.total()) / n_layer / mt / 1e9 : 0;
  state.counters["dense_GBps"] = mb > 0 ? static_cast<double>(base.bytes().total()) / n_layer / mb / 1e9 : 0;
  state.counters["kv_bytes_ratio"] =
      static_cast<double>(bt.total()) / static_cast<double>(base.bytes().total());
}

// One cache kept alive across the benchmarks that share it (they are registered in order).
struct CacheSlot {
  std::string key;
  std::unique_ptr<KvCache> cache;
  const KvCache& get(const std::string& k, const std::function<std::unique_ptr<KvCache>()>& make) {
    if (k != key) {
      cache.reset();
      cache = make();
      key = k;
    }
    return *cache;
  }
};
CacheSlot g_base, g_test;

void register_membw() {
  for (int nth : {1, 2}) {
    benchmark::RegisterBenchmark((std::string("MemRead/threads:") + std::to_string(nth)).c_str(),
                                 [nth](benchmark::State& st) {
                                   ThreadPool pool(nth);
                                   for (auto _ : st) {
                                     const Bandwidth bw = measure_read_bandwidth(&pool, size_t{256} << 20, 5);
                                     st.counters["read_GBps"] = bw.gbps;
                                     st.counters["read_GBps_median"] = bw.gbps_median;
                                     st.SetIterationTime(static_cast<double>(bw.bytes) / (bw.gbps_median * 1e9));
                                   }
                                 })
        ->Iterations(1)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
}

// One benchmark that times the dense f16 cache of (shape, ctx) against a test cache made by
// make_test (built once, kept in g_test under test_key).
void register_pair(const std::string& name, const ModelShape& s, int64_t ctx,
                   const std::string& test_key, std::function<std::unique_ptr<KvCache>()> make_test,
                   int nth) {
  const int nl = n_layers_for(s, ctx, KvDtype::kF16);
  const std::string dense_key = std::string(s.name) + "/" + std::to_string(ctx) + "/f16";
  benchmark::RegisterBenchmark(
      name.c_str(),
      [=](benchmark::State& st) {
        const KvCache& base =
            g_base.get(dense_key, [&] { return build_cache(s, ctx, KvDtype::kF16, nl); });
        const KvCache& test = g_test.get(dense_key + "/" + test_key, make_test);
        run_pair(st, s, base, test, nth);
      })
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond);
}

void register_shape(const ModelShape& s, int64_t ctx) {
  const int nl = n_layers_for(s, ctx, KvDtype::kF16);
  const std::string prefix = std::string(s.name) + "/ctx:" + std::to_string(ctx) + "/";
  for (double keep : {0.5, 0.25}) {
    for (int nth : {1, 2}) {
      const std::string keep_name = keep == 0.5 ? "0.50" : "0.25";
      register_pair(
          "KvAttnEvict/" + prefix + "keep:" + keep_name + "/threads:" + std::to_string(nth), s, ctx,
          "keep" + keep_name,
          [=] {
            auto c = build_cache(s, ctx, KvDtype::kF16, nl);
            evict(*c, keep, 7);
            return c;
          },
          nth);
    }
  }
  for (int nth : {1, 2}) {
    register_pair(
        "KvAttnBasis/" + prefix + "keepdims:0.5/threads:" + std::to_string(nth), s, ctx, "basis0.5",
        [=] {
          auto c = build_cache(s, ctx, KvDtype::kF16, nl);
          low_rank(*c, 0.5, 11);
          return c;
        },
        nth);
  }
  // KvAttnChannel/<model>/ctx:<n>/<spark|think>:<λ>/threads:1: the channel axis (SPARK's
  // per-token keys with recovery, ThinK's per-head subset) against dense f16, equal tokens.
  // (λ < 0: SWAN's store at retention 1 + λ)
  for (const auto& [per_token, lambda] :
       {std::pair{true, 0.5}, std::pair{true, 0.8}, std::pair{false, 0.5}, std::pair{true, -0.5}}) {
    const std::string mode = lambda < 0  ? std::string("swan:0.5")
                             : per_token ? std::string("spark:") + (lambda == 0.5 ? "0.5" : "0.8")
                                         : std::string("think:0.5");
    // (the bindings copied by name: clang 14 cannot capture a structured binding)
    register_pair(
        "KvAttnChannel/" + prefix + mode + "/threads:1", s, ctx, mode,
        [=, per_token = per_token, lambda = lambda] {
          auto c = build_cache(s, ctx, KvDtype::kF16, nl);
          channel_prune(*c, lambda, per_token);
          return c;
        },
        1);
  }
  for (KvDtype t : {KvDtype::kQ8, KvDtype::kBF16, KvDtype::kF32}) {
    register_pair(
        "KvAttnDtype/" + prefix + kv_dtype_name(t) + "_vs_f16/threads:1", s, ctx, kv_dtype_name(t),
        [=] { return build_cache(s, ctx, t, nl); }, 1);
  }
}

void register_all() {
  register_membw();
  for (const ModelShape& s : kShapes) {
    for (int64_t ctx : {4096, 8192}) register_shape(s, ctx);
  }
}

const int g_registered = (register_all(), 0);

}  // namespace
}  // namespace kvtrim
