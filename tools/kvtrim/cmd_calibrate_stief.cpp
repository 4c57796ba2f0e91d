// kvtrim calibrate --stief: StiefAttention's training after the statistics and fits
// (src/calib/stief_train.h; docs/stiefattention.md), with a per-layer progress bar, a resumable
// checkpoint next to the output file, and the r = d/2 diagnostics table (StiefAttention vs
// EigenAttention: layer-output error, token cosine, attention-output error).
#include "cmd_calibrate_stief.h"

#include <cstdio>
#include <filesystem>

#include "calib/capture.h"
#include "calib/stief_fits.h"
#include "calib/stief_train.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/timer.h"

namespace kvtrim::cli {

void add_stief_options(CLI::App* c, StiefCliOptions& o) {
  c->add_flag("--stief", o.enabled,
              "also train StiefAttention's bases and error surfaces (docs/stiefattention.md)");
  c->add_option("--stief-seqs", o.seqs, "StiefAttention: whole sequences (the last 4 held out)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{5}, int64_t{1} << 16));
  c->add_option("--stief-len", o.seq_len, "StiefAttention: tokens per sequence")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{16}, int64_t{1} << 20));
  c->add_option("--stief-epochs", o.epochs, "StiefAttention: at most this many epochs per rank")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  c->add_option("--stief-rows", o.rows,
                "StiefAttention: query rows per training step (0 = every position)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  c->add_option("--stief-val-rows", o.val_rows,
                "StiefAttention: evaluated rows of each held-out sequence (evenly spaced)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  c->add_option("--stief-eig-step", o.eig_step,
                "StiefAttention: step of EigenAttention's energy-threshold walk")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 0.5));
  c->add_option("--stief-init", o.init,
                "StiefAttention: eigen (start from EigenAttention's bases) or random (the paper)")
      ->capture_default_str()
      ->check(CLI::IsMember({"eigen", "random"}));
}

void check_stief_options(const StiefCliOptions& o, const std::vector<BasisMethod>& methods) {
  if (!o.enabled) return;
  bool eig = false;
  for (BasisMethod m : methods) eig = eig || m == BasisMethod::kEigenAttention;
  KVTRIM_CHECK(eig, "--stief needs the EigenAttention fits (warm start and baseline): include "
               "eigenattention in --methods");
}

