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
// nullptr). extra_lse (may be nullptr): [n_q, n_head], log of a further term in each query
// head's softmax denominator (keys the query saw that are not in k, e.g. a question's own).
void attention_max_sum(const float* q, const int32_t* q_pos, int64_t n_q, int n_head, int ih, int group,
                       int head_dim, const float* k, const int32_t* k_pos, int64_t n_k, float scale, int window,
                       float* acc_max, float* acc_sum, ThreadPool* pool, const float* extra_lse = nullptr);

// log Σ_j exp(scale · q·k_j) over the keys j query i sees (k_pos[j] <= q_pos[i] and, when
// window > 0, q_pos[i] - k_pos[j] < window), for every query head: out [n_q, n_head]; -inf where
// it sees none. q: [n_q, n_head, head_dim]; k: [n_k, n_head_kv, head_dim] (grouped query
// heads: head h reads kv head h / (n_head / n_head_kv)). Scalar (for a question's few tokens).
void self_logsumexp(const float* q, const int32_t* q_pos, int64_t n_q, int n_head, int n_head_kv, int head_dim,
                    const float* k, const int32_t* k_pos, int64_t n_k, float scale, int window, float* out);

}  // namespace kvtrim
