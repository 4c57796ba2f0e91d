#include "core/memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <new>
#include <string>
#include <utility>

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

namespace {
constexpr size_t kHugePage = size_t{2} << 20;

uintptr_t round_up(uintptr_t x, size_t unit) { return (x + unit - 1) / unit * unit; }
}  // namespace

HugePageBuffer::HugePageBuffer(size_t bytes) {
  if (bytes == 0) return;
  // under one huge page (a tiny test model): 4 KiB pages, not 2 MiB of memory for a few KiB
  const bool huge = bytes >= kHugePage;
  const size_t len = round_up(bytes, huge ? kHugePage : static_cast<size_t>(sysconf(_SC_PAGESIZE)));
  const size_t mapped = huge ? len + kHugePage : len;  // room to start on a 2 MiB boundary
  void* m = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) throw std::bad_alloc();
  const auto base = reinterpret_cast<uintptr_t>(m);
  const uintptr_t start = huge ? round_up(base, kHugePage) : base;
  // the slack before and after the aligned range goes back (the buffer is its own mapping)
  if (start > base) munmap(m, start - base);
  if (base + mapped > start + len) munmap(reinterpret_cast<void*>(start + len), base + mapped - (start + len));
  map_ = reinterpret_cast<void*>(start);
  map_bytes_ = len;
  if (huge) (void)madvise(map_, len, MADV_HUGEPAGE);  // advice: EINVAL without THP support is harmless
  data_ = static_cast<uint8_t*>(map_);
  size_ = bytes;
}

HugePageBuffer::~HugePageBuffer() { release(); }

void HugePageBuffer::release() {
  if (map_) munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
  data_ = nullptr;
  size_ = 0;
}

HugePageBuffer::HugePageBuffer(HugePageBuffer&& o) noexcept { *this = std::move(o); }

HugePageBuffer& HugePageBuffer::operator=(HugePageBuffer&& o) noexcept {
  if (this != &o) {
    release();
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    std::swap(map_, o.map_);
    std::swap(map_bytes_, o.map_bytes_);
  }
  return *this;
}

size_t HugePageBuffer::huge_page_bytes() const {
  if (!map_) return 0;
  std::ifstream f("/proc/self/smaps");
  const auto start = reinterpret_cast<uintptr_t>(map_);
  std::string line;
  bool in = false;
  while (std::getline(f, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) {
      in = lo <= start && start < hi;
      continue;
    }
    if (in && line.rfind("AnonHugePages:", 0) == 0) {
      unsigned long kb = 0;
      std::sscanf(line.c_str() + 14, "%lu", &kb);
      return static_cast<size_t>(kb) * 1024;
    }
  }
  return 0;
}

std::string format_bytes(size_t n) {
  const double x = static_cast<double>(n);
  if (x >= 1024.0 * 1024 * 1024) return strprintf("%.2f GiB", x / (1024.0 * 1024 * 1024));
  if (x >= 1024.0 * 1024) return strprintf("%.2f MiB", x / (1024.0 * 1024));
  if (x >= 1024.0) return strprintf("%.1f KiB", x / 1024.0);
  return strprintf("%zu B", n);
}

}  // namespace kvtrim
