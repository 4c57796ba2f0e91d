// kvtrim eval sweep (DESIGN.md §1 use 1, §5 "Summaries of a sweep"; docs/eval.md "Sweeps"):
// one benchmark over presses × compression ratios (× models), with per-row results appended
// as each cell of a sample finishes (resumable), and the summaries a reader wants: a table
// (markdown and CSV), the accuracy-vs-ratio curves (SVG, src/eval/plot_svg.h), the area
// under each curve and the largest ratio within a tolerance of the uncompressed score.
//
// The grid: the baseline (no press, ratio 0) once, then every press entry at every ratio.
// A press entry is a press spec whose `ratio` option the sweep sets per cell
// ("snapkv:window=16" at 0.5 runs "snapkv:ratio=0.5,window=16").
//
// One prefill per sample (ruler, query-agnostic): the session's observer captures the union
// of every press's needs (PressNeeds::merge) while the context is prefilled once; the
// session's state (a deep copy of the cache, the observations, the logits) is saved; every
// cell restores it, compresses with its own press (Session::compress_with) and answers the
// sample's questions exactly as `kvtrim eval ruler --press` does (eval::run_sample). A press
// scores from what it needs of the union (snapkv takes the last W of a longer window), so a
// cell's outputs and KV bytes equal the single-press run's (tested). Fresh prefill per cell
// (the row says "prefill": "fresh", and the run is eval ruler's / eval mc's own path with
// the press installed on the session): query-aware ruler (the press sees the question before
// compressing, so nothing can be shared), presses that work inside the session's prefill or
// decode loop (Press::plans_after_append, decode_interval: low-rank presses compressed
// throughout, OjaKV's updates), and mc (eval::score_item prefills itself; its contexts are
// short). Every cell and sample starts from an empty cache (Session::reset).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "eval/mc.h"
#include "eval/results_file.h"
#include "eval/runner.h"
#include "eval/sample.h"
#include "press/press.h"

namespace kvtrim {
class Model;
class Session;
}  // namespace kvtrim

