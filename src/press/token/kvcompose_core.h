// KVCompose, the pure maths (no cache, no session): attention-guided token scores (eqs. 3,
// 14-16), composite tokens (eqs. 17-19), one global budget spread over layers (eqs. 20-22)
// and each head's top-N_l selection (eqs. 23-24); the unstructured variant (appendix A.2);
// the v-norm / vo-norm weights (appendix A.1.3).
//
// Based on Akulov et al. 2025, "KVCompose: Efficient Structured KV Cache Compression with
// Composite Tokens" (papers/kvcompose.txt). The press that wires this to the cache and the
// session's observations is src/press/token/kvcompose.cpp; docs/presses-kvcompose.md maps
// every equation to code.
//
// Notation: layer il, kv head ih, query head h = ih * group + g, context token c (a stored
// token of the head, by its index in the head's storage), task token m.
#pragma once
#include <cstdint>
#include <vector>

#include "ops/matmul.h"

namespace kvtrim {

class ThreadPool;

namespace kvcompose {

enum class Agg { kMax, kMean };
const char* agg_name(Agg a);

// Eq. 3 + eq. 14 for the `group` query heads of kv head ih, over one block of task queries:
//   A[h, c, m] = softmax_c(scale · q_m·k_c) over the tokens query m sees (k_pos <= q_pos and,
//   when window > 0, q_pos - k_pos < window; invisible tokens get A = 0);
//   acc[c, g] = max(acc[c, g], A[h, c, m])   (Agg_task = max)   or
//   acc[c, g] += A[h, c, m]                  (Agg_task = mean: divided by M in group_scores).
// Calling it again with the next block of queries continues the aggregation (online over
// chunks: only acc [n_k, group] is kept, never the queries).
// q: [n_q, n_head, head_dim] (all query heads; the group's are read), q_pos: [n_q];
// k: [n_k, head_dim] (the head's stored keys, RoPE applied), k_pos: [n_k] increasing;
// acc: [n_k, group], initialised to 0 by the caller. pool may be nullptr. extra_lse (may be
// nullptr): [n_q, n_head], the log of a further term in each softmax denominator (the
// question's own keys, ObservedQueries::self_lse).
void accumulate_task_attention(const float* q, const int32_t* q_pos, int64_t n_q, int n_head,
                               int ih, int group, int head_dim, const float* k,
                               const int32_t* k_pos, int64_t n_k, float scale, int window,
                               Agg agg_task, float* acc, ThreadPool* pool, const float* extra_lse = nullptr);

// Both aggregates at once: press/attention_stats.h (attention_max_sum), which the session's
// observer also runs during the forward pass (task-agnostic causal accumulation, the re-feeds).

// Eq. 15 for one kv head: out[c] = Agg_group over g of (w[c, g] · S_agg_task[c, g]), where
// S_agg_task = acc (max) or acc / n_task (mean over the M = n_task task tokens). w (may be
// nullptr = 1) is the v-norm / vo-norm weight of appendix A.1.3: it multiplies every
// A[h, c, m] of token c, and since it does not depend on m and is >= 0 it commutes with
// Agg_task (max or mean), so weighting the aggregate is the same as weighting A.
// acc, w: [n_tok, group]; out: [n_tok].
void group_scores(const float* acc, int64_t n_tok, int group, int64_t n_task, Agg agg_task,
                  Agg agg_group, const float* w, float* out);

// Eq. 16 for one layer: s[ih][c] += (1 / n_head_kv) Σ_i s[i][c'] where c' is the token of
// head i with the same original position as c (a head that does not hold that position adds
// 0; with a dense cache every head holds the same positions and this is exactly eq. 16).
// Scores equal to -inf (not candidates) are neither changed nor added.
// s: [n_head_kv][n_tok(ih)], pos: [n_head_kv][n_tok(ih)] increasing.
void add_head_mean(std::vector<std::vector<float>>* s, const std::vector<std::vector<int32_t>>& pos);

// What the selection keeps: keep[il * n_head_kv + ih] = indices into s[il][ih] (increasing);
// n_keep_layer[il] = N_l (structured) or the layer's total over heads / n_head_kv rounded
// down (unstructured, informative only).
struct Selection {
  std::vector<std::vector<int32_t>> keep;
  std::vector<int64_t> n_keep_layer;
};

// Structured selection, eqs. 17-24. s: [n_layer][n_head_kv][n_tok(il, ih)] final scores S
// (eq. 16); -inf marks a token that is not a candidate (it is dropped: a sliding-window
// layer's tokens no future query can see). Per head, idx = argsort(S, descending) over its
// candidates (ties: lower index first) (eq. 17); S'[k] = S[idx[k]] (eq. 18); composite score
// I[il, k] = Agg_head over the heads that have a k-th candidate (eq. 19); the pool of all
// (il, k) (eq. 20); the top-b_total of the pool by I (ties: lower layer, then lower k)
// (eq. 22) gives N_l = how many of layer il's ranks are in it; each head keeps
// idx[:min(N_l, n_cand)] (eqs. 23-24). A head never goes empty (framework rule): rank 0 of
// every layer with a candidate is always selected and counts toward b_total.
// Choices of the authors' implementation (NVIDIA/kvpress KVComposePress) the paper does not
// describe; both off by default (the paper). layer0_max: layer 0's k-th composite score is
// replaced by the largest k-th composite score over all layers ("ensures first layer is the
// largest"); keep_min: every layer keeps at least its keep_min best composite tokens
// (keep_token_lower_bound; they count toward B_total).
struct StructuredOptions {
  bool layer0_max = false;
  int64_t keep_min = 0;
};
Selection select_structured(const std::vector<std::vector<std::vector<float>>>& s, Agg agg_head,
                            int64_t b_total, const StructuredOptions& opt = {});

// Unstructured variant (appendix A.2: "removing the final aggregation step and allowing each
// head to select its tokens independently"): the top-b_entries of all (il, ih, c) candidates
// by S (ties: lower il, ih, c), each head keeping its own count. Each head's best candidate
// is always kept (a head never goes empty) and counts toward b_entries.
Selection select_unstructured(const std::vector<std::vector<std::vector<float>>>& s,
                              int64_t b_entries);

// Eq. 21 generalised to n entries: floor((1 - ratio) · n), computed as kvpress computes it
// (int((1 - r) · n) in double).
int64_t budget_from_ratio(double ratio, int64_t n);

// Appendix A.1.3 vo-norm: the Gram matrices G_h = W_O^(h)ᵀ W_O^(h) [dv, dv] of each query
// head's slice of the output projection (columns h·dv .. h·dv+dv-1 of wo [n_embd, n_head·dv]),
// accumulated in double over wo's dequantized rows; then ‖W_O^(h) v‖ = sqrt(vᵀ G_h v) costs
// dv² per token instead of n_embd · dv. Returns [n_head, dv, dv].
std::vector<double> vo_gram(const WeightView& wo, int n_head, int head_dim_v);
// sqrt(vᵀ G v) for one value v [dv] and one Gram matrix gram [dv, dv].
float vo_norm(const double* gram, const float* v, int head_dim_v);
// ‖v‖₂ for one value v [dv].
float v_norm(const float* v, int head_dim_v);

}  // namespace kvcompose
}  // namespace kvtrim
