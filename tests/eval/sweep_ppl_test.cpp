// kvtrim eval sweep ppl (src/eval/sweep_ppl.h): the summary maths (paired ΔPPL, mean ΔPPL
// over the ratio span, the PPL tolerance ratios, the pooled full-cache point) on hand-written
// rows, the outputs, and on a tiny random model: a cell's rows equal eval ppl's
// score_ppl_window with the same press, the full-cache pass is the same in every cell, and an
// interrupted sweep resumes to exactly the rows of an uninterrupted one.
#include "eval/sweep_ppl.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

#include "core/error.h"
#include "engine/press_runner.h"
#include "engine/session.h"
#include "eval/plot_svg.h"
#include "eval_fixture.h"

namespace kvtrim::eval {
namespace {

using test_support::configs_of;
using test_support::fresh_path;
using test_support::tiny_model;
using test_support::tiny_session_params;

// ---------------------------------------------------------------- summary maths

// A window of two scored tokens, both with NLL log(ppl_press) through the press and
// log(ppl_full) through the full cache (no spread: standard errors 0).
PplSweepRow ppl_row(const std::string& press, double ratio, int64_t window, double ppl_press,
                    double ppl_full, double kv_bytes, double kv_dense,
                    const std::string& model = "m") {
  PplSweepRow r;
  r.config = model + "/" + press + "/" + std::to_string(ratio);
  r.model = model;
  r.press = press;
  r.ratio = ratio;
  r.spec = press;
  PplWindow& w = r.w;
  w.index = window;
  w.tokens_hash = "h" + std::to_string(window);
  w.n_scored = 2;
  const double lp = std::log(ppl_press), lf = std::log(ppl_full);
  w.nll_press = 2 * lp;
  w.nll2_press = 2 * lp * lp;
  w.nll_full = 2 * lf;
  w.nll2_full = 2 * lf * lf;
  w.nll_cross = 2 * lp * lf;
  w.kv_bytes = kv_bytes;
  w.kv_dense = kv_dense;
  w.n_compress = 1;
  return r;
}

// Full cache: PPL 10. p: 10.5 at 0.5 (gap 0.05), 11.5 at 0.75 (0.15), 13 at 0.9 (0.30);
// q: 12.5 at 0.5 (0.25). Rows deliberately out of ratio order.
std::vector<PplSweepRow> ppl_hand_rows() {
  std::vector<PplSweepRow> r;
  for (int64_t w : {0, 1}) {
    r.push_back(ppl_row("p", 0.9, w, 13, 10, 15, 100));
    r.push_back(ppl_row("p", 0.5, w, 10.5, 10, 60, 100));
    r.push_back(ppl_row("p", 0.75, w, 11.5, 10, 30, 100));
    r.push_back(ppl_row("q", 0.5, w, 12.5, 10, 50, 100));
  }
  return r;
}

TEST(SweepPplMaths, PointsArePairedPerCell) {
  const auto pts = sweep_ppl_points(ppl_hand_rows());
  ASSERT_EQ(pts.size(), 5u);
  EXPECT_EQ(pts[0].press, "none");  // the full cache first, pooled over the windows
  EXPECT_EQ(pts[0].s.n_windows, 2);
  EXPECT_EQ(pts[0].s.n_scored, 4);
  EXPECT_NEAR(pts[0].s.ppl_full, 10, 1e-12);
  EXPECT_NEAR(pts[0].s.ppl_press, 10, 1e-12);
  EXPECT_NEAR(pts[0].s.delta, 0, 1e-12);
  EXPECT_NEAR(pts[0].s.kv_ratio, 1, 1e-12);
  EXPECT_EQ(pts[1].press, "p");
  EXPECT_DOUBLE_EQ(pts[1].ratio, 0.5);  // ascending within a press
  EXPECT_NEAR(pts[1].s.ppl_press, 10.5, 1e-12);
  EXPECT_NEAR(pts[1].s.delta, 0.5, 1e-12);
  EXPECT_NEAR(pts[1].s.se_delta, 0, 1e-9);
  EXPECT_NEAR(pts[1].ppl_ratio(), 1.05, 1e-12);
  EXPECT_NEAR(pts[1].s.kv_ratio, 0.6, 1e-12);  // measured, not the nominal 0.5
  EXPECT_DOUBLE_EQ(pts[2].ratio, 0.75);
  EXPECT_DOUBLE_EQ(pts[3].ratio, 0.9);
  EXPECT_EQ(pts[4].press, "q");
  EXPECT_NEAR(pts[4].s.delta, 2.5, 1e-12);
}

TEST(SweepPplMaths, CurvesMeanDeltaAndPplTolerance) {
  const auto curves = sweep_ppl_curves(sweep_ppl_points(ppl_hand_rows()));
  ASSERT_EQ(curves.size(), 2u);
  const PplSweepCurve& p = curves[0];
  EXPECT_EQ(p.press, "p");
  EXPECT_NEAR(p.ppl_full, 10, 1e-12);
  // nominal: ΔPPL 0 / 0.5 / 1.5 / 3 at 0 / 0.5 / 0.75 / 0.9: (0.5*0.25 + 0.25*1 + 0.15*2.25) / 0.9
  EXPECT_NEAR(p.nominal.auc, 0.7125 / 0.9, 1e-12);
  // PPL / full - 1 = 0.05 / 0.15 / 0.30: 10 % crossed between 0.5 and 0.75, half way
  EXPECT_NEAR(p.nominal.r10, 0.625, 1e-12);
  EXPECT_DOUBLE_EQ(p.nominal.r10_grid, 0.5);
  // 20 %: crossed between 0.75 (0.15) and 0.9 (0.30), a third of the way
  EXPECT_NEAR(p.nominal.r20, 0.8, 1e-12);
  EXPECT_DOUBLE_EQ(p.nominal.r20_grid, 0.75);
  // measured: KV / f16 0.6 / 0.3 / 0.15 -> savings 0.4 / 0.7 / 0.85; mean ΔPPL over [0, 0.85]
  EXPECT_NEAR(p.reached, 0.85, 1e-12);
  EXPECT_NEAR(p.measured.auc, (0.4 * 0.25 + 0.3 * 1.0 + 0.15 * 2.25) / 0.85, 1e-12);
  EXPECT_NEAR(p.measured.r10, 0.55, 1e-12);
  EXPECT_NEAR(p.measured.r10_grid, 0.4, 1e-12);
  EXPECT_NEAR(p.measured.r20, 0.75, 1e-12);
  EXPECT_NEAR(p.measured.r20_grid, 0.7, 1e-12);
  const PplSweepCurve& q = curves[1];
  EXPECT_NEAR(q.nominal.auc, 1.25, 1e-12);  // ΔPPL 0 -> 2.5 over [0, 0.5]: mean 1.25
  EXPECT_NEAR(q.nominal.r10, 0.2, 1e-12);   // gap 0.25 at 0.5: 10 % at 0.4 of the way
  EXPECT_DOUBLE_EQ(q.nominal.r10_grid, 0.0);
  EXPECT_NEAR(q.nominal.r20, 0.4, 1e-12);
  EXPECT_NEAR(q.measured.auc, 1.25, 1e-12);  // KV 0.5 of f16: the same axis here
  EXPECT_NEAR(q.measured.r10, 0.2, 1e-12);
}

TEST(SweepPplMaths, MeasuredMeanNeedsASaving) {
  // a press that holds more than f16 saved nothing: no mean ΔPPL, no saving within
  const auto c = sweep_ppl_curves(sweep_ppl_points({ppl_row("p", 0.5, 0, 10.1, 10, 120, 100)}));
  ASSERT_EQ(c.size(), 1u);
  EXPECT_TRUE(std::isnan(c[0].measured.auc));
  EXPECT_NEAR(c[0].reached, -0.2, 1e-12);
  EXPECT_DOUBLE_EQ(c[0].measured.r10, 0.0);
  EXPECT_NEAR(c[0].nominal.r10, 0.5, 1e-12);  // nominal says 0.5 within 10 %
  const std::string md = sweep_ppl_summary_markdown(sweep_ppl_points({ppl_row("p", 0.5, 0, 10.1, 10, 120, 100)}), c, "T");
  EXPECT_NE(md.find("| p | — | -0.200 |"), std::string::npos) << md;
}

TEST(SweepPplMaths, FirstCrossingEndsTheWalk) {
  // 10 %: within at 0.25, beyond at 0.5 (gap 0.15), back within at 0.75: the 0.75 does not count
  std::vector<PplSweepRow> rows = {ppl_row("p", 0.25, 0, 10.2, 10, 1, 1),
                                   ppl_row("p", 0.5, 0, 11.5, 10, 1, 1),
                                   ppl_row("p", 0.75, 0, 10.5, 10, 1, 1)};
  const auto c = sweep_ppl_curves(sweep_ppl_points(rows));
  ASSERT_EQ(c.size(), 1u);
  EXPECT_DOUBLE_EQ(c[0].nominal.r10_grid, 0.25);
  EXPECT_LT(c[0].nominal.r10, 0.5);
  EXPECT_DOUBLE_EQ(c[0].nominal.r20_grid, 0.75);  // 20 %: never crossed
}

TEST(SweepPplMaths, SummaryFiles) {
  const auto pts = sweep_ppl_points(ppl_hand_rows());
  const auto curves = sweep_ppl_curves(pts);
  const std::string md = sweep_ppl_summary_markdown(pts, curves, "T");
  EXPECT_NE(md.find("| full cache | 0.00 | 2 | 4 | 10.0000 ± 0.0000 | — | 1.000 | — | — |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| p | 0.50 | 2 | 4 | 10.5000 ± 0.0000 | +0.5000 ± 0.0000 | 1.050 | 0.600 |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| p | +0.8676 | 0.850 | 0.550 (grid 0.400) | 0.750 (grid 0.700) | +0.7917 | "
                    "0.625 (grid 0.50) | 0.800 (grid 0.75) |"),
            std::string::npos)
      << md;
  const std::string csv = sweep_ppl_summary_csv(pts);
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 6);
  EXPECT_NE(csv.find("m,q,0.5,2,4,12.500000,"), std::string::npos) << csv;
  const std::string ccsv = sweep_ppl_curves_csv(curves);
  EXPECT_NE(ccsv.find("m,p,10.000000,0.867647,0.8500,0.5500,0.4000,0.7500,0.7000,0.9,0.791667,0.6250,"
                      "0.5,0.8000,0.75"),
            std::string::npos)
      << ccsv;
  const std::string svg = sweep_ppl_plot_svg(pts, curves, "T <&>");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("T &lt;&amp;&gt;"), std::string::npos);
  size_t n_poly = 0, n_dash = 0;
  for (size_t at = svg.find("<polyline"); at != std::string::npos;
       at = svg.find("<polyline", at + 1))
    ++n_poly;
  for (size_t at = svg.find("stroke-dasharray"); at != std::string::npos;
       at = svg.find("stroke-dasharray", at + 1))
    ++n_dash;
  EXPECT_EQ(n_poly, 4u);  // per press: PPL vs ratio and ΔPPL vs KV / f16
  EXPECT_EQ(n_dash, 3u);  // the full-cache PPL, ΔPPL 0, the legend's
  EXPECT_NE(svg.find("full cache (PPL 10.000)"), std::string::npos);
  EXPECT_NE(svg.find("KV / f16 (measured)"), std::string::npos);
  EXPECT_NE(svg.find("p (mean ΔPPL +0.868 to saving 0.85)"), std::string::npos);
}

