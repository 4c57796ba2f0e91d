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

// Precision of stored K and V (the precision axis). kQ8: int8 with one f32 scale per
// (token, kv head) vector (symmetric, round-to-nearest).
enum class KvDtype { kF32, kF16, kBF16, kQ8 };
const char* kv_dtype_name(KvDtype t);

struct KvCacheConfig {
  int n_layer = 0;
  int n_head_kv = 0;
  int head_dim_k = 0;  // key head size
  int head_dim_v = 0;  // value head size
  int64_t n_ctx = 0;   // maximum number of positions (the context limit)
  KvDtype dtype = KvDtype::kF16;
  std::vector<int>
      sliding_window;  // per layer: 0 = global attention, w > 0 = only the last w positions matter
};

// Bytes held, by part: keys / values (the stored elements: full vectors, or basis
// coefficients), positions (int32 original positions), scales (q8: one f32 per stored key
// vector and one per value vector), bases (f32 basis matrices, encoders and decoders, each
// stored basis counted once per head that holds it), indices (channel indices of the channel
// axis: per-head subsets as uint16, one per kept
// key channel of each stored channel epoch, counted once; per-token subsets: one uint8 per kept
// channel of each stored token, uint16 when head_dim_k > 256), bitmasks (per-token subsets with
// recovery: the sign bits of each token's pruned channels, ceil((head_dim_k - T) / 8) bytes per
// token), other (int32 epoch ids, one per stored basis/channel-epoch segment). Per-token
// recovery also counts under scales: one f32 fill per stored token and the f32 recovery scale
// vector [head_dim_k] of each stored epoch, once.
// total() = keys + values + positions + scales + bases + indices + bitmasks + other;
// per_layer: [n_layer], the same total split by layer.
struct KvBytes {
  size_t keys = 0, values = 0, positions = 0, scales = 0, bases = 0, indices = 0, bitmasks = 0,
         other = 0;
  std::vector<size_t> per_layer;
  size_t total() const {
    return keys + values + positions + scales + bases + indices + bitmasks + other;
  }
};

