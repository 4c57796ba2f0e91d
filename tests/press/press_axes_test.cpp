// docs/HOWTO-add-press.md, checked: a toy press of each axis (token, channel, basis) registered
// with register_press, as an out-of-tree press would be, is picked up by the generic sweep of
// its axis (press_sweeps.h: the registry's presses of that axis, their default test settings)
// and passes it. The toys are written here, independently of src/press.
#include <gtest/gtest.h>

#include <algorithm>

#include "press_sweeps.h"

namespace kvtrim {
namespace {

// Token axis: a ScorerPress keeping each head's newest tokens.
class ToyTokenPress : public ScorerPress {
 public:
  explicit ToyTokenPress(Budget b) : ScorerPress(b) {}
  std::string name() const override { return "toy_token"; }
  void score_layer(const PressContext& ctx, int il,
                   std::vector<std::vector<float>>* scores) const override {
    for (int ih = 0; ih < ctx.n_head_kv(); ++ih) {
      auto& sc = (*scores)[static_cast<size_t>(ih)];
      sc.resize(static_cast<size_t>(ctx.n_tokens(il, ih)));
      for (size_t t = 0; t < sc.size(); ++t) sc[t] = static_cast<float>(t);
    }
  }
};

// Channel axis: every token kept, each head stores only its first d - int(ratio d) key
// coordinates (a per-head subset, as ThinK without scores).
class ToyChannelPress : public Press {
 public:
  explicit ToyChannelPress(double ratio) : ratio_(ratio) {}
  std::string name() const override { return "toy_channel"; }
  CompressionPlan plan(const PressContext& ctx) const override {
    CompressionPlan plan(ctx.n_layer(), ctx.n_head_kv());
    const int d = ctx.head_dim_k();
    const int keep = d - static_cast<int>(ratio_ * d);
    if (keep >= d) return plan;
    for (HeadPlan& hp : plan.heads) {
      ChannelSubset sub;
      for (int c = 0; c < keep; ++c) sub.channels.push_back(static_cast<uint16_t>(c));
      hp.key.channels = sub;
    }
    return plan;
  }

 private:
  double ratio_;
};

// Basis axis: every token kept, keys and values stored as their first r coordinates (the basis
// [d, r] = the first r columns of the identity), r = LowRankPress::rank_for_removed_ratio.
class ToyBasisPress : public Press {
 public:
  explicit ToyBasisPress(double ratio) : ratio_(ratio) {}
  std::string name() const override { return "toy_basis"; }
  CompressionPlan plan(const PressContext& ctx) const override {
    CompressionPlan plan(ctx.n_layer(), ctx.n_head_kv());
    for (HeadPlan& hp : plan.heads) {
      set_basis(ctx.head_dim_k(), &hp.key);
      set_basis(ctx.head_dim_v(), &hp.value);
    }
    return plan;
  }

 private:
  void set_basis(int d, SideSpec* side) const {
    const int r = LowRankPress::rank_for_removed_ratio(ratio_, d);
    side->rank = r;
    side->basis.assign(static_cast<size_t>(d) * static_cast<size_t>(r), 0.f);  // [d, r] row-major
    for (int i = 0; i < r; ++i)
      side->basis[static_cast<size_t>(i) * static_cast<size_t>(r) + static_cast<size_t>(i)] = 1.f;
  }
  double ratio_;
};

PressInfo toy_info(const char* name, PressAxis axis,
                   std::function<std::unique_ptr<Press>(const PressArgs&)> make) {
  PressInfo i;
  i.name = name;
  i.description = "a toy press of the HOWTO (tests/press/press_axes_test.cpp)";
  i.paper = "none";
  i.options =
      budget_options();  // ratio, budget: test_easy / test_hard take register_press's defaults
  i.axis = axis;
  i.make = std::move(make);
  return i;
}

void register_toys() {
  if (find_press("toy_token")) return;
  register_press(toy_info("toy_token", PressAxis::kToken, [](const PressArgs& a) {
    return std::make_unique<ToyTokenPress>(a.get_budget());
  }));
  register_press(toy_info("toy_channel", PressAxis::kChannel, [](const PressArgs& a) {
    return std::make_unique<ToyChannelPress>(a.get_budget().ratio);
  }));
  register_press(toy_info("toy_basis", PressAxis::kBasis, [](const PressArgs& a) {
    return std::make_unique<ToyBasisPress>(a.get_budget().ratio);
  }));
}

class PressAxes : public test::PressFixture {};

// The sweep of an axis lists its toy, and no other axis's.
bool listed(PressAxis axis, const std::string& name) {
  const auto v = test::presses_of(axis);
  return std::any_of(v.begin(), v.end(), [&](const PressInfo* p) { return p->name == name; });
}

TEST_F(PressAxes, ToyPressOfEachAxisIsPickedUpBySweeps) {
  register_toys();
  const std::vector<std::pair<PressAxis, const char*>> toys = {{PressAxis::kToken, "toy_token"},
                                                               {PressAxis::kChannel, "toy_channel"},
                                                               {PressAxis::kBasis, "toy_basis"}};
  for (const auto& [axis, name] : toys) {
    SCOPED_TRACE(name);
    for (PressAxis other :
         {PressAxis::kToken, PressAxis::kBasis, PressAxis::kChannel, PressAxis::kPrecision})
      EXPECT_EQ(listed(other, name), other == axis) << press_axis_name(other);
    const PressInfo* info = find_press(name);
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(info->test_easy, std::string(name) + ":ratio=0.25");
    EXPECT_EQ(info->test_hard, std::string(name) + ":ratio=0.9");
  }
  const auto prompt = tokens(test::kSweepTokens);
  EXPECT_EQ(test::sweep_token_press(*find_press("toy_token"), *model_, prompt, params()), 3 * 3);
  EXPECT_EQ(test::sweep_channel_press(*find_press("toy_channel"), *model_, prompt, params()),
            3 * 4 * 2);
  EXPECT_EQ(test::sweep_basis_press(*find_press("toy_basis"), *model_, prompt, params()), 2 * 3);
}

}  // namespace
}  // namespace kvtrim
