// kvtrim eval sweep (src/eval/sweep.h): the grid's parsing, the summary maths (AUC,
// KVCompose's gap and tolerance ratios) on hand-written cases and the outputs. Runs on a tiny
// model: sweep_run_test.cpp.
#include "eval/sweep.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "core/error.h"
#include "engine/press_runner.h"
#include "engine/session.h"
#include "eval/jsonl.h"
#include "eval/plot_svg.h"
#include "eval_fixture.h"

namespace kvtrim::eval {
namespace {

using test_support::configs_of;
using test_support::fresh_path;
using test_support::tiny_model;
using test_support::tiny_prompts;
using test_support::tiny_session_params;

// ---------------------------------------------------------------- the grid

TEST(SweepGrid, SplitsPressListKeepingOptions) {
  EXPECT_EQ(split_press_list("snapkv,streamingllm"),
            (std::vector<std::string>{"snapkv", "streamingllm"}));
  EXPECT_EQ(split_press_list("snapkv:window=16,kernel=5, tova"),
            (std::vector<std::string>{"snapkv:window=16,kernel=5", "tova"}));
  EXPECT_EQ(split_press_list("adakv(snapkv:window=8),h2o"),
            (std::vector<std::string>{"adakv(snapkv:window=8)", "h2o"}));
  EXPECT_THROW(split_press_list("snapkv,,tova"), Error);
  EXPECT_THROW(split_press_list("window=3"), Error);
}

TEST(SweepGrid, RatioList) {
  EXPECT_EQ(parse_ratio_list("0.9,0.25,0,0.5,0.25"), (std::vector<double>{0.25, 0.5, 0.9}));
  for (const char* bad : {"1.0", "-0.1", "x", "0.5,", "0", "nan"}) {
    try {
      parse_ratio_list(bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--ratios"), std::string::npos) << e.what();
    }
  }
}

TEST(SweepGrid, SetsTheRatioOfEachEntry) {
  EXPECT_EQ(spec_with_ratio("snapkv", 0.5), make_press("snapkv:ratio=0.5")->spec());
  EXPECT_EQ(spec_with_ratio("snapkv:window=16", 0.25),
            make_press("snapkv:ratio=0.25,window=16")->spec());
  EXPECT_EQ(spec_with_ratio("snapkv:0.3,window=16", 0.75),
            make_press("snapkv:ratio=0.75,window=16")->spec());
  EXPECT_EQ(spec_with_ratio("snapkv:ratio=0.3", 0.9), make_press("snapkv:ratio=0.9")->spec());
  EXPECT_EQ(press_label("snapkv:ratio=0.3,window=16"), "snapkv:window=16");
  EXPECT_EQ(press_label("snapkv:0.3"), "snapkv");
  // a wrapper passes the ratio to its inner press
  EXPECT_EQ(spec_with_ratio("adakv(snapkv)", 0.5), make_press("adakv(snapkv:ratio=0.5)")->spec());
  // a composition: the sweep sets the last press's ratio; the others stay as given
  EXPECT_EQ(spec_with_ratio("snapkv:0.5+spark", 0.8), make_press("snapkv:ratio=0.5+spark:ratio=0.8")->spec());
  EXPECT_EQ(spec_with_ratio("snapkv:0.5+spark:0.3,recovery=zero", 0.8),
            make_press("snapkv:ratio=0.5+spark:ratio=0.8,recovery=zero")->spec());
  EXPECT_EQ(press_label("snapkv:0.5+spark:0.3"), make_press("snapkv:0.5")->spec() + "+spark");
  // labels as the committed sweeps recorded them (docs/results/*/results.jsonl): resuming
  // them must find the same cells
  EXPECT_EQ(press_label("snapkv:0.5,query_aware=true+spark:query_aware=true"),
            "snapkv:ratio=0.5,query_aware=true+spark:query_aware=true");
  EXPECT_EQ(press_label("pyramidkv:0.5+think"), "pyramidkv:ratio=0.5+think");
  EXPECT_EQ(press_label("swan:buffer=0,values=fp8"), "swan:buffer=0,values=fp8");
  EXPECT_EQ(press_label("kvcompose:mode=unstructured"), "kvcompose:mode=unstructured");
  EXPECT_EQ(press_label("adakv(snapkv:0.3):alpha_safeguard=0.3"), "adakv(snapkv):alpha_safeguard=0.3");
  EXPECT_THROW(spec_with_ratio("snapkv:nosuch=1+spark", 0.5), Error);
  EXPECT_THROW(spec_with_ratio("+spark", 0.5), Error);
  try {
    spec_with_ratio("nosuchpress", 0.5);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown press 'nosuchpress'"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(spec_with_ratio("snapkv:nosuchoption=3", 0.5), Error);
}

TEST(SweepGrid, CellsStartWithTheBaselineOnce) {
  const auto cells = sweep_cells({"snapkv", "streamingllm"}, {0.25, 0.5});
  ASSERT_EQ(cells.size(), 5u);
  EXPECT_TRUE(cells[0].baseline());
  EXPECT_EQ(cells[0].ratio, 0);
  EXPECT_EQ(cells[1].press, "snapkv");
  EXPECT_EQ(cells[2].ratio, 0.5);
  EXPECT_EQ(cells[4].spec, make_press("streamingllm:ratio=0.5")->spec());
  EXPECT_THROW(sweep_cells({"snapkv", "snapkv:ratio=0.1"}, {0.5}), Error);  // the same press twice
}

// ---------------------------------------------------------------- summary maths

TEST(SweepMaths, AucIsTheTrapezoidMeanOverTheRatioSpan) {
  // (0.5 * (100 + 50) / 2 + 0.4 * (50 + 10) / 2) / 0.9 = (37.5 + 12) / 0.9 = 55
  EXPECT_DOUBLE_EQ(curve_auc({{0, 100}, {0.5, 50}, {0.9, 10}}), 55.0);
  EXPECT_DOUBLE_EQ(curve_auc({{0, 80}, {0.25, 80}, {0.75, 80}}), 80.0);  // flat: its value
  EXPECT_DOUBLE_EQ(curve_auc({{0, 42}}), 42.0);
  EXPECT_DOUBLE_EQ(curve_auc({}), 0.0);
  EXPECT_THROW(curve_auc({{0, 1}, {0.5, 1}, {0.5, 2}}), Error);
}

TEST(SweepMaths, ToleranceRatioStopsAtTheFirstCrossing) {
  const std::vector<std::pair<double, double>> gaps = {
      {0, 0}, {0.25, 0.05}, {0.5, 0.15}, {0.75, 0.08}};
  double grid = -1;
  // crosses 0.10 between 0.25 (0.05) and 0.5 (0.15): halfway
  EXPECT_DOUBLE_EQ(tolerance_ratio(gaps, 0.10, &grid), 0.375);
  EXPECT_DOUBLE_EQ(grid, 0.25);  // 0.75 is back within 10 % but comes after a crossing
  EXPECT_DOUBLE_EQ(tolerance_ratio(gaps, 0.20, &grid), 0.75);  // never beyond: the last ratio
  EXPECT_DOUBLE_EQ(grid, 0.75);
  // beyond already at the first swept ratio: interpolated from (0, 0)
  EXPECT_NEAR(tolerance_ratio({{0, 0}, {0.1, 0.5}, {0.5, 0.9}}, 0.2, &grid), 0.04, 1e-12);
  EXPECT_DOUBLE_EQ(grid, 0.0);
  // exactly at the tolerance counts as within
  EXPECT_DOUBLE_EQ(tolerance_ratio({{0, 0}, {0.5, 0.1}, {0.9, 0.3}}, 0.1, &grid), 0.5);
  EXPECT_DOUBLE_EQ(grid, 0.5);
}

TEST(SweepMaths, GapIsTheMeanRelativeDropOverTasks) {
  SweepPoint base, p;
  base.group_score = {{"a", 80}, {"b", 0}, {"c", 50}};
  base.score = 130.0 / 3;
  p.group_score = {{"a", 40}, {"b", 10}, {"c", 50}};
  p.score = 100.0 / 3;
  // a: (80 - 40) / 80 = 0.5; c: 0; b has no baseline to lose: skipped
  EXPECT_DOUBLE_EQ(relative_gap(base, p), 0.25);
  SweepPoint zero, z2;
  zero.group_score = {{"a", 0}};
  z2.group_score = {{"a", 30}};
  z2.score = 30;
  EXPECT_DOUBLE_EQ(relative_gap(zero, z2), 0.0);
  // better than the baseline: a negative gap
  SweepPoint up;
  up.group_score = {{"a", 100}, {"b", 10}, {"c", 75}};
  EXPECT_DOUBLE_EQ(relative_gap(base, up), (-0.25 - 0.5) / 2);
}

SweepRow row(const std::string& press, double ratio, const std::string& task, int idx, double score,
             size_t kv, double tps) {
  SweepRow r;
  r.config = press + std::to_string(ratio);
  r.model = "m";
  r.bench = "ruler";
  r.press = press;
  r.ratio = ratio;
  r.spec = press;
  r.group = task;
  r.id = task + "/" + std::to_string(idx);
  r.score = score;
  r.kv_bytes = kv;
  r.kv_bytes_dense = 1000;
  r.decode_tps = tps;
  return r;
}

std::vector<SweepRow> hand_rows() {
  // baseline: task a 100, 100; task b 50, 0 -> score (100 + 25) / 2 = 62.5
  // p at 0.5: a 100, 50; b 25, 25 -> (75 + 25) / 2 = 50;   gap ((100-75)/100 + 0) / 2 = 0.125
  // p at 0.9: a 0, 0; b 25, 0 -> (0 + 12.5) / 2 = 6.25;    gap (1 + 0.5) / 2 = 0.75
  // q at 0.5: a 100, 100; b 50, 0 -> 62.5 (gap 0)
  std::vector<SweepRow> r = {
      row("none", 0, "a", 0, 100, 1000, 10), row("none", 0, "a", 1, 100, 1000, 20),
      row("none", 0, "b", 0, 50, 1000, 0),   row("none", 0, "b", 1, 0, 1000, 30),
      row("p", 0.9, "a", 0, 0, 100, 50),     row("p", 0.9, "a", 1, 0, 100, 50),
      row("p", 0.9, "b", 0, 25, 100, 50),    row("p", 0.9, "b", 1, 0, 100, 50),
      row("p", 0.5, "a", 0, 100, 500, 40),   row("p", 0.5, "a", 1, 50, 500, 40),
      row("p", 0.5, "b", 0, 25, 500, 40),    row("p", 0.5, "b", 1, 25, 600, 40),
      row("q", 0.5, "a", 0, 100, 400, 0),    row("q", 0.5, "a", 1, 100, 400, 0),
      row("q", 0.5, "b", 0, 50, 400, 0),     row("q", 0.5, "b", 1, 0, 400, 0)};
  return r;
}

TEST(SweepMaths, PointsAndCurvesFromRows) {
  const auto pts = sweep_points(hand_rows());
  ASSERT_EQ(pts.size(), 4u);
  EXPECT_EQ(pts[0].press, "none");
  EXPECT_DOUBLE_EQ(pts[0].score, 62.5);
  EXPECT_DOUBLE_EQ(pts[0].decode_tps, 20.0);  // rows that decoded nothing (0) are left out
  EXPECT_EQ(pts[1].press, "p");
  EXPECT_DOUBLE_EQ(pts[1].ratio, 0.5);  // ascending within a press
  EXPECT_DOUBLE_EQ(pts[1].score, 50.0);
  EXPECT_DOUBLE_EQ(pts[1].kv_bytes, 525.0);
  EXPECT_DOUBLE_EQ(pts[1].kv_ratio(), 0.525);
  EXPECT_DOUBLE_EQ(pts[2].score, 6.25);
  EXPECT_EQ(pts[2].n, 4);
  EXPECT_EQ(pts[3].press, "q");
  EXPECT_DOUBLE_EQ(pts[3].decode_tps, 0.0);
  EXPECT_DOUBLE_EQ(pts[1].kv_ratio_wo_bases(), -1.0);  // rows without kv_bases: unknown

  // kv_bases: averaged when every row of the cell has it, else unknown
  std::vector<SweepRow> rb = hand_rows();
  for (SweepRow& r : rb)
    if (r.press == "p") r.kv_bases = r.ratio == 0.5 ? 100 : 10;
  rb[4].kv_bases = -1;  // one row of p at 0.9 written before kv_bases existed
  const auto pb = sweep_points(rb);
  EXPECT_DOUBLE_EQ(pb[1].kv_bases, 100.0);
  EXPECT_DOUBLE_EQ(pb[1].kv_ratio_wo_bases(), 0.425);  // (525 - 100) / 1000
  EXPECT_DOUBLE_EQ(pb[2].kv_bases, -1.0);
  const std::string mdb = sweep_summary_markdown(pb, sweep_curves(pb), "T");
  EXPECT_NE(mdb.find("| p | 0.50 | 50.0 | - | 0.00 | 0.525 | 0.425 | 40.0 | 4 |"), std::string::npos) << mdb;
  EXPECT_NE(sweep_summary_csv(pb).find("m,p,0.5,50.0000,0.0005,0.52500,0.42500,"), std::string::npos);

  const auto curves = sweep_curves(pts);
  ASSERT_EQ(curves.size(), 2u);
  const SweepCurve& p = curves[0];
  EXPECT_EQ(p.press, "p");
  EXPECT_DOUBLE_EQ(p.base_score, 62.5);
  // nominal axis: (0.5 * (62.5 + 50) / 2 + 0.4 * (50 + 6.25) / 2) / 0.9
  EXPECT_NEAR(p.nominal.auc, (28.125 + 11.25) / 0.9, 1e-12);
  // gaps 0 / 0.125 / 0.75: 10 % crossed between 0 and 0.5 at 0.1 / 0.125 of the way
  EXPECT_NEAR(p.nominal.r10, 0.4, 1e-12);
  EXPECT_DOUBLE_EQ(p.nominal.r10_grid, 0.0);
  // 20 %: crossed between 0.5 (0.125) and 0.9 (0.75): 0.5 + 0.4 * 0.075 / 0.625
  EXPECT_NEAR(p.nominal.r20, 0.5 + 0.4 * 0.075 / 0.625, 1e-12);
  EXPECT_DOUBLE_EQ(p.nominal.r20_grid, 0.5);
  // measured axis: p holds 0.525 of f16 at ratio 0.5 (saving 0.475) and 0.1 at 0.9 (0.9)
  EXPECT_DOUBLE_EQ(p.span, 0.9);
  EXPECT_NEAR(p.reached, 0.9, 1e-12);
  EXPECT_NEAR(p.measured.auc, (0.475 * (62.5 + 50) / 2 + 0.425 * (50 + 6.25) / 2) / 0.9, 1e-12);
  EXPECT_NEAR(p.measured.r10, 0.8 * 0.475, 1e-12);
  EXPECT_DOUBLE_EQ(p.measured.r10_grid, 0.0);
  EXPECT_NEAR(p.measured.r20, 0.475 + 0.425 * 0.075 / 0.625, 1e-12);
  EXPECT_NEAR(p.measured.r20_grid, 0.475, 1e-12);
  // q: no gap at ratio 0.5, but it saved 0.6 of the bytes and nothing beyond: [0.6, 0.9] scores 0
  EXPECT_DOUBLE_EQ(curves[1].nominal.auc, 62.5);
  EXPECT_DOUBLE_EQ(curves[1].nominal.r10, 0.5);
  EXPECT_NEAR(curves[1].measured.auc, 0.6 * 62.5 / 0.9, 1e-12);
  EXPECT_NEAR(curves[1].measured.r10, 0.6, 1e-12);
  EXPECT_NEAR(curves[1].reached, 0.6, 1e-12);
}

TEST(SweepMaths, MeasuredAxis) {
  // sorted by saving; left of the first point its value; beyond the last, `beyond`
  EXPECT_DOUBLE_EQ(measured_auc({{0.5, 40}, {0, 100}}, 1.0, 0), (0.5 * 70 + 0) / 1.0);
  EXPECT_DOUBLE_EQ(measured_auc({{0.2, 50}, {0.6, 50}}, 0.8, 0), (0.6 * 50) / 0.8);
  EXPECT_DOUBLE_EQ(measured_auc({{0, 10}, {0.5, 10}}, 1.0, 10), 10.0);
  // a cell holding more than f16 (saving -0.5) only counts where its segment crosses [0, span]
  EXPECT_NEAR(measured_auc({{0, 100}, {-0.5, 0}, {0.5, 50}}, 0.5, 0), 75.0, 1e-12);
  EXPECT_NEAR(measured_auc({{-0.5, 0}, {0.5, 100}}, 0.5, 0), 75.0, 1e-12);
  EXPECT_THROW(measured_auc({{0, 1}}, 0, 0), Error);
  // tolerance: cells that save nothing are left out of the walk; the rest sorted by saving
  double grid = -1;
  EXPECT_NEAR(measured_tolerance({{0, 0}, {-0.3, 0.9}, {0.6, 0.05}, {0.2, 0.0}}, 0.1, &grid), 0.6,
              1e-12);
  EXPECT_NEAR(grid, 0.6, 1e-12);
  EXPECT_NEAR(measured_tolerance({{0, 0}, {0.4, 0.2}, {0.2, 0.05}}, 0.1, &grid), 0.2 + 0.2 / 3, 1e-12);
  EXPECT_NEAR(grid, 0.2, 1e-12);
  EXPECT_DOUBLE_EQ(measured_tolerance({{0, 0}, {-0.1, 0.0}}, 0.1, &grid), 0.0);  // saved nothing
  // a baseline that already saves (a q8 cache): the walk starts there
  EXPECT_NEAR(measured_tolerance({{0.47, 0}, {0.3, 0.0}, {0.7, 0.0}}, 0.1, &grid), 0.7, 1e-12);
}

TEST(SweepMaths, SameAnswerAsTheUncompressedCell) {
  // the comparison per benchmark
  EXPECT_EQ(same_answer("gsm8k", R"({"output": " 3*4=12\n#### 12"})", R"({"output": "so 12.0"})"), true);
  EXPECT_EQ(same_answer("gsm8k", R"({"output": "#### 12"})", R"({"output": "#### 13"})"), false);
  EXPECT_EQ(same_answer("gsm8k", R"({"output": "none"})", R"({"output": "nothing"})"), true);  // both no number
  EXPECT_EQ(same_answer("gsm8k", R"({"output": "none"})", R"({"output": "7"})"), false);
  EXPECT_EQ(same_answer("ruler", R"({"output": " 123\n"})", R"({"output": "123"})"), true);  // post-processed
  EXPECT_EQ(same_answer("ruler", R"({"output": "123"})", R"({"output": "124"})"), false);
  EXPECT_EQ(same_answer("piqa", R"({"pred": 0, "pred_norm": 1})", R"({"pred": 1, "pred_norm": 1})"), true);
  EXPECT_EQ(same_answer("mmlu", R"({"pred": 0, "pred_norm": 1})", R"({"pred": 1, "pred_norm": 1})"), false);
  EXPECT_EQ(same_answer("ruler", "", R"({"output": "1"})"), std::nullopt);  // nothing to compare
  EXPECT_EQ(same_answer("ruler", "not json", R"({"output": "1"})"), std::nullopt);
  // the cell's share, against the baseline row of the same (model, question)
  auto gen = [](const std::string& press, double ratio, const std::string& id, const std::string& out) {
    SweepRow r;
    r.model = "m";
    r.bench = "gsm8k";
    r.press = press;
    r.ratio = ratio;
    r.group = "gsm8k";
    r.id = id;
    r.kv_bytes_dense = 100;
    r.extra = nlohmann::json{{"output", out}}.dump();
    return r;
  };
  const std::vector<SweepRow> rows = {gen("none", 0, "g/1", "#### 5"),   gen("none", 0, "g/2", "#### 6"),
                                      gen("none", 0, "g/3", "#### 7"),   gen("p", 0.5, "g/1", "so 5"),
                                      gen("p", 0.5, "g/2", "#### 60"),   gen("p", 0.5, "g/3", "#### 7"),
                                      gen("p", 0.5, "g/4", "#### 1")};  // g/4: no baseline row
  const auto pts = sweep_points(rows);
  ASSERT_EQ(pts.size(), 2u);
  EXPECT_DOUBLE_EQ(pts[0].same_as_none, -1);
  EXPECT_EQ(pts[1].n_compared, 3);
  EXPECT_NEAR(pts[1].same_as_none, 2.0 / 3.0, 1e-12);
  const std::string md = sweep_summary_markdown(pts, sweep_curves(pts), "T");
  EXPECT_NE(md.find("| p | 0.50 | 0.0 | 66.7% |"), std::string::npos) << md;
  EXPECT_NE(sweep_summary_csv(pts).find(",0.6667\n"), std::string::npos);
}

TEST(SweepMaths, SummaryFiles) {
  const auto pts = sweep_points(hand_rows());
  const auto curves = sweep_curves(pts);
  const std::string md = sweep_summary_markdown(pts, curves, "T");
  EXPECT_NE(md.find("| p | 0.50 | 50.0 | - | 0.00 | 0.525 | - | 40.0 | 4 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| q | 0.50 | 62.5 | - | 0.00 | 0.400 | - | - | 4 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| p | 43.0 | 0.380 (grid 0.000) | 0.526 (grid 0.475) | 0.900 | 43.8 | 0.400 "
                    "(grid 0.00) | 0.548 (grid 0.50) |"),
            std::string::npos)
      << md;
  const std::string csv = sweep_summary_csv(pts);
  EXPECT_EQ(csv.substr(0, csv.find('\n')), "model,press,ratio,score,kv_mib,kv_ratio,kv_ratio_wo_bases,decode_tps,n,same_as_none");
  EXPECT_NE(csv.find("m,p,0.9,6.2500,"), std::string::npos) << csv;
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 5);
  const std::string svg = sweep_plot_svg(pts, curves, "T <&>", "score");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("T &lt;&amp;&gt;"), std::string::npos);
  size_t n_poly = 0;
  for (size_t at = svg.find("<polyline"); at != std::string::npos;
       at = svg.find("<polyline", at + 1))
    ++n_poly;
  EXPECT_EQ(n_poly, 2u);                                       // one line per press
  EXPECT_NE(svg.find("stroke-dasharray"), std::string::npos);  // the uncompressed score
  EXPECT_NE(svg.find("p (AUC 43.0)"), std::string::npos);  // the measured AUC
  EXPECT_NE(svg.find("KV saved, measured"), std::string::npos);
}

TEST(SweepMaths, OnePanelPerModel) {
  std::vector<SweepRow> rows = hand_rows();
  for (SweepRow r : hand_rows()) {
    r.model = "m2";
    r.score /= 2;
    rows.push_back(r);
  }
  const auto pts = sweep_points(rows);
  ASSERT_EQ(pts.size(), 8u);
  EXPECT_EQ(pts[4].model, "m2");
  EXPECT_EQ(pts[4].press, "none");
  EXPECT_DOUBLE_EQ(pts[4].score, 31.25);
  const auto curves = sweep_curves(pts);
  ASSERT_EQ(curves.size(), 4u);
  EXPECT_DOUBLE_EQ(curves[2].measured.r10, curves[0].measured.r10);  // halving every score keeps the relative gaps
  const std::string svg = sweep_plot_svg(pts, curves, "T", "score");
  size_t n_base = 0;
  for (size_t at = svg.find("uncompressed ("); at != std::string::npos;
       at = svg.find("uncompressed (", at + 1))
    ++n_base;
  EXPECT_EQ(n_base, 2u);
  EXPECT_NE(svg.find(">m2</text>"), std::string::npos);
}

}  // namespace
}  // namespace kvtrim::eval