// ---------------------------------------------------------------- runs on a tiny model

PplConfig ppl_config() {
  PplConfig c;
  c.ctx = 64;
  c.mode = PplMode::kPcc;
  return c;
}

std::vector<SweepCell> ppl_cells(const std::vector<std::string>& presses,
                                 const std::vector<double>& ratios) {
  auto c = ppl_sweep_cells(sweep_cells(presses, ratios));
  set_cell_configs(&c, {"model=tiny", "ctx=64", "mode=pcc"}, "sweep-ppl-test");
  return c;
}

// A row as written, without its timing.
std::string key(const PplSweepRow& r) {
  PplSweepRow c = r;
  c.w.seconds = 0;
  const PplWindow& w = c.w;
  return nlohmann::json{
      {"config", c.config}, {"model", c.model},    {"press", c.press},      {"ratio", c.ratio},
      {"spec", c.spec},     {"window", w.index},   {"hash", w.tokens_hash}, {"n", w.n_scored},
      {"np", w.nll_press},  {"np2", w.nll2_press}, {"nf", w.nll_full},      {"nf2", w.nll2_full},
      {"nx", w.nll_cross},  {"kv", w.kv_bytes},    {"kvd", w.kv_dense},     {"nc", w.n_compress}}
      .dump();
}

std::vector<std::string> keys(const std::vector<PplSweepRow>& rows) {
  std::vector<std::string> out;
  for (const auto& r : rows) out.push_back(key(r));
  return out;
}

