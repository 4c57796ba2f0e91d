// Minimal leveled logging to stderr. Library code logs; it never exits.
#pragma once
#include <string>

namespace kvtrim {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kQuiet = 4 };

void set_log_level(LogLevel level);
LogLevel log_level();
void log(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace kvtrim

#define KVTRIM_LOG_DEBUG(...) ::kvtrim::log(::kvtrim::LogLevel::kDebug, __VA_ARGS__)
#define KVTRIM_LOG_INFO(...) ::kvtrim::log(::kvtrim::LogLevel::kInfo, __VA_ARGS__)
#define KVTRIM_LOG_WARN(...) ::kvtrim::log(::kvtrim::LogLevel::kWarn, __VA_ARGS__)
