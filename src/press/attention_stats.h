// Attention statistics of observed queries over one kv head's keys, shared by the presses that
// score with them (KVCompose's eq. 3 + 14) and by the session's observer, which accumulates them
// while the forward pass runs (H2O's cumulative attention, KVCompose's causal accumulators, the
// re-feed passes of src/engine/refeed.h). Not one press's internals: the engine includes this,
// not a press's header.
#pragma once
#include <cstdint>

namespace kvtrim {

class ThreadPool;

// For the `group` query heads of kv head ih, over one block of queries:
//   A[h, c, m] = softmax_c(scale · q_m·k_c) over the keys query m sees (k_pos <= q_pos and,
//   when window > 0, q_pos - k_pos < window; invisible keys get A = 0);
//   acc_max[c, g] = max(acc_max[c, g], A[h, c, m]),  acc_sum[c, g] += A[h, c, m].
// Calling it again with the next block of queries continues both aggregates (online over
// chunks: only [n_k, group] is kept, never the queries). Either accumulator may be nullptr.
// q: [n_q, n_head, head_dim] (all query heads; the group's are read), q_pos: [n_q];
// k: [n_k, head_dim] (RoPE applied), k_pos: [n_k] increasing; accumulators [n_k, group],
// initialised by the caller. Logits run as one sgemm per block of queries (about 16 MiB of
// logits at a time), the softmax with the SIMD exp; rows and columns split over `pool` (may be
// nullptr).
void attention_max_sum(const float* q, const int32_t* q_pos, int64_t n_q, int n_head, int ih, int group,
                       int head_dim, const float* k, const int32_t* k_pos, int64_t n_k, float scale, int window,
                       float* acc_max, float* acc_sum, ThreadPool* pool);

}  // namespace kvtrim
