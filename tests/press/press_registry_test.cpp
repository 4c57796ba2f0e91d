// The registry and the press-string parser: every press is listed with its options, specs
// round-trip, composition and wrappers parse, and every mistake gets a clear error.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "press/press.h"
#include "press/press_spec.h"

namespace kvtrim {
namespace {

std::string press_error(const std::string& spec) {
  try {
    make_press(spec);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_ERROR_HAS(spec, text)                                                     \
  do {                                                                                   \
    const std::string e_ = press_error(spec);                                            \
    EXPECT_NE(e_.find(text), std::string::npos) << "spec '" << (spec) << "' gave: '" << e_ << "'"; \
  } while (0)

TEST(PressRegistry, ListsEveryBuiltinWithOptions) {
  for (const PressInfo& p : press_registry()) {
    EXPECT_FALSE(p.description.empty()) << p.name;
    EXPECT_FALSE(p.paper.empty()) << p.name;
    for (const auto& o : p.options) EXPECT_FALSE(o.help.empty()) << p.name << "." << o.name;
  }
  const std::string listing = describe_presses();
  EXPECT_NE(listing.find("window             = 32"), std::string::npos);
  EXPECT_NE(listing.find("alpha_safeguard"), std::string::npos);
}

// The one place that names presses: those DESIGN.md's papers (and their baselines) need, by axis.
// The sweeps (press_sweep_test, channel_press_test, basis_sweep_test) run whatever the registry
// holds of their axis and count nothing themselves, so a press lost from the registry, or filed
// under another axis, fails here.
TEST(PressRegistry, HoldsThePressesThePapersNeedByAxis) {
  const std::vector<std::pair<PressAxis, std::vector<const char*>>> need = {
      {PressAxis::kToken,
       {"streamingllm", "snapkv", "pyramidkv", "tova", "h2o", "expected_attention", "knorm",
        "random", "kvcompose", "kvzip"}},
      {PressAxis::kBasis,
       {"ksvd", "eigenattention", "kqsvd", "staticpca", "stiefattention", "ojakv", "palu"}},
      {PressAxis::kChannel, {"think", "spark", "swan", "lexico"}},
      {PressAxis::kPrecision, {}},
  };
  for (const auto& [axis, names] : need) {
    SCOPED_TRACE(press_axis_name(axis));
    for (const char* name : names) {
      const PressInfo* p = find_press(name);
      ASSERT_NE(p, nullptr) << name;
      EXPECT_EQ(p->axis, axis) << name << " is on the " << press_axis_name(p->axis) << " axis";
      EXPECT_FALSE(p->wrapper) << name;
    }
    const auto n = std::count_if(press_registry().begin(), press_registry().end(),
                                 [ax = axis](const PressInfo& p) { return !p.wrapper && p.axis == ax; });
    EXPECT_GE(n, static_cast<std::ptrdiff_t>(names.size()));
  }
  const PressInfo* adakv = find_press("adakv");
  ASSERT_NE(adakv, nullptr);
  EXPECT_TRUE(adakv->wrapper);
  for (const char* name : {"pyramidkv", "kvcompose", "kvzip", "stiefattention"})
    EXPECT_TRUE(find_press(name)->per_layer_budget) << name;
  for (const char* name : {"snapkv", "streamingllm", "ksvd", "think"})
    EXPECT_FALSE(find_press(name)->per_layer_budget) << name;
}

// Every press the sweeps run has its easy and hard settings: press strings of that press alone
// (wrappers have none: the sweeps wrap the others in them).
TEST(PressRegistry, EveryPressHasTestSettings) {
  for (const PressInfo& info : press_registry()) {
    SCOPED_TRACE(info.name);
    if (info.wrapper) {
      EXPECT_TRUE(info.test_easy.empty() && info.test_hard.empty());
      continue;
    }
    for (const std::string& text : {info.test_easy, info.test_hard}) {
      ASSERT_FALSE(text.empty());
      const PressSpec spec = parse_press_spec(text);
      ASSERT_EQ(spec.items.size(), 1u) << text;
      EXPECT_EQ(spec.items[0].name, info.name) << text;
    }
    EXPECT_NE(info.test_easy, info.test_hard);
  }
  EXPECT_EQ(find_press("snapkv")->test_easy, "snapkv:ratio=0.25");  // register_press's defaults
  EXPECT_EQ(find_press("snapkv")->test_hard, "snapkv:ratio=0.9");
  EXPECT_STREQ(press_axis_name(PressAxis::kPrecision), "precision");
}

TEST(PressRegistry, ParsesOptionsCompositionAndWrappers) {
  auto p = make_press("snapkv:ratio=0.5,window=32+streamingllm:sinks=4");
  EXPECT_EQ(p->name(), "composed");
  EXPECT_EQ(p->spec(), "snapkv:ratio=0.5,window=32+streamingllm:sinks=4");
  auto* c = dynamic_cast<ComposedPress*>(p.get());
  ASSERT_NE(c, nullptr);
  ASSERT_EQ(c->presses().size(), 2u);
  EXPECT_EQ(c->needs().window, 32);

  auto s = make_press(" SnapKV:0.25 ");  // bare value = ratio; names are case-insensitive
  EXPECT_EQ(s->spec(), "snapkv:ratio=0.25");
  EXPECT_DOUBLE_EQ(dynamic_cast<ScorerPress*>(s.get())->budget().ratio, 0.25);

  auto a = make_press("adakv(snapkv:ratio=0.5,window=16):alpha_safeguard=0.3");
  EXPECT_EQ(a->name(), "adakv");
  EXPECT_EQ(a->spec(), "adakv(snapkv:ratio=0.5,window=16):alpha_safeguard=0.3");
  EXPECT_EQ(a->needs().window, 16);
  EXPECT_EQ(make_press("adakv:press=tova")->spec(), "adakv(tova)");
  EXPECT_EQ(make_press("adakv(knorm:0.5)+streamingllm")->name(), "composed");
  EXPECT_TRUE(make_press("h2o")->needs().cum_attn);
  EXPECT_TRUE(make_press("tova:query_aware=true")->needs().question);
  EXPECT_EQ(dynamic_cast<ScorerPress*>(make_press("knorm:budget=64").get())->budget().n_keep, 64);
}

TEST(PressRegistry, ClearErrors) {
  EXPECT_ERROR_HAS("snapkvv", "unknown press 'snapkvv' (known presses: streamingllm, snapkv");
  EXPECT_ERROR_HAS("snapkv:windw=3", "press 'snapkv' has no option 'windw' (options: ratio, budget, window");
  EXPECT_ERROR_HAS("snapkv:window=abc", "press 'snapkv': option 'window' = 'abc' is not an integer");
  EXPECT_ERROR_HAS("snapkv:ratio=x", "option 'ratio' = 'x' is not a number");
  EXPECT_ERROR_HAS("snapkv:ratio=1", "ratio = 1 is out of range [0, 1)");
  EXPECT_ERROR_HAS("knorm:ratio=-0.1", "ratio = -0.1 is out of range [0, 1)");
  EXPECT_ERROR_HAS("snapkv:1.5", "ratio = 1.5 is out of range [0, 1)");
  EXPECT_ERROR_HAS("snapkv:window=0", "option 'window' = 0 must be >= 1");
  EXPECT_ERROR_HAS("snapkv:kernel=4", "must be odd");
  EXPECT_ERROR_HAS("snapkv:pool=min", "must be max or avg");
  EXPECT_ERROR_HAS("tova:query_aware=maybe", "is not a boolean");
  EXPECT_ERROR_HAS("snapkv:ratio=0.5,ratio=0.2", "given twice");
  EXPECT_ERROR_HAS("snapkv:ratio=0.5,window", "option 'window' has no value");
  EXPECT_ERROR_HAS("snapkv+", "empty press");
  EXPECT_ERROR_HAS("", "empty press string");
  EXPECT_ERROR_HAS("adakv", "press 'adakv' wraps another press");
  EXPECT_ERROR_HAS("adakv(snapkv", "unbalanced");
  EXPECT_ERROR_HAS("snapkv(knorm)", "does not wrap another press");
  EXPECT_ERROR_HAS("adakv(snapkv+knorm)", "wraps a scoring press");
  EXPECT_ERROR_HAS("adakv(snapkv):alpha_safeguard=2", "out of range [0, 1]");
  EXPECT_ERROR_HAS("adakv(foo)", "unknown press 'foo'");
}

TEST(PressSpecTree, ParsesIntoItemsOptionsAndInnerPresses) {
  const PressSpec s = parse_press_spec(" SnapKV:0.5, window=16 +adakv(tova:query_aware=true):alpha_safeguard=0.3");
  ASSERT_EQ(s.items.size(), 2u);
  EXPECT_EQ(s.items[0].name, "snapkv");
  ASSERT_EQ(s.items[0].options.size(), 2u);
  EXPECT_EQ(s.items[0].options[0].name, "ratio");  // the bare first value, resolved
  EXPECT_EQ(s.items[0].options[0].value, "0.5");
  EXPECT_TRUE(s.items[0].options[0].bare);
  EXPECT_EQ(s.items[0].options[1].name, "window");
  ASSERT_EQ(s.items[1].inner.size(), 1u);
  EXPECT_EQ(s.items[1].inner[0].items[0].name, "tova");
  EXPECT_EQ(written_press_spec(s), "snapkv:0.5,window=16+adakv(tova:query_aware=true):alpha_safeguard=0.3");
  EXPECT_EQ(canonical_press_spec(s), make_press(s)->spec());
  EXPECT_EQ(canonical_press_spec(parse_press_spec("adakv:press=knorm")), "adakv(knorm)");
}

TEST(PressSpecTree, CanonicalFormIsThePressSpecForEveryPress) {
  // Options given in reverse declaration order print in declaration order, as make_press.
  int compared = 0;
  for (const PressInfo& info : press_registry()) {
    std::string text = info.name;
    if (info.wrapper) text += "(snapkv)";
    std::string opts;
    for (auto o = info.options.rbegin(); o != info.options.rend(); ++o)
      if (o->name != "calib" && o->name != "press" && !o->default_value.empty()) opts += (opts.empty() ? "" : ",") + o->name + "=" + o->default_value;
    if (!opts.empty()) text += ":" + opts;
    const PressSpec spec = parse_press_spec(text);
    std::string built;
    try {
      built = make_press(text)->spec();
    } catch (const Error&) {
      continue;  // presses whose defaults need a calibration file: the tree is still checked
    }
    EXPECT_EQ(canonical_press_spec(spec), built) << text;
    EXPECT_EQ(canonical_press_spec(parse_press_spec(built)), built) << text;
    ++compared;
  }
  EXPECT_GE(compared, 20);
}

TEST(PressSpecTree, EditsOptionsAndFindsTheRatiosPress) {
  PressSpec s = parse_press_spec("snapkv:0.3,window=16");
  ratio_target(s).set("ratio", "0.75");
  EXPECT_EQ(written_press_spec(s), "snapkv:ratio=0.75,window=16");
  ratio_target(s).erase("ratio");
  EXPECT_EQ(written_press_spec(s), "snapkv:window=16");
  ratio_target(s).set("ratio", "0.25");  // not given: inserted first
  EXPECT_EQ(written_press_spec(s), "snapkv:ratio=0.25,window=16");
  EXPECT_THROW(s.items[0].set("nosuch", "1"), Error);

  PressSpec w = parse_press_spec("snapkv:0.5+adakv(knorm):alpha_safeguard=0.3");
  EXPECT_EQ(&ratio_target(w), &w.items[1].inner[0].items[0]);  // the last press, inside its wrapper
  PressSpec nr = parse_press_spec("streamingllm:sinks=4+think");
  EXPECT_NO_THROW(ratio_target(nr));
  for (const PressInfo& info : press_registry()) {
    if (info.wrapper || std::any_of(info.options.begin(), info.options.end(),
                                    [](const PressOption& o) { return o.name == "ratio"; }))
      continue;
    PressSpec x = parse_press_spec(info.name);
    EXPECT_THROW(ratio_target(x), Error) << info.name;  // no ratio to set
  }
}

TEST(PressSpecTree, ErrorsNameTheMistake) {
  auto err = [](const std::string& text) {
    try {
      parse_press_spec(text);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(err("adakv()").find("inner press is empty"), std::string::npos);
  EXPECT_NE(err("snapkv)").find("unbalanced ')'"), std::string::npos);
  EXPECT_NE(err("snapkv:window=").find("empty value"), std::string::npos);
  EXPECT_NE(err("snapkv:,").find("empty option"), std::string::npos);
  EXPECT_NE(err("adakv(snapkv) x").find("unexpected 'x'"), std::string::npos);
  EXPECT_NE(err(":0.5").find("missing press name"), std::string::npos);
  EXPECT_NE(err("adakv(snapkv:nosuch=1)").find("press 'snapkv' has no option 'nosuch'"), std::string::npos);
}

// The budget a caller may restate (the server's follow-up turns): every press that takes its
// token count from the context's size, none where there is no such budget.
TEST(PressRegistry, TokenBudgetOfThePressesThatHaveOne) {
  int n = 0;
  for (const PressInfo& info : press_registry()) {
    if (info.wrapper || info.axis != PressAxis::kToken) continue;
    const std::string spec = info.name + ":0.3";
    const auto p = make_press(spec);
    ASSERT_NE(p->token_budget(), nullptr) << spec;
    EXPECT_DOUBLE_EQ(p->token_budget()->ratio, 0.3) << spec;
    ++n;
  }
  EXPECT_GE(n, 5);
  EXPECT_EQ(make_press("kvcompose:total=100")->token_budget(), nullptr);  // absolute over all layers
  EXPECT_EQ(make_press("snapkv:0.3+tova:0.3")->token_budget(), nullptr);
  for (const PressInfo& info : press_registry()) {
    if (info.axis == PressAxis::kToken) continue;
    EXPECT_EQ(make_press(info.name + ":0.3")->token_budget(), nullptr) << info.name;  // not tokens
  }
}

TEST(PressRegistry, BudgetKeepCountFollowsKvpress) {
  Budget b;
  b.ratio = 0.5;
  EXPECT_EQ(b.keep_count(48), 24);
  EXPECT_EQ(b.keep_count(7), 3);  // int(7 * 0.5)
  b.ratio = 0.9;
  EXPECT_EQ(b.keep_count(5), 1);  // never empty
  b.n_keep = 10;
  EXPECT_EQ(b.keep_count(48), 10);
  EXPECT_EQ(b.keep_count(4), 4);
  EXPECT_EQ(Budget{}.keep_count(48), 48);
}

TEST(PressRegistry, ComposePlans) {
  CompressionPlan a(1, 2), b(1, 2);
  a.at(0, 0).keep_all = false;
  a.at(0, 0).keep = {1, 3, 5, 7};
  b.at(0, 0).keep_all = false;
  b.at(0, 0).keep = {0, 2};
  b.at(0, 1).keep_all = false;
  b.at(0, 1).keep = {4};
  const CompressionPlan c = compose_plans(a, b);
  EXPECT_EQ(c.at(0, 0).keep, (std::vector<int32_t>{1, 5}));
  EXPECT_EQ(c.at(0, 1).keep, (std::vector<int32_t>{4}));
  EXPECT_EQ(top_k_indices({0.5f, 2.f, 2.f, 1.f}, 2), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(top_k_indices({1.f, 1.f, 1.f}, 2), (std::vector<int32_t>{0, 1}));  // ties: earlier wins
}

}  // namespace
}  // namespace kvtrim

#undef EXPECT_ERROR_HAS  // not into the next file of a unity build
