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
#include <optional>
#include <string>
#include <vector>

#include "kv/kv_types.h"
#include "kv/plan.h"

namespace kvtrim {

class ThreadPool;

struct KvCacheConfig {
  int n_layer = 0;
  int n_head_kv = 0;
  int head_dim_k = 0;  // key head size
  int head_dim_v = 0;  // value head size
  int64_t n_ctx = 0;   // maximum number of positions (the context limit)
  KvDtype dtype = KvDtype::kF16;          // precision of stored K and V (both sides) ...
  std::optional<KvDtype> dtype_k, dtype_v;  // ... unless a side sets its own (-ctk / -ctv)
  std::vector<int>
      sliding_window;  // per layer: 0 = global attention, w > 0 = only the last w positions matter
  // A head holds at most this many distinct bases (each epoch's, the current one included): an
  // epoch that would exceed it re-expresses the tokens of every older basis epoch in the newest
  // basis, c' = E_newᵀ D_old c (exact when the spans agree; otherwise the part outside the new
  // span is lost, as when those tokens had been encoded in it). Periodic basis updates (OjaKV)
  // then never hold more than a few bases per head. 0 = no bound.
  int max_live_bases = 2;
  // Quantized dense rows (q8 / q4 on a side whose head dim is a power of two) are stored
  // in a fixed orthonormal rotation, the normalised Hadamard matrix H/sqrt(d): it spreads
  // outlier channels over the whole vector before quantisation (QuaRot; llama.cpp rotates its
  // quantized KV cache the same way). Scores are unchanged in exact arithmetic (q·H)·(Hᵀk);
  // the query is rotated once per segment and the value sum once per query. One matrix per
  // head dim, stored once (bytes().bases).
  bool rotate_quantized = false;
  KvDtype type_k() const { return dtype_k.value_or(dtype); }
  KvDtype type_v() const { return dtype_v.value_or(dtype); }
  // Bytes one uncompressed token takes in every layer and KV head at the configured precisions
  // (keys, values, their scales, its position): what a cache grows by per token before any
  // press removes anything. n_ctx times this bounds a run's cache (Session's memory check).
  size_t dense_bytes_per_token() const;
};

// Bytes held, by part (docs/kv-cache.md has the layout of each):
//  keys / values: the stored elements (full vectors, basis coefficients, kept channels; q4 half
//    a byte each);
//  positions: int32 original positions (once per layer while its heads agree, else per token);
//  scales: q8 / fp8 one f32 per stored vector (per-token channel rows: per row), q4 one f16 per
//    block of 32 (per-token rows: one f32 per row); the f32 recovery scale vector of each held
//    epoch, once;
//  bases: f32 basis matrices (encoders and decoders), each counted once in the cache however
//    many heads, epochs or clones hold it (attributed to the first layer holding it);
//  indices: per-head channel subsets (uint16 per kept channel of each held epoch, once);
//    per-token channels (uint8 per kept entry, uint16 when the width > 256, or in the bitmask
//    layout ceil(w / 8) bytes per row; a variable count adds uint32 row offsets, n + 1 per
//    segment side);
//  bitmasks: per-token recovery sign bits, one per coordinate (ceil(w / 8) bytes per token);
//  fills: per-token channel rows' fill parameters, f32: a key recovery fill sqrt(μ_t) (or μ_t
//    and, Gaussian, σ_t for a sampled recovery) or a value fill, per token;
//  other: int32 epoch ids, one per stored epoch segment.
// total() = keys + values + positions + scales + bases + indices + bitmasks + fills + other;
// per_layer: [n_layer], the same total split by layer.
struct KvBytes {
  size_t keys = 0, values = 0, positions = 0, scales = 0, bases = 0, indices = 0, bitmasks = 0,
         fills = 0, other = 0;
  std::vector<size_t> per_layer;
  // [n_layer * n_head_kv]: the bytes of each (layer, kv head)'s own rows (elements, scales,
  // indices, bitmasks, fills, per-head positions); positions shared by a layer's heads, bases
  // and epoch metadata count in per_layer only. For pictures of where the bytes are.
  std::vector<size_t> per_head;
  // The matrices `bases` counts, by identity, with their bytes: interned (kv/encoding.h), so
  // every cache of a process that uses one holds the same copy. Several caches together hold
  // each distinct matrix once (held_once below).
  std::vector<std::pair<const void*, size_t>> basis_ids;
  size_t total() const {
    return keys + values + positions + scales + bases + indices + bitmasks + fills + other;
  }
};

// Bytes held by several caches together (a server's slots): their totals with each shared basis
// matrix counted once, however many of them hold it; bases_once (optional): of those, the bases.
size_t held_once(const std::vector<KvBytes>& caches, size_t* bases_once = nullptr);

struct AttnParams {
  int n_head = 0;          // query heads (a multiple of n_head_kv: GQA groups)
  float scale = 0;         // multiplies q·k
  int sliding_window = 0;  // 0 = none; else key visible iff q_pos - k_pos < window
  float softcap = 0;       // 0 = none; else s = softcap * tanh(s / softcap)
  // Threads the decode splits are sized for (0 = the pool's). A batched decode step attends its
  // sequences in one pool job, each on one thread, sized as on the whole pool: the same pieces
  // and merge order, so the same result bit for bit as when the sequence runs alone.
  int split_threads = 0;
};

class KvCache {
 public:
  virtual ~KvCache() = default;

