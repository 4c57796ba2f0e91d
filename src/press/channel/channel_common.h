// Shared pieces of the channel-axis presses (ThinK, SPARK; DESIGN.md §4.2): statistics of the
// observation window's queries per (layer, KV head), channel counts from a pruning ratio, and a
// deterministic top-k of channels.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "press/press.h"

namespace kvtrim::channel {

// The window's queries of the KV head's group, reduced per channel c (d = head_dim_k):
//   sq_mean[c]  = mean over window queries w and group heads g of q_wgc²   (ThinK)
//   mean_l2[c]  = ‖(mean_g q_wgc)_w‖₂: the L2 norm over the window of the group-mean query
//                 (SPARK's code: queries averaged over the group, then torch.norm over W)
//   mean_abs[c] = |mean_w mean_g q_wgc|: the magnitude of the mean query (SPARK's paper, |q̄_c|)
struct WindowStats {
  std::vector<double> sq_mean, mean_l2, mean_abs;
};
WindowStats window_stats(const ObservedQueries& q, int ih, int group, int n_head, int d);

// The queries a channel press observes for layer il: the last `window` of the context's, or,
// query-aware, every query of the question (Session::observe_question; the SPARK and ThinK
// papers' prompts end with the question, so their observation window holds it). needs() must
// ask for the same (window_needs).
ObservedQueries observed_queries(const PressContext& ctx, int il, bool query_aware, int64_t window, const char* who);
PressNeeds window_needs(bool query_aware, int64_t window);

// How many of d channels a pruning ratio λ keeps:
//   kCode:  d − int(λ·d) (kvpress's ThinKPress and SPARK's code prune int(λ·d) channels);
//   kPaper: ⌊(1 − λ)·d⌋ (the papers' T), at least 1.
// They differ when λ·d is not an integer (λ = 0.8, d = 64: 13 vs 12).
enum class CountRule { kCode, kPaper };
int kept_channels(double ratio, int d, CountRule rule);
CountRule parse_count_rule(const PressArgs& a);
PressOption count_rule_option();

// The k largest of s[0..d) as increasing indices; ties: the lower index wins (as bf_topk in the
// tests). order (scratch, size d) receives every index sorted by decreasing score.
void top_channels(const float* s, int d, int k, std::vector<int32_t>* order, int32_t* out);

}  // namespace kvtrim::channel
