#include "eval/plot_svg.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"

namespace kvtrim::eval {

std::string svg_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

namespace {

// Panel geometry (pixels): the plot area sits inside the margins; the legend right of it.
constexpr double kW = 760, kH = 400, kLeft = 64, kRight = 230, kTop = 36, kBottom = 56,
                 kTitleH = 34;
// Matplotlib's tab10: distinguishable, also in greyscale print.
constexpr const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                   "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

// The models and presses of a sweep's points in first-seen order, and the largest ratio.
template <typename Point>
void collect(const std::vector<Point>& points, std::vector<std::string>* models,
             std::vector<std::string>* presses, double* max_ratio) {
  for (const Point& p : points) {
    if (std::find(models->begin(), models->end(), p.model) == models->end()) models->push_back(p.model);
    if (p.press != "none" && std::find(presses->begin(), presses->end(), p.press) == presses->end())
      presses->push_back(p.press);
    *max_ratio = std::max(*max_ratio, p.ratio);
  }
}

// The document's opening: size, white background, the title, and a note when nothing is there.
std::string svg_open(double width, double height, const std::string& title, bool empty, double title_h) {
  std::string o = strprintf(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f "
      "%.0f\" "
      "font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
      "<text x=\"%.0f\" y=\"22\" font-size=\"15\" font-weight=\"bold\" "
      "text-anchor=\"middle\">%s</text>\n",
      width, height, width, height, width / 2, svg_escape(title).c_str());
  if (empty)
    o += strprintf("<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">no results yet</text>\n",
                   width / 2, title_h + 40);
  return o;
}

}  // namespace

std::string sweep_plot_svg(const std::vector<SweepPoint>& points,
                           const std::vector<SweepCurve>& curves, const std::string& title,
                           const std::string& score_label) {
  std::vector<std::string> models, presses;
  double max_ratio = 0, lo_saving = 0, hi_saving = 0;
  collect(points, &models, &presses, &max_ratio);
  for (const SweepPoint& p : points) {
    lo_saving = std::min(lo_saving, kv_saving(p.kv_ratio()));
    hi_saving = std::max(hi_saving, kv_saving(p.kv_ratio()));
  }
  // x: the measured KV saving, from 0 (or the lowest saving, down to -1: cells holding more
  // than twice f16 are drawn at the edge) to the larger of the sweep's largest ratio and the
  // largest saving, rounded to tenths; y: the 0-100 score scale.
  const double x_max = std::max(0.1, std::ceil(std::max(max_ratio, hi_saving) * 10 - 1e-9) / 10);
  const double x_min = std::max(-1.0, std::floor(lo_saving * 10 + 1e-9) / 10);
  const double pw = kW - kLeft - kRight, ph = kH - kTop - kBottom;
  const double total_h = kTitleH + kH * static_cast<double>(std::max<size_t>(1, models.size()));
  std::string o = svg_open(kW, total_h, title, models.empty(), kTitleH);
  for (size_t mi = 0; mi < models.size(); ++mi) {
    const std::string& m = models[mi];
    const double y0 = kTitleH + kH * static_cast<double>(mi);  // panel top
    auto X = [&](double r) { return kLeft + pw * (std::max(r, x_min) - x_min) / (x_max - x_min); };
    auto Y = [&](double s) { return y0 + kTop + ph * (1 - std::clamp(s, 0.0, 100.0) / 100); };
    o += strprintf(
        "<g>\n<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\" font-weight=\"bold\">%s</text>\n", kLeft,
        y0 + kTop - 12, svg_escape(m).c_str());
    // grid, ticks and tick labels
    for (int i = 0; i <= 5; ++i) {
      const double s = 20.0 * i, y = Y(s);
      o += strprintf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>\n",
                     X(x_min), y, X(x_max), y);
      o += strprintf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n",
                     X(x_min) - 5, y, X(x_min), y);
      o += strprintf("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.0f</text>\n", X(x_min) - 8,
                     y + 4, s);
    }
    const int xt0 = static_cast<int>(std::lround(x_min * 10)), xt1 = static_cast<int>(std::lround(x_max * 10));
    const int x_step = xt1 - xt0 > 10 ? 2 : 1;
    for (int i = xt0; i <= xt1; i += x_step) {
      const double r = i / 10.0, x = X(r), yb = Y(0);
      o += strprintf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>\n",
                     x, Y(100), x, yb);
      o += strprintf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n",
                     x, yb, x, yb + 5);
      o += strprintf("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.1f</text>\n", x, yb + 18,
                     r);
    }
    // axes and their labels
    o += strprintf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n",
                   X(x_min), Y(0), X(x_max), Y(0));
    o += strprintf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n",
                   X(x_min), Y(0), X(x_min), Y(100));
    o += strprintf(
        "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">KV saved, measured: 1 - KV bytes / f16 "
        "bytes</text>\n",
        X((x_min + x_max) / 2), Y(0) + 40);
    o += strprintf(
        "<text transform=\"translate(%.1f,%.1f) rotate(-90)\" text-anchor=\"middle\">%s</text>\n",
        kLeft - 44, Y(50), svg_escape(score_label).c_str());
    // the uncompressed score
    const SweepPoint* base = nullptr;
    for (const SweepPoint& p : points)
      if (p.model == m && p.press == "none") base = &p;
    double legend_y = y0 + kTop + 8;
    const double lx = kW - kRight + 20;
    if (base) {
      o += strprintf(
          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#444\" "
          "stroke-width=\"1.5\" "
          "stroke-dasharray=\"6,4\"/>\n",
          X(x_min), Y(base->score), X(x_max), Y(base->score));
      o += strprintf(
          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#444\" "
          "stroke-width=\"1.5\" "
          "stroke-dasharray=\"6,4\"/>\n<text x=\"%.1f\" y=\"%.1f\">uncompressed (%.1f)</text>\n",
          lx, legend_y, lx + 24, legend_y, lx + 30, legend_y + 4, base->score);
      legend_y += 20;
    }
    // one line with markers per press through its cells sorted by measured saving, starting
    // from the uncompressed score at the baseline's saving
    for (size_t pi = 0; pi < presses.size(); ++pi) {
      const char* color = kColors[pi % (sizeof kColors / sizeof kColors[0])];
      std::vector<std::pair<double, double>> xy;
      if (base) xy.emplace_back(kv_saving(base->kv_ratio()), base->score);
      for (const SweepPoint& p : points)
        if (p.model == m && p.press == presses[pi]) xy.emplace_back(kv_saving(p.kv_ratio()), p.score);
      if (xy.size() <= (base ? 1u : 0u)) continue;
      std::stable_sort(xy.begin(), xy.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      std::string path;
      for (const auto& [r, s] : xy)
        path += strprintf("%s%.1f,%.1f", path.empty() ? "" : " ", X(r), Y(s));
      o += strprintf("<polyline points=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\"/>\n",
                     path.c_str(), color);
      for (const auto& [r, s] : xy)
        o += strprintf(
            "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"><title>%s, KV saved %.3f: "
            "%.1f</title></circle>\n",
            X(r), Y(s), color, svg_escape(presses[pi]).c_str(), r, s);
      std::string label = presses[pi];
      for (const SweepCurve& c : curves)
        if (c.model == m && c.press == presses[pi]) label += strprintf(" (AUC %.1f)", c.measured.auc);
      o += strprintf(
          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"/>"
          "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"/>\n<text x=\"%.1f\" "
          "y=\"%.1f\">%s</text>\n",
          lx, legend_y, lx + 24, legend_y, color, lx + 12, legend_y, color, lx + 30, legend_y + 4,
          svg_escape(label).c_str());
      legend_y += 20;
    }
    o += "</g>\n";
  }
  o += "</svg>\n";
  return o;
}

