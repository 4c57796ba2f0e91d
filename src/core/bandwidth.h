// Memory read bandwidth of this machine, measured (the roofline that decode speeds are held
// against: a decode step must read every weight and the whole KV cache once).
#pragma once
#include <cstddef>

namespace kvtrim {

class ThreadPool;

struct Bandwidth {
  double gbps = 0;      // best of the repetitions, 1e9 bytes per second
  double gbps_median = 0;
  size_t bytes = 0;     // buffer size read per repetition
  int threads = 1;
  int reps = 0;
};

// Reads a `bytes`-sized buffer (default 256 MiB, far past any last-level cache), split in
// contiguous parts over the pool's threads (nullptr: the caller alone), `reps` times after one
// untimed pass that faults the pages in. The read loop sums 64-bit words into 8 independent
// accumulators (no stores, no SIMD needed: scalar loads issue faster than DRAM delivers), so it
// measures what a streaming kernel could at best read: the STREAM "sum" figure.
Bandwidth measure_read_bandwidth(ThreadPool* pool, size_t bytes = size_t{256} << 20, int reps = 5);

}  // namespace kvtrim
