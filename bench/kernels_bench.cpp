// Kernel benchmarks (Google Benchmark) at the real model shapes: matvec per weight type
// (decode), matmul at n_tok = 512 (prefill), one SmolLM2-135M token's worth of matvecs, and
// the thread pool's dispatch overhead. Counters: GB/s = weight bytes read per second;
// tok/s for the whole-token benchmarks.
//
//   build/ops/bench/kvtrim_bench_kernels --benchmark_filter=Matvec --benchmark_min_time=0.2
// On a shared machine add --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
// and read the _min rows.
//
// Shapes: SmolLM2-135M (n_embd 576, n_ff 1536, n_head_kv 3 x 64, vocab 49152; Q4_1 + Q8_0
// output), Qwen2.5-1.5B (n_embd 1536, n_ff 8960; Q4_K / Q6_K).

#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/fp16.h"
#include "core/ggml_type.h"
#include "core/memory.h"
#include "core/quant_blocks.h"
#include "core/thread_pool.h"
#include "engine/sampler.h"
#include "ops/matmul.h"
#include "ops/matmul_internal.h"
#include "ops/nn.h"
#include "ops/weight_pack.h"

namespace kvtrim {
namespace {

// Weight storage with random blocks (speed does not depend on the values); fp16 scales are
// set to small sane numbers so the f32 arithmetic stays finite.
struct BenchWeight {
  std::vector<uint8_t> data;
  WeightView view;
};

std::unique_ptr<BenchWeight> make_weight(GgmlType t, int64_t n_rows, int64_t n_cols,
                                         uint32_t seed) {
  auto w = std::make_unique<BenchWeight>();
  const size_t rb = ggml_row_size(t, n_cols);
  w->data.resize(rb * static_cast<size_t>(n_rows));
  std::mt19937 rng(seed);
  for (size_t i = 0; i + 4 <= w->data.size(); i += 4) {
    const uint32_t v = rng();
    std::memcpy(w->data.data() + i, &v, 4);
  }
  const auto& tr = ggml_traits(t);
  const size_t nb = w->data.size() / tr.type_size;
  auto put = [&](size_t off, uint16_t h) { std::memcpy(w->data.data() + off, &h, 2); };
  const uint16_t small = fp32_to_fp16(0.01f);
  for (size_t b = 0; b < nb; ++b) {
    const size_t o = b * tr.type_size;
    switch (t) {
      case GgmlType::F16:
        put(o, small);
        break;
      case GgmlType::BF16:
        put(o, fp32_to_bf16(0.01f));
        break;
      case GgmlType::F32: {
        const float f = 0.01f;
        std::memcpy(w->data.data() + o, &f, 4);
        break;
      }
      case GgmlType::Q6_K:
        put(o + offsetof(BlockQ6_K, d), small);
        break;
      case GgmlType::Q3_K:
        put(o + offsetof(BlockQ3_K, d), small);
        break;
      case GgmlType::Q2_K:
        put(o + offsetof(BlockQ2_K, d), small);
        put(o + offsetof(BlockQ2_K, dmin), small);
        break;
      case GgmlType::Q4_1:
      case GgmlType::Q5_1:
      case GgmlType::Q4_K:
      case GgmlType::Q5_K:
        put(o, small);
        put(o + 2, small);
        break;
      default:
        put(o, small);
        break;
    }
  }
  w->view = WeightView{t, w->data.data(), n_rows, n_cols, rb};
  return w;
}

const WeightView& cached_weight(GgmlType t, int64_t n_rows, int64_t n_cols) {
  static std::map<std::tuple<int, int64_t, int64_t>, std::unique_ptr<BenchWeight>> cache;
  auto& slot = cache[{static_cast<int>(t), n_rows, n_cols}];
  if (!slot) slot = make_weight(t, n_rows, n_cols, static_cast<uint32_t>(n_rows * 7 + n_cols));
  return slot->view;
}

ThreadPool* pool_for(int n_threads) {
  static std::map<int, std::unique_ptr<ThreadPool>> pools;
  if (n_threads <= 1) return nullptr;
  auto& p = pools[n_threads];
  if (!p) p = std::make_unique<ThreadPool>(n_threads);
  return p.get();
}

std::vector<float> rand_vec(int64_t n) {
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = nd(rng);
  return v;
}

// "min" aggregate for --benchmark_repetitions: on a shared, loaded machine the fastest
// repetition is the best estimate of what the kernel can do.
double min_of(const std::vector<double>& v) {
  return *std::min_element(v.begin(), v.end());
}

// args: type, n_rows, n_cols, threads
void BM_Matvec(benchmark::State& state) {
  const auto t = static_cast<GgmlType>(state.range(0));
  const WeightView& w = cached_weight(t, state.range(1), state.range(2));
  ThreadPool* pool = pool_for(static_cast<int>(state.range(3)));
  const auto x = rand_vec(w.n_cols);
  std::vector<float> y(static_cast<size_t>(w.n_rows));
  for (auto _ : state) {
    matvec(w, x.data(), y.data(), pool);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.counters["GB/s"] =
      benchmark::Counter(static_cast<double>(w.row_bytes * static_cast<size_t>(w.n_rows)) / 1e9,
                         benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(ggml_type_name(t)) + " " + detail::kernel_target_name());
}

void matvec_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"type", "rows", "cols", "thr"});
  auto add = [&](GgmlType t, int64_t r, int64_t c) {
    for (int thr : {1, 2}) b->Args({static_cast<int64_t>(t), r, c, thr});
  };
  // SmolLM2-135M
  for (auto [r, c] :
       {std::pair<int64_t, int64_t>{576, 576}, {192, 576}, {1536, 576}, {576, 1536}}) {
    add(GgmlType::Q4_1, r, c);
  }
  add(GgmlType::Q8_0, 49152, 576);
  // other legacy / float types at the FFN shape
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::F16,
                     GgmlType::BF16, GgmlType::F32}) {
    add(t, 1536, 576);
  }
  // Qwen2.5-1.5B
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q2_K, GgmlType::Q3_K,
                     GgmlType::IQ4_XS, GgmlType::IQ4_NL}) {
    add(t, 1536, 1536);
    add(t, 8960, 1536);
  }
  add(GgmlType::Q4_K, 1536, 8960);
  add(GgmlType::Q6_K, 1536, 8960);  // down (half of Qwen2.5's layers)
}
BENCHMARK(BM_Matvec)->Apply(matvec_args)->UseRealTime()->ComputeStatistics("min", min_of);

