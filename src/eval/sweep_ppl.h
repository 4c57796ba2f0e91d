// kvtrim eval sweep ppl (docs/eval.md "Sweeps"): perplexity through the compressed cache over
// presses × compression ratios (× models), on eval ppl's own path: every (cell, window) row is
// one score_ppl_window (src/eval/ppl.h) with the cell's press installed on the session, as
// `kvtrim eval ppl --press SPEC` runs it, so a cell's rows equal that command's lines (tested).
//
// The full-cache pass: score_ppl_window runs both passes of a window (the full one and the
// press's) and returns their paired NLL sums; it has no entry point for the press pass alone,
// so every cell recomputes the (identical, deterministic) full pass of its windows. Each row
// keeps the window's full-cache NLL sums (nll_full, nll2_full, nll_cross), so ΔPPL is paired
// within the cell and a resumed sweep needs nothing else; the uncompressed PPL of a model is
// taken from the first cell that has each window (sweep_ppl_points).
//
// No baseline cell: the full cache is the reference of every row. Lower is better: the curves
// report, on the measured KV-saving axis (DESIGN.md §3) and, labelled, on the nominal ratio
// axis, the mean ΔPPL over the span (the "AUC") and the largest saving / ratio whose PPL stays
// within (1 + tol) × the full-cache PPL, walked upward with the first crossing ending the walk
// (tolerance_ratio, as for RULER).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "eval/ppl.h"
#include "eval/sweep.h"

namespace kvtrim {
class Session;
}  // namespace kvtrim

namespace kvtrim::eval {

// One line of results.jsonl: one window under one cell.
struct PplSweepRow {
  std::string config, model, press, spec;
  double ratio = 0;
  PplWindow w;
};

// A perplexity sweep's results.jsonl (results_file.h): one window under one cell a line, keyed
// by (config, window), with the window's tokens' hash; rows whose config is one of `configs` are
// this run's (every_config: every row, for `kvtrim eval sweep summary`).
class PplSweepResultsFile : public ResultsFile<PplSweepRow, std::pair<std::string, int64_t>> {
 public:
  PplSweepResultsFile(std::string path, std::set<std::string> configs, bool every_config = false);
  // Throws Error if (config, window) is there with other tokens.
  bool done(const std::string& config, int64_t window, const std::string& tokens_hash) const;
};

struct PplSweepRunOptions {
  std::string model;  // label written to each row
  PplConfig ppl;
  std::function<void(const PplSweepRow&)> on_row;  // after each append (a test throws here)
};

// The cells without the baseline (a ppl row always holds the full-cache pass).
std::vector<SweepCell> ppl_sweep_cells(const std::vector<SweepCell>& cells);
// (cell, window) pairs of `tokens` not yet in `results`.
int64_t sweep_ppl_pending(const std::vector<int32_t>& tokens, const std::vector<SweepCell>& cells,
                          const PplSweepResultsFile& results, const PplConfig& c);
// Runs every pending (cell, window), cell by cell (the press installed once per cell, as eval
// ppl holds one press over its windows), appending each row as it finishes; returns the rows
// run. The session's press is replaced; its context must hold c.ctx tokens.
int64_t sweep_ppl(Session& s, const std::vector<int32_t>& tokens,
                  const std::vector<SweepCell>& cells, PplSweepResultsFile& results,
                  const PplSweepRunOptions& opt);

// ---------------------------------------------------------------------------------------
// Summary maths

// One (model, press, ratio) cell: summarize_ppl over its windows. press "none" / ratio 0: the
// model's full cache over the windows of any cell (each window once), kv_ratio 1.
struct PplSweepPoint {
  std::string model, press;
  double ratio = 0;
  PplSummary s;
  double ppl_ratio() const { return s.ppl_full > 0 ? s.ppl_press / s.ppl_full : 0; }
};
// Models in order of first appearance; within a model the full cache first, then presses in
// order of first appearance, ratios ascending.
std::vector<PplSweepPoint> sweep_ppl_points(const std::vector<PplSweepRow>& rows);

struct PplSweepCurve {
  std::string model, press;
  double ppl_full = 0;
  // x = the measured KV saving 1 - KV / f16 (sweep.h kv_saving). auc: the mean ΔPPL over savings
  // [0, min(reached, span)] (measured_auc, piecewise linear from ΔPPL 0 at saving 0), NaN when
  // the press saved nothing (reached <= 0): ΔPPL has no natural value beyond what a press
  // reached, so the figure is the mean over what it reached, printed beside `reached`.
  // r10 / r20: the largest saving with PPL <= (1 + tol) PPL_full (measured_tolerance).
  CurveFigures measured;
  // x = the nominal ratio (curve_auc over [0, largest ratio], tolerance_ratio), labelled.
  CurveFigures nominal;
  double reached = 0;  // the largest measured saving among the press's cells
  double span = 0;     // the largest nominal ratio of the model's sweep
};
// For every (model, press): the gap of a cell is its paired PPL_press / PPL_full - 1.
std::vector<PplSweepCurve> sweep_ppl_curves(const std::vector<PplSweepPoint>& points);

std::string sweep_ppl_summary_markdown(const std::vector<PplSweepPoint>& points,
                                       const std::vector<PplSweepCurve>& curves,
                                       const std::string& title);
std::string sweep_ppl_summary_csv(const std::vector<PplSweepPoint>& points);
std::string sweep_ppl_curves_csv(const std::vector<PplSweepCurve>& curves);
// summary.md, summary.csv, curves.csv and plot.svg (src/eval/plot_svg.h) into out_dir; returns
// the markdown.
std::string write_sweep_ppl_summaries(const std::string& out_dir,
                                      const std::vector<PplSweepRow>& rows,
                                      const std::string& title);

}  // namespace kvtrim::eval
