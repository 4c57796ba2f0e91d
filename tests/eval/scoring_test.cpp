// RULER's scorers on hand-written cases.
#include "eval/scoring.h"

#include <gtest/gtest.h>

namespace kvtrim::eval {
namespace {

TEST(Scoring, StringMatchAll) {
  EXPECT_DOUBLE_EQ(string_match_all(" 1234567.", {"1234567"}), 100.0);
  EXPECT_DOUBLE_EQ(string_match_all("The numbers are 1, 2 and 9", {"1", "2", "3", "4"}), 50.0);
  EXPECT_DOUBLE_EQ(string_match_all("FORSAKE, Blazer", {"forsake", "blazer", "hock"}), 100.0 * 2 / 3);
  EXPECT_DOUBLE_EQ(string_match_all("nothing here", {"abc"}), 0.0);
  EXPECT_DOUBLE_EQ(string_match_all("anything", {}), 0.0);
  // Substring match, as RULER: "12" is found in "123".
  EXPECT_DOUBLE_EQ(string_match_all("123", {"12"}), 100.0);
}

TEST(Scoring, StringMatchPart) {
  EXPECT_DOUBLE_EQ(string_match_part("Paris, France", {"London", "paris"}), 100.0);
  EXPECT_DOUBLE_EQ(string_match_part("Berlin", {"London", "Paris"}), 0.0);
  EXPECT_DOUBLE_EQ(string_match_part("music theory and more", {"Music Theory"}), 100.0);
}

TEST(Scoring, PostprocessAndMetric) {
  EXPECT_EQ(postprocess_prediction("\t  answer\x01 text \n"), "answer\n text");
  EXPECT_EQ(metric_for_task("qa_1"), Metric::kPart);
  EXPECT_EQ(metric_for_task("qa_2"), Metric::kPart);
  EXPECT_EQ(metric_for_task("niah_single_1"), Metric::kAll);
  EXPECT_EQ(metric_for_task("cwe"), Metric::kAll);
  EXPECT_DOUBLE_EQ(score(Metric::kPart, "b", {"a", "b"}), 100.0);
  EXPECT_DOUBLE_EQ(score(Metric::kAll, "b", {"a", "b"}), 50.0);
}

}  // namespace
}  // namespace kvtrim::eval
