// TokenCache::attend (token_cache.h): flash-decoding style scheduling over segments.
//
// Work items are (query token, kv head, split s of n_split); an item serves all n_head /
// n_head_kv query heads of its group, so each stored row is read once per group. For every
// segment of the head it walks split s of the segment's visible run (its own sorted positions:
// causal, within the sliding window; binary search) in blocks of kBlock tokens with an online
// softmax, leaving one slot per segment in the segment's stored value space (segment_attend.h).
// A second parallel pass per (query, kv head) merges each segment's splits (merge_softmax),
// lifts the segment's slot to the output space once, merges the segments (merge_softmax again)
// and normalises. Splitting runs keeps every thread busy during decode (n_q = 1, few kv heads).
// The query is projected once per (query, segment) — before the items when the runs are split,
// else inside the item — and reused by consecutive segments that see the same projection.
// Prefill (at least kTileMinQueries queries, every store dense): work items are tiles of
// consecutive queries instead (flash-attention style): each block of kBlock stored rows is
// scored and summed for the tile's ~kTileRows query rows in one kernel call, each row over its
// own causal / sliding-window run, so the block is read from memory once per tile rather than
// once per query; no n_q x n_kv scratch (a tile's scores are kTileRows x kBlock floats). Measured
// on one 256-query chunk at position 3840 (2 threads, best of 7; f16 cache unless said):
// SmolLM2 shape 126 -> 138 GFLOP/s, f32 cache 103 -> 132, Qwen2.5 shape 114 -> 155, Gemma3
// shape 87 -> 150.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kv/segment_attend.h"
#include "kv/token_cache.h"

namespace kvtrim::kv {
namespace {

// Visible run [lo, hi) of sorted positions p[0..n) for a query at q_pos.
std::pair<int64_t, int64_t> visible_run(const int32_t* p, int64_t n, int32_t q_pos, int window) {
  const int64_t hi = std::upper_bound(p, p + n, q_pos) - p;
  int64_t lo = window > 0 ? std::lower_bound(p, p + n, q_pos - window + 1) - p : 0;
  return {std::min(lo, hi), hi};
}

// Floats of a head's slots (every segment) for G query heads.
int64_t slots_floats(const Head& H, int G) {
  int64_t n = 0;
  for (const Segment& S : H.segs) n += static_cast<int64_t>(G) * (slot_width(*S.enc) + 2);
  return n;
}

// Floats of a head's projected queries (segments that need one, reused by the next segment
// when it sees the same projection).
int64_t qproj_floats(const Head& H, int G) {
  int64_t n = 0;
  const SideEncoding* prev = nullptr;
  for (const Segment& S : H.segs) {
    const SideEncoding& k = S.enc->k;
    if (k.identity() || (prev && same_key_query(*prev, k))) continue;
    n += static_cast<int64_t>(G) * key_query_width(k);
    prev = &k;
  }
  return n;
}

// The projected query of each segment of H (dst: qproj_floats(H, G) floats): qp[si] points at
// segment si's [G, key_query_width] (the raw group queries for an identity key side). compute
// false: dst already holds them (only the pointers are set).
void project_queries(const Head& H, const float* q_group, int G, float* dst, bool compute,
                     std::vector<const float*>* qp) {
  qp->assign(H.segs.size(), nullptr);
  const SideEncoding* prev = nullptr;
  const float* prev_q = nullptr;
  for (size_t si = 0; si < H.segs.size(); ++si) {
    const SideEncoding& k = H.segs[si].enc->k;
    if (k.identity()) {
      (*qp)[si] = q_group;
      continue;
    }
    if (prev && same_key_query(*prev, k)) {
      (*qp)[si] = prev_q;
      continue;
    }
    if (compute) key_query(k, q_group, G, dst);
    (*qp)[si] = prev_q = dst;
    prev = &k;
    dst += static_cast<int64_t>(G) * key_query_width(k);
  }
}

// One attend() call: the layer, the queries and the split plan; item() and finish() run inside
// the pool (scratch is per call of them, so each worker has its own).
struct AttendJob {
  const Layer& L;
  const float* q;        // [n_q, n_head, dk]
  const int32_t* q_pos;  // [n_q]
  const AttnParams& p;
  float* out;            // [n_q, n_head, dv]
  int nkv, dk, dv, G;
  int64_t n_split = 1, part_stride = 0;
  float* parts = nullptr;            // [n_q * nkv * n_split, part_stride]: every item's slots
  const float* qproj = nullptr;      // split runs: projected queries, filled before the items
  const int64_t* qproj_at = nullptr; // [n_q * nkv] their offsets

  int64_t n_q = 0, bq = 0;            // tiles (prefill): bq queries per item, 0 = per query

  const float* q_group(int64_t iq, int ih) const { return q + (iq * p.n_head + static_cast<int64_t>(ih) * G) * dk; }

