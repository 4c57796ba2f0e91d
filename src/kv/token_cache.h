// The token cache (private to src/kv): the one KvCache implementation, uncompressed and
// compressed alike (DESIGN.md §3). Files:
//   token_cache.cpp  storage: append, truncate, reset, read_head, bytes, describe;
//   cache_apply.cpp  apply(plan): token selection, new epochs, re-expression of old bases;
//   attend.cpp       attention scheduling: work items, decode splits, the softmax merge;
//   segment_attend.cpp  one segment's scores and value sums per encoding (the kernels' callers).
//
// Storage per (layer, kv head): segments, each {encoding, key store, value store, positions}.
// segs[0] holds the dense rows (identity encoding in the cache's K / V types): every token
// while the head has no epoch, then its anchors and dense-buffered appends. Every later segment
// is one epoch (SegmentEncoding id >= 0), in creation order. Within a segment rows are sorted
// by position; segments interleave in position. A layer whose heads hold the same tokens (no
// plan has told them apart) stores positions once (Layer::pos); otherwise per segment.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kv/encoding.h"
#include "kv/kv_cache.h"
#include "kv/side_store.h"

namespace kvtrim::kv {

constexpr int64_t kGrowTokens = 256;            // minimum capacity step (tokens)
constexpr int64_t kBlock = 256;                 // tokens per score block inside a work item
constexpr int64_t kMinSplit = 512;              // a decode split covers at least this many tokens
constexpr size_t kTrimBytes = size_t{8} << 20;  // malloc_trim after an apply frees this much

struct Segment {
  std::shared_ptr<const SegmentEncoding> enc;
  SideStore k, v;
  std::vector<int32_t> pos;  // [n] original positions, increasing (unshared layers only)
  int64_t n() const { return k.n(); }
};

struct Head {
  std::vector<Segment> segs;                   // [0] dense rows, then epochs
  std::shared_ptr<const SegmentEncoding> cur;  // the head's current epoch (null: none)
  int64_t buffered = 0;  // the last `buffered` dense rows form the current epoch's dense buffer
  int64_t n_tokens() const {
    int64_t n = 0;
    for (const Segment& s : segs) n += s.n();
    return n;
  }
  bool plain() const { return !cur && segs.size() == 1; }  // every token dense
};

struct Layer {
  bool shared = true;        // all heads hold the same tokens: positions stored once, here
  std::vector<int32_t> pos;  // [n] shared positions (shared layers only)
  std::vector<Head> heads;   // [n_head_kv]
};

// Positions of segment si of head H in layer L (shared layers: the layer's).
inline const int32_t* segment_positions(const Layer& L, const Head& H, size_t si) {
  return L.shared ? L.pos.data() : H.segs[si].pos.data();
}

class TokenCache final : public KvCache {
 public:
  explicit TokenCache(KvCacheConfig cfg);

  void append(int il, int64_t n, const float* k, const float* v, const int32_t* pos,
              ThreadPool* pool = nullptr) override;
  void attend(int il, int64_t n_q, const float* q, const int32_t* q_pos, const AttnParams& p,
              float* out, ThreadPool* pool) const override;
  int64_t n_tokens(int il, int ih) const override;
  void apply(const CompressionPlan& plan) override;
  void read_head(int il, int ih, std::vector<float>* k, std::vector<float>* v,
                 std::vector<int32_t>* pos) const override;
  void read_head_rows(int il, int ih, const std::vector<int32_t>& rows, std::vector<float>* k,
                      std::vector<float>* v) const override;
  KvBytes bytes() const override;
  void truncate(int32_t pos) override;
  std::string describe() const override;
  std::unique_ptr<KvCache> clone() const override { return std::make_unique<TokenCache>(*this); }
  HeadLayout head_layout(int il, int ih) const override;
  RawRows raw_values(int il, int ih) const override;
  void reset() override;

 private:
  // The head's tokens in position order: (segment, row).
  std::vector<std::pair<int, int64_t>> order(const Layer& L, const Head& H) const;
  int32_t last_pos(const Layer& L, const Head& H) const;
  // Token (segment si, row j) at position pos reconstructed: kt [head_dim_k], vt [head_dim_v]
  // (may be null).
  void read_row(const Head& H, size_t si, int64_t j, int32_t pos, float* kt, float* vt) const;
  Segment new_segment(std::shared_ptr<const SegmentEncoding> enc) const;
  void reserve(Segment& S, int64_t rows, int64_t entries_k, int64_t entries_v) const;
  // apply() for one head (cache_apply.cpp).
  void apply_head(Layer& L, Head& H, const HeadPlan& hp);
  std::shared_ptr<const SegmentEncoding> make_encoding(const HeadPlan& hp);
  void bound_live_bases(Head& H) const;
  // The segment of H holding its current epoch's tokens (created when missing).
  Segment& current_segment(Head& H) const;
  // Encodes n tokens at positions pos [n] (head coordinates, rows ldk / ldv apart) with segment
  // S's encoding and appends them to S (S.pos: the caller's).
  void encode_into(Segment& S, int64_t n, const float* k, int64_t ldk, const float* v,
                   int64_t ldv, const int32_t* pos) const;
  // Moves the oldest dense-buffer rows into the current epoch until `keep` remain.
  void spill_buffer(Head& H, int64_t keep) const;
  HeadShape shape_of(const Layer& L, int il, int ih) const;

  std::shared_ptr<const SegmentEncoding> dense_enc_;  // identity, the cache's K / V types
  int32_t next_epoch_ = 0;
  std::vector<Layer> layers_;
};

}  // namespace kvtrim::kv
