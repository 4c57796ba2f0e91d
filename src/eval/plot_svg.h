// The accuracy-vs-compression plot of a sweep (src/eval/sweep.h) as a self-contained SVG,
// written by hand (no dependencies): one panel per model, score against the compression
// ratio, one line with markers per press, the uncompressed score as a dashed horizontal
// line, axes with ticks and labels, and a legend with each press's AUC.
#pragma once
#include <string>
#include <vector>

#include "eval/sweep.h"

namespace kvtrim::eval {

// `title` heads the figure; `score_label` names the y axis ("RULER score (0-100)"). The y axis
// spans 0-100 (scores are 0-100); the x axis 0 to the largest ratio rounded up to a tenth.
std::string sweep_plot_svg(const std::vector<SweepPoint>& points,
                           const std::vector<SweepCurve>& curves, const std::string& title,
                           const std::string& score_label);

// XML text escape (&, <, >, ").
std::string svg_escape(const std::string& s);

}  // namespace kvtrim::eval
