// kvtrim bench: prefill and decode throughput, medians over repetitions (llama-bench style).
//  pp<N>:        prefill N tokens into an empty cache; tokens/s = N / time.
//  tg<M>@d<D>:   with D tokens already in the cache, decode M tokens one at a time;
//                tokens/s = M / time (the D-token prefill is not timed).
// Token ids are drawn from a seeded generator (content does not change the cost).
#include <algorithm>
#include <cstdio>
#include <random>
#include <sstream>

#include "cli.h"
#include "core/error.h"
#include "core/timer.h"

namespace kvtrim::cli {

namespace {
struct BenchOptions {
  CommonOptions common;
  std::vector<int64_t> prompts{512};
  std::vector<int64_t> depths{0, 512};
  int n_gen = 32;
  int reps = 5;
  bool json = false;
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
  struct Row { std::string test; Stat tps; };
  std::vector<Row> rows;
  std::fprintf(stderr, "threads: %d, reps: %d (+1 warm-up), kv: %s\n", s.pool().n_threads(), o.reps, kv_tag(o.common).c_str());
  for (int64_t n : o.prompts) {
    std::vector<double> tps;
    for (int r = 0; r <= o.reps; ++r) {
      auto toks = random_tokens(n);
      s.reset();
      const double t0 = now_seconds();
      s.prefill(toks);
      const double dt = now_seconds() - t0;
      if (r > 0) tps.push_back(static_cast<double>(n) / dt);
    }
    rows.push_back({strprintf("pp%lld", static_cast<long long>(n)), stats(tps)});
    std::fprintf(stderr, "  %-14s %8.1f tokens/s\n", rows.back().test.c_str(), rows.back().tps.median);
  }
  for (int64_t d : o.depths) {
    std::vector<double> tps;
    for (int r = 0; r <= o.reps; ++r) {
      s.reset();
      if (d > 0) s.prefill(random_tokens(d));
      auto gen = random_tokens(o.n_gen);
      const double t0 = now_seconds();
      for (int32_t t : gen) s.decode(t);
      const double dt = now_seconds() - t0;
      if (r > 0) tps.push_back(static_cast<double>(o.n_gen) / dt);
    }
    rows.push_back({strprintf("tg%d@d%lld", o.n_gen, static_cast<long long>(d)), stats(tps)});
    std::fprintf(stderr, "  %-14s %8.1f tokens/s\n", rows.back().test.c_str(), rows.back().tps.median);
  }
  const auto& hp = model->hparams();
  if (o.json) {
    std::printf("[");
    for (size_t i = 0; i < rows.size(); ++i)
      std::printf("%s{\"model\":\"%s\",\"threads\":%d,\"test\":\"%s\",\"tps_median\":%.3f,\"tps_min\":%.3f,\"tps_max\":%.3f}",
                  i ? "," : "", hp.name.c_str(), s.pool().n_threads(), rows[i].test.c_str(), rows[i].tps.median,
                  rows[i].tps.min, rows[i].tps.max);
    std::printf("]\n");
  } else {
    std::printf("| model | threads | test | tokens/s (median) | min | max |\n|---|---|---|---|---|---|\n");
    for (const auto& r : rows)
      std::printf("| %s | %d | %s | %.1f | %.1f | %.1f |\n", hp.name.c_str(), s.pool().n_threads(), r.test.c_str(),
                  r.tps.median, r.tps.min, r.tps.max);
  }
  std::fprintf(stderr, "%s\n", kv_bytes_line(s.cache()).c_str());
}
}  // namespace

void register_bench(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* c = app.add_subcommand("bench", "prefill and decode tokens/s (medians over repetitions)");
  add_common_options(c, o->common);
  c->add_option("-p,--prompt", o->prompts, "prefill sizes (pp tests)")->capture_default_str()->delimiter(',');
  c->add_option("-d,--depth", o->depths, "context depths for decode tests")->capture_default_str()->delimiter(',');
  c->add_option("-n,--n-gen", o->n_gen, "tokens decoded per decode test")->capture_default_str()->check(CLI::PositiveNumber);
  c->add_option("-r,--reps", o->reps, "timed repetitions (median reported)")->capture_default_str()->check(CLI::PositiveNumber);
  c->add_flag("--json", o->json, "print JSON instead of a table");
  c->callback([o] { bench(*o); });
}

}  // namespace kvtrim::cli
