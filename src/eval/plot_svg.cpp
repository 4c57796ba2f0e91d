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

}  // namespace

std::string sweep_plot_svg(const std::vector<SweepPoint>& points,
                           const std::vector<SweepCurve>& curves, const std::string& title,
                           const std::string& score_label) {
  std::vector<std::string> models, presses;
  double max_ratio = 0;
  for (const SweepPoint& p : points) {
    if (std::find(models.begin(), models.end(), p.model) == models.end()) models.push_back(p.model);
    if (p.press != "none" && std::find(presses.begin(), presses.end(), p.press) == presses.end())
      presses.push_back(p.press);
    max_ratio = std::max(max_ratio, p.ratio);
  }
  // x: 0 .. the largest ratio rounded up to a tenth; y: the 0-100 score scale.
  const double x_max = std::max(0.1, std::ceil(max_ratio * 10 - 1e-9) / 10);
  const double pw = kW - kLeft - kRight, ph = kH - kTop - kBottom;
  const double total_h = kTitleH + kH * static_cast<double>(std::max<size_t>(1, models.size()));
  std::string o = strprintf(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f "
      "%.0f\" "
      "font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
      "<text x=\"%.0f\" y=\"22\" font-size=\"15\" font-weight=\"bold\" "
      "text-anchor=\"middle\">%s</text>\n",
      kW, total_h, kW, total_h, kW / 2, svg_escape(title).c_str());
  if (models.empty())
    o += strprintf("<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">no results yet</text>\n",
                   kW / 2, kTitleH + 40);
  for (size_t mi = 0; mi < models.size(); ++mi) {
    const std::string& m = models[mi];
    const double y0 = kTitleH + kH * static_cast<double>(mi);  // panel top
    auto X = [&](double r) { return kLeft + pw * r / x_max; };
    auto Y = [&](double s) { return y0 + kTop + ph * (1 - std::clamp(s, 0.0, 100.0) / 100); };
    o += strprintf(
        "<g>\n<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\" font-weight=\"bold\">%s</text>\n", kLeft,
        y0 + kTop - 12, svg_escape(m).c_str());
    // grid, ticks and tick labels
    for (int i = 0; i <= 5; ++i) {
      const double s = 20.0 * i, y = Y(s);
      o += strprintf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>\n",
                     X(0), y, X(x_max), y);
      o += strprintf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n",
                     X(0) - 5, y, X(0), y);
      o += strprintf("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.0f</text>\n", X(0) - 8,
                     y + 4, s);
    }
    const int n_xt = static_cast<int>(std::lround(x_max * 10));
    const int x_step = n_xt > 10 ? 2 : 1;
    for (int i = 0; i <= n_xt; i += x_step) {
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
                   X(0), Y(0), X(x_max), Y(0));
    o += strprintf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n",
                   X(0), Y(0), X(0), Y(100));
    o += strprintf(
        "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">compression ratio (fraction of the KV "
        "cache "
        "evicted)</text>\n",
        X(x_max / 2), Y(0) + 40);
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
          X(0), Y(base->score), X(x_max), Y(base->score));
      o += strprintf(
          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#444\" "
          "stroke-width=\"1.5\" "
          "stroke-dasharray=\"6,4\"/>\n<text x=\"%.1f\" y=\"%.1f\">uncompressed (%.1f)</text>\n",
          lx, legend_y, lx + 24, legend_y, lx + 30, legend_y + 4, base->score);
      legend_y += 20;
    }
    // one line with markers per press, starting from the uncompressed score at ratio 0
    for (size_t pi = 0; pi < presses.size(); ++pi) {
      const char* color = kColors[pi % (sizeof kColors / sizeof kColors[0])];
      std::vector<std::pair<double, double>> xy;
      if (base) xy.emplace_back(0.0, base->score);
      for (const SweepPoint& p : points)
        if (p.model == m && p.press == presses[pi]) xy.emplace_back(p.ratio, p.score);
      if (xy.size() <= (base ? 1u : 0u)) continue;
      std::string path;
      for (const auto& [r, s] : xy)
        path += strprintf("%s%.1f,%.1f", path.empty() ? "" : " ", X(r), Y(s));
      o += strprintf("<polyline points=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\"/>\n",
                     path.c_str(), color);
      for (const auto& [r, s] : xy)
        o += strprintf(
            "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"><title>%s @ %.2f: "
            "%.1f</title></circle>\n",
            X(r), Y(s), color, svg_escape(presses[pi]).c_str(), r, s);
      std::string label = presses[pi];
      for (const SweepCurve& c : curves)
        if (c.model == m && c.press == presses[pi]) label += strprintf(" (AUC %.1f)", c.auc);
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

}  // namespace kvtrim::eval
