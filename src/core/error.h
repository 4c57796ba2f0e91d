// Errors: library code throws kvtrim::Error with a message that names the problem
// (file, field, value); the CLI catches it, prints it and exits non-zero.
#pragma once
#include <cstdarg>
#include <stdexcept>
#include <string>

namespace kvtrim {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// printf-style formatting into a std::string.
std::string strprintf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// Throws Error(strprintf(fmt, ...)).
[[noreturn]] void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace kvtrim

// Checks an input condition; on failure throws kvtrim::Error with the formatted message.
#define KVTRIM_CHECK(cond, ...)       \
  do {                                \
    if (!(cond)) ::kvtrim::fail(__VA_ARGS__); \
  } while (0)

// Internal invariant ("call only if ..."): a failure is a kvtrim bug, not bad input.
#define KVTRIM_ASSERT(cond)                                                              \
  do {                                                                                   \
    if (!(cond))                                                                         \
      ::kvtrim::fail("internal error: %s (%s:%d)", #cond, __FILE__, __LINE__);          \
  } while (0)
