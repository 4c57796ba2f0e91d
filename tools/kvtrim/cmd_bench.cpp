// kvtrim bench: prefill and decode throughput, medians over repetitions (llama-bench style).
//  pp<N>:        prefill N tokens into an empty cache; tokens/s = N / time.
//  tg<M>@d<D>:   with D tokens already in the cache, decode M tokens one at a time;
//                tokens/s = M / time (the D-token prefill is not timed).
//  --press SPEC (repeatable): every decode test also runs with the cache compressed by SPEC after
//                the D-token prefill (compression not timed), in the same run as the uncompressed
//                cache; each row shows the KV bytes the decode read from and its speed as a ratio
//                to the uncompressed row.
//  --streams S (list): tg<M>@d<D>x<S>: S sessions, each with D tokens, decode M tokens each as
//                batched steps (Session::step_batch, the server's continuous batching); tokens/s =
//                S * M / time, shown as a ratio to the single-stream row of the same depth.
// -p 0 / -n 0 skip the prefill / decode tests (as llama-bench).
// Roofline: the machine's read bandwidth is measured once (core/bandwidth.h: all the pool's
//                threads streaming a 256 MiB buffer, best of 5); a decode row's bytes per token
//                are the weights one step reads (Model::decode_weight_bytes) plus the KV cache's
//                bytes (mean of before and after the M decoded tokens: attention reads all of it
//                each step), and its roofline fraction is tokens/s ÷ (bandwidth ÷ bytes per
//                token). Activations, logits and scratch are not counted, so the fraction is an
//                upper bound of what the memory system allows, not a measured traffic.
// Token ids are drawn from a seeded generator (content does not change the cost).
#include <algorithm>
#include <cstdio>
#include <random>
#include <sstream>

#include "cli.h"
#include "core/bandwidth.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/timer.h"
#include "engine/session.h"
#include "ops/matmul.h"
#include <nlohmann/json.hpp>

