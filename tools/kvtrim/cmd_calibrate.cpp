// kvtrim calibrate: runs a model over calibration text (default WikiText-2 valid from
// ../shared/data), streams per (layer, kv head) statistics (src/calib/capture.h), fits the
// low-rank bases (K-SVD, EigenAttention, KQ-SVD, StaticPCA; src/calib/fit.h) and writes a
// versioned calibration file with the model's fingerprint (docs/calibration.md).
// kvtrim calibrate --report: residual-energy ratio and subspace-overlap diagnostics of a
// calibration file's bases on the statistics of another text (distribution shift), or
// in-sample without --calib.
#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <map>
#include <sstream>

#include "calib/calibration.h"
#include "calib/capture.h"
#include "calib/fit.h"
#include "calib/lexico.h"
#include "cli.h"
#include "eval/recipe.h"
#include "cmd_calibrate_stief.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/thread_pool.h"
#include "core/timer.h"
#include "eval/text.h"

namespace kvtrim::cli {

namespace {

namespace fs = std::filesystem;

struct CalibrateOptions {
  CommonOptions common;
  std::string file;  // text file or directory of .txt ("" = WikiText-2 valid)
  int64_t seqs = 32;
  int64_t seq_len = 512;
  int layer_io_rows = 128;
  std::string methods = "all";
  std::string out;
  uint64_t seed = 42;
  bool report = false;
  std::string calib;
  double ratio = 0;
  double energy = 0;
  StiefCliOptions stief;
  bool lexico = false;  // --lexico: learn Lexico's dictionaries (calib/lexico.h)
  LexicoTrainOptions lex;
  int lexico_rows = 16384;
};

std::vector<BasisMethod> parse_methods(const std::string& s) {
  if (s == "all") return all_basis_methods();
  std::vector<BasisMethod> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    const BasisMethod m = parse_basis_method(item);
    if (std::find(out.begin(), out.end(), m) == out.end()) out.push_back(m);
  }
  KVTRIM_CHECK(
      !out.empty(),
      "--methods: no method given (use all or a list of ksvd,eigenattention,kqsvd,staticpca,swan)");
  return out;
}

std::string text_path(const CalibrateOptions& o) {
  return o.file.empty() ? eval::shared_data_path("wikitext-2/valid.txt", "-f FILE_OR_DIR") : o.file;
}

std::string load_text(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return eval::join(eval::load_text_dir(path), "\n\n");
  KVTRIM_CHECK(fs::exists(path, ec), "calibration text '%s' does not exist", path.c_str());
  return read_file(path);
}

std::string default_out(const std::string& model_path) {
  std::string p = model_path;
  if (p.ends_with(".gguf")) p.resize(p.size() - 5);
  return p + ".kvcalib";
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// Captured statistics of a text, with the sequences it used.
struct Captured {
  std::vector<HeadStats> stats;
  std::vector<LayerIoSample> io;
  std::vector<std::vector<float>> k_rows, v_rows;  // --lexico's samples
  int64_t n_seqs = 0, n_tokens = 0;
  double seconds = 0;
};

Captured capture_text(const Model& model, const std::string& path, const CalibrateOptions& o,
                      int layer_io_rows, ThreadPool& pool, int kv_rows = 0) {
  const std::string text = load_text(path);
  const Tokenizer& tok = model.tokenizer();
  const std::vector<int32_t> tokens = tok.encode(text, tok.add_bos(), false);
  const auto seqs = cut_sequences(tokens, o.seqs, o.seq_len, tok.add_bos() ? tok.bos() : -1);
  KVTRIM_CHECK(
      !seqs.empty(),
      "calibration text '%s' has %zu tokens: not enough for one sequence of %lld (lower --seq-len)",
      path.c_str(), tokens.size(), static_cast<long long>(o.seq_len));
  if (static_cast<int64_t>(seqs.size()) < o.seqs)
    std::fprintf(stderr,
                 "warning: '%s' has %zu tokens: using %zu sequences of %lld instead of %lld\n",
                 path.c_str(), tokens.size(), seqs.size(), static_cast<long long>(o.seq_len),
                 static_cast<long long>(o.seqs));
  std::fprintf(stderr, "capturing %zu sequences x %lld tokens of %s\n", seqs.size(),
               static_cast<long long>(o.seq_len), path.c_str());
  CalibCapture cap(model, layer_io_rows, o.seed, kv_rows);
  const double t0 = now_seconds();
  ProgressBar bar("calibrate", static_cast<int64_t>(seqs.size()), "seq");
  run_capture(model, seqs, cap, &pool, [&](int64_t done, int64_t) { bar.update(done); });
  bar.finish();
  Captured c;
  c.stats = cap.stats();
  c.io = cap.layer_io();
  c.k_rows = cap.key_rows();
  c.v_rows = cap.value_rows();
  c.n_seqs = static_cast<int64_t>(seqs.size());
  c.n_tokens = cap.n_tokens();
  c.seconds = now_seconds() - t0;
  return c;
}

// --lexico: learns the dictionaries from the captured key / value rows into c.
void run_lexico(const Model& model, Calibration& c, const Captured& cap, const CalibrateOptions& o, ThreadPool& pool) {
  const HParams& hp = model.hparams();
  const size_t rows = cap.k_rows.empty() ? 0 : cap.k_rows[0].size() / static_cast<size_t>(hp.head_dim_k);
  KVTRIM_CHECK(rows >= static_cast<size_t>(o.lex.n_atoms),
               "--lexico: %zu sampled rows per layer cannot train %d atoms (raise --lexico-rows or the "
               "calibration tokens, or lower --lexico-atoms)",
               rows, o.lex.n_atoms);
  const double t0 = now_seconds();
  ProgressBar bar("lexico", hp.n_layer, "layer");
  auto d = std::make_shared<LexicoDicts>(train_lexico(cap.k_rows, cap.v_rows, hp.head_dim_k, hp.head_dim_v, o.lex,
                                                      &pool, [&](int64_t done, int64_t) { bar.update(done); }));
  bar.finish();
  double ek = 0, ev = 0;
  for (int il = 0; il < d->n_layer(); ++il) {
    ek += d->k_err[static_cast<size_t>(il)] / d->n_layer();
    ev += d->v_err[static_cast<size_t>(il)] / d->n_layer();
  }
  std::printf("lexico: %d atoms per layer and side from %zu rows, training sparsity %d / %d, %d iterations: "
              "mean relative error keys %.4f, values %.4f (%.1f s)\n",
              d->n_atoms, rows, d->sparsity_k, d->sparsity_v,
              o.lex.iters, ek, ev, now_seconds() - t0);
  c.set_lexico(std::move(d));
  c.meta["lexico_rows"] = std::to_string(rows);
  c.meta["lexico_iters"] = std::to_string(o.lex.iters);
}

// --lexico --calib FILE: adds Lexico's dictionaries to an existing calibration of the same model
// (captures the calibration text again for the key / value rows).
void add_lexico_to(const CalibrateOptions& o, Calibration& c, const Model& model, const std::string& tpath,
                   ThreadPool& pool) {
  Captured cap = capture_text(model, tpath, o, 0, pool, o.lexico_rows);
  run_lexico(model, c, cap, o, pool);
  c.meta["lexico_text"] = fs::path(tpath).filename().string();
}

// --stief --calib FILE: adds StiefAttention to an existing calibration of the same model (its
// statistics and EigenAttention fits), without capturing again.
void add_to(const CalibrateOptions& o) {
  const std::string tpath = text_path(o);
  load_text(tpath);
  Calibration c = Calibration::load(o.calib);
  if (o.stief.enabled) check_stief_options(o.stief, c.methods());
  auto model = load_model(o.common);
  c.check_model(*model, o.calib);
  ThreadPool pool(o.common.threads);
  const double t0 = now_seconds();
  const std::string out = o.out.empty() ? o.calib : o.out;
  if (o.lexico) add_lexico_to(o, c, *model, tpath, pool);
  if (o.stief.enabled) {
    const Tokenizer& tok = model->tokenizer();
    int64_t captured = 0;
    if (c.meta.count("sequences") && c.meta.count("seq_len"))
      captured = std::atoll(c.meta["sequences"].c_str()) * std::atoll(c.meta["seq_len"].c_str());
    run_stief(*model, c, tok.encode(load_text(tpath), tok.add_bos(), false),
              tok.add_bos() ? tok.bos() : -1, captured, o.stief, pool, out);
    c.meta["stief_text"] = fs::path(tpath).filename().string();
  }
  c.meta["date"] = utc_now();
  c.save(out);
  remove_stief_checkpoint(out);
  std::error_code ec;
  const auto size = fs::file_size(out, ec);
  std::printf("wrote %s (%s): %s plus%s%s; total %.1f s\n", out.c_str(), human_bytes(ec ? 0 : size).c_str(),
              o.calib.c_str(), o.stief.enabled ? " StiefAttention" : "", o.lexico ? " Lexico" : "",
              now_seconds() - t0);
}

void calibrate(const CalibrateOptions& o) {
  const std::vector<BasisMethod> methods = parse_methods(o.methods);
  KVTRIM_CHECK(o.layer_io_rows >= 0, "--layer-io-rows must be >= 0");
  check_stief_options(o.stief, methods);
  const std::string tpath = text_path(o);
  load_text(tpath);  // a missing text fails before the model loads
  const std::string model_path = resolve_model_path(o.common.model);
  auto model = load_model(o.common);
  ThreadPool pool(o.common.threads);
  const double t0 = now_seconds();
  Captured cap = capture_text(*model, tpath, o, o.layer_io_rows, pool, o.lexico ? o.lexico_rows : 0);
  const double t_fit = now_seconds();
  const HParams& hp = model->hparams();
  Calibration c(model_fingerprint(*model), hp.n_layer, hp.n_head_kv);
  for (BasisMethod m : methods) c.set_fits(m, fit_all(m, cap.stats));
  const double fit_s = now_seconds() - t_fit;
  if (o.lexico) run_lexico(*model, c, cap, o, pool);
  c.set_stats(std::move(cap.stats));
  if (o.layer_io_rows > 0) c.set_layer_io(std::move(cap.io));
  c.meta["text"] = fs::path(tpath).filename().string();
  c.meta["sequences"] = std::to_string(cap.n_seqs);
  c.meta["seq_len"] = std::to_string(o.seq_len);
  c.meta["tokens"] = std::to_string(cap.n_tokens);
  c.meta["seed"] = std::to_string(o.seed);
  c.meta["kvtrim_version"] = "0.1.0";
  c.meta["date"] = utc_now();
  const std::string out = o.out.empty() ? default_out(model_path) : o.out;
  if (o.stief.enabled) {
    const Tokenizer& tok = model->tokenizer();
    run_stief(*model, c, tok.encode(load_text(tpath), tok.add_bos(), false),
              tok.add_bos() ? tok.bos() : -1, cap.n_seqs * o.seq_len, o.stief, pool, out);
  }
  c.save(out);
  remove_stief_checkpoint(out);
  std::error_code ec;
  const auto size = fs::file_size(out, ec);
  std::printf(
      "wrote %s (%s): %zu methods, %d layers x %d kv heads, %lld tokens (%lld x %lld); capture "
      "%.1f s, fit %.1f s, total %.1f s\n",
      out.c_str(), human_bytes(ec ? 0 : size).c_str(), methods.size(), hp.n_layer, hp.n_head_kv,
      static_cast<long long>(cap.n_tokens), static_cast<long long>(cap.n_seqs),
      static_cast<long long>(o.seq_len), cap.seconds, fit_s, now_seconds() - t0);
}

struct Cell {
  double rer_k = 0, rer_v = 0, so_k = 0, so_v = 0, rank_k = 0, rank_v = 0;
};

void report(const CalibrateOptions& o) {
  KVTRIM_CHECK(!(o.ratio > 0 && o.energy > 0), "give --ratio or --energy, not both");
  // --ratio is the fraction of each head's dimensions REMOVED, as in the presses' `ratio`
  const double ratio = o.energy > 0 ? 0 : (o.ratio > 0 ? o.ratio : 0.5);
  KVTRIM_CHECK(ratio < 1, "--ratio must be in [0, 1) (the fraction of dimensions removed)");
  const double keep = 1.0 - ratio;
  KVTRIM_CHECK(o.energy <= 1, "--energy must be in (0, 1]");
  const std::string tpath = text_path(o);
  load_text(tpath);
  // a missing or damaged file fails before the model loads; the model match is checked after
  std::unique_ptr<Calibration> file;
  if (!o.calib.empty()) file = std::make_unique<Calibration>(Calibration::load(o.calib));
  auto model = load_model(o.common);
  if (file) file->check_model(*model, o.calib);
  ThreadPool pool(o.common.threads);
  Captured cap = capture_text(*model, tpath, o, 0, pool);
  const HParams& hp = model->hparams();
  const int L = hp.n_layer, H = hp.n_head_kv;
  std::vector<BasisMethod> methods = file ? file->methods() : parse_methods(o.methods);
  if (file && o.methods != "all") methods = parse_methods(o.methods);
  // cells[method][layer], averaged over kv heads
  std::map<BasisMethod, std::vector<Cell>> cells;
  for (BasisMethod m : methods) {
    const std::vector<HeadFit> oracle = fit_all(m, cap.stats);
    std::vector<Cell>& col = cells[m];
    col.assign(L, Cell{});
    for (int il = 0; il < L; ++il) {
      for (int ih = 0; ih < H; ++ih) {
        const size_t i = static_cast<size_t>(il) * H + ih;
        const HeadFit& f = file ? file->fit(m, il, ih) : oracle[i];
        const HeadStats& s = cap.stats[i];
        const int rk = ratio > 0 ? rank_for_ratio(keep, f.k.d) : f.k.rank_for_energy(o.energy);
        const int rv = ratio > 0 ? rank_for_ratio(keep, f.v.d) : f.v.rank_for_energy(o.energy);
        Cell c;
        if (m == BasisMethod::kKqSvd) {
          c.rer_k = kq_score_rel_error(s, f.k, rk);
          c.rer_v = vo_rel_error(s, f.v, rv);
        } else {
          c.rer_k = rer_gram(s.gram_k, f.k.d, f.k.enc_cols(rk), rk);
          c.rer_v = rer_gram(s.gram_v, f.v.d, f.v.enc_cols(rv), rv);
        }
        c.so_k = span_overlap(f.k.enc_cols(rk), oracle[i].k.enc_cols(rk), f.k.d, rk);
        c.so_v = span_overlap(f.v.enc_cols(rv), oracle[i].v.enc_cols(rv), f.v.d, rv);
        c.rank_k = rk;
        c.rank_v = rv;
        Cell& acc = col[il];
        acc.rer_k += c.rer_k / H;
        acc.rer_v += c.rer_v / H;
        acc.so_k += c.so_k / H;
        acc.so_v += c.so_v / H;
        acc.rank_k += c.rank_k / H;
        acc.rank_v += c.rank_v / H;
      }
    }
  }
  const std::string rank_rule =
      ratio > 0 ? strprintf("ratio %.3g removed (rank %d/%d of d = %d/%d)", ratio,
                            rank_for_ratio(keep, hp.head_dim_k),
                            rank_for_ratio(keep, hp.head_dim_v), hp.head_dim_k, hp.head_dim_v)
                : strprintf("energy %.3g of each head's fit", o.energy);
  std::printf("## calibration report: %s, %s\n\n", hp.name.c_str(), rank_rule.c_str());
  std::printf("bases: %s; statistics: %s (%lld tokens)\n",
              file ? o.calib.c_str() : "fitted in-sample on the same text", tpath.c_str(),
              static_cast<long long>(cap.n_tokens));
  std::printf(
      "each cell: error k / v, then SO k / v = subspace overlap with the basis the same method "
      "fits on this text.\n");
  std::printf(
      "error = residual-energy ratio RER = 1 - tr(UᵀGU)/tr(G); kqsvd: relative score error "
      "‖Q(I-DEᵀ)Kᵀ‖²/‖QKᵀ‖² (k) and ‖V(I-EDᵀ)W_O‖²/‖VW_O‖² (v).\n\n");
  std::string head = "| layer |", sep = "|---|";
  for (BasisMethod m : methods) {
    head += strprintf(" %s err k/v | %s SO k/v |", basis_method_name(m), basis_method_name(m));
    sep += "---|---|";
  }
  if (ratio == 0) {
    head += " mean rank k/v |";
    sep += "---|";
  }
  std::printf("%s\n%s\n", head.c_str(), sep.c_str());
  auto row = [&](const std::string& label, auto get) {
    std::string line = "| " + label + " |";
    double rk = 0, rv = 0;
    for (BasisMethod m : methods) {
      const Cell c = get(cells[m]);
      line += strprintf(" %.4f / %.4f | %.3f / %.3f |", c.rer_k, c.rer_v, c.so_k, c.so_v);
      rk = c.rank_k;
      rv = c.rank_v;
    }
    if (ratio == 0) line += strprintf(" %.1f / %.1f |", rk, rv);
    std::printf("%s\n", line.c_str());
  };
  for (int il = 0; il < L; ++il)
    row(std::to_string(il), [&](const std::vector<Cell>& col) { return col[il]; });
  row("**mean**", [&](const std::vector<Cell>& col) {
    Cell m;
    for (const Cell& c : col) {
      m.rer_k += c.rer_k / L;
      m.rer_v += c.rer_v / L;
      m.so_k += c.so_k / L;
      m.so_v += c.so_v / L;
      m.rank_k += c.rank_k / L;
      m.rank_v += c.rank_v / L;
    }
    return m;
  });
}

}  // namespace

void register_calibrate(CLI::App& app) {
  auto o = std::make_shared<CalibrateOptions>();
  CLI::App* c = app.add_subcommand(
      "calibrate",
      "fit low-rank KV bases (K-SVD, EigenAttention, KQ-SVD, StaticPCA) on calibration text");
  add_common_options(c, o->common);
  c->remove_option(c->get_option("--ctx"));
  c->remove_option(c->get_option("--batch"));
  c->remove_option(c->get_option("--kv-type"));
  c->remove_option(c->get_option("--cache-type-k"));
  c->remove_option(c->get_option("--cache-type-v"));
  c->remove_option(c->get_option("--no-kv-rotate"));
  c->remove_option(c->get_option("--mem-limit"));
  c->add_option("-f,--file", o->file,
                "calibration text: a file or a directory of .txt files (default: WikiText-2 valid "
                "from ../shared/data)");
  c->add_option("--seqs", o->seqs, "number of sequences")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  c->add_option("--seq-len", o->seq_len, "tokens per sequence")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 20));
  c->add_option("--layer-io-rows", o->layer_io_rows,
                "residual-stream rows (layer input, output) sampled per layer (0 = none)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  c->add_option("--methods", o->methods,
                "all, or a comma-separated list of ksvd,eigenattention,kqsvd,staticpca,swan")
      ->capture_default_str();
  c->add_option("-o,--out", o->out, "output file (default: next to the model, <model>.kvcalib)");
  c->add_option("--seed", o->seed, "seed of the layer-io reservoir sample")->capture_default_str();
  add_stief_options(c, o->stief);
  c->add_flag("--lexico", o->lexico,
              "also learn Lexico's per-layer key / value dictionaries (docs/presses-lexico.md); with --calib: "
              "add them to that file");
  c->add_option("--lexico-atoms", o->lex.n_atoms, "Lexico: atoms per dictionary (N)")
      ->capture_default_str()
      ->check(CLI::Range(1, 65535));
  c->add_option("--lexico-sparsity", o->lex.sparsity,
                "Lexico: atoms per row while learning (0 = max(4, head_dim / 8))")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  c->add_option("--lexico-iters", o->lex.iters, "Lexico: dictionary-learning iterations (OMP codes + MOD update)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  c->add_option("--lexico-rows", o->lexico_rows,
                "Lexico: key / value rows sampled per layer (each (token, kv head) one row) to learn from")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 24));
  c->add_flag("--report", o->report,
              "print RER / subspace-overlap diagnostics instead of writing a file");
  c->add_option("--calib", o->calib,
                "with --report: the calibration file to evaluate (default: fit in-sample on -f); "
                "with --stief: the calibration to add StiefAttention to (written back unless -o)");
  c->add_option("--ratio", o->ratio,
                "with --report: fraction of each head's dimensions removed, as a press's ratio (default 0.5)")
      ->check(CLI::Range(0.0, 1.0));
  c->add_option("--energy", o->energy,
                "with --report: rank = smallest holding this fraction of the fit's energy")
      ->check(CLI::Range(0.0, 1.0));
  c->callback([o] {
    if (o->report) {
      KVTRIM_CHECK(!o->stief.enabled && !o->lexico,
                   "--stief and --lexico write a calibration file: they do not go with --report");
      report(*o);
    } else {
      KVTRIM_CHECK(o->ratio == 0 && o->energy == 0, "--ratio and --energy need --report");
      if (!o->calib.empty()) {
        KVTRIM_CHECK(o->stief.enabled || o->lexico, "--calib needs --report, or --stief / --lexico (to add "
                     "StiefAttention / Lexico to that file)");
        add_to(*o);
        return;
      }
      calibrate(*o);
    }
  });
}

}  // namespace kvtrim::cli
