// The summaries of a sweep (src/eval/sweep.h, "Summary maths"; docs/eval.md "Sweeps"): rows
// aggregated into cells, the curves on the measured and the nominal axis (AUC, tolerance
// figures), and the files written from them (summary.md / .csv, curves.csv, plot.svg).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <tuple>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "eval/gsm8k.h"
#include "eval/plot_svg.h"
#include "eval/scoring.h"
#include "eval/sweep.h"

namespace kvtrim::eval {

// ---------------------------------------------------------------------------------------
// Summary maths

std::optional<bool> same_answer(const std::string& bench, const std::string& extra_a, const std::string& extra_b) {
  using nlohmann::json;
  const json a = json::parse(extra_a.empty() ? "{}" : extra_a, nullptr, false);
  const json b = json::parse(extra_b.empty() ? "{}" : extra_b, nullptr, false);
  if (!a.is_object() || !b.is_object()) return std::nullopt;
  auto str = [](const json& j, const char* k) -> const std::string* {
    const auto it = j.find(k);
    return it != j.end() && it->is_string() ? it->get_ptr<const std::string*>() : nullptr;
  };
  if (const std::string *oa = str(a, "output"), *ob = str(b, "output"); oa && ob) {
    if (bench == "gsm8k") return same_final_answer(*oa, *ob);
    return postprocess_prediction(*oa) == postprocess_prediction(*ob);
  }
  const char* key = bench == "mmlu" ? "pred" : "pred_norm";
  const auto pa = a.find(key), pb = b.find(key);
  if (pa == a.end() || pb == b.end()) return std::nullopt;
  return *pa == *pb;
}

std::vector<SweepPoint> sweep_points(const std::vector<SweepRow>& rows) {
  // the uncompressed cell's answers, per (model, question)
  std::map<std::tuple<std::string, std::string, int>, const SweepRow*> base;
  for (const SweepRow& r : rows)
    if (r.press == "none") base[{r.model, r.id, r.q}] = &r;
  struct Acc {
    int64_t n_same = 0, n_compared = 0;
    int64_t n = 0, n_tps = 0;
    double kv = 0, kv_dense = 0, tps = 0, bases = 0;
    bool bases_known = true;
    std::map<std::string, std::pair<double, int64_t>> groups;  // sum, n
  };
  std::vector<std::string> models, presses;
  std::map<std::tuple<std::string, std::string, double>, Acc> acc;
  for (const SweepRow& r : rows) {
    if (std::find(models.begin(), models.end(), r.model) == models.end()) models.push_back(r.model);
    if (r.press != "none" && std::find(presses.begin(), presses.end(), r.press) == presses.end())
      presses.push_back(r.press);
    Acc& a = acc[{r.model, r.press, r.ratio}];
    ++a.n;
    a.kv += static_cast<double>(r.kv_bytes);
    a.kv_dense += static_cast<double>(r.kv_bytes_dense);
    a.bases += static_cast<double>(r.kv_bases);
    a.bases_known = a.bases_known && r.kv_bases >= 0;
    if (r.decode_tps > 0) {
      a.tps += r.decode_tps;
      ++a.n_tps;
    }
    if (r.press != "none") {
      const auto b = base.find({r.model, r.id, r.q});
      if (b != base.end()) {
        if (const std::optional<bool> same = same_answer(r.bench, r.extra, b->second->extra)) {
          ++a.n_compared;
          a.n_same += *same;
        }
      }
    }
    auto& g = a.groups[r.group];
    g.first += r.score;
    ++g.second;
  }
  presses.insert(presses.begin(), "none");
  std::vector<SweepPoint> out;
  for (const std::string& m : models) {
    for (const std::string& p : presses) {
      for (const auto& [key, a] : acc) {  // the map orders ratios ascending within (model, press)
        if (std::get<0>(key) != m || std::get<1>(key) != p) continue;
        SweepPoint pt;
        pt.model = m;
        pt.press = p;
        pt.ratio = std::get<2>(key);
        pt.n = a.n;
        double sum = 0;
        for (const auto& [g, sn] : a.groups) {
          pt.group_score[g] = sn.first / static_cast<double>(sn.second);
          sum += pt.group_score[g];
        }
        pt.score = sum / static_cast<double>(a.groups.size());
        pt.kv_bytes = a.kv / static_cast<double>(a.n);
        pt.kv_bytes_dense = a.kv_dense / static_cast<double>(a.n);
        pt.kv_bases = a.bases_known ? a.bases / static_cast<double>(a.n) : -1;
        pt.decode_tps = a.n_tps ? a.tps / static_cast<double>(a.n_tps) : 0;
        pt.n_compared = a.n_compared;
        pt.same_as_none = a.n_compared ? static_cast<double>(a.n_same) / static_cast<double>(a.n_compared) : -1;
        out.push_back(std::move(pt));
      }
    }
  }
  return out;
}

double curve_auc(const std::vector<std::pair<double, double>>& pts) {
  if (pts.empty()) return 0;
  if (pts.size() == 1) return pts[0].second;
  double area = 0;
  for (size_t i = 1; i < pts.size(); ++i) {
    KVTRIM_CHECK(pts[i].first > pts[i - 1].first, "curve_auc: ratios must increase (%g after %g)",
                 pts[i].first, pts[i - 1].first);
    area += (pts[i].first - pts[i - 1].first) * (pts[i].second + pts[i - 1].second) / 2;
  }
  return area / (pts.back().first - pts.front().first);
}

double relative_gap(const SweepPoint& base, const SweepPoint& p) {
  double sum = 0;
  int n = 0;
  for (const auto& [g, r0] : base.group_score) {
    auto it = p.group_score.find(g);
    if (r0 <= 0 || it == p.group_score.end()) continue;
    sum += (r0 - it->second) / r0;
    ++n;
  }
  if (n > 0) return sum / n;
  return base.score > 0 ? (base.score - p.score) / base.score : 0;
}

double tolerance_ratio(const std::vector<std::pair<double, double>>& gaps, double tol,
                       double* grid) {
  KVTRIM_CHECK(!gaps.empty(), "tolerance_ratio: no points");
  double last_r = gaps[0].first, last_e = gaps[0].second;
  for (size_t i = 1; i < gaps.size(); ++i) {
    const auto [r, e] = gaps[i];
    if (e > tol) {
      if (grid) *grid = last_r;
      // the gap crosses tol between last_r (within) and r (beyond): linear in the gap
      const double t = e > last_e ? (tol - last_e) / (e - last_e) : 0;
      return last_r + std::clamp(t, 0.0, 1.0) * (r - last_r);
    }
    last_r = r;
    last_e = e;
  }
  if (grid) *grid = last_r;
  return last_r;
}

double measured_auc(std::vector<std::pair<double, double>> pts, double span, double beyond) {
  KVTRIM_CHECK(span > 0, "measured_auc: span %g must be > 0", span);
  if (pts.empty()) return beyond;
  std::stable_sort(pts.begin(), pts.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  // the integral of the curve over [lo, hi] ∩ [0, span]
  double area = 0;
  auto add = [&](double x0, double y0, double x1, double y1) {  // a linear piece, x0 <= x1
    const double lo = std::max(x0, 0.0), hi = std::min(x1, span);
    if (hi <= lo) return;
    auto at = [&](double x) { return x1 > x0 ? y0 + (y1 - y0) * (x - x0) / (x1 - x0) : y0; };
    area += (hi - lo) * (at(lo) + at(hi)) / 2;
  };
  add(std::min(0.0, pts.front().first), pts.front().second, pts.front().first, pts.front().second);
  for (size_t i = 1; i < pts.size(); ++i)
    add(pts[i - 1].first, pts[i - 1].second, pts[i].first, pts[i].second);
  add(pts.back().first, beyond, std::max(span, pts.back().first), beyond);
  return area / span;
}

double measured_tolerance(std::vector<std::pair<double, double>> gaps, double tol, double* grid) {
  KVTRIM_CHECK(!gaps.empty(), "measured_tolerance: no points");
  const double base = gaps[0].first;
  std::vector<std::pair<double, double>> walk = {gaps[0]};
  for (size_t i = 1; i < gaps.size(); ++i)
    if (gaps[i].first > base) walk.push_back(gaps[i]);
  std::stable_sort(walk.begin() + 1, walk.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  return tolerance_ratio(walk, tol, grid);
}

std::vector<SweepCurve> sweep_curves(const std::vector<SweepPoint>& points) {
  std::vector<SweepCurve> out;
  std::map<std::string, const SweepPoint*> base;
  std::map<std::string, double> span;  // the largest nominal ratio of each model's sweep
  for (const SweepPoint& p : points) {
    if (p.press == "none") base[p.model] = &p;
    span[p.model] = std::max(span[p.model], p.ratio);
  }
  std::vector<std::pair<std::string, std::string>> order;
  for (const SweepPoint& p : points) {
    if (p.press == "none" || !base.count(p.model)) continue;
    if (std::find(order.begin(), order.end(), std::make_pair(p.model, p.press)) == order.end())
      order.emplace_back(p.model, p.press);
  }
  auto figures = [](CurveFigures* f, const std::vector<std::pair<double, double>>& gaps, bool measured) {
    f->r10 = measured ? measured_tolerance(gaps, 0.10, &f->r10_grid) : tolerance_ratio(gaps, 0.10, &f->r10_grid);
    f->r20 = measured ? measured_tolerance(gaps, 0.20, &f->r20_grid) : tolerance_ratio(gaps, 0.20, &f->r20_grid);
  };
  for (const auto& [m, press] : order) {
    const SweepPoint& b = *base.at(m);
    const double s0 = kv_saving(b.kv_ratio());
    std::vector<std::pair<double, double>> sc = {{0.0, b.score}}, gaps = {{0.0, 0.0}};
    std::vector<std::pair<double, double>> msc = {{s0, b.score}}, mgaps = {{s0, 0.0}};
    SweepCurve c;
    c.reached = -std::numeric_limits<double>::infinity();
    for (const SweepPoint& p : points) {
      if (p.model != m || p.press != press) continue;
      const double gap = relative_gap(b, p), x = kv_saving(p.kv_ratio());
      sc.emplace_back(p.ratio, p.score);
      gaps.emplace_back(p.ratio, gap);
      msc.emplace_back(x, p.score);
      mgaps.emplace_back(x, gap);
      c.reached = std::max(c.reached, x);
    }
    c.model = m;
    c.press = press;
    c.base_score = b.score;
    c.span = span.at(m);
    c.nominal.auc = curve_auc(sc);
    figures(&c.nominal, gaps, false);
    c.measured.auc = measured_auc(msc, c.span, 0.0);
    figures(&c.measured, mgaps, true);
    out.push_back(std::move(c));
  }
  return out;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

void write_summary_file(const std::string& out_dir, const char* name, const std::string& text) {
  const std::string path = (std::filesystem::path(out_dir) / name).string();
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    KVTRIM_CHECK(f.good(), "cannot write '%s'", tmp.c_str());
    f << text;
    KVTRIM_CHECK(f.good(), "error writing '%s'", tmp.c_str());
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);  // never leave a half-written summary behind
  KVTRIM_CHECK(!ec, "cannot rename '%s' to '%s': %s", tmp.c_str(), path.c_str(),
               ec.message().c_str());
}

std::string sweep_summary_markdown(const std::vector<SweepPoint>& points,
                                   const std::vector<SweepCurve>& curves,
                                   const std::string& title) {
  std::string out = "# " + title + "\n";
  std::vector<std::string> models;
  for (const SweepPoint& p : points)
    if (std::find(models.begin(), models.end(), p.model) == models.end()) models.push_back(p.model);
  for (const std::string& m : models) {
    out += "\n## " + m +
           "\n\n| press | ratio | score | same as none | KV MiB held | KV / f16 | KV / f16 w/o bases | decode tok/s | n |\n"
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for (const SweepPoint& p : points) {
      if (p.model != m) continue;
      const double wo = p.kv_ratio_wo_bases();
      out += strprintf("| %s | %.2f | %.1f | %s | %.2f | %.3f | %s | %s | %lld |\n", p.press.c_str(), p.ratio,
                       p.score, p.same_as_none >= 0 ? strprintf("%.1f%%", 100 * p.same_as_none).c_str() : "-",
                       p.kv_bytes / kSweepMiB, p.kv_ratio(), wo >= 0 ? strprintf("%.3f", wo).c_str() : "-",
                       p.decode_tps > 0 ? strprintf("%.1f", p.decode_tps).c_str() : "-",
                       static_cast<long long>(p.n));
    }
    bool any = false;
    for (const SweepCurve& c : curves) any = any || c.model == m;
    if (!any) continue;
    out +=
        "\n| press | AUC | KV saving within 10% | within 20% | largest saving | nominal: AUC | "
        "ratio within 10% | within 20% |\n|---|---:|---:|---:|---:|---:|---:|---:|\n";
    for (const SweepCurve& c : curves) {
      if (c.model != m) continue;
      out += strprintf(
          "| %s | %.1f | %.3f (grid %.3f) | %.3f (grid %.3f) | %.3f | %.1f | %.3f (grid %.2f) | "
          "%.3f (grid %.2f) |\n",
          c.press.c_str(), c.measured.auc, c.measured.r10, c.measured.r10_grid, c.measured.r20,
          c.measured.r20_grid, c.reached, c.nominal.auc, c.nominal.r10, c.nominal.r10_grid,
          c.nominal.r20, c.nominal.r20_grid);
    }
  }
  out +=
      "\nscore: mean over tasks (groups) of the mean per task, 0-100. same as none: the share of the "
      "cell's questions whose answer equals the uncompressed cell's on the same question (fidelity "
      "to the full cache, right or wrong; gsm8k: the same final number, ruler: the same output, mc: "
      "the same choice). KV MiB held: mean cache bytes "
      "after the context's compression (the cache's own accounting); KV / f16: that over the "
      "uncompressed f16 size of the same positions; w/o bases: the same without the bases, rotations "
      "and dictionaries every context shares (low-rank presses, SWAN, Lexico; - where the rows did "
      "not record them). Curves are on the measured axis, the KV "
      "saving 1 - KV / f16 (the nominal ratio a press is asked for can differ a lot: low-rank "
      "bases, indices, per-head positions). AUC: the mean score over savings 0 to the sweep's "
      "largest ratio, piecewise linear through the cells sorted by saving; beyond a press's "
      "largest saving it scores 0 (no credit for savings it did not make). KV saving within t: "
      "the largest saving up to which the relative gap to the uncompressed score (KVCompose eq. "
      "10, mean over tasks) stays <= t, walking the cells by saving (cells that save nothing are "
      "left out) and stopping at the first beyond, interpolated; grid = the last cell within. "
      "Nominal: the same figures on the nominal ratio axis (what the papers and kvpress report), "
      "for comparison only.\n";
  return out;
}

std::string sweep_summary_csv(const std::vector<SweepPoint>& points) {
  std::string out = "model,press,ratio,score,kv_mib,kv_ratio,kv_ratio_wo_bases,decode_tps,n,same_as_none\n";
  for (const SweepPoint& p : points) {
    const double wo = p.kv_ratio_wo_bases();
    out += strprintf("%s,%s,%g,%.4f,%.4f,%.5f,%s,%.3f,%lld,%s\n", csv_field(p.model).c_str(),
                     csv_field(p.press).c_str(), p.ratio, p.score, p.kv_bytes / kSweepMiB, p.kv_ratio(),
                     wo >= 0 ? strprintf("%.5f", wo).c_str() : "", p.decode_tps, static_cast<long long>(p.n),
                     p.same_as_none >= 0 ? strprintf("%.4f", p.same_as_none).c_str() : "");
  }
  return out;
}

std::string sweep_curves_csv(const std::vector<SweepCurve>& curves) {
  std::string out =
      "model,press,base_score,auc,saving_10,saving_10_grid,saving_20,saving_20_grid,largest_saving,"
      "span,nominal_auc,nominal_ratio_10,nominal_ratio_10_grid,nominal_ratio_20,nominal_ratio_20_"
      "grid\n";
  for (const SweepCurve& c : curves)
    out += strprintf("%s,%s,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%g,%.4f,%.4f,%g,%.4f,%g\n",
                     csv_field(c.model).c_str(), csv_field(c.press).c_str(), c.base_score,
                     c.measured.auc, c.measured.r10, c.measured.r10_grid, c.measured.r20,
                     c.measured.r20_grid, c.reached, c.span, c.nominal.auc, c.nominal.r10,
                     c.nominal.r10_grid, c.nominal.r20, c.nominal.r20_grid);
  return out;
}

std::string write_sweep_summaries(const std::string& out_dir, const std::vector<SweepRow>& rows,
                                  const std::string& title, const std::string& score_label) {
  const std::vector<SweepPoint> points = sweep_points(rows);
  const std::vector<SweepCurve> curves = sweep_curves(points);
  const std::string md = sweep_summary_markdown(points, curves, title);
  write_summary_file(out_dir, "summary.md", md);
  write_summary_file(out_dir, "summary.csv", sweep_summary_csv(points));
  write_summary_file(out_dir, "curves.csv", sweep_curves_csv(curves));
  write_summary_file(out_dir, "plot.svg", sweep_plot_svg(points, curves, title, score_label));
  return md;
}

}  // namespace kvtrim::eval
