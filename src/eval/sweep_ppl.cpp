#include "eval/sweep_ppl.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "engine/session.h"
#include "eval/jsonl.h"
#include "eval/plot_svg.h"
#include "press/press.h"

namespace kvtrim::eval {

using nlohmann::json;

// ---------------------------------------------------------------------------------------
// Rows and the results file

namespace {

json row_to_json(const PplSweepRow& r) {
  json j = ppl_window_json(r.w);
  j["config"] = r.config;
  j["model"] = r.model;
  j["bench"] = "ppl";
  j["press"] = r.press;
  j["ratio"] = r.ratio;
  j["spec"] = r.spec;
  return j;
}

PplSweepRow ppl_row_from_json(const json& j) {
  PplSweepRow r;
  r.config = j.at("config").get<std::string>();
  r.model = j.at("model").get<std::string>();
  r.press = j.at("press").get<std::string>();
  r.ratio = j.at("ratio").get<double>();
  r.spec = j.at("spec").get<std::string>();
  r.w = ppl_window_from_json(j);
  return r;
}

}  // namespace

namespace {
const ResultsFormat<PplSweepRow, std::pair<std::string, int64_t>> kPplSweepFormat = {
    "window", "ppl sweep results line", "--out-dir", ppl_row_from_json,
    [](const PplSweepRow& r, const std::string&) {  // the row carries its config
      return row_to_json(r).dump(-1, ' ', false, json::error_handler_t::replace);
    },
    [](const PplSweepRow& r) { return std::make_pair(r.config, r.w.index); },
    [](const PplSweepRow& r) -> const std::string& { return r.w.tokens_hash; }};
}  // namespace

PplSweepResultsFile::PplSweepResultsFile(std::string path, std::set<std::string> configs, bool every_config)
    : ResultsFile(std::move(path), kPplSweepFormat, std::move(configs), every_config) {}

bool PplSweepResultsFile::done(const std::string& config, int64_t window, const std::string& tokens_hash) const {
  return ResultsFile::done({config, window}, tokens_hash, strprintf("window %lld", static_cast<long long>(window)),
                           "was scored on other tokens");
}

// ---------------------------------------------------------------------------------------
// Running

std::vector<SweepCell> ppl_sweep_cells(const std::vector<SweepCell>& cells) {
  std::vector<SweepCell> out;
  for (const SweepCell& c : cells)
    if (!c.baseline()) out.push_back(c);
  return out;
}

int64_t sweep_ppl_pending(const std::vector<int32_t>& tokens, const std::vector<SweepCell>& cells,
                          const PplSweepResultsFile& results, const PplConfig& c) {
  const int64_t n_win = ppl_window_count(static_cast<int64_t>(tokens.size()), c.ctx);
  int64_t n = 0;
  for (int64_t w = 0; w < n_win; ++w) {
    const std::string h = ppl_tokens_hash(ppl_window_tokens(tokens, c.ctx, w, c.bos));
    for (const SweepCell& cell : cells) n += !cell.baseline() && !results.done(cell.config, w, h);
  }
  return n;
}

int64_t sweep_ppl(Session& s, const std::vector<int32_t>& tokens,
                  const std::vector<SweepCell>& cells, PplSweepResultsFile& results,
                  const PplSweepRunOptions& opt) {
  const PplConfig& c = opt.ppl;
  const int64_t n_win = ppl_window_count(static_cast<int64_t>(tokens.size()), c.ctx);
  std::vector<std::vector<int32_t>> wins;
  std::vector<std::string> hashes;
  for (int64_t w = 0; w < n_win; ++w) {
    wins.push_back(ppl_window_tokens(tokens, c.ctx, w, c.bos));
    hashes.push_back(ppl_tokens_hash(wins.back()));
  }
  int64_t n_run = 0;
  for (const SweepCell& cell : cells) {
    if (cell.baseline()) continue;  // the full cache is in every row
    KVTRIM_CHECK(!cell.config.empty(), "sweep ppl: cell %s has no config (set_cell_configs)",
                 cell.spec.c_str());
    bool installed = false;
    for (int64_t w = 0; w < n_win; ++w) {
      if (results.done(cell.config, w, hashes[static_cast<size_t>(w)])) continue;
      if (!installed) {
        // eval ppl's session: the press installed with no after-prefill compression (the
        // pcc pass compresses once itself), from an empty cache of its own.
        PressSchedule sched;
        sched.after_prefill = false;
        s.set_press(make_press(cell.spec), sched);
        s.reset();
        check_ppl_config(s, c);
        installed = true;
      }
      PplSweepRow r;
      r.config = cell.config;
      r.model = opt.model;
      r.press = cell.press;
      r.ratio = cell.ratio;
      r.spec = cell.spec;
      r.w = score_ppl_window(s, wins[static_cast<size_t>(w)], w, c);
      results.append(r);
      ++n_run;
      if (opt.on_row) opt.on_row(r);
    }
  }
  return n_run;
}

// ---------------------------------------------------------------------------------------
// Summary maths

std::vector<PplSweepPoint> sweep_ppl_points(const std::vector<PplSweepRow>& rows) {
  std::vector<std::string> models, presses;
  std::map<std::tuple<std::string, std::string, double>, std::vector<PplWindow>> cells;
  std::map<std::string, std::map<int64_t, PplWindow>> full;  // model -> window -> the first row's
  for (const PplSweepRow& r : rows) {
    if (std::find(models.begin(), models.end(), r.model) == models.end()) models.push_back(r.model);
    if (std::find(presses.begin(), presses.end(), r.press) == presses.end())
      presses.push_back(r.press);
    cells[{r.model, r.press, r.ratio}].push_back(r.w);
    if (!full[r.model].count(r.w.index)) {
      // the full pass as a "press" pass: PPL_press = PPL_full, ΔPPL 0, KV / f16 1
      PplWindow f = r.w;
      f.nll_press = f.nll_full;
      f.nll2_press = f.nll2_full;
      f.nll_cross = f.nll2_full;
      f.kv_bytes = f.kv_dense;
      full[r.model][r.w.index] = f;
    }
  }
  std::vector<PplSweepPoint> out;
  for (const std::string& m : models) {
    PplSweepPoint base;
    base.model = m;
    base.press = "none";
    std::vector<PplWindow> fw;
    for (const auto& [w, f] : full[m]) fw.push_back(f);
    base.s = summarize_ppl(fw);
    out.push_back(std::move(base));
    for (const std::string& p : presses) {
      for (const auto& [key, ws] :
           cells) {  // the map orders ratios ascending within (model, press)
        if (std::get<0>(key) != m || std::get<1>(key) != p) continue;
        PplSweepPoint pt;
        pt.model = m;
        pt.press = p;
        pt.ratio = std::get<2>(key);
        pt.s = summarize_ppl(ws);
        out.push_back(std::move(pt));
      }
    }
  }
  return out;
}

std::vector<PplSweepCurve> sweep_ppl_curves(const std::vector<PplSweepPoint>& points) {
  std::map<std::string, double> base, span;
  std::vector<std::pair<std::string, std::string>> order;
  for (const PplSweepPoint& p : points) {
    span[p.model] = std::max(span[p.model], p.ratio);
    if (p.press == "none") {
      base[p.model] = p.s.ppl_full;
    } else if (std::find(order.begin(), order.end(), std::make_pair(p.model, p.press)) ==
               order.end()) {
      order.emplace_back(p.model, p.press);
    }
  }
  std::vector<PplSweepCurve> out;
  for (const auto& [m, press] : order) {
    // ratio 0 / saving 0 is the full f16 cache: ΔPPL 0 and no gap.
    std::vector<std::pair<double, double>> deltas = {{0.0, 0.0}}, gaps = {{0.0, 0.0}};
    std::vector<std::pair<double, double>> mdeltas = {{0.0, 0.0}}, mgaps = {{0.0, 0.0}};
    PplSweepCurve c;
    c.reached = -std::numeric_limits<double>::infinity();
    for (const PplSweepPoint& p : points) {
      if (p.model != m || p.press != press) continue;
      const double x = kv_saving(p.s.kv_ratio), gap = p.ppl_ratio() - 1;  // paired: the cell's own full PPL
      deltas.emplace_back(p.ratio, p.s.delta);
      gaps.emplace_back(p.ratio, gap);
      mdeltas.emplace_back(x, p.s.delta);
      mgaps.emplace_back(x, gap);
      c.reached = std::max(c.reached, x);
    }
    c.model = m;
    c.press = press;
    c.ppl_full = base.count(m) ? base[m] : 0;
    c.span = span.at(m);
    c.nominal.auc = curve_auc(deltas);
    c.nominal.r10 = tolerance_ratio(gaps, 0.10, &c.nominal.r10_grid);
    c.nominal.r20 = tolerance_ratio(gaps, 0.20, &c.nominal.r20_grid);
    const double upto = std::min(c.reached, c.span);
    c.measured.auc = upto > 0 ? measured_auc(mdeltas, upto, 0.0) : std::numeric_limits<double>::quiet_NaN();
    c.measured.r10 = measured_tolerance(mgaps, 0.10, &c.measured.r10_grid);
    c.measured.r20 = measured_tolerance(mgaps, 0.20, &c.measured.r20_grid);
    out.push_back(std::move(c));
  }
  return out;
}

std::string sweep_ppl_summary_markdown(const std::vector<PplSweepPoint>& points,
                                       const std::vector<PplSweepCurve>& curves,
                                       const std::string& title) {
  std::string out = "# " + title + "\n";
  std::vector<std::string> models;
  for (const PplSweepPoint& p : points)
    if (std::find(models.begin(), models.end(), p.model) == models.end()) models.push_back(p.model);
  for (const std::string& m : models) {
    out += "\n## " + m +
           "\n\n| press | ratio | windows | tokens | PPL | ΔPPL vs full | PPL / full | KV / f16 | "
           "KV / f16 w/o bases | KV MiB held |\n"
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for (const PplSweepPoint& p : points) {
      if (p.model != m) continue;
      const PplSummary& s = p.s;
      if (p.press == "none") {
        out += strprintf("| full cache | 0.00 | %lld | %lld | %.4f ± %.4f | — | 1.000 | — | — | — |\n",
                         static_cast<long long>(s.n_windows), static_cast<long long>(s.n_scored),
                         s.ppl_full, s.se_full);
        continue;
      }
      out += strprintf(
          "| %s | %.2f | %lld | %lld | %.4f ± %.4f | %+.4f ± %.4f | %.3f | %.3f | %s | %.2f |\n",
          p.press.c_str(), p.ratio, static_cast<long long>(s.n_windows),
          static_cast<long long>(s.n_scored), s.ppl_press, s.se_press, s.delta, s.se_delta,
          p.ppl_ratio(), s.kv_ratio, s.kv_ratio_rows >= 0 ? strprintf("%.3f", s.kv_ratio_rows).c_str() : "—",
          s.mean_kv_bytes / kSweepMiB);
    }
    bool any = false;
    for (const PplSweepCurve& c : curves) any = any || c.model == m;
    if (!any) continue;
    out +=
        "\n| press | mean ΔPPL over the saving reached | largest saving | KV saving, PPL within 10% "
        "| within 20% | nominal: mean ΔPPL | ratio within 10% | within 20% "
        "|\n|---|---:|---:|---:|---:|---:|---:|---:|\n";
    for (const PplSweepCurve& c : curves) {
      if (c.model != m) continue;
      out += strprintf(
          "| %s | %s | %.3f | %.3f (grid %.3f) | %.3f (grid %.3f) | %+.4f | %.3f (grid %.2f) | %.3f "
          "(grid %.2f) |\n",
          c.press.c_str(), std::isnan(c.measured.auc) ? "—" : strprintf("%+.4f", c.measured.auc).c_str(),
          c.reached, c.measured.r10, c.measured.r10_grid, c.measured.r20, c.measured.r20_grid,
          c.nominal.auc, c.nominal.r10, c.nominal.r10_grid, c.nominal.r20, c.nominal.r20_grid);
    }
  }
  out +=
      "\nLower is better. PPL: perplexity of the press pass over the scored tokens of the windows "
      "(eval ppl); "
      "ΔPPL: PPL press - PPL full on the same tokens, paired, ± its standard error; PPL / full: "
      "the cell's "
      "PPL over its own full-cache PPL. The full-cache row pools every window any cell scored. KV "
      "/ f16: cache "
      "bytes held while each scored token is evaluated over the uncompressed f16 size of the same "
      "positions "
      "(measured: low-rank bases and full-rank anchors count); KV / f16 w/o bases: the same "
      "without the bases, rotations and dictionaries shared by every head, session and context "
      "length (what each token costs; '—' for rows recorded before it was); KV MiB held: the mean "
      "of the bytes held. Curves are on the measured axis, the KV saving 1 - KV / f16. Mean ΔPPL: ΔPPL "
      "piecewise linear through the cells sorted by saving, from 0 at saving 0, averaged over "
      "savings up to the largest the press reached (capped at the sweep's largest ratio; '—' when "
      "it saved nothing). KV saving within t: the largest saving up to which PPL <= (1 + t) x the "
      "full-cache PPL, walking the cells by saving (cells that save nothing are left out) and "
      "stopping at the first crossing, interpolated; grid = the last cell within. Nominal: the same "
      "figures on the nominal ratio axis (what the papers report), for comparison only.\n";
  return out;
}

std::string sweep_ppl_summary_csv(const std::vector<PplSweepPoint>& points) {
  std::string out =
      "model,press,ratio,windows,tokens,ppl,ppl_se,ppl_full,ppl_full_se,delta,delta_se,kv_ratio,kv_"
      "mib\n";
  for (const PplSweepPoint& p : points) {
    const PplSummary& s = p.s;
    out += strprintf("%s,%s,%g,%lld,%lld,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f,%.5f,%.4f\n",
                     csv_field(p.model).c_str(), csv_field(p.press).c_str(), p.ratio,
                     static_cast<long long>(s.n_windows), static_cast<long long>(s.n_scored),
                     s.ppl_press, s.se_press, s.ppl_full, s.se_full, s.delta, s.se_delta,
                     s.kv_ratio, s.mean_kv_bytes / kSweepMiB);
  }
  return out;
}

std::string sweep_ppl_curves_csv(const std::vector<PplSweepCurve>& curves) {
  std::string out =
      "model,press,ppl_full,mean_delta_ppl,largest_saving,saving_10,saving_10_grid,saving_20,"
      "saving_20_grid,span,nominal_mean_delta_ppl,nominal_ratio_10,nominal_ratio_10_grid,"
      "nominal_ratio_20,nominal_ratio_20_grid\n";
  for (const PplSweepCurve& c : curves)
    out += strprintf("%s,%s,%.6f,%s,%.4f,%.4f,%.4f,%.4f,%.4f,%g,%.6f,%.4f,%g,%.4f,%g\n",
                     csv_field(c.model).c_str(), csv_field(c.press).c_str(), c.ppl_full,
                     std::isnan(c.measured.auc) ? "" : strprintf("%.6f", c.measured.auc).c_str(),
                     c.reached, c.measured.r10, c.measured.r10_grid, c.measured.r20,
                     c.measured.r20_grid, c.span, c.nominal.auc, c.nominal.r10, c.nominal.r10_grid,
                     c.nominal.r20, c.nominal.r20_grid);
  return out;
}

std::string write_sweep_ppl_summaries(const std::string& out_dir,
                                      const std::vector<PplSweepRow>& rows,
                                      const std::string& title) {
  const std::vector<PplSweepPoint> points = sweep_ppl_points(rows);
  const std::vector<PplSweepCurve> curves = sweep_ppl_curves(points);
  const std::string md = sweep_ppl_summary_markdown(points, curves, title);
  write_summary_file(out_dir, "summary.md", md);
  write_summary_file(out_dir, "summary.csv", sweep_ppl_summary_csv(points));
  write_summary_file(out_dir, "curves.csv", sweep_ppl_curves_csv(curves));
  write_summary_file(out_dir, "plot.svg", sweep_ppl_plot_svg(points, curves, title));
  return md;
}

}  // namespace kvtrim::eval