namespace kvtrim::cli {

namespace {
struct BenchOptions {
  CommonOptions common;
  std::vector<int64_t> prompts{512};
  std::vector<int64_t> depths{0, 512};
  int n_gen = 32;
  int reps = 5;
  bool json = false;
  std::vector<std::string> presses;  // decode tests also run compressed by each
  std::vector<int> streams;          // batched decode tests with this many sessions
};

struct Stat { double median, min, max; };
Stat stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  const double med = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  return {med, v.front(), v.back()};
}

void bench(const BenchOptions& o) {
  auto model = load_model(o.common);
  const int32_t n_vocab = model->hparams().n_vocab;
  int64_t need = 0;
  for (auto p : o.prompts) need = std::max(need, p);
  if (o.n_gen > 0)
    for (auto d : o.depths) need = std::max(need, d + o.n_gen);
  SessionParams sp = session_params(o.common);
  if (sp.n_ctx == 0) sp.n_ctx = std::min<int64_t>(model->hparams().n_ctx_train, std::max<int64_t>(need, 512));
  KVTRIM_CHECK(need <= sp.n_ctx, "bench needs %lld positions but the context limit is %lld", static_cast<long long>(need),
               static_cast<long long>(sp.n_ctx));
  Session s(*model, sp);
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> pick(0, n_vocab - 1);
  auto random_tokens = [&](int64_t n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = pick(rng);
    return t;
  };
  struct Row {
    std::string test, press = "none";
    Stat tps;
    size_t kv_bytes = 0;
    double ratio = 0;  // tokens/s relative to the uncompressed row of the same test (0: none)
    double bytes_per_token = 0;  // decode rows: weights + KV read per decoded token
    double roofline = 0;         // decode rows: tokens/s ÷ (bandwidth ÷ bytes_per_token)
  };
  std::vector<std::unique_ptr<Press>> presses;
  for (const std::string& spec : o.presses) presses.push_back(make_press(spec));  // bad specs fail first
  std::vector<Row> rows;
  const char* prefill = int8_prefill() ? "8-bit activations" : "f32 activations (--f32-prefill)";
  std::fprintf(stderr, "threads: %d, reps: %d (+1 warm-up), kv: %s, prefill: %s\n", s.pool().n_threads(), o.reps,
               kv_tag(o.common, model->hparams()).c_str(), prefill);
  const Bandwidth bw = measure_read_bandwidth(&s.pool());
  const double weight_bytes = static_cast<double>(model->decode_weight_bytes());
  std::fprintf(stderr, "read bandwidth: %.1f GB/s (best of %d; median %.1f) on %d threads; weights read per decode step: %s\n",
               bw.gbps, bw.reps, bw.gbps_median, bw.threads, format_bytes(static_cast<size_t>(weight_bytes)).c_str());
  // kv_read: KV bytes one step reads; a batched step of `streams` sessions reads the weights once
  // for all of them, so per token they count 1/streams
  auto roofline = [&](Row& row, double kv_read, int streams = 1) {
    row.bytes_per_token = (weight_bytes + kv_read) / streams;
    row.roofline = row.tps.median / (bw.gbps * 1e9 / row.bytes_per_token);
  };
  for (int64_t n : o.prompts) {
    if (n <= 0) continue;
    std::vector<double> tps;
    for (int r = 0; r <= o.reps; ++r) {
      auto toks = random_tokens(n);
      s.reset();
      const double t0 = now_seconds();
      s.prefill(toks);
      const double dt = now_seconds() - t0;
      if (r > 0) tps.push_back(static_cast<double>(n) / dt);
    }
    rows.push_back({strprintf("pp%lld", static_cast<long long>(n)), "none", stats(tps)});
    std::fprintf(stderr, "  %-14s %8.1f tokens/s\n", rows.back().test.c_str(), rows.back().tps.median);
  }
  for (int64_t d : o.depths) {
    if (o.n_gen <= 0) break;
    // the uncompressed cache first, then each press, interleaved per repetition so that drifts of
    // the machine hit every configuration alike
    const size_t nc = presses.size() + 1;
    std::vector<std::vector<double>> tps(nc);
    std::vector<size_t> kvb(nc, 0), kv_read(nc, 0);
    for (int r = 0; r <= o.reps; ++r) {
      const auto ctx = random_tokens(d);
      const auto gen = random_tokens(o.n_gen);
      for (size_t ci = 0; ci < nc; ++ci) {
        s.reset();
        if (ci > 0) s.set_press(make_press(presses[ci - 1]->spec()));
        if (d > 0) s.prefill(ctx);
        if (ci > 0) s.compress();
        kvb[ci] = s.cache().bytes().total();
        const double t0 = now_seconds();
        for (int32_t t : gen) s.decode(t);
        const double dt = now_seconds() - t0;
        kv_read[ci] = (kvb[ci] + s.cache().bytes().total()) / 2;
        if (r > 0) tps[ci].push_back(static_cast<double>(o.n_gen) / dt);
        s.set_press(nullptr);
      }
    }
    const std::string test = strprintf("tg%d@d%lld", o.n_gen, static_cast<long long>(d));
    const double base = stats(tps[0]).median;
    for (size_t ci = 0; ci < nc; ++ci) {
      Row row{test, ci ? presses[ci - 1]->spec() : "none", stats(tps[ci]), kvb[ci], 0};
      if (ci > 0) row.ratio = row.tps.median / base;
      roofline(row, static_cast<double>(kv_read[ci]));
      rows.push_back(row);
      std::fprintf(stderr, "  %-14s %-40s %8.1f tokens/s  KV %.2f MiB  %.1f%% of roofline%s\n", test.c_str(),
                   row.press.c_str(), row.tps.median, static_cast<double>(row.kv_bytes) / (1024.0 * 1024.0),
                   100.0 * row.roofline, ci ? strprintf("  (%.3fx uncompressed)", row.ratio).c_str() : "");
    }
  }
  // batched decode: S sessions on the bench session's pool, one step_batch per generated token
  for (int64_t d : o.depths) {
    if (o.n_gen <= 0) break;
    const std::string single = strprintf("tg%d@d%lld", o.n_gen, static_cast<long long>(d));
    double base = 0;
    for (const Row& r : rows)
      if (r.test == single && r.press == "none") base = r.tps.median;
    for (int n_s : o.streams) {
      SessionParams shared = sp;
      shared.pool = &s.pool();
      std::vector<std::unique_ptr<Session>> ss;
      for (int i = 0; i < n_s; ++i) ss.push_back(std::make_unique<Session>(*model, shared));
      std::vector<double> tps;
      size_t kv = 0, kv_start = 0;
      for (int r = 0; r <= o.reps; ++r) {
        std::vector<std::vector<int32_t>> gen;
        for (auto& x : ss) {
          x->reset();
          if (d > 0) x->prefill(random_tokens(d));
          gen.push_back(random_tokens(o.n_gen));
        }
        kv_start = 0;
        for (auto& x : ss) kv_start += x->cache().bytes().total();
        const double t0 = now_seconds();
        for (int t = 0; t < o.n_gen; ++t) {
          std::vector<SessionChunk> chunks;
          for (int i = 0; i < n_s; ++i) chunks.push_back(SessionChunk{ss[i].get(), &gen[i][t], 1, true});
          Session::step_batch(chunks);
        }
        const double dt = now_seconds() - t0;
        if (r > 0) tps.push_back(static_cast<double>(n_s) * o.n_gen / dt);
        kv = 0;
        for (auto& x : ss) kv += x->cache().bytes().total();
      }
      Row row{strprintf("%sx%d", single.c_str(), n_s), "none", stats(tps), kv, 0};
      if (base > 0) row.ratio = row.tps.median / base;
      roofline(row, static_cast<double>(kv_start + kv) / 2, n_s);
      rows.push_back(row);
      std::fprintf(stderr, "  %-14s %d streams, batched %8.1f tokens/s in all%s\n", row.test.c_str(), n_s,
                   row.tps.median, base > 0 ? strprintf("  (%.3fx one stream)", row.ratio).c_str() : "");
    }
  }
  const auto& hp = model->hparams();
  if (o.json) {
    std::printf("[");
    for (size_t i = 0; i < rows.size(); ++i)
      std::printf("%s{\"model\":\"%s\",\"threads\":%d,\"test\":\"%s\",\"press\":%s,\"tps_median\":%.3f,"
                  "\"tps_min\":%.3f,\"tps_max\":%.3f,\"kv_bytes\":%zu,\"tps_vs_uncompressed\":%.4f,"
                  "\"bytes_per_token\":%.0f,\"roofline_fraction\":%.4f,\"bandwidth_GBps\":%.2f,\"prefill\":\"%s\"}",
                  i ? "," : "", hp.name.c_str(), s.pool().n_threads(), rows[i].test.c_str(),
                  nlohmann::json(rows[i].press).dump().c_str(), rows[i].tps.median, rows[i].tps.min, rows[i].tps.max,
                  rows[i].kv_bytes, rows[i].ratio, rows[i].bytes_per_token, rows[i].roofline, bw.gbps,
                  int8_prefill() ? "int8" : "f32");
    std::printf("]\n");
  } else {
    std::printf("| model | threads | test | press | tokens/s (median) | min | max | KV MiB | vs uncompressed | "
                "MiB read / token | roofline |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (const auto& r : rows)
      std::printf("| %s | %d | %s | %s | %.1f | %.1f | %.1f | %s | %s | %s | %s |\n", hp.name.c_str(),
                  s.pool().n_threads(), r.test.c_str(), r.press.c_str(), r.tps.median, r.tps.min, r.tps.max,
                  r.kv_bytes ? strprintf("%.2f", static_cast<double>(r.kv_bytes) / (1024.0 * 1024.0)).c_str() : "",
                  r.ratio > 0 ? strprintf("%.3fx", r.ratio).c_str() : "",
                  r.bytes_per_token > 0 ? strprintf("%.1f", r.bytes_per_token / (1024.0 * 1024.0)).c_str() : "",
                  r.roofline > 0 ? strprintf("%.0f%%", 100.0 * r.roofline).c_str() : "");
    std::printf("\nread bandwidth %.1f GB/s (%d threads, best of %d); roofline = tokens/s x bytes per token / bandwidth\n",
                bw.gbps, bw.threads, bw.reps);
  }
  std::fprintf(stderr, "%s\n", kv_bytes_line(s.cache()).c_str());
}
}  // namespace

void register_bench(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* c = app.add_subcommand("bench", "prefill and decode tokens/s (medians over repetitions)");
  add_common_options(c, o->common);
  c->add_option("-p,--prompt", o->prompts, "prefill sizes (pp tests; 0: none)")->capture_default_str()->delimiter(',');
  c->add_option("-d,--depth", o->depths, "context depths for decode tests")->capture_default_str()->delimiter(',');
  c->add_option("-n,--n-gen", o->n_gen, "tokens decoded per decode test (0: no decode tests)")->capture_default_str()->check(CLI::NonNegativeNumber);
  c->add_option("-r,--reps", o->reps, "timed repetitions (median reported)")->capture_default_str()->check(CLI::PositiveNumber);
  c->add_flag("--json", o->json, "print JSON instead of a table");
  c->add_option("--streams", o->streams,
                "decode tests also run with this many sessions decoding together in batched steps "
                "(continuous batching, as kvtrim serve); rows give total tokens/s vs one stream")
      ->delimiter(',')
      ->check(CLI::Range(1, 256));
  c->add_option("--press", o->presses,
                "decode tests also run with the cache compressed by this press after the depth's prefill "
                "(repeatable; same syntax as run --press); rows give KV bytes and speed vs uncompressed")
      ->take_all()
      ->allow_extra_args(false);
  c->callback([o] { bench(*o); });
}

}  // namespace kvtrim::cli