void run_stief(const Model& model, Calibration& cal, const std::vector<int32_t>& tokens,
               int32_t bos, int64_t capture_tokens, const StiefCliOptions& o, ThreadPool& pool,
               const std::string& out) {
  const HParams& hp = model.hparams();
  KVTRIM_CHECK(o.seq_len <= hp.n_ctx_train,
               "--stief-len %lld exceeds the model's context limit of %d tokens",
               static_cast<long long>(o.seq_len), hp.n_ctx_train);
  // From the end of the text: the statistics (and so EigenAttention's bases and the warm start)
  // come from its start, so the held-out sequences are held out from those too.
  const size_t need = static_cast<size_t>(o.seqs * o.seq_len);
  const size_t from = tokens.size() > need ? tokens.size() - need : 0;
  if (static_cast<int64_t>(from) < capture_tokens)
    std::fprintf(stderr, "warning: the text has %zu tokens: StiefAttention's sequences overlap "
                 "the %lld tokens the statistics were captured from (the held-out error is then "
                 "partly in-sample for EigenAttention)\n", tokens.size(),
                 static_cast<long long>(capture_tokens));
  const auto seqs = cut_sequences(std::vector<int32_t>(tokens.begin() + static_cast<std::ptrdiff_t>(from), tokens.end()),
                                  o.seqs, o.seq_len, bos);
  StiefTrainConfig cfg;
  cfg.max_epochs = o.epochs;
  cfg.rows = o.rows;
  cfg.val_rows = o.val_rows;
  cfg.eig_step = o.eig_step;
  cfg.warm_start = o.init == "eigen";
  KVTRIM_CHECK(static_cast<int>(seqs.size()) > cfg.val_seqs,
               "the calibration text has %zu tokens: %zu sequences of %lld, StiefAttention needs "
               "more than %d (lower --stief-len or use a longer text)",
               tokens.size(), seqs.size(), static_cast<long long>(o.seq_len), cfg.val_seqs);
  const std::string ckpt = out + ".stief-partial";
  std::fprintf(stderr, "StiefAttention: %zu sequences x %lld tokens (%d held out), %s\n",
               seqs.size(), static_cast<long long>(o.seq_len), cfg.val_seqs,
               cfg.describe().c_str());
  std::fprintf(stderr, "StiefAttention: checkpoint after each layer in %s (an interrupted run "
               "resumes from it)\n", ckpt.c_str());
  ProgressBar bar("stief", hp.n_layer, "layer");
  double total_s = 0, bwd_s = 0;
  int64_t steps = 0;
  const double t0 = now_seconds();
  StiefFits fits = train_stief(model, cal, seqs, cfg, &pool, ckpt, [&](const StiefLayerReport& r) {
    total_s += r.seconds;
    bwd_s += r.backward_seconds;
    steps += r.steps;
    bar.update(r.layer + 1, strprintf("layer %d %.0f s", r.layer, r.seconds));
  });
  bar.finish();
  const double wall = now_seconds() - t0;
  cal.set_stief(std::make_shared<StiefFits>(fits));
  cal.meta["stief"] = cfg.describe();
  cal.meta["stief_sequences"] = strprintf("%zu x %lld", seqs.size(), static_cast<long long>(o.seq_len));
  cal.meta["stief_seconds"] = strprintf("%.1f", wall);
  // Diagnostics (the paper's Fig. 6) at the candidate nearest d/2.
  std::printf("\n## StiefAttention vs EigenAttention at r_k = %d, r_v = %d (held-out rows)\n\n",
              fits.ranks_k[fits.half_index()], fits.ranks_v[fits.half_index()]);
  std::printf("| layer | out err stief | out err eigen | cos stief | cos eigen | attn err stief | "
              "attn err eigen |\n|---|---|---|---|---|---|---|\n");
  double m[kDiagCount] = {};
  for (int il = 0; il < fits.n_layer(); ++il) {
    const auto& d = fits.layers[static_cast<size_t>(il)].diag;
    std::printf("| %d | %.4f | %.4f | %.4f | %.4f | %.4f | %.4f |\n", il, d[kDiagStiefOutErr],
                d[kDiagEigenOutErr], d[kDiagStiefOutCos], d[kDiagEigenOutCos],
                d[kDiagStiefAttnErr], d[kDiagEigenAttnErr]);
    for (int k = 0; k < kDiagCount; ++k) m[k] += d[static_cast<size_t>(k)] / fits.n_layer();
  }
  std::printf("| **mean** | %.4f | %.4f | %.4f | %.4f | %.4f | %.4f |\n\n", m[kDiagStiefOutErr],
              m[kDiagEigenOutErr], m[kDiagStiefOutCos], m[kDiagEigenOutCos], m[kDiagStiefAttnErr],
              m[kDiagEigenAttnErr]);
  std::printf("StiefAttention vs EigenAttention (means over layers): layer-output error %+.1f %%, "
              "token cosine %+.1f %%, attention-output error %+.1f %%\n",
              100.0 * (m[kDiagStiefOutErr] / m[kDiagEigenOutErr] - 1),
              100.0 * (m[kDiagStiefOutCos] / m[kDiagEigenOutCos] - 1),
              100.0 * (m[kDiagStiefAttnErr] / m[kDiagEigenAttnErr] - 1));
  const double thread_s = total_s * std::max(1, pool.n_threads());
  std::printf("StiefAttention training: %.1f s wall (this run; layers resumed from a checkpoint "
              "not counted), %lld optimizer steps; backward passes %.1f of %.1f thread-seconds "
              "(%.0f %%)\n",
              wall, static_cast<long long>(steps), bwd_s, thread_s,
              thread_s > 0 ? 100.0 * bwd_s / thread_s : 0.0);
}

void remove_stief_checkpoint(const std::string& out) {
  std::error_code ec;
  std::filesystem::remove(out + ".stief-partial", ec);
}

}  // namespace kvtrim::cli