  const KvCacheConfig& config() const { return cfg_; }

  // Appends n tokens to layer il. k: [n, n_head_kv, head_dim_k] (RoPE applied),
  // v: [n, n_head_kv, head_dim_v], pos: [n] strictly increasing, > every stored position.
  // pool (may be nullptr): the kv heads may be stored in parallel on it where storing a token
  // costs real work (a sparse code per token leaving a dense buffer: Lexico); the cache is the
  // same either way.
  virtual void append(int il, int64_t n, const float* k, const float* v, const int32_t* pos,
                      ThreadPool* pool = nullptr) = 0;

  // out[n_q, n_head, head_dim_v] = softmax(scale · q kᵀ) v over the stored tokens of layer il
  // visible to each query: causal (k_pos <= q_pos) and within the sliding window.
  // q: [n_q, n_head, head_dim_k], q_pos: [n_q].
  virtual void attend(int il, int64_t n_q, const float* q, const int32_t* q_pos,
                      const AttnParams& p, float* out, ThreadPool* pool) const = 0;

  virtual int64_t n_tokens(int il, int ih) const = 0;  // tokens stored for (layer, kv head)

  // Applies a press's plan (only the cache mutates storage). Throws Error if the plan does not
  // match the cache's shape or an index is out of range / not increasing (the cache is then
  // unchanged). Memory of dropped tokens is released (bytes() and the process's memory shrink
  // accordingly). Kept keys stay as stored (RoPE'd at their original positions); n_past()
  // does not change.
  virtual void apply(const CompressionPlan& plan) = 0;

