#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli.h"
#include "core/error.h"
#include "core/strings.h"
#include "core/memory.h"
#include "core/thread_pool.h"
#include "core/timer.h"
#include "ops/matmul.h"
#include "ops/weight_pack.h"

namespace kvtrim::cli {

void add_common_options(CLI::App* app, CommonOptions& o) {
  app->add_option("-m,--model", o.model, "model: installed name (smollm2, qwen2.5-coder-1.5b, gemma3-270m) or a .gguf path")
      ->capture_default_str();
  app->add_option("--chat-template", o.chat_template,
                  "chat template instead of the model file's own Jinja template: a built-in (chatml, gemma) or a "
                  "Jinja file's path");
  app->add_option("-t,--threads", o.threads, "threads (0 = all cores)")
      ->capture_default_str()->check(CLI::Range(0, ThreadPool::kMaxThreads));
  app->add_option("-c,--ctx", o.ctx, "context limit in tokens (0 = the model's training context)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app->add_option("-b,--batch", o.batch, "prefill chunk size in tokens")
      ->capture_default_str()->check(CLI::Range(1, 1 << 16));
  const std::vector<std::string> types = kv_type_names();
  app->add_option("--kv-type", o.kv_type, std::string("precision of stored keys and values: ") + kv_type_list())
      ->capture_default_str()->check(CLI::IsMember(types));
  app->add_option("--cache-type-k", o.cache_type_k, "precision of stored keys, also -ctk (default: --kv-type)")
      ->check(CLI::IsMember(types));
  app->add_option("--cache-type-v", o.cache_type_v, "precision of stored values, also -ctv (default: --kv-type)")
      ->check(CLI::IsMember(types));
  app->add_option("--mem-limit", o.mem_limit,
                  "most memory the KV cache may take, e.g. 2GiB: a longer --ctx or prompt is refused before "
                  "allocation (default: the memory the OS reports available; off: no check)");
  auto* f32 = app->add_flag(
      "--f32-prefill", o.f32_prefill,
      "prefill with f32 activations times the dequantized weights (sgemm) instead of the "
      "default 8-bit activations on the integer kernels (the default has the numerics of "
      "decode and of llama.cpp and prefills 2-4x faster; WikiText-2 PPL of SmolLM2: 15.94 "
      "with this flag, 15.98 without): the numerics of the reference checks (an eval results "
      "file records the prefill precision and resumes only rows made with the same)");
  app->add_flag("--int8-prefill", o.int8_prefill,
                "8-bit-activation prefill (the default: the same as no flag)")
      ->excludes(f32);
  app->add_flag("--no-repack", o.no_repack,
                "keep the weights only as the GGUF file stores them: no packed copy of the Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 "
                "matrices for the 16-row tile kernels (made at load on CPUs with AVX-512 VNNI; same results bit "
                "for bit, decode batches and prefill faster; the file's pages of packed matrices leave memory)");
  app->add_flag("--no-kv-rotate", o.no_kv_rotate,
                "store q8 / q4 keys and values as they are, without the Hadamard rotation "
                "that spreads outlier channels before quantization");
}

std::string kv_tag(const CommonOptions& o, const HParams& hp) {
  const KvDtype k = kv_dtype_from_name(o.cache_type_k.empty() ? o.kv_type : o.cache_type_k);
  const KvDtype v = kv_dtype_from_name(o.cache_type_v.empty() ? o.kv_type : o.cache_type_v);
  const std::string types = kv_pair_name(k, v);
  const bool rotated = kv_rotation_applies(k, hp.head_dim_k) || kv_rotation_applies(v, hp.head_dim_v);
  return types + (!o.no_kv_rotate && rotated ? "+hadamard" : "");
}

std::string prefill_tag(const CommonOptions& o) { return o.f32_prefill ? "" : "int8"; }

void add_press_options(CLI::App* app, PressOptions& o) {
  app->add_option("--press", o.spec,
                  "compress the KV cache after the prompt: PRESS[:opt=value,...][+PRESS...], e.g. snapkv:ratio=0.5 "
                  "(`kvtrim presses` lists them); none = no press")
      ->transform([](std::string s) { return s == "none" ? std::string() : s; });
  app->add_option("--press-every", o.decode_every, "also compress while decoding, every N generated tokens (0 = off)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app->add_option("--press-target", o.decode_target,
                  "with --press-every: tokens kept per (layer, kv head) by each decode-time compression")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
}

void add_press_min_tokens_option(CLI::App* app, PressOptions& o) {
  app->add_option("--press-min-tokens", o.min_tokens,
                  "a context (document, earlier turns) of fewer tokens is not compressed (32: the observation window of "
                  "snapkv, pyramidkv, think, spark, ojakv; a shorter one is all window)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
}

void add_press_guard_options(CLI::App* app, PressOptions& o) {
  app->add_option("--press-max-loss", o.max_loss,
                  "quality guard: when a compression's loss estimate (the attention output's relative error over the "
                  "question's last <= 32 queries, or the context's last 32 without a question, in [0, 1]) exceeds X, restore the context and retry with half the press's ratio, at "
                  "most twice, then leave it uncompressed (1 = off)")
      ->capture_default_str()
      ->check([](const std::string& v) {
        char* end = nullptr;
        const double x = std::strtod(v.c_str(), &end);
        if (end == v.c_str() || *end != '\0') return std::string("--press-max-loss must be a number in [0, 1]");
        return max_loss_problem(x, "--press-max-loss");
      });
  app->add_flag("--no-loss-estimate", o.no_loss_estimate,
                "do not estimate what each compression loses (saves the question's or the window's attention before and "
                "after the plan, and the question's pass for a press that is not query-aware)");
}

bool loss_estimate_on(const PressOptions& o) {
  KVTRIM_CHECK(!o.no_loss_estimate || o.max_loss >= 1, "--press-max-loss needs the loss estimate: drop --no-loss-estimate");
  return !o.no_loss_estimate;
}

bool press_loss_on(const PressOptions& o) { return loss_estimate_on(o) && !o.spec.empty(); }

std::string loss_text(const PressLoss& l) {
  if (!l.measured) return "";
  const bool q = l.queries == LossQueries::kQuestion;
  std::string t = strprintf("loss estimate %.4f (attention output error over the %s %lld queries, mean of the layers; "
                            "max %.4f at layer %d)",
                            l.rel_err, q ? "question's last" : "context's last", static_cast<long long>(l.n_queries),
                            l.rel_err_max, l.max_layer);
  if (l.tokens_removed > 0) t += strprintf(", evicted attention mass %.4f", l.evicted_mass);
  return t + strprintf(", estimated in %.3f s", l.seconds);
}

void install_press(Session& s, const PressOptions& o, bool after_prefill) {
  if (o.spec.empty()) {
    KVTRIM_CHECK(o.decode_every == 0, "--press-every needs --press");
    return;
  }
  PressSchedule sched;
  sched.after_prefill = after_prefill;
  sched.decode_every = o.decode_every;
  sched.decode_target = o.decode_target;
  KVTRIM_CHECK(o.decode_every == 0 || o.decode_target > 0, "--press-every needs --press-target > 0");
  auto p = make_press(o.spec);
  std::fprintf(stderr, "press: %s\n", p->spec().c_str());
  s.set_press(std::move(p), sched);
}

namespace {
// A compression that left the cache larger than it found it (SPARK's per-token index, signs and
// fill on q4 rows outweigh the half of each row it prunes): said, not hidden in the numbers.
std::string grew_warning(const CompressStats& st) {
  if (st.bytes_after <= st.bytes_before) return "";
  return strprintf(
      "; WARNING: the cache grew by %s: what the press stores per token (kept-channel "
      "indices, signs, fills, scales) outweighs what it removed at this storage type",
      human_bytes(st.bytes_after - st.bytes_before).c_str());
}
}  // namespace

std::string compress_line(const Press& p, const CompressStats& st, const std::string& part) {
  const double rss_drop = static_cast<double>(st.rss_before) - static_cast<double>(st.rss_after);
  return strprintf(
             "press %s: %s%lld -> %lld tokens (all layers and kv heads, %.1f%% removed), KV %s -> "
             "%s in %.3f s; "
             "process RSS %s -> %s (%s%.2f MiB)",
             p.spec().c_str(), part.c_str(), static_cast<long long>(st.tokens_before),
             static_cast<long long>(st.tokens_after),
             st.tokens_before ? 100.0 * static_cast<double>(st.tokens_before - st.tokens_after) /
                                    static_cast<double>(st.tokens_before)
                              : 0.0,
             human_bytes(st.bytes_before).c_str(), human_bytes(st.bytes_after).c_str(), st.seconds,
             human_bytes(st.rss_before).c_str(), human_bytes(st.rss_after).c_str(),
             rss_drop >= 0 ? "-" : "+", std::abs(rss_drop) / (1024.0 * 1024.0)) +
         (st.refeed_seconds > 0
              ? strprintf("; re-feed pass first: %.2f s, process RSS at its fullest %s",
                          st.refeed_seconds, human_bytes(st.refeed_rss_peak).c_str())
              : std::string()) +
         (st.loss.measured ? "; " + loss_text(st.loss) : std::string()) + grew_warning(st);
}

std::string context_compress_line(const Press& p, const ContextCompression& c, int64_t n_protected,
                                  const std::string& protected_what) {
  const std::string tail = strprintf("; protected: %lld tokens (%s), all kept", static_cast<long long>(n_protected),
                                     protected_what.c_str());
  if (!c.ran)
    return strprintf("press %s: context %lld positions %s", p.spec().c_str(), static_cast<long long>(c.n_context),
                     c.note.c_str()) +
           tail;
  std::string guard;  // the attempts --press-max-loss refused before the one kept
  for (const CompressAttempt& a : c.attempts)
    if (!a.accepted) guard += strprintf("%s%s (estimate %.4f)", guard.empty() ? "" : ", ", a.press.c_str(), a.loss.rel_err);
  if (!guard.empty())
    guard = strprintf(", compressed with %s after --press-max-loss refused %s", c.attempts.back().press.c_str(),
                      guard.c_str());
  const std::string part = strprintf("context %lld positions%s%s: ", static_cast<long long>(c.n_context),
                                     c.saw_question ? " (scored with the question's queries)" : "", guard.c_str());
  return compress_line(p, c.stats, part) + tail;
}

std::unique_ptr<Model> load_model(const CommonOptions& o) {
  const std::string path = resolve_model_path(o.model);
  const double t0 = now_seconds();
  set_int8_prefill(!o.f32_prefill);
  set_weight_packing(!o.no_repack);
  auto m = Model::load(path);
  if (!o.chat_template.empty()) m->set_chat_template(ChatTemplate::from_gguf(m->gguf(), o.chat_template));
  const auto& hp = m->hparams();
  const size_t packed = m->packed_weight_bytes();
  std::string packed_note;
  if (packed) {
    const size_t huge = m->packed_weight_huge_page_bytes();
    packed_note = ", weights packed for the tile kernels: " + human_bytes(packed) +
                  (huge ? " (" + human_bytes(huge) + " in 2 MiB pages)" : " (in 4 KiB pages)");
  }
  std::fprintf(stderr, "model: %s (%s, %d layers, %d heads / %d kv heads, head_dim %d, ctx %d) from %s in %.2f s%s\n",
               hp.name.c_str(), arch_name(hp.arch), hp.n_layer, hp.n_head, hp.n_head_kv, hp.head_dim_k,
               hp.n_ctx_train, path.c_str(), now_seconds() - t0, packed_note.c_str());
  return m;
}

SessionParams session_params(const CommonOptions& o) {
  SessionParams p;
  p.n_ctx = o.ctx;
  p.n_threads = o.threads;
  p.n_batch = o.batch;
  p.kv_dtype = kv_dtype_from_name(o.kv_type);
  if (!o.cache_type_k.empty()) p.kv_dtype_k = kv_dtype_from_name(o.cache_type_k);
  if (!o.cache_type_v.empty()) p.kv_dtype_v = kv_dtype_from_name(o.cache_type_v);
  p.kv_rotate = !o.no_kv_rotate;
  if (o.mem_limit == "off") {
    p.kv_mem_limit = -1;
  } else if (!o.mem_limit.empty()) {
    p.kv_mem_limit = static_cast<int64_t>(parse_byte_size(o.mem_limit));
  }
  return p;
}

std::string human_bytes(size_t n) { return format_bytes(n); }

// "512MiB", "2G", "1.5GiB", "1000000" (bytes); K/M/G are binary multiples, as llama.cpp's sizes.
size_t parse_byte_size(const std::string& s) {
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  KVTRIM_CHECK(i > 0, "'%s' is not a size (e.g. 512MiB, 2GiB, 1000000)", s.c_str());
  double v = 0;
  try {
    v = std::stod(s.substr(0, i));
  } catch (...) {
    throw Error(strprintf("'%s' is not a size (e.g. 512MiB, 2GiB, 1000000)", s.c_str()));
  }
  const std::string unit = ascii_lower(s.substr(i));
  double mul = 1;
  if (unit.empty() || unit == "b") mul = 1;
  else if (unit == "k" || unit == "kb" || unit == "kib") mul = 1024.0;
  else if (unit == "m" || unit == "mb" || unit == "mib") mul = 1024.0 * 1024;
  else if (unit == "g" || unit == "gb" || unit == "gib") mul = 1024.0 * 1024 * 1024;
  else throw Error(strprintf("'%s': unknown unit '%s' (B, KiB, MiB, GiB)", s.c_str(), unit.c_str()));
  const double bytes = v * mul;
  KVTRIM_CHECK(bytes >= 1 && bytes < 1e15, "'%s' is not a sensible size", s.c_str());
  return static_cast<size_t>(bytes);
}

std::string kv_bytes_line(const KvCache& c) {
  const KvBytes b = c.bytes();
  const size_t dense = c.dense_bytes_f16();
  return strprintf("KV cache: %s held (%zu bytes: keys %zu, values %zu, positions %zu, scales %zu, bases %zu, indices %zu, bitmasks %zu, fills %zu, other %zu) for %d "
                   "positions; uncompressed f16: %s (ratio %.3f) [%s]",
                   human_bytes(b.total()).c_str(), b.total(), b.keys, b.values, b.positions, b.scales, b.bases, b.indices, b.bitmasks, b.fills, b.other,
                   c.n_past(),
                   human_bytes(dense).c_str(), dense ? static_cast<double>(b.total()) / static_cast<double>(dense) : 0.0,
                   c.describe().c_str());
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  KVTRIM_CHECK(f.good(), "cannot read file '%s'", path.c_str());
  std::ostringstream ss;
  ss << f.rdbuf();
  KVTRIM_CHECK(!f.bad(), "error reading file '%s'", path.c_str());
  return ss.str();
}

}  // namespace kvtrim::cli