namespace kvtrim::eval {

// ---------------------------------------------------------------------------------------
// The grid

// Splits a --presses value into press entries. Commas at parenthesis depth 0 separate
// entries, except that a piece of the form name=value continues the previous entry's options:
// "snapkv:window=16,kernel=5,streamingllm" -> {"snapkv:window=16,kernel=5", "streamingllm"}.
// Throws Error for an empty list or entry.
std::vector<std::string> split_press_list(const std::string& list);
// "0.25,0.5" -> the ratios, sorted, without duplicates and without 0 (the baseline is always
// run). Throws Error naming an item that is not a number in [0, 1), or an empty list.
std::vector<double> parse_ratio_list(const std::string& list);
// The entry without any ratio it gives ("snapkv:ratio=0.3,window=16" -> "snapkv:window=16").
std::string press_label(const std::string& entry);
// The entry's spec with ratio = `ratio` (replacing a given ratio= or bare first value). In a
// composition ('+') the last press gets the ratio and the others stay as given
// ("snapkv:0.5+spark" at 0.8: snapkv:ratio=0.5+spark:ratio=0.8). Throws Error for a press
// without a ratio option; make_press reports unknown presses and options.
std::string spec_with_ratio(const std::string& entry, double ratio);

struct SweepCell {
  std::string press = "none";  // label (press_label); "none" for the baseline
  double ratio = 0;            // 0 = the baseline
  std::string spec = "none";   // canonical press spec (Press::spec()); "none" for the baseline
  std::string calib;   // the calibration the cell's press reads (Press::calibration_id; "" = none)
  std::string config;  // hash of everything that decides this cell's rows (set_cell_configs)
  bool baseline() const { return spec == "none"; }
};
// The baseline, then every entry at every ratio (entry-major). Builds each press once (so a
// bad entry fails before any model is loaded). Throws Error for duplicate entries.
std::vector<SweepCell> sweep_cells(const std::vector<std::string>& entries,
                                   const std::vector<double>& ratios);
// Appends "press=" + press and, when the press reads a calibration (calib not empty),
// "calib=" + calib: only then, so runs without one keep the hashes they had before
// calibrations were identified. Every recipe's press part (recipe.h) and the sweeps'.
void append_press_parts(std::vector<std::string>* parts, const std::string& press, const std::string& calib);
// cell.config = config_hash(base_parts + append_press_parts(spec, calib) + "protocol=" + protocol).
void set_cell_configs(std::vector<SweepCell>* cells, const std::vector<std::string>& base_parts,
                      const std::string& protocol);

// ---------------------------------------------------------------------------------------
// Rows and the results file

// One line of results.jsonl: one question (ruler) or item (mc) under one cell.
struct SweepRow {
  std::string config;  // the cell's config hash
  std::string model;   // model label (-m as given)
  std::string bench;   // "ruler", "hellaswag", ...
  std::string press;   // cell label
  double ratio = 0;
  std::string spec;
  std::string group;  // what scores are averaged within first: the RULER task, the mc bench
  std::string id;     // unit id: "task/index" (ruler), "bench/index" (mc)
  int q = 0;          // question within the unit (0 for mc)
  std::string unit_hash;
  double score = 0;  // 0-100, higher is better (ruler: the scorer; mc: 100 x the headline metric)
  size_t kv_bytes = 0;        // cache().bytes().total() after the context's compression
  size_t kv_bytes_dense = 0;  // the uncompressed f16 size of the same positions
  int64_t kv_bases = -1;      // of kv_bytes: bases / rotations / dictionaries (-1: not recorded)
  double decode_tps = 0;      // 0 when nothing was decoded (mc)
  bool shared_prefill = false;
  std::string extra;  // the benchmark's own fields, a JSON object (output, answers, loglik ...)
};

// A sweep's results.jsonl (results_file.h): one row a line, keyed by (config, sample id,
// question), with the unit's hash; rows whose config is one of `configs` are this run's
// (every_config: every row, for `kvtrim eval sweep summary`).
class SweepResultsFile : public ResultsFile<SweepRow, std::tuple<std::string, std::string, int>> {
 public:
  SweepResultsFile(std::string path, std::set<std::string> configs, bool every_config = false);
  // True if (config, id, q) is there. Throws Error if it is there with another unit hash (the
  // samples changed under the same config).
  bool done(const std::string& config, const std::string& id, int q, const std::string& unit_hash) const;
};

// ---------------------------------------------------------------------------------------
// Running

struct SweepRunOptions {
  std::string model;         // label written to each row
  bool query_aware = false;  // ruler only: fresh prefill per cell, the press sees the question
  std::string bench = "ruler";  // sweep_ruler's rows: "ruler", or "gsm8k" (the same protocol)
  // After each row is appended (the progress bar; a test interrupts by throwing here).
  std::function<void(const SweepRow&)> on_row;
};


// (cell, question) pairs of `samples` not yet in `results`.
int64_t sweep_ruler_pending(const std::vector<EvalSample>& samples,
                            const std::vector<SweepCell>& cells, const SweepResultsFile& results);
// Runs every pending (cell, question), appending each row as it finishes; returns the rows
// run. Cells are set up (set_cell_configs) by the caller; the session's press is replaced.
int64_t sweep_ruler(Session& s, const PromptBuilder& pb, const std::vector<EvalSample>& samples,
                    const std::vector<SweepCell>& cells, SweepResultsFile& results,
                    const SweepRunOptions& opt);

// The same for multiple choice: one row per (cell, item), score = 100 x acc_norm (hellaswag,
// piqa) or acc (mmlu), the benchmark's headline metric.
int64_t sweep_mc_pending(const std::string& bench, const std::vector<McItem>& items,
                         const std::vector<SweepCell>& cells, const SweepResultsFile& results);
int64_t sweep_mc(Session& s, const std::string& bench, const std::vector<McItem>& items,
                 const std::vector<SweepCell>& cells, SweepResultsFile& results,
                 const SweepRunOptions& opt);
// "bench/index", the mc row id.
std::string mc_row_id(const std::string& bench, const McItem& item);

// ---------------------------------------------------------------------------------------
// Summary maths (docs/eval.md "Sweeps"; src/eval/sweep_summary.cpp)

// One (model, press, ratio) cell aggregated over its rows.
struct SweepPoint {
  std::string model, press;
  double ratio = 0;
  int64_t n = 0;                              // rows
  double score = 0;                           // mean over groups of the group's mean score
  std::map<std::string, double> group_score;  // per group (RULER task): mean score
  double kv_bytes = 0, kv_bytes_dense = 0;    // means over rows
  double kv_bases = -1;                       // mean over rows (-1 when a row did not record it)
  double decode_tps = 0;                      // mean over rows that decoded (0 if none did)
  // Fidelity to the full cache: the fraction of rows whose answer equals the uncompressed cell's
  // on the same question (same_answer); -1 for the baseline and where none can be compared.
  double same_as_none = -1;
  int64_t n_compared = 0;
  double kv_ratio() const { return kv_bytes_dense > 0 ? kv_bytes / kv_bytes_dense : 0; }
  // KV / f16 without the bases shared by every context (-1 when unknown).
  double kv_ratio_wo_bases() const {
    return kv_bases >= 0 && kv_bytes_dense > 0 ? (kv_bytes - kv_bases) / kv_bytes_dense : -1;
  }
};
// Whether two rows of one question give the same answer: gsm8k: the same final number
// (gsm8k_extract_answer, numerically); ruler: the same output after RULER's post-processing; mc:
// the same choice (the headline metric's: pred_norm, or pred for mmlu). a, b: the rows' extra
// JSON. nullopt when either lacks what is compared (such rows are not counted).
std::optional<bool> same_answer(const std::string& bench, const std::string& extra_a, const std::string& extra_b);
// Every cell of `rows`: models in order of first appearance; within a model the baseline
// ("none") first, then presses in order of first appearance, ratios ascending.
std::vector<SweepPoint> sweep_points(const std::vector<SweepRow>& rows);

// Area under score(ratio): trapezoids over the ratio axis from the first point (ratio 0, the
// uncompressed score) to the last, divided by that span: the curve's mean score, in the
// score's units. pts ascending in ratio; one point: its score; none: 0.
double curve_auc(const std::vector<std::pair<double, double>>& pts);
// KVCompose's performance gap (eq. 10): the mean over groups of the relative drop
// (R0 - R) / R0, over the groups whose baseline R0 is > 0 (a group the uncompressed model
// fails cannot degrade); when no group has R0 > 0, the relative drop of the overall score
// (0 when that is 0 too). Negative when the press scores better.
double relative_gap(const SweepPoint& base, const SweepPoint& p);
// KVCompose's table 2: the maximum compression ratio whose gap stays within tol. The ratios
// are walked upward from (0, 0) and the walk stops at the first gap > tol: a curve that dips
// out of the tolerance and comes back later does not count, so the answer is a ratio up to
// which every swept ratio is within. Returned: the crossing, interpolated linearly in the gap
// between the last ratio within and the first beyond (the paper's table gives values between
// its grid points); *grid (may be nullptr) gets the last swept ratio within. No ratio beyond:
// the last ratio (both). gaps ascending in ratio, starting at ratio 0.
double tolerance_ratio(const std::vector<std::pair<double, double>>& gaps, double tol,
                       double* grid = nullptr);

// The figures of one curve on one x axis.
struct CurveFigures {
  double auc = 0;
  double r10 = 0, r20 = 0;            // tolerance_ratio at 10 % and 20 %, interpolated
  double r10_grid = 0, r20_grid = 0;  // the last point within
};

// The measured axis (DESIGN.md §3: every ratio the tools report comes from the cache's bytes).
// A cell's KV saving is 1 - KV bytes / f16 bytes of the same positions: 0 for an uncompressed
// f16 cache, 0.5 when half the f16 bytes are gone, below 0 when the cache holds more than f16
// would (low-rank bases at short contexts, index overheads).
inline double kv_saving(double kv_ratio) { return 1 - kv_ratio; }
// Mean of y over [0, span] (span > 0) of the piecewise-linear curve through pts (x = measured
// saving) sorted by x (ties keep their order): left of the first point, the first point's y;
// right of the last point, `beyond` (what a saving the press never reached is worth: 0 for a
// score, so a press is not credited with savings it did not make).
double measured_auc(std::vector<std::pair<double, double>> pts, double span, double beyond);
// tolerance_ratio on the measured axis: gaps = (saving, gap) with the baseline (its saving, 0)
// first. Points whose saving is not above the baseline's save nothing and are left out; the
// rest are walked in ascending saving (ties in the given order). The answer is a saving.
double measured_tolerance(std::vector<std::pair<double, double>> gaps, double tol,
                          double* grid = nullptr);

// One press's curve for one model, on the measured axis (the headline) and on the nominal one.
struct SweepCurve {
  std::string model, press;
  double base_score = 0;
  // x = measured KV saving. AUC: measured_auc over [0, span] with 0 beyond the press's largest
  // saving; tolerance figures: measured_tolerance (a saving, not a ratio).
  CurveFigures measured;
  // x = the nominal ratio each cell asked for (curve_auc from 0 to the largest ratio,
  // tolerance_ratio): what kvpress and the papers report; labelled "nominal" everywhere.
  CurveFigures nominal;
  double reached = 0;  // the largest measured saving among the press's cells
  double span = 0;     // the largest nominal ratio of the model's sweep (every press the same)
};
// For every (model, press) of points with that model's baseline; presses with no baseline
// point (an incomplete sweep) are skipped.
std::vector<SweepCurve> sweep_curves(const std::vector<SweepPoint>& points);
// summary.md: the per-cell table (score, KV MiB held, KV / f16, decode tok/s, n) per model,
// then the curves table (measured: AUC, KV saving within 10 % / 20 %, largest saving; then the
// nominal figures, labelled). `title` heads it.
std::string sweep_summary_markdown(const std::vector<SweepPoint>& points,
                                   const std::vector<SweepCurve>& curves, const std::string& title);
// summary.csv: one row per cell; curves.csv: one row per curve.
std::string sweep_summary_csv(const std::vector<SweepPoint>& points);
std::string sweep_curves_csv(const std::vector<SweepCurve>& curves);

// Shared by the sweep summaries (ruler / mc and ppl): a CSV field quoted when it needs it,
// and a file written whole or not at all (temporary file, then rename).
std::string csv_field(const std::string& s);
void write_summary_file(const std::string& out_dir, const char* name, const std::string& text);
inline constexpr double kSweepMiB = 1024.0 * 1024.0;

// Writes summary.md, summary.csv, curves.csv and plot.svg into out_dir from `rows`; returns the
// markdown.
std::string write_sweep_summaries(const std::string& out_dir, const std::vector<SweepRow>& rows,
                                  const std::string& title, const std::string& score_label);

}  // namespace kvtrim::eval