TEST(SweepPpl, CellEqualsEvalPplAndSharesTheFullPass) {
  const auto toks = kvtrim::test::random_tokens(3 * 64, 256, 4242);
  const auto cs = ppl_cells({"snapkv", "streamingllm"}, {0.25, 0.5});
  ASSERT_EQ(cs.size(), 4u);  // no baseline cell
  PplSweepResultsFile res(fresh_path("sweep_ppl", "cell.jsonl"), configs_of(cs));
  Session s(tiny_model(), tiny_session_params(64));
  PplSweepRunOptions opt;
  opt.model = "tiny";
  opt.ppl = ppl_config();
  EXPECT_EQ(sweep_ppl_pending(toks, cs, res, opt.ppl), 12);
  ASSERT_EQ(sweep_ppl(s, toks, cs, res, opt), 12);
  EXPECT_EQ(sweep_ppl_pending(toks, cs, res, opt.ppl), 0);
  std::map<int64_t, double> full;
  for (const PplSweepRow& r : res.rows()) {
    // the full-cache pass does not depend on the cell
    auto [it, fresh] = full.emplace(r.w.index, r.w.nll_full);
    if (!fresh) {
      EXPECT_EQ(it->second, r.w.nll_full) << r.spec << " window " << r.w.index;
    }
  }
  for (const SweepCell& c : cs) {
    // eval ppl's session: a new one with the press installed, no after-prefill compression
    Session one(tiny_model(), tiny_session_params(64));
    PressSchedule sched;
    sched.after_prefill = false;
    one.set_press(make_press(c.spec), sched);
    for (int64_t w = 0; w < 3; ++w) {
      PplSweepRow ref;
      ref.config = c.config;
      ref.model = "tiny";
      ref.press = c.press;
      ref.ratio = c.ratio;
      ref.spec = c.spec;
      ref.w = score_ppl_window(one, ppl_window_tokens(toks, 64, w, -1), w, ppl_config());
      bool found = false;
      for (const PplSweepRow& r : res.rows())
        if (r.config == c.config && r.w.index == w) {
          EXPECT_EQ(key(r), key(ref));
          found = true;
        }
      EXPECT_TRUE(found) << c.spec << " window " << w;
    }
  }
  // every cell holds less than the full cache, against the same full-cache PPL
  const auto pts = sweep_ppl_points(res.rows());
  ASSERT_EQ(pts.size(), 5u);
  for (size_t i = 1; i < pts.size(); ++i) {
    EXPECT_LT(pts[i].s.kv_ratio, 1.0) << pts[i].press << " " << pts[i].ratio;
    EXPECT_DOUBLE_EQ(pts[i].s.ppl_full, pts[0].s.ppl_full);
  }
}

