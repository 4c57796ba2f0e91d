// The KV cache interface (DESIGN.md §3). The model's forward pass appends each layer's new
// keys (post-RoPE) and values, then asks the cache to attend: the cache owns both storage
// and the attention over its layout, so compressed layouts (token eviction, low-rank,
// channel-sparse, low precision) are read directly without rebuilding a dense copy.
//
// Invariants:
//  - storage is per layer and per KV head; each stored token keeps its original position;
//  - n_past() is the uncompressed length (the position the next token gets), which is
//    what generation continues from even after tokens were dropped;
//  - bytes() is exact: it counts the bytes actually held for the stored tokens, by part.
// Only the cache mutates its storage (a press will plan; the cache applies the plan).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvtrim {

class ThreadPool;

enum class KvDtype { kF32, kF16 };  // precision of stored K/V (more formats with the cache issue)
const char* kv_dtype_name(KvDtype t);

struct KvCacheConfig {
  int n_layer = 0;
  int n_head_kv = 0;
  int head_dim_k = 0;     // key head size
  int head_dim_v = 0;     // value head size
  int64_t n_ctx = 0;      // maximum number of positions (the context limit)
  KvDtype dtype = KvDtype::kF16;
  std::vector<int> sliding_window;  // per layer: 0 = global attention, w > 0 = only the last w positions matter
};

// Bytes held, by part. total() = keys + values + positions + other.
struct KvBytes {
  size_t keys = 0, values = 0, positions = 0, other = 0;
  std::vector<size_t> per_layer;
  size_t total() const { return keys + values + positions + other; }
};

struct AttnParams {
  int n_head = 0;          // query heads (a multiple of n_head_kv: GQA groups)
  float scale = 0;         // multiplies q·k
  int sliding_window = 0;  // 0 = none; else key visible iff q_pos - k_pos < window
  float softcap = 0;       // 0 = none; else s = softcap * tanh(s / softcap)
};

class KvCache {
 public:
  virtual ~KvCache() = default;

  const KvCacheConfig& config() const { return cfg_; }

  // Appends n tokens to layer il. k: [n, n_head_kv, head_dim_k] (RoPE applied),
  // v: [n, n_head_kv, head_dim_v], pos: [n] strictly increasing, > every stored position.
  virtual void append(int il, int64_t n, const float* k, const float* v, const int32_t* pos) = 0;

  // out[n_q, n_head, head_dim_v] = softmax(scale · q kᵀ) v over the stored tokens of layer il
  // visible to each query: causal (k_pos <= q_pos) and within the sliding window.
  // q: [n_q, n_head, head_dim_k], q_pos: [n_q].
  virtual void attend(int il, int64_t n_q, const float* q, const int32_t* q_pos,
                      const AttnParams& p, float* out, ThreadPool* pool) const = 0;

  virtual int64_t n_tokens(int il, int ih) const = 0;  // tokens stored for (layer, kv head)
  virtual KvBytes bytes() const = 0;
  // Bytes the same tokens would take uncompressed (f16 K and V for all n_past() positions).
  size_t dense_bytes_f16() const;

  int32_t n_past() const { return n_past_; }
  // Called by the engine after a forward step has appended positions up to pos_end (exclusive).
  void advance(int32_t pos_end) { if (pos_end > n_past_) n_past_ = pos_end; }
  // Drops every token with position >= pos in every layer and sets n_past() to pos.
  virtual void truncate(int32_t pos) = 0;
  void clear() { truncate(0); }

  virtual std::string describe() const = 0;

 protected:
  explicit KvCache(KvCacheConfig cfg) : cfg_(std::move(cfg)) {}
  KvCacheConfig cfg_;
  int32_t n_past_ = 0;
};

// The uncompressed cache: per (layer, kv head) contiguous K [n_tok, head_dim_k] and
// V [n_tok, head_dim_v] arrays in cfg.dtype, grown in chunks.
std::unique_ptr<KvCache> make_dense_cache(const KvCacheConfig& cfg);

}  // namespace kvtrim
