// Process memory as the OS sees it (for reports that memory savings are real).
#pragma once
#include <cstddef>

namespace kvtrim {

// Resident set size of this process in bytes (from /proc/self/statm); 0 if unavailable.
size_t process_rss_bytes();

}  // namespace kvtrim