TEST(SweepPpl, InterruptedSweepResumesToTheSameRows) {
  const auto toks = kvtrim::test::random_tokens(3 * 64 + 17, 256, 4242);
  const auto cs = ppl_cells({"snapkv", "streamingllm"}, {0.25, 0.5});
  PplSweepRunOptions opt;
  opt.model = "tiny";
  opt.ppl = ppl_config();

  const std::string full_path = fresh_path("sweep_ppl", "full.jsonl");
  std::vector<std::string> full;
  {
    PplSweepResultsFile res(full_path, configs_of(cs));
    Session s(tiny_model(), tiny_session_params(64));
    ASSERT_EQ(sweep_ppl(s, toks, cs, res, opt), 12);
    full = keys(res.rows());
  }

  // interrupted after 5 rows (the second cell's second window), then resumed
  const std::string path = fresh_path("sweep_ppl", "resumed.jsonl");
  {
    PplSweepResultsFile res(path, configs_of(cs));
    Session s(tiny_model(), tiny_session_params(64));
    PplSweepRunOptions stop = opt;
    int n = 0;
    stop.on_row = [&n](const PplSweepRow&) {
      if (++n == 5) throw std::runtime_error("interrupted");
    };
    EXPECT_THROW(sweep_ppl(s, toks, cs, res, stop), std::runtime_error);
  }
  {
    // an interrupted write: the torn last line is cut off and its row runs again
    std::ofstream f(path, std::ios::app | std::ios::binary);
    f << R"({"config": ")" << cs[1].config << R"(", "model": "tiny", "window": 2, "nll_pr)";
  }
  {
    PplSweepResultsFile res(path, configs_of(cs));
    EXPECT_EQ(res.rows().size(), 5u);
    EXPECT_EQ(sweep_ppl_pending(toks, cs, res, opt.ppl), 7);
    Session s(tiny_model(), tiny_session_params(64));
    EXPECT_EQ(sweep_ppl(s, toks, cs, res, opt), 7);
    EXPECT_EQ(keys(res.rows()), full);  // same rows, same order (cell by cell, windows ascending)
  }
  {
    PplSweepResultsFile res(path, configs_of(cs));
    EXPECT_EQ(keys(res.rows()), full);
    EXPECT_EQ(sweep_ppl_pending(toks, cs, res, opt.ppl), 0);
    PplSweepResultsFile other(path, {cs[0].config});
    EXPECT_EQ(other.rows().size(), 3u);
    EXPECT_EQ(other.n_other_config(), 9);
    // the summaries are written from the rows
    const std::string dir = kvtrim::test::temp_dir("sweep_ppl_out");
    const std::string md = write_sweep_ppl_summaries(dir, res.rows(), "tiny");
    EXPECT_NE(md.find("| streamingllm | 0.50 | 3 | 93 |"), std::string::npos) << md;
    for (const char* f : {"summary.md", "summary.csv", "curves.csv", "plot.svg"})
      EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(dir) / f)) << f;
  }
  {
    // other tokens under the same config: an error naming the window
    auto changed = toks;
    changed[70] = (changed[70] + 1) % 256;
    PplSweepResultsFile res(path, configs_of(cs));
    try {
      sweep_ppl_pending(changed, cs, res, opt.ppl);
      ADD_FAILURE() << "changed tokens accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("window 1"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace kvtrim::eval
