#include "core/utf8.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvtrim {
namespace {

TEST(Utf8, RoundTripsEveryLength) {
  for (uint32_t cp : {0x24u, 0x7Fu, 0x80u, 0xE9u, 0x7FFu, 0x800u, 0x20ACu, 0xFFFFu, 0x10000u, 0x1F600u, 0x10FFFFu}) {
    std::string s;
    utf8_append(cp, &s);
    EXPECT_EQ(s.size(), utf8_len(static_cast<uint8_t>(s[0]))) << std::hex << cp;
    size_t pos = 0;
    EXPECT_EQ(utf8_next(s, &pos), cp);
    EXPECT_EQ(pos, s.size());
  }
  std::string big;
  utf8_append(0x110000, &big);  // past Unicode
  EXPECT_EQ(big, "\xEF\xBF\xBD");
}

TEST(Utf8, InvalidAndTruncatedSequencesAreOneByte) {
  // a lone continuation byte, a lead byte cut short at the end, a lead followed by ASCII
  const std::string s = "a\x80" "b\xE2\x82" "c\xC3";
  std::vector<uint32_t> cps;
  for (size_t pos = 0; pos < s.size();) cps.push_back(utf8_next(s, &pos));
  EXPECT_EQ(cps, (std::vector<uint32_t>{'a', 0xFFFD, 'b', 0xFFFD, 0xFFFD, 'c', 0xFFFD}));
  // utf8_chars keeps the bytes themselves, one string each
  EXPECT_EQ(utf8_chars(s), (std::vector<std::string>{"a", "\x80", "b", "\xE2", "\x82", "c", "\xC3"}));
  EXPECT_EQ(utf8_chars("h\xC3\xA9\xE2\x82\xAC!"), (std::vector<std::string>{"h", "\xC3\xA9", "\xE2\x82\xAC", "!"}));
  EXPECT_TRUE(utf8_chars("").empty());
}

}  // namespace
}  // namespace kvtrim