// ---------------------------------------------------------------------------------------
// The perplexity sweep

namespace {

// A 1-2-5 tick step giving about n intervals over span.
double nice_step(double span, int n) {
  if (!(span > 0)) return 1;
  const double raw = span / n, mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (raw <= m * mag * (1 + 1e-9)) return m * mag;
  return 10 * mag;
}

struct Series {
  std::string label;
  const char* color;
  std::vector<std::pair<double, double>> xy;
};

// One panel: plot area at (px, py) of size pw x ph, x in [x0, x1], y in [y0, y1] (nice
// ticks), a dashed horizontal reference at ref_y, the series as lines with markers.
std::string ppl_panel(double px, double py, double pw, double ph, double x0, double x1,
                      double xstep, double y0, double y1, double ystep, const std::string& xlabel,
                      const std::string& ylabel, double ref_y, const std::vector<Series>& series,
                      int y_decimals) {
  auto X = [&](double x) { return px + pw * (x - x0) / (x1 - x0); };
  auto Y = [&](double y) { return py + ph * (1 - (std::clamp(y, y0, y1) - y0) / (y1 - y0)); };
  std::string o;
  for (double y = y0; y <= y1 + ystep * 1e-6; y += ystep) {
    o += strprintf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>\n",
                   X(x0), Y(y), X(x1), Y(y));
    o += strprintf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n",
                   X(x0) - 5, Y(y), X(x0), Y(y));
    o += strprintf("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">", X(x0) - 8, Y(y) + 4) +
         strprintf("%.*f", y_decimals, std::fabs(y) < ystep * 1e-6 ? 0.0 : y) + "</text>\n";
  }
  for (double x = x0; x <= x1 + xstep * 1e-6; x += xstep) {
    o += strprintf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>\n",
                   X(x), Y(y1), X(x), Y(y0));
    o += strprintf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n",
                   X(x), Y(y0), X(x), Y(y0) + 5);
    o += strprintf("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.1f</text>\n", X(x),
                   Y(y0) + 18, x);
  }
  o += strprintf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n",
                 X(x0), Y(y0), X(x1), Y(y0));
  o += strprintf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n",
                 X(x0), Y(y0), X(x0), Y(y1));
  o += strprintf("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", px + pw / 2,
                 Y(y0) + 40, svg_escape(xlabel).c_str());
  o += strprintf(
      "<text transform=\"translate(%.1f,%.1f) rotate(-90)\" text-anchor=\"middle\">%s</text>\n",
      px - 50, py + ph / 2, svg_escape(ylabel).c_str());
  o += strprintf(
      "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#444\" stroke-width=\"1.5\" "
      "stroke-dasharray=\"6,4\"/>\n",
      X(x0), Y(ref_y), X(x1), Y(ref_y));
  for (const Series& sr : series) {
    std::string path;
    for (const auto& [x, y] : sr.xy)
      path += strprintf("%s%.1f,%.1f", path.empty() ? "" : " ", X(x), Y(y));
    o += strprintf("<polyline points=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\"/>\n",
                   path.c_str(), sr.color);
    for (const auto& [x, y] : sr.xy)
      o += strprintf(
          "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"><title>%s: (%.3f, "
          "%.4f)</title></circle>\n",
          X(x), Y(y), sr.color, svg_escape(sr.label).c_str(), x, y);
  }
  return o;
}

