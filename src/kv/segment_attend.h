// Attention over one segment, per encoding (private to src/kv; attend.cpp schedules it).
//
// A work item holds, per segment, a softmax state ("slot") in the segment's stored value space:
//   acc [G, aw] unnormalised Σ_t e^{s_t - m} ṽ_t   (aw = slot_width: the stored value width,
//                                                   plus one fill sum for value fill)
//   m [G] running max, l [G] Σ_t e^{s_t - m}
// lift_slot takes acc to the output space once per segment ((Σ a ṽ) scattered to the value
// coordinates, pruned coordinates' fill added, then ·D_vᵀ); merge_softmax joins states.
#pragma once
#include <cstdint>

#include "kv/encoding.h"
#include "kv/side_store.h"

namespace kvtrim::kv {

// Elements of a segment's projected query per query head: the key side's stored dense width
// (subset: |S|), or the full coordinate width for per-token keys.
int key_query_width(const SideEncoding& k);
// qk [G, key_query_width] = the group's queries q [G, d] seen by the stored key elements:
// projected with the key decoder (q·D_k) and, for a subset, gathered (q[S]).
void key_query(const SideEncoding& k, const float* q, int G, float* qk);
// True when two segments' key sides see the same projected query (reuse it).
bool same_key_query(const SideEncoding& a, const SideEncoding& b);
// Floats of one slot of G query heads: G · (slot_width + 2).
int slot_width(const SegmentEncoding& e);

// Rows [t0, t1) of segment stores (k, v) with encoding e for the group's G query heads:
// qk [G, key_query_width] (unscaled), slot acc [G, slot_width] / m [G] / l [G] (initialised here).
// pos: the segment's positions (read by a pre-RoPE key basis only).
void attend_rows(const SideStore& k, const SideStore& v, const SegmentEncoding& e, const float* qk,
                 int G, float scale, float softcap, int64_t t0, int64_t t1, float* acc, float* m,
                 float* l, const int32_t* pos);

// The same for R query rows at once over dense key and value stores (neither sparse), each
// row r over its own visible rows [lo[r], hi[r]) (empty when lo >= hi: m = -inf, acc = 0):
// every block of kBlock stored rows is scored and accumulated for all R rows in one kernel
// call, so a block is read from memory once per R rows instead of once per query (the prefill
// tiles of attend.cpp). qk [R, key_query_width] (unscaled), acc [R, slot_width], m [R], l [R].
void attend_rows_multi(const SideStore& k, const SideStore& v, const SegmentEncoding& e, const float* qk,
                       int R, float scale, float softcap, const int64_t* lo, const int64_t* hi, float* acc,
                       float* m, float* l, const int32_t* pos);

// out [G, dv] = the slot's accumulator acc [G, slot_width] in the output space.
void lift_slot(const SegmentEncoding& e, const float* acc, int G, float* out);

// The one online-softmax merge: M = max_s m_s, acc = Σ_s e^{m_s - M} acc_s,
// l = Σ_s e^{m_s - M} l_s over n states (acc_s: [width] at accs[s]; states with m = -inf
// skipped; all skipped: m = -inf, acc = 0).
void merge_softmax(int n, const float* const* accs, const float* ms, const float* ls,
                   int64_t width, float* acc, float* m, float* l);

}  // namespace kvtrim::kv
