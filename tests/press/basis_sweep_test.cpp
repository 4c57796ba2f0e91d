// The sweep of the basis-axis (low-rank) presses, as press_sweep_test does for token presses:
// every registered press with PressInfo::axis kBasis x its settings (PressInfo::test_easy,
// test_hard) x variants (compressed during prefill, prefill=full where the press has it, after
// snapkv, before streamingllm) runs prefill + compress + decode + generation on the tiny model
// with an in-memory calibration (press_sweeps.h): every token is kept (or exactly the evicting
// press's selection), the K/V elements shrink with the rank, n_past stays the uncompressed
// length and generation continues with finite logits.
#include <gtest/gtest.h>

#include "basis_test_util.h"
#include "press_sweeps.h"

namespace kvtrim {
namespace {

class BasisSweep : public test::PressFixture {};

TEST_F(BasisSweep, EveryLowRankPressEveryRatioEveryVariant) {
  test::CalibrationScope scope(test::with_stief_fits(
      *model_, *test::tiny_calibration(*model_, capture(test::calib_tokens()))));
  const std::vector<const PressInfo*> presses = test::presses_of(PressAxis::kBasis);
  EXPECT_FALSE(presses.empty());  // which presses must be there: press_registry_test
  for (const PressInfo* info : presses) {
    // easy, hard x (as given, after snapkv, before streamingllm): at least 6 runs per press
    EXPECT_GE(test::sweep_basis_press(*info, *model_, tokens(test::kSweepTokens), params()), 6)
        << info->name;
  }
}

}  // namespace
}  // namespace kvtrim
