// Process memory as the OS sees it (for reports that memory savings are real).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace kvtrim {

// Resident set size of this process in bytes (from /proc/self/statm); 0 if unavailable.
size_t process_rss_bytes();

// Memory this process could still use, in bytes: MemAvailable (/proc/meminfo), lowered to the
// room left under a cgroup v2 limit (memory.max - memory.current) when one is set. 0 if
// unknown. `source` (may be nullptr) names where the figure came from, for messages.
size_t available_memory_bytes(const char** source = nullptr);

// A zeroed buffer for large data read whole on every decode step (the packed weights): anonymous
// memory aligned to 2 MiB and advised MADV_HUGEPAGE, so that where the kernel's transparent huge
// pages are on ("always" or "madvise", the Debian default) it is backed by 2 MiB pages: one TLB
// entry per 2 MiB instead of 512 (a SmolLM2 step streams ~23k 4 KiB pages of weights, more than
// the TLBs hold, every step). Without THP the same buffer in 4 KiB pages; under 2 MiB (a tiny
// test model) always 4 KiB pages, page-aligned, not advised. Moves, not copies.
class HugePageBuffer {
 public:
  HugePageBuffer() = default;
  explicit HugePageBuffer(size_t bytes);  // throws std::bad_alloc when the mapping fails
  ~HugePageBuffer();
  HugePageBuffer(HugePageBuffer&& o) noexcept;
  HugePageBuffer& operator=(HugePageBuffer&& o) noexcept;
  HugePageBuffer(const HugePageBuffer&) = delete;
  HugePageBuffer& operator=(const HugePageBuffer&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  // Bytes of the buffer the kernel backs with huge pages now (AnonHugePages of its mapping in
  // /proc/self/smaps; 0 where unknown).
  size_t huge_page_bytes() const;

 private:
  void release();
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  void* map_ = nullptr;  // the whole mapping (the aligned buffer lies inside it)
  size_t map_bytes_ = 0;
};

// "1.50 GiB", "640.00 MiB", "3.5 KiB", "512 B".
std::string format_bytes(size_t n);

}  // namespace kvtrim
