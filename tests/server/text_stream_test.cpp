// TextStream: released text never ends inside a UTF-8 character nor contains what could start
// a stop sequence; stop sequences are found across pieces; compared with a brute-force model.
#include "server/text_stream.h"

#include <gtest/gtest.h>

#include <random>

namespace kvtrim::server {
namespace {

TEST(TextStream, HoldsBackPartialStopsAndFindsThemAcrossPieces) {
  TextStream t({"END"});
  EXPECT_EQ(t.push("hello E"), "hello ");
  EXPECT_EQ(t.push("N"), "");
  EXPECT_EQ(t.push("D and more"), "");
  EXPECT_TRUE(t.stopped());
  EXPECT_EQ(t.text(), "hello ");
  EXPECT_EQ(t.push("x"), "");
  EXPECT_EQ(t.flush(), "");
}

TEST(TextStream, APartialStopThatDoesNotCompleteIsReleased) {
  TextStream t({"END"});
  EXPECT_EQ(t.push("a E"), "a ");
  EXPECT_EQ(t.push("Nx"), "ENx");
  EXPECT_EQ(t.push("EN"), "");
  EXPECT_EQ(t.flush(), "EN");
  EXPECT_FALSE(t.stopped());
  EXPECT_EQ(t.text(), "a ENxEN");
}

TEST(TextStream, NeverCutsAUtf8Character) {
  TextStream t;
  const std::string euro = "\xE2\x82\xAC";  // U+20AC, 3 bytes
  EXPECT_EQ(t.push("a\xE2"), "a");
  EXPECT_EQ(t.push("\x82"), "");
  EXPECT_EQ(t.push("\xAC"), euro);
  EXPECT_EQ(utf8_complete_prefix("\xF0\x9F\x98", 3), 0u);
  EXPECT_EQ(utf8_complete_prefix("\xF0\x9F\x98\x80", 4), 4u);
  EXPECT_EQ(utf8_complete_prefix("ab", 2), 2u);
  EXPECT_EQ(utf8_complete_prefix("\x80\x80", 2), 2u);  // stray continuation bytes pass
}

// Random pieces over a small alphabet with several stops: the concatenation of what is
// released equals the brute-force answer (text up to the first stop occurrence, or all).
TEST(TextStream, MatchesBruteForceOnRandomPieces) {
  std::mt19937 rng(5);
  const std::vector<std::string> stops = {"abca", "cc", "bab"};
  for (int trial = 0; trial < 2000; ++trial) {
    std::string all;
    std::vector<std::string> pieces;
    const int n = 1 + static_cast<int>(rng() % 8);
    for (int i = 0; i < n; ++i) {
      std::string p;
      const int len = static_cast<int>(rng() % 4);
      for (int k = 0; k < len; ++k) p += static_cast<char>('a' + rng() % 3);
      pieces.push_back(p);
      all += p;
    }
    size_t first = std::string::npos;
    for (const auto& s : stops) first = std::min(first, all.find(s));
    const std::string expect = first == std::string::npos ? all : all.substr(0, first);
    TextStream t(stops);
    std::string got;
    for (const auto& p : pieces) {
      got += t.push(p);
      // nothing released may be followed by text completing a stop: released is a prefix of expect
      ASSERT_EQ(expect.compare(0, got.size(), got), 0) << all;
    }
    got += t.flush();
    EXPECT_EQ(got, expect) << all;
    EXPECT_EQ(t.stopped(), first != std::string::npos) << all;
  }
}

}  // namespace
}  // namespace kvtrim::server