// args: type, n_rows, n_cols, n_tok, threads
void BM_Matmul(benchmark::State& state) {
  const auto t = static_cast<GgmlType>(state.range(0));
  const WeightView& w = cached_weight(t, state.range(1), state.range(2));
  const int64_t n_tok = state.range(3);
  ThreadPool* pool = pool_for(static_cast<int>(state.range(4)));
  const auto x = rand_vec(n_tok * w.n_cols);
  std::vector<float> y(static_cast<size_t>(n_tok * w.n_rows));
  for (auto _ : state) {
    matmul(w, x.data(), n_tok, y.data(), pool);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * static_cast<double>(n_tok * w.n_rows * w.n_cols) / 1e9,
                         benchmark::Counter::kIsIterationInvariantRate);
  state.counters["tok/s"] =
      benchmark::Counter(static_cast<double>(n_tok), benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(ggml_type_name(t)));
}
BENCHMARK(BM_Matmul)
    ->ArgNames({"type", "rows", "cols", "ntok", "thr"})
    ->Args({static_cast<int64_t>(GgmlType::Q4_1), 1536, 576, 512, 2})
    ->Args({static_cast<int64_t>(GgmlType::Q4_1), 576, 1536, 512, 2})
    ->Args({static_cast<int64_t>(GgmlType::Q4_1), 576, 576, 512, 2})
    ->Args({static_cast<int64_t>(GgmlType::Q4_K), 1536, 1536, 512, 2})
    ->Args({static_cast<int64_t>(GgmlType::Q4_1), 1536, 576, 8, 2})
    ->Args({static_cast<int64_t>(GgmlType::Q4_K), 8960, 1536, 4, 2})  // Qwen2.5-1.5B's up, 4 streams
    ->Args({static_cast<int64_t>(GgmlType::Q4_K), 8960, 1536, 8, 2})
    ->Args({static_cast<int64_t>(GgmlType::Q6_K), 8960, 1536, 4, 2})
    ->Args({static_cast<int64_t>(GgmlType::Q6_K), 8960, 1536, 8, 2})
    ->UseRealTime()
    ->ComputeStatistics("min", min_of)
    ->Unit(benchmark::kMillisecond);

