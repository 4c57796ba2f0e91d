#include "core/log.h"

#include <atomic>
#include <cstdarg>
#include <cstdio>

namespace kvtrim {

namespace {
std::atomic<LogLevel> g_level{LogLevel::kInfo};
}

void set_log_level(LogLevel level) { g_level.store(level); }
LogLevel log_level() { return g_level.load(); }

void log(LogLevel level, const char* fmt, ...) {
  if (level < g_level.load()) return;
  static const char* kTags[] = {"debug", "info", "warn", "error", ""};
  std::fprintf(stderr, "[kvtrim %s] ", kTags[static_cast<int>(level)]);
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stderr, fmt, ap);
  va_end(ap);
  std::fputc('\n', stderr);
}

}  // namespace kvtrim