// Decimals that show a tick step (0.05 -> 2).
int decimals(double step) {
  return std::clamp(static_cast<int>(std::ceil(-std::log10(step) - 1e-9)), 0, 6);
}

// [lo, hi] widened to multiples of a nice step (at least one step wide).
void nice_range(double* lo, double* hi, double* step) {
  if (!(*hi > *lo)) {
    const double pad = std::max(1e-3, std::fabs(*lo) * 0.05);
    *lo -= pad;
    *hi += pad;
  }
  *step = nice_step(*hi - *lo, 5);
  *lo = std::floor(*lo / *step + 1e-9) * *step;
  *hi = std::ceil(*hi / *step - 1e-9) * *step;
}

}  // namespace

std::string sweep_ppl_plot_svg(const std::vector<PplSweepPoint>& points,
                               const std::vector<PplSweepCurve>& curves, const std::string& title) {
  // Two plot areas of pw x ph per model row, the legend right of them.
  constexpr double pw = 400, ph = 300, left = 74, gap = 96, legend = 250, top = 40, bottom = 60,
                   title_h = 34;
  const double row_h = top + ph + bottom, width = left + pw + gap + pw + legend;
  std::vector<std::string> models, presses;
  double max_ratio = 0;
  collect(points, &models, &presses, &max_ratio);
  const double total_h = title_h + row_h * static_cast<double>(std::max<size_t>(1, models.size()));
  std::string o = svg_open(width, total_h, title, models.empty(), title_h);
  const double x_max = std::max(0.1, std::ceil(max_ratio * 10 - 1e-9) / 10);
  for (size_t mi = 0; mi < models.size(); ++mi) {
    const std::string& m = models[mi];
    const double ry = title_h + row_h * static_cast<double>(mi) + top;  // plot areas' top
    double ppl_full = 0;
    for (const PplSweepPoint& p : points)
      if (p.model == m && p.press == "none") ppl_full = p.s.ppl_full;
    std::vector<Series> by_ratio, by_kv;
    double plo = ppl_full, phi = ppl_full, dlo = 0, dhi = 0;
    for (size_t pi = 0; pi < presses.size(); ++pi) {
      Series a{presses[pi], kColors[pi % (sizeof kColors / sizeof kColors[0])], {{0.0, ppl_full}}};
      Series b{presses[pi], a.color, {{1.0, 0.0}}};
      for (const PplSweepPoint& p : points) {
        if (p.model != m || p.press != presses[pi]) continue;
        a.xy.emplace_back(p.ratio, p.s.ppl_press);
        b.xy.emplace_back(p.s.kv_ratio, p.s.delta);
        plo = std::min(plo, p.s.ppl_press), phi = std::max(phi, p.s.ppl_press);
        dlo = std::min(dlo, p.s.delta), dhi = std::max(dhi, p.s.delta);
      }
      if (a.xy.size() < 2) continue;
      std::sort(b.xy.begin(), b.xy.end());
      for (const PplSweepCurve& c : curves)
        if (c.model == m && c.press == presses[pi])
          a.label += std::isnan(c.measured.auc)
                         ? std::string(" (saved nothing)")
                         : strprintf(" (mean ΔPPL %+.3f to saving %.2f)", c.measured.auc,
                                     std::min(c.reached, c.span));
      by_ratio.push_back(a);
      by_kv.push_back(b);
    }
    double pstep = 1, dstep = 1;
    nice_range(&plo, &phi, &pstep);
    nice_range(&dlo, &dhi, &dstep);
    o += strprintf(
        "<g>\n<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\" font-weight=\"bold\">%s</text>\n", left,
        ry - 14, svg_escape(m).c_str());
    o += ppl_panel(left, ry, pw, ph, 0, x_max, x_max > 1.0 ? 0.2 : 0.1, plo, phi, pstep,
                   "compression ratio (nominal)", "perplexity (lower is better)", ppl_full,
                   by_ratio, decimals(pstep));
    o += ppl_panel(left + pw + gap, ry, pw, ph, 0, 1, 0.1, dlo, dhi, dstep, "KV / f16 (measured)",
                   "ΔPPL vs the full cache", 0.0, by_kv, decimals(dstep));
    // legend
    const double lx = left + pw + gap + pw + 20;
    double ly = ry + 8;
    o += strprintf(
        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#444\" "
        "stroke-width=\"1.5\" "
        "stroke-dasharray=\"6,4\"/>\n<text x=\"%.1f\" y=\"%.1f\">full cache (PPL %.3f)</text>\n",
        lx, ly, lx + 24, ly, lx + 30, ly + 4, ppl_full);
    ly += 20;
    for (const Series& sr : by_ratio) {
      o += strprintf(
          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"/>"
          "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"/>\n<text x=\"%.1f\" "
          "y=\"%.1f\">%s</text>\n",
          lx, ly, lx + 24, ly, sr.color, lx + 12, ly, sr.color, lx + 30, ly + 4,
          svg_escape(sr.label).c_str());
      ly += 20;
    }
    o += "</g>\n";
  }
  o += "</svg>\n";
  return o;
}

}  // namespace kvtrim::eval
