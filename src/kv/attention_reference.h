// Dense reference attention (scalar, f32 inputs, double accumulation): the ground truth the
// cache's attention is tested against. For tests only; never on a hot path.
#pragma once
#include <cstdint>

#include "kv/kv_cache.h"

namespace kvtrim {

// out[n_q, n_head, hdv] = softmax(scale · q kᵀ (+ softcap)) v over the keys visible to each
// query: k_pos <= q_pos and, with a sliding window w > 0, q_pos - k_pos < w.
// GQA: query head h reads kv head h / (n_head / n_head_kv).
// q: [n_q, n_head, hdk], q_pos: [n_q]; k: [n_kv, n_head_kv, hdk], v: [n_kv, n_head_kv, hdv],
// k_pos: [n_kv] (any order). A query that sees no key gets zeros.
void attention_reference(int64_t n_q, const float* q, const int32_t* q_pos, int64_t n_kv,
                         const float* k, const float* v, const int32_t* k_pos, int n_head_kv,
                         int hdk, int hdv, const AttnParams& p, float* out);

// The dense reference over any cache's layout: for each kv head of layer il, reconstruct the
// f32 K/V and positions of its kept tokens (read_head), then run attention_reference for the
// head's group of query heads. Same shapes as KvCache::attend: q [n_q, n_head, head_dim_k],
// q_pos [n_q], out [n_q, n_head, head_dim_v].
void attention_reference_cache(const KvCache& cache, int il, int64_t n_q, const float* q,
                               const int32_t* q_pos, const AttnParams& p, float* out);

}  // namespace kvtrim
