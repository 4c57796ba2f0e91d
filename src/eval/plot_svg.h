// The accuracy-vs-compression plot of a sweep (src/eval/sweep.h) as a self-contained SVG,
// written by hand (no dependencies): one panel per model, score against the measured KV
// saving (1 - KV bytes / f16 bytes, DESIGN.md §3), one line with markers per press, the uncompressed score as a dashed horizontal
// line, axes with ticks and labels, and a legend with each press's AUC.
#pragma once
#include <string>
#include <vector>

#include "eval/sweep.h"
#include "eval/sweep_ppl.h"

namespace kvtrim::eval {

// `title` heads the figure; `score_label` names the y axis ("RULER score (0-100)"). The y axis
// spans 0-100 (scores are 0-100); the x axis from 0 (or the lowest saving, at most 1 below) to
// the larger of the largest ratio and the largest saving, rounded to tenths; legend AUCs are the
// measured ones (SweepCurve::measured).
std::string sweep_plot_svg(const std::vector<SweepPoint>& points,
                           const std::vector<SweepCurve>& curves, const std::string& title,
                           const std::string& score_label);

// The perplexity sweep (src/eval/sweep_ppl.h): per model two panels side by side. Left: PPL
// against the compression ratio, each press's line starting at the full-cache PPL at ratio 0,
// which is also drawn dashed. Right: ΔPPL against the measured KV / f16 (a press's bytes differ
// from its nominal ratio: low-rank bases, full-rank anchors), each line starting at (1, 0); the
// dashed line is ΔPPL 0. y axes span the data, rounded to 1-2-5 ticks.
std::string sweep_ppl_plot_svg(const std::vector<PplSweepPoint>& points,
                               const std::vector<PplSweepCurve>& curves, const std::string& title);

// XML text escape (&, <, >, ").
std::string svg_escape(const std::string& s);

}  // namespace kvtrim::eval