// What a press decided for one (layer, kv head). Token axis: `keep` lists indices into the
// head's stored tokens (0 .. n_tokens(il, ih)-1, strictly increasing) to keep; every other
// token is dropped and its memory freed. keep_all = true keeps every token.
//
// Basis axis (optional): basis_k [head_dim_k, rank_k] row-major with orthonormal columns
// (UᵀU = I within 1e-4), basis_v [head_dim_v, rank_v] likewise; rank 0 with an empty matrix =
// no basis for that side (identity, full dims). Giving either starts a new basis epoch of the
// head: every kept token that is still stored full-rank and is not an anchor is re-encoded as
// coefficients k̃ = U_kᵀ k, ṽ = U_vᵀ v (in the cache dtype); tokens already stored in an
// earlier epoch keep the basis they were encoded with; tokens appended later are encoded with
// this (the head's current) basis. anchors: indices (same index space as keep, strictly
// increasing, each one kept and still full-rank) of tokens that stay dense and exact; only
// with a basis (or key channels). A cache that cannot apply a field must throw, never ignore it.
//
// Channel axis, keys (optional; ThinK): key_channels = the key channels (indices into
// 0 .. head_dim_k-1, strictly increasing, non-empty) kept for the head, in the head's own
// coordinates; not combinable with a basis (basis_k / basis_v must be empty). Like a basis it
// starts a new epoch of the head: every kept token still stored dense and not an anchor keeps
// only those channels (the others are dropped: they contribute zero to q·k, ThinK's
// definition); tokens of earlier epochs keep theirs; tokens appended later are stored dense
// (all channels) until the next plan with key_channels.
//
// Channel axis, keys, per token (SPARK / SWAN; optional): key_topk = T (1 <= T <= head_dim_k)
// channels kept per token, listed in key_token_channels [n_rows][T] (each row strictly
// increasing in [0, head_dim_k)), one row per kept token in keep order (n_rows = keep.size(),
// or the head's token count with keep_all); rows of tokens that are not re-encoded (anchors,
// tokens of earlier epochs) are validated and ignored. Starts an epoch like key_channels (the
// same rules: no basis, no key_channels; tokens appended later stay dense). Recovery
// (optional, SPARK): key_recovery_scale r [head_dim_k] and key_token_fill [n_rows] = sqrt(μ_t);
// a pruned channel c of token t then contributes q_c · sign(k_tc) · key_token_fill[t] · r[c]
// (the sign bit is taken from the stored key); without them a pruned channel contributes zero
// (the ablation). Both are given or neither.
//
// Oblique bases (KQ-SVD; optional): decoder_k [head_dim_k, rank_k] (row-major, the basis_k's
// shape; only with basis_k) makes scores (q·D_k)·k̃ while tokens are still encoded
// k̃ = E_kᵀ k (E_k = basis_k), i.e. the key attention sees is D_k E_kᵀ k; decoder_v
// [head_dim_v, rank_v] (only with basis_v) makes outputs (Σ a ṽ)·D_vᵀ, i.e. the value is
// D_v E_vᵀ v. read_head reconstructs D·c. Empty = the basis itself (D = E). With a decoder the
// side's basis need not be orthonormal; both matrices must be finite. Decoders belong to the
// epoch: tokens of an epoch are always decoded with that epoch's decoder.
// appends_dense (only with a basis or key channels): tokens appended after this plan stay dense
// (full rank, exact, epoch -1 in head_layout) until a later plan with a basis re-encodes them into
// its new epoch (OjaKV's decode buffer and recent window); tokens already in an epoch keep it.
// false = appended tokens are encoded with the head's current basis at once (compressed
// throughout). Channel epochs always append dense. A basis plan on a head that holds no tokens
// yet (before prefill) is valid: it only sets the head's current basis, so with appends_dense
// false every token appended later is encoded before any attention reads it.
struct HeadPlan {
  bool keep_all = true;
  std::vector<int32_t> keep;
  int rank_k = 0, rank_v = 0;
  std::vector<float> basis_k, basis_v;
  std::vector<float> decoder_k, decoder_v;
  bool appends_dense = false;
  std::vector<int32_t> anchors;
  std::vector<int32_t> key_channels;
  int key_topk = 0;
  std::vector<int32_t> key_token_channels;
  std::vector<float> key_recovery_scale, key_token_fill;
  bool has_basis() const {
    return rank_k != 0 || rank_v != 0 || !basis_k.empty() || !basis_v.empty() ||
           !decoder_k.empty() || !decoder_v.empty();
  }
  bool has_channels() const {
    return !key_channels.empty() || key_topk != 0 || !key_token_channels.empty() ||
           !key_recovery_scale.empty() || !key_token_fill.empty();
  }
  bool planned() const {
    return !keep_all || has_basis() || has_channels() || !anchors.empty();
  }
};

// A plan for the whole cache: one HeadPlan per (layer, kv head).
struct CompressionPlan {
  int n_layer = 0;
  int n_head_kv = 0;
  std::vector<HeadPlan> heads;  // [n_layer * n_head_kv], index il * n_head_kv + ih
  CompressionPlan() = default;
  CompressionPlan(int n_layer_, int n_head_kv_)
      : n_layer(n_layer_),
        n_head_kv(n_head_kv_),
        heads(static_cast<size_t>(n_layer_ * n_head_kv_)) {}
  HeadPlan& at(int il, int ih) { return heads[static_cast<size_t>(il * n_head_kv + ih)]; }
  const HeadPlan& at(int il, int ih) const {
    return heads[static_cast<size_t>(il * n_head_kv + ih)];
  }
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

// The token cache (src/kv/token_cache.cpp): per (layer, kv head) K [n_tok, head_dim_k] and
// V [n_tok, head_dim_v] arrays in cfg.dtype (f32, f16, bf16 or q8), grown in chunks, with
// per-head token counts and original positions. It starts uncompressed and applies token
// plans (apply) in place, releasing the dropped tokens' memory; attention reads the kept
// tokens directly. One implementation serves both, so the uncompressed path is the same code.
std::unique_ptr<KvCache> make_kv_cache(const KvCacheConfig& cfg);
// The uncompressed cache: the same token cache (kept so existing callers read naturally).
std::unique_ptr<KvCache> make_dense_cache(const KvCacheConfig& cfg);

}  // namespace kvtrim