// Prefill products of Qwen2.5-1.5B's shapes (up / gate: 8960 x 1536 Q4_K, down: 1536 x 8960 Q6_K
// in half its layers) on both prefill paths: int8 0 = f32 activations on sgemm, 1 = 8-bit
// activations on the integer kernels (16-row tiles with AVX-512 VNNI, ops/kquant_tiles-inl.h).
void BM_MatmulPrefill(benchmark::State& state) {
  set_int8_prefill(state.range(5) != 0);
  BM_Matmul(state);
  set_int8_prefill(false);
}
BENCHMARK(BM_MatmulPrefill)
    ->ArgNames({"type", "rows", "cols", "ntok", "thr", "int8"})
    ->ArgsProduct({{static_cast<int64_t>(GgmlType::Q4_K)}, {8960}, {1536}, {512}, {2}, {0, 1}})
    ->ArgsProduct({{static_cast<int64_t>(GgmlType::Q6_K)}, {1536}, {8960}, {512}, {2}, {0, 1}})
    ->UseRealTime()
    ->ComputeStatistics("min", min_of)
    ->Unit(benchmark::kMillisecond);

// One SmolLM2-135M token: 30 layers x (q, k, v, o, gate, up, down) in Q4_1 plus the Q8_0
// output projection, with distinct weights per layer (so nothing stays in cache that would
// not in the model). Attention, norms and the KV cache are not included.
// args: threads, n_tok (1 = decode via matvec; 2..15 = a batched decode step of n_tok streams
// (the decode kernel, logits for every stream); >= 16 = prefill via matmul, output once), int8
// (1 = set_int8_prefill: prefill on the integer strip kernels instead of sgemm), packed (1 = the
// weights' packed copies, ops/weight_pack.h, each in its own malloc'd buffer of 4 KiB pages; 2 =
// the same copies one after another in a HugePageBuffer, as Model::load makes them: 2 MiB pages
// where the kernel's THP allows; where the CPU lacks the packed kernels 1 and 2 are the same as 0)
void BM_SmolLM2Token(benchmark::State& state) {
  constexpr int64_t kEmbd = 576, kFf = 1536, kKv = 192, kVocab = 49152, kLayers = 30;
  const int64_t n_tok = state.range(1);
  set_int8_prefill(state.range(2) != 0);
  const int use_packed = static_cast<int>(state.range(3));
  ThreadPool* pool = pool_for(static_cast<int>(state.range(0)));
  static std::vector<std::unique_ptr<BenchWeight>> layers;
  static std::unique_ptr<BenchWeight> output;
  static std::vector<PackedWeight> packed;  // layers', then the output's (if packable here)
  static std::vector<PackedWeight> packed_huge;
  static HugePageBuffer huge;
  static std::vector<WeightView> views[3];  // plain, packed, packed in huge pages: the layers', then the output's
  if (layers.empty()) {
    const std::pair<int64_t, int64_t> shapes[] = {{kEmbd, kEmbd}, {kKv, kEmbd}, {kKv, kEmbd},
                                                  {kEmbd, kEmbd}, {kFf, kEmbd}, {kFf, kEmbd},
                                                  {kEmbd, kFf}};
    for (int64_t il = 0; il < kLayers; ++il) {
      for (auto [r, c] : shapes)
        layers.push_back(make_weight(GgmlType::Q4_1, r, c, static_cast<uint32_t>(layers.size())));
    }
    output = make_weight(GgmlType::Q8_0, kVocab, kEmbd, 99);
    for (const auto& l : layers) views[0].push_back(l->view);
    views[0].push_back(output->view);
    std::vector<WeightView> to_pack;
    for (const WeightView& v : views[0]) {
      if (PackedWeight::available(v.type)) {
        packed.emplace_back(v);
        views[1].push_back(packed.back().view(v));
        to_pack.push_back(v);
      } else {
        views[1].push_back(v);
      }
    }
    packed_huge = PackedWeight::pack_all(to_pack, &huge);
    size_t k = 0;
    for (const WeightView& v : views[0]) views[2].push_back(PackedWeight::available(v.type) ? packed_huge[k++].view(v) : v);
  }
  const std::vector<WeightView>& ws = views[std::clamp(use_packed, 0, 2)];
  const auto x = rand_vec(n_tok * kFf);
  std::vector<float> y(static_cast<size_t>(n_tok * kFf));
  const int64_t n_out = n_tok < kMatmulGemmMinTokens ? n_tok : 1;  // rows needing logits
  std::vector<float> logits(static_cast<size_t>(n_out * kVocab));
  size_t bytes = output->data.size();
  for (const auto& l : layers) bytes += l->data.size();
  for (auto _ : state) {
    for (size_t i = 0; i + 1 < ws.size(); ++i) matmul(ws[i], x.data(), n_tok, y.data(), pool);
    matmul(ws.back(), x.data(), n_out, logits.data(), pool);
    benchmark::DoNotOptimize(logits.data());
  }
  state.counters["tok/s"] =
      benchmark::Counter(static_cast<double>(n_tok), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(bytes) / 1e9,
                                              benchmark::Counter::kIsIterationInvariantRate);
  set_int8_prefill(false);
}
BENCHMARK(BM_SmolLM2Token)
    ->ArgNames({"thr", "ntok", "int8", "packed"})
    ->ArgsProduct({{2}, {1, 2, 4, 8}, {0}, {0, 1, 2}})
    ->Args({1, 1, 0, 0})
    ->Args({1, 1, 0, 1})
    ->Args({1, 1, 0, 2})
    ->Args({2, 15, 0, 0})
    ->Args({2, 15, 0, 1})
    ->Args({2, 16, 0, 0})
    ->Args({2, 64, 0, 0})
    ->Args({2, 128, 0, 0})
    ->Args({2, 512, 0, 0})
    ->ArgsProduct({{2}, {16, 64, 128, 512}, {1}, {0, 1, 2}})
    ->UseRealTime()
    ->ComputeStatistics("min", min_of)
    ->Unit(benchmark::kMillisecond);

