#include "core/memory.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <utility>

namespace kvtrim {
namespace {

constexpr size_t kTwoMiB = size_t{2} << 20;

// The buffer the packed weights live in: zeroed, on a 2 MiB boundary (from 2 MiB on), every byte writable,
// moved without copying; what it reports in huge pages is at most its mapping (whether the kernel
// gives any depends on its THP setting and free memory, so that is not asserted).
TEST(HugePageBuffer, AlignedZeroedWritableAndMoved) {
  for (size_t n : {size_t{1}, size_t{4096}, kTwoMiB - 64, kTwoMiB + 1, 3 * kTwoMiB}) {
    SCOPED_TRACE(n);
    HugePageBuffer b(n);
    ASSERT_NE(b.data(), nullptr);
    EXPECT_EQ(b.size(), n);
    // on a 2 MiB boundary from 2 MiB on, else page-aligned (a few KiB take no huge page)
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % (n >= kTwoMiB ? kTwoMiB : 4096), 0u);
    if (n < kTwoMiB) {
      EXPECT_EQ(b.huge_page_bytes(), 0u);
    }
    size_t nonzero = 0;
    for (size_t i = 0; i < n; i += 4096) nonzero += b.data()[i] != 0;
    nonzero += b.data()[n - 1] != 0;
    EXPECT_EQ(nonzero, 0u);
    std::memset(b.data(), 0x5A, n);
    EXPECT_EQ(b.data()[n - 1], 0x5A);
    EXPECT_LE(b.huge_page_bytes(), (n + kTwoMiB - 1) / kTwoMiB * kTwoMiB);
    uint8_t* const p = b.data();
    HugePageBuffer m(std::move(b));
    EXPECT_EQ(m.data(), p);
    EXPECT_EQ(m.size(), n);
    EXPECT_EQ(b.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty
    EXPECT_EQ(b.size(), 0u);
    HugePageBuffer a(64);
    a = std::move(m);  // the old mapping is released, this one taken
    EXPECT_EQ(a.data(), p);
    EXPECT_EQ(a.data()[0], 0x5A);
  }
  HugePageBuffer empty(0);
  EXPECT_EQ(empty.data(), nullptr);
  EXPECT_EQ(empty.huge_page_bytes(), 0u);
}

}  // namespace
}  // namespace kvtrim