  // Tiles [b, e) of (block of bq queries, head): every segment's rows are scored and summed for
  // the block's bq·G query rows at once (attend_rows_multi), each row over its own visible run,
  // and the states land in the same slots as items() with one split would leave.
  // With `next`, the items are claimed one at a time from that counter, the last one first: a
  // causal prefill's later rows see more keys, so contiguous halves left one thread with about
  // three quarters of the work (25 / 75 for a 96-token chunk from an empty cache).
  void tiles(int64_t b, int64_t e, std::atomic<int64_t>* next = nullptr) const {
    std::vector<float> qbuf, qk, acc, ml;
    std::vector<const float*> qp, qpa;
    std::vector<int64_t> lo, hi;
    for (int64_t i = 0; i < e - b; ++i) {
      const int64_t c = next ? next->fetch_add(1, std::memory_order_relaxed) : i;  // c-th item taken
      if (c >= e - b) break;
      const int64_t item = next ? e - 1 - c : b + c;
      const int64_t i0 = item / nkv * bq;
      const int ih = static_cast<int>(item % nkv);
      const int64_t nq = std::min(bq, n_q - i0);
      const int R = static_cast<int>(nq) * G;
      const Head& H = L.heads[static_cast<size_t>(ih)];
      const size_t n_seg = H.segs.size();
      const int64_t qf = qproj_floats(H, G);
      qbuf.resize(static_cast<size_t>(nq * qf));
      qpa.resize(static_cast<size_t>(nq) * n_seg);
      for (int64_t i = 0; i < nq; ++i) {
        project_queries(H, q_group(i0 + i, ih), G, qbuf.data() + i * qf, true, &qp);
        std::copy(qp.begin(), qp.end(), qpa.begin() + static_cast<std::ptrdiff_t>(i * static_cast<int64_t>(n_seg)));
      }
      lo.resize(static_cast<size_t>(R));
      hi.resize(static_cast<size_t>(R));
      int64_t off = 0;  // the segment's slot offset inside a part
      for (size_t si = 0; si < n_seg; ++si) {
        const Segment& S = H.segs[si];
        const int kw = key_query_width(S.enc->k), aw = slot_width(*S.enc);
        qk.resize(static_cast<size_t>(R) * kw);
        for (int64_t i = 0; i < nq; ++i) {
          const float* src = qpa[static_cast<size_t>(i * static_cast<int64_t>(n_seg)) + si];
          std::copy(src, src + static_cast<int64_t>(G) * kw, qk.data() + i * G * kw);
          const auto [l0, h0] = visible_run(segment_positions(L, H, si), S.n(), q_pos[i0 + i], p.sliding_window);
          for (int g = 0; g < G; ++g) {
            lo[static_cast<size_t>(i * G + g)] = l0;
            hi[static_cast<size_t>(i * G + g)] = h0;
          }
        }
        acc.resize(static_cast<size_t>(R) * aw);
        ml.resize(2 * static_cast<size_t>(R));
        attend_rows_multi(S.k, S.v, *S.enc, qk.data(), R, p.scale, p.softcap, lo.data(), hi.data(), acc.data(),
                          ml.data(), ml.data() + R, segment_positions(L, H, si));
        for (int64_t i = 0; i < nq; ++i) {  // query i's G rows into its slot
          float* slot = parts + ((i0 + i) * nkv + ih) * part_stride + off;
          std::copy_n(acc.data() + i * G * aw, static_cast<int64_t>(G) * aw, slot);
          std::copy_n(ml.data() + i * G, G, slot + static_cast<int64_t>(G) * aw);
          std::copy_n(ml.data() + R + i * G, G, slot + static_cast<int64_t>(G) * aw + G);
        }
        off += static_cast<int64_t>(G) * (aw + 2);
      }
    }
  }

  // Items [b, e): split s of every segment's visible run of (query iq, head ih) into its slots.
  void items(int64_t b, int64_t e) const {
    std::vector<float> qbuf;  // this thread's projected queries (unsplit items)
    std::vector<const float*> qp;
    for (int64_t item = b; item < e; ++item) {
      const int64_t s = item % n_split;
      const int64_t iq = item / n_split / nkv;
      const int ih = static_cast<int>(item / n_split % nkv);
      const Head& H = L.heads[static_cast<size_t>(ih)];
      if (qproj) {  // pointers only: the buffer was filled before the items
        project_queries(H, q_group(iq, ih), G, const_cast<float*>(qproj) + qproj_at[iq * nkv + ih], false, &qp);
      } else {
        qbuf.resize(static_cast<size_t>(qproj_floats(H, G)));
        project_queries(H, q_group(iq, ih), G, qbuf.data(), true, &qp);
      }
      float* slot = parts + item * part_stride;
      for (size_t si = 0; si < H.segs.size(); ++si) {
        const Segment& S = H.segs[si];
        const int aw = slot_width(*S.enc);
        float* acc = slot;
        float* m = acc + static_cast<int64_t>(G) * aw;
        float* l = m + G;
        slot = l + G;
        const auto [lo, hi] = visible_run(segment_positions(L, H, si), S.n(), q_pos[iq], p.sliding_window);
        const int64_t len = hi - lo;
        const int64_t t0 = lo + len * s / n_split, t1 = lo + len * (s + 1) / n_split;
        attend_rows(S.k, S.v, *S.enc, qp[si], G, p.scale, p.softcap, t0, t1, acc, m, l,
                    segment_positions(L, H, si));
      }
    }
  }