// Thread pool: cost of one run() with an empty job (wake, run, join), and of a
// parallel_for over 576 rows with trivial work (what a tiny matvec pays).
void BM_PoolRun(benchmark::State& state) {
  ThreadPool* pool = pool_for(static_cast<int>(state.range(0)));
  std::atomic<int> sink{0};
  for (auto _ : state) {
    pool->run([&](int ith, int) {
      if (ith < 0) sink++;
    });
  }
  benchmark::DoNotOptimize(sink.load());
}
BENCHMARK(BM_PoolRun)->Arg(2)->Arg(3)->UseRealTime()->ComputeStatistics("min", min_of);

void BM_PoolParallelFor(benchmark::State& state) {
  ThreadPool* pool = pool_for(static_cast<int>(state.range(0)));
  std::vector<float> v(576);
  for (auto _ : state) {
    pool->parallel_for(
        576,
        [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) v[static_cast<size_t>(i)] += 1.0f;
        },
        16);
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_PoolParallelFor)->Arg(2)->UseRealTime()->ComputeStatistics("min", min_of);

// nn kernels used per head / per token.
void BM_Softmax(benchmark::State& state) {
  auto x = rand_vec(state.range(0));
  for (auto _ : state) {
    softmax(x.data(), state.range(0));
    benchmark::DoNotOptimize(x.data());
  }
}
BENCHMARK(BM_Softmax)->Arg(512)->Arg(4096);

void BM_Dot64(benchmark::State& state) {
  const auto a = rand_vec(64), b = rand_vec(64);
  for (auto _ : state) benchmark::DoNotOptimize(dot(a.data(), b.data(), 64));
}
BENCHMARK(BM_Dot64);

// One sampled token over a vocabulary of logits like a model's (normal, sd 3): the server's
// default (temperature, no top-k, top_p 1) and the CLI's (top_k 40, top_p 0.95).
// args: vocabulary, top_k, top_p x 100
void BM_Sample(benchmark::State& state) {
  const auto logits = rand_vec(state.range(0));
  std::vector<float> scaled(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) scaled[i] = 3.f * logits[i];
  Sampler s({0.8f, static_cast<int>(state.range(1)), static_cast<float>(state.range(2)) / 100.f, 1});
  for (auto _ : state) benchmark::DoNotOptimize(s.sample(scaled.data(), static_cast<int32_t>(scaled.size())));
}
BENCHMARK(BM_Sample)
    ->ArgNames({"vocab", "top_k", "top_p100"})
    ->Args({49152, 0, 100})
    ->Args({49152, 40, 95})
    ->Args({151936, 0, 100})
    ->Args({151936, 0, 90})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kvtrim
