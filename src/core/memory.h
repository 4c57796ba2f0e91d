// Process memory as the OS sees it (for reports that memory savings are real).
#pragma once
#include <cstddef>
#include <string>

namespace kvtrim {

// Resident set size of this process in bytes (from /proc/self/statm); 0 if unavailable.
size_t process_rss_bytes();

// Memory this process could still use, in bytes: MemAvailable (/proc/meminfo), lowered to the
// room left under a cgroup v2 limit (memory.max - memory.current) when one is set. 0 if
// unknown. `source` (may be nullptr) names where the figure came from, for messages.
size_t available_memory_bytes(const char** source = nullptr);

// "1.50 GiB", "640.00 MiB", "3.5 KiB", "512 B".
std::string format_bytes(size_t n);

}  // namespace kvtrim