  // Pairs [b, e) of (query, head): merge each segment's splits, lift it once, merge the
  // segments, normalise into out.
  void finish(int64_t b, int64_t e) const {
    std::vector<float> merged, lifted;  // [G, aw] / [n_seg][G, dv] then m, l [n_seg][G]
    std::vector<const float*> accs;
    std::vector<float> ms, ls;
    for (int64_t pair = b; pair < e; ++pair) {
      const int64_t iq = pair / nkv;
      const int ih = static_cast<int>(pair % nkv);
      const Head& H = L.heads[static_cast<size_t>(ih)];
      const size_t n_seg = H.segs.size();
      lifted.resize(n_seg * static_cast<size_t>(G) * (dv + 2));
      float* lm = lifted.data() + n_seg * static_cast<size_t>(G) * dv;
      float* ll = lm + n_seg * static_cast<size_t>(G);
      int64_t off = 0;  // the segment's slot offset inside a part
      for (size_t si = 0; si < n_seg; ++si) {
        const int aw = slot_width(*H.segs[si].enc);
        merged.resize(static_cast<size_t>(G) * aw);
        accs.resize(static_cast<size_t>(n_split));
        ms.resize(static_cast<size_t>(n_split));
        ls.resize(static_cast<size_t>(n_split));
        for (int g = 0; g < G; ++g) {
          for (int64_t sp = 0; sp < n_split; ++sp) {
            const float* part = parts + (pair * n_split + sp) * part_stride + off;
            accs[static_cast<size_t>(sp)] = part + static_cast<int64_t>(g) * aw;
            ms[static_cast<size_t>(sp)] = part[static_cast<int64_t>(G) * aw + g];
            ls[static_cast<size_t>(sp)] = part[static_cast<int64_t>(G) * aw + G + g];
          }
          merge_softmax(static_cast<int>(n_split), accs.data(), ms.data(), ls.data(), aw,
                        merged.data() + static_cast<int64_t>(g) * aw, &lm[si * G + g], &ll[si * G + g]);
        }
        lift_slot(*H.segs[si].enc, merged.data(), G, lifted.data() + si * G * dv);
        off += static_cast<int64_t>(G) * (aw + 2);
      }
      accs.resize(n_seg);
      ms.resize(n_seg);
      ls.resize(n_seg);
      for (int g = 0; g < G; ++g) {
        float* o = out + (iq * p.n_head + static_cast<int64_t>(ih) * G + g) * dv;
        for (size_t si = 0; si < n_seg; ++si) {
          accs[si] = lifted.data() + (si * G + static_cast<size_t>(g)) * dv;
          ms[si] = lm[si * G + g];
          ls[si] = ll[si * G + g];
        }
        float m, l;
        merge_softmax(static_cast<int>(n_seg), accs.data(), ms.data(), ls.data(), dv, o, &m, &l);
        if (std::isinf(m)) continue;  // no visible key: zeros
        const float inv = 1.f / l;
        for (int i = 0; i < dv; ++i) o[i] *= inv;
      }
    }
  }
};

// Prefill tiles: at least this many queries in the call, about this many query rows per tile
// (a block of kBlock stored rows is then read once per tile rather than once per query; the
// scores of a tile, kTileRows x kBlock floats, stay in L2).
constexpr int64_t kTileMinQueries = 4;
constexpr int64_t kTileRows = 48;

// True when every segment of every head stores its keys and values densely (the tiles' kernel).
bool dense_layer(const Layer& L) {
  for (const Head& H : L.heads)
    for (const Segment& S : H.segs)
      if (S.k.sparse() || S.v.sparse()) return false;
  return true;
}

// Decode splits: when there are fewer (query, kv head) pairs than threads, each run is split
// in pieces of at least kMinSplit tokens. max_len: a plain head's longest visible run, else
// all its tokens.
int64_t split_count(const Layer& L, int64_t n_q, const int32_t* q_pos, int window, int nth) {
  const int64_t n_base = n_q * static_cast<int64_t>(L.heads.size());
  if (n_base >= 2 * nth) return 1;
  int64_t max_len = 0;
  for (size_t ih = 0; ih < L.heads.size(); ++ih) {
    const Head& H = L.heads[ih];
    if (!H.plain()) {
      max_len = std::max(max_len, H.n_tokens());
      continue;
    }
    const int32_t* pb = segment_positions(L, H, 0);
    for (int64_t iq = 0; iq < n_q; ++iq) {
      const auto [lo, hi] = visible_run(pb, H.segs[0].n(), q_pos[iq], window);
      max_len = std::max(max_len, hi - lo);
    }
    if (L.shared) break;  // every head has the same positions
  }
  return std::min((2 * nth + n_base - 1) / n_base, std::max<int64_t>(1, max_len / kMinSplit));
}

}  // namespace

void TokenCache::attend(int il, int64_t n_q, const float* q, const int32_t* q_pos,
                        const AttnParams& p, float* out, ThreadPool* pool) const {
  KVTRIM_CHECK(il >= 0 && il < cfg_.n_layer, "KV cache: layer %d out of range [0, %d)", il,
               cfg_.n_layer);
  KVTRIM_CHECK(p.n_head > 0 && p.n_head % cfg_.n_head_kv == 0,
               "attention: n_head %d is not a positive multiple of n_head_kv %d", p.n_head,
               cfg_.n_head_kv);
  if (n_q <= 0) return;
  const Layer& L = layers_[static_cast<size_t>(il)];
  const int nkv = cfg_.n_head_kv;
  AttendJob job{L, q, q_pos, p, out, nkv, cfg_.head_dim_k, cfg_.head_dim_v, p.n_head / nkv};
  const int G = job.G;
  const int64_t n_base = n_q * nkv;
  job.n_split = split_count(L, n_q, q_pos, p.sliding_window,
                            p.split_threads > 0 ? p.split_threads : pool ? pool->n_threads() : 1);
  for (const Head& H : L.heads) job.part_stride = std::max(job.part_stride, slots_floats(H, G));
  // (thread_local scratch is only touched here and through plain pointers inside the pool's
  // tasks: a thread_local named there would be the worker's own instance.)
  thread_local std::vector<float> qproj_buf, parts;
  thread_local std::vector<int64_t> qproj_off;
  if (job.n_split > 1) {  // split runs: each (query, head)'s projected queries once, here
    qproj_off.assign(static_cast<size_t>(n_base), 0);
    int64_t nf = 0;
    for (int64_t i = 0; i < n_base; ++i) {
      qproj_off[static_cast<size_t>(i)] = nf;
      nf += qproj_floats(L.heads[static_cast<size_t>(i % nkv)], G);
    }
    qproj_buf.resize(static_cast<size_t>(nf));
    std::vector<const float*> unused;
    for (int64_t i = 0; i < n_base; ++i)
      project_queries(L.heads[static_cast<size_t>(i % nkv)], job.q_group(i / nkv, static_cast<int>(i % nkv)), G,
                      qproj_buf.data() + qproj_off[static_cast<size_t>(i)], true, &unused);
    job.qproj = qproj_buf.data();
    job.qproj_at = qproj_off.data();
  }
  parts.resize(static_cast<size_t>(n_base * job.n_split * job.part_stride));
  job.parts = parts.data();
  const int nth = pool ? pool->n_threads() : 1;
  if (job.n_split == 1 && n_q >= kTileMinQueries && dense_layer(L)) {
    // prefill: tiles of about kTileRows query rows, halved while there are fewer than two
    // tiles per thread
    job.n_q = n_q;
    job.bq = std::max<int64_t>(1, kTileRows / G);
    while (job.bq > 1 && (n_q + job.bq - 1) / job.bq * nkv < 2 * nth) job.bq /= 2;
    const int64_t n_tiles = (n_q + job.bq - 1) / job.bq * nkv;
    if (nth > 1 && n_tiles > 1) {
      struct Claim {
        const AttendJob* job;
        int64_t n;
        std::atomic<int64_t> next{0};
      } claim{&job, n_tiles};
      Claim* cp = &claim;  // (one pointer: the std::function needs no allocation)
      pool->run([cp](int, int) { cp->job->tiles(0, cp->n, &cp->next); });
    } else {
      job.tiles(0, n_tiles);
    }
  } else {
    const int64_t n_items = n_base * job.n_split;
    for_range(pool, n_items, 1, [&](int64_t b, int64_t e) { job.items(b, e); });
  }
  // The merge is O(G · d · n_split) per (query, head): a decode step's few heads cost less than
  // the pool's round trip (one per layer and stream of a batched step), so they merge here.
  constexpr int64_t kPoolMinMerges = 64;
  for_range(n_base < kPoolMinMerges ? nullptr : pool, n_base, 1, [&](int64_t b, int64_t e) { job.finish(b, e); });
}

}  // namespace kvtrim::kv