  // f32 copies of one head's stored tokens (in position order; tokens stored in a basis are
  // reconstructed with the basis of their epoch, U·k̃, or its decoder, D·k̃, when oblique), for
  // scoring: k [n_tok, head_dim_k] (RoPE applied),
  // v [n_tok, head_dim_v], pos [n_tok] (any pointer may be nullptr when not needed). Costs one
  // head's worth of memory: scoring never doubles the cache.
  virtual void read_head(int il, int ih, std::vector<float>* k, std::vector<float>* v,
                         std::vector<int32_t>* pos) const = 0;
  // read_head for selected tokens only: rows = indices into the head's tokens in position order
  // (as read_head numbers them), strictly increasing and in [0, n_tokens(il, ih)), else Error.
  // k [rows.size(), head_dim_k], v [rows.size(), head_dim_v] (either may be nullptr), the same
  // values read_head gives for those rows; only these rows are reconstructed (OjaKV's periodic
  // updates read the few dense tokens of a long head).
  virtual void read_head_rows(int il, int ih, const std::vector<int32_t>& rows,
                              std::vector<float>* k, std::vector<float>* v) const = 0;
  // How one head's tokens are stored (presses that build on earlier plans, e.g. OjaKV's
  // periodic updates): per stored token in position order, the epoch it is encoded in
  // (-1 = dense / full rank, else the id of its basis or channel epoch); the head's current
  // basis (the one new tokens are encoded with or will be, with appends_dense) as encoders,
  // plus its decoders when oblique. Bytes of the decoders count under KvBytes::bases.
  struct HeadLayout {
    std::vector<int32_t> epoch;        // [n_tokens(il, ih)]
    int32_t current_epoch = -1;        // -1: no basis
    bool appends_dense = false;        // the current epoch's appends_dense
    int rank_k = 0, rank_v = 0;        // current basis ranks (0: that side is full)
    std::vector<float> basis_k, basis_v;  // current encoders [d, r] (empty: none)
    std::vector<float> decoder_k, decoder_v;  // current decoders [d, r] (empty: the encoder)
  };
  virtual HeadLayout head_layout(int il, int ih) const = 0;
  // A head's values as they lie in memory, for zero-copy views (the Python module): when every
  // token of (il, ih) is stored dense and row-major (no epoch, values in f32 / f16 / bf16),
  // data [n, dim] with rows row_bytes apart and pos [n] (int32); else has() is false (keys are
  // always stored in tiles for the attention kernels, compressed epochs in their encodings:
  // read_head decodes those). Valid until the cache next changes.
  struct RawRows {
    const void* data = nullptr;
    const int32_t* pos = nullptr;
    int64_t n = 0;
    int dim = 0;
    size_t row_bytes = 0;
    KvDtype dtype = KvDtype::kF16;
    bool has() const { return data != nullptr || (n == 0 && pos != nullptr); }
  };
  virtual RawRows raw_values(int il, int ih) const { return {}; }

  virtual KvBytes bytes() const = 0;
  // Bytes the same tokens would take uncompressed (f16 K and V for all n_past() positions).
  size_t dense_bytes_f16() const;

  int32_t n_past() const { return n_past_; }
  // Called by the engine after a forward step has appended positions up to pos_end (exclusive).
  void advance(int32_t pos_end) {
    if (pos_end > n_past_) n_past_ = pos_end;
  }
  // Drops every token with position >= pos in every (layer, kv head) and sets n_past() to pos.
  virtual void truncate(int32_t pos) = 0;
  // Drops every token; each head keeps its current basis / channel epoch, so later appends are
  // still encoded with it (the compressed-throughout mode of a plan made on an empty cache).
  void clear() { truncate(0); }
  // Drops every token AND every head's basis / channel epoch: the cache as make_kv_cache made
  // it, for a new, unrelated context (allocations may be kept).
  virtual void reset() = 0;

  virtual std::string describe() const = 0;

  // A deep copy: same tokens, bases (immutable, shared), positions, n_past(). Lets one
  // prefill be compressed several ways (eval sweeps) without running the model again.
  virtual std::unique_ptr<KvCache> clone() const = 0;

 protected:
  explicit KvCache(KvCacheConfig cfg) : cfg_(std::move(cfg)) {}
  KvCacheConfig cfg_;
  int32_t n_past_ = 0;
};

// The token cache (src/kv/token_cache.h): per (layer, kv head) segments of tokens, each with
// its own key and value encoding (basis -> channels -> precision); dense rows in the cache's
// K / V types until a plan starts an epoch. It starts uncompressed and applies plans in place,
// releasing the dropped tokens' memory; attention reads every encoding directly. One
// implementation serves both, so the uncompressed path is the same code.
std::unique_ptr<KvCache> make_kv_cache(const KvCacheConfig& cfg);
// The uncompressed cache: the same token cache (kept so existing callers read naturally).
std::unique_ptr<KvCache> make_dense_cache(const KvCacheConfig& cfg);

}  // namespace kvtrim
