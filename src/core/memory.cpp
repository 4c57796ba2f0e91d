#include "core/memory.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "core/error.h"

namespace kvtrim {

size_t process_rss_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long size = 0, resident = 0;
  const int got = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  return got == 2 ? resident * static_cast<size_t>(sysconf(_SC_PAGESIZE)) : 0;
}

namespace {

// The first number in a file ("max" or a missing file: 0).
size_t read_number(const char* path) {
  std::ifstream f(path);
  std::string s;
  if (!(f >> s) || s.empty() || s[0] < '0' || s[0] > '9') return 0;
  return static_cast<size_t>(std::strtoull(s.c_str(), nullptr, 10));
}

}  // namespace

size_t available_memory_bytes(const char** source) {
  size_t avail = 0;
  if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    while (std::fgets(line, sizeof line, f)) {
      unsigned long long kb = 0;
      if (std::sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
        avail = static_cast<size_t>(kb) * 1024;
        break;
      }
    }
    std::fclose(f);
  }
  if (source) *source = "MemAvailable in /proc/meminfo";
  // cgroup v2 (containers): the limit of this process's group, if any.
  const size_t max = read_number("/sys/fs/cgroup/memory.max");
  if (max > 0) {
    const size_t cur = read_number("/sys/fs/cgroup/memory.current");
    const size_t room = max > cur ? max - cur : 0;
    if (avail == 0 || room < avail) {
      avail = room;
      if (source) *source = "the cgroup limit /sys/fs/cgroup/memory.max";
    }
  }
  return avail;
}

std::string format_bytes(size_t n) {
  const double x = static_cast<double>(n);
  if (x >= 1024.0 * 1024 * 1024) return strprintf("%.2f GiB", x / (1024.0 * 1024 * 1024));
  if (x >= 1024.0 * 1024) return strprintf("%.2f MiB", x / (1024.0 * 1024));
  if (x >= 1024.0) return strprintf("%.1f KiB", x / 1024.0);
  return strprintf("%zu B", n);
}

}  // namespace kvtrim
