// Helpers shared by the fuzz targets (fuzz/*_fuzz.cpp).
//
// The contract every target checks: whatever the bytes, kvtrim either succeeds or throws
// kvtrim::Error (a message naming the problem). Any other exception escapes the target and
// libFuzzer reports it as a crash, as it does for sanitizer findings, timeouts and leaks.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace kvtrim::fuzz {

// Splits the input into fields at a separator byte sequence ("\n--\n" by default), so a
// target can take several strings from one input and the seeds stay readable.
inline std::vector<std::string> split_fields(std::string_view in, std::string_view sep = "\n--\n") {
  std::vector<std::string> out;
  size_t at = 0;
  for (;;) {
    const size_t next = in.find(sep, at);
    if (next == std::string_view::npos) {
      out.emplace_back(in.substr(at));
      return out;
    }
    out.emplace_back(in.substr(at, next - at));
    at = next + sep.size();
  }
}

// A property that must hold (beyond "no crash"): prints what failed and aborts, which
// libFuzzer reports with the input that did it.
#define KVTRIM_FUZZ_ASSERT(cond, ...)                                   \
  do {                                                                  \
    if (!(cond)) {                                                      \
      std::fprintf(stderr, "fuzz property failed: %s\n  ", #cond);     \
      std::fprintf(stderr, __VA_ARGS__);                                \
      std::fprintf(stderr, "\n");                                       \
      std::abort();                                                     \
    }                                                                   \
  } while (0)

// An error message must name its problem: non-empty, no NUL, bounded length (a corrupt
// length must not be echoed as megabytes of text).
inline void check_error_message(const Error& e) {
  const std::string_view m = e.what();
  KVTRIM_FUZZ_ASSERT(!m.empty(), "empty error message");
  KVTRIM_FUZZ_ASSERT(m.size() < 64 * 1024, "error message of %zu bytes", m.size());
}

// The directory holding the project's models (models/ in the source tree unless
// KVTRIM_MODELS_DIR says otherwise).
inline std::string models_dir() {
  if (const char* d = std::getenv("KVTRIM_MODELS_DIR")) return d;
  return std::string(KVTRIM_SOURCE_DIR) + "/models";
}

}  // namespace kvtrim::fuzz
