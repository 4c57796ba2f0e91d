// What a press decides, as data the cache applies (DESIGN.md §3): per (layer, KV head) a
// composition of per-axis specs. Validation (validate_head_plan) and composition of two
// presses' plans (compose_plans) live here, in one place; only the cache mutates storage.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "kv/kv_types.h"

namespace kvtrim {

// The channel stage of one side (keys or values), in the coordinates after the basis stage
// (width w = the basis rank, or the head dim without a basis).
//  - all channels: nothing set;
//  - per-head subset (ThinK): `subset` = kept coordinates, strictly increasing in [0, w);
//  - per-token (SPARK, SWAN): each re-encoded token keeps its own coordinates, listed row after
//    row in `token_channels` (each row strictly increasing in [0, w)), one row per kept token
//    in keep order (rows = keep.size(), or the head's token count with keep_all; rows of
//    tokens that are not re-encoded — anchors, tokens of earlier epochs — are validated and
//    ignored). Fixed count: topk = T (1..w) channels per row. Variable count (SPARK-p): topk
//    = 0 and token_counts [rows] (each 1..w) gives each row's length.
//    Keys, optional recovery (SPARK): recovery_scale r [w] and token_fill [rows] = sqrt(μ_t):
//    a pruned coordinate c of token t then reads sign(k_tc)·token_fill[t]·r[c] (the sign bit
//    of every pruned coordinate is stored); without them a pruned coordinate reads zero.
//    Keys, sampled recovery (SPARK's Gaussian / exponential F): recovery_dist kGaussian or
//    kExponential with recovery_scale r [w], token_fill [rows] = μ_t and (Gaussian) token_spread
//    [rows] = σ_t, both ≥ 0: a pruned coordinate c reads sign(k_tc)·m(w̃_tc)·r[c], where w̃_tc =
//    max(0, μ_t + σ_t·z) (z ~ N(0, 1)) or μ_t·e (e ~ Exp(1)) is drawn by a counter-based hash of
//    (recovery_seed, μ_t, σ_t, c) (kv/recovery.h: the same draw at every read, nothing stored per
//    coordinate) and m = sqrt when recovery_sqrt, else the identity.
//    Values, optional fill (SPARK's value pruning): token_fill [rows] without recovery_scale:
//    a pruned coordinate reads token_fill[t] (the token's mean pruned value).
//  - per-token by magnitude (SWAN): by_magnitude with topk = T (1..w) and nothing else: the cache
//    itself keeps each token's T coordinates of largest |c_j| (ties: the lower index), for the
//    tokens the plan re-encodes and for every token the epoch encodes later (appends, tokens
//    leaving the dense buffer); pruned coordinates read zero.
//  - per-token sparse codes (Lexico): sparse_code with topk = s (1..min(w, d)) and nothing else,
//    over a basis that is a dictionary (SideSpec::basis = D [d, N], N atoms of unit norm, N may
//    exceed d, no decoder): the cache codes each token it encodes by orthogonal matching pursuit
//    (kv/sparse_code.h), x ≈ Σ_j c_j D[:, j] over s atoms, and stores (c_j, j); the attention
//    reads the stored vector as D·c. Like by_magnitude, tokens appended later are coded too.
//  Per-token rows record their kept coordinates as a list or a bitmask (`index`, kv_types.h
//  IndexLayout; kAuto: whichever is smaller).
struct ChannelSpec {
  std::vector<int32_t> subset;
  int topk = 0;
  std::vector<int32_t> token_channels;
  std::vector<int32_t> token_counts;
  std::vector<float> recovery_scale;
  std::vector<float> token_fill;
  RecoveryDist recovery_dist = RecoveryDist::kFill;
  std::vector<float> token_spread;
  uint32_t recovery_seed = 0;
  bool recovery_sqrt = false;
  bool by_magnitude = false;
  bool sparse_code = false;
  IndexLayout index = IndexLayout::kAuto;  // per-token rows: kept-coordinate list or bitmask
  bool per_token() const {
    return topk != 0 || !token_channels.empty() || !token_counts.empty() || sparse_code;
  }
  bool set() const {
    return !subset.empty() || per_token() || !recovery_scale.empty() || !token_fill.empty() ||
           !token_spread.empty() || recovery_dist != RecoveryDist::kFill || by_magnitude || sparse_code;
  }
};

// One side's encoding of a new epoch: basis -> channels -> precision.
//  basis [d, rank] row-major (tokens are stored as coefficients c = basisᵀ x), orthonormal
//  columns (|UᵀU - I| <= 1e-4) unless an oblique decoder [d, rank] is given (KQ-SVD: the
//  attention then sees decoder·c; both must be finite). rank 0 with no matrix = identity.
//  With sparse-coded channels the basis is a dictionary: rank = N atoms (any N >= 1, more than d
//  allowed), columns of unit norm (| |D_j| - 1 | <= 1e-3), no decoder.
//  dtype: the precision of this epoch's stored elements (default: the cache's type for the side).
//  rope (keys only, with a basis and all channels): the basis describes the key before its
//  rotary embedding (Palu's latent): the cache undoes the RoPE of each token's key at the
//  token's position before projecting, c = basisᵀ R_pos⁻¹ k, and attention reads the key as
//  R_pos (basis·c), reconstructed per token (no projected query can see a per-position rotation).
struct SideSpec {
  int rank = 0;
  std::vector<float> basis;
  std::vector<float> decoder;
  std::optional<RopeSpec> rope;
  ChannelSpec channels;
  std::optional<KvDtype> dtype;
  bool has_basis() const { return rank != 0 || !basis.empty() || !decoder.empty(); }
  bool set() const { return has_basis() || channels.set() || dtype.has_value(); }
};

// What a press decided for one (layer, kv head):
//  token axis: `keep` lists indices into the head's stored tokens (0 .. n_tokens-1, in position
//    order, strictly increasing); every other token is dropped and its memory freed;
//    keep_all = true keeps every token.
//  key / value: the encoding of a new epoch (SideSpec). Any side set starts a new epoch of the
//    head: every kept token still stored dense (not in an earlier epoch) and not an anchor is
//    re-encoded, rounding once from its stored vector; tokens of earlier epochs keep their
//    encoding (or are re-expressed in the new basis when the head would otherwise hold more
//    than KvCacheConfig::max_live_bases bases, see kv_cache.h).
//  anchors: indices (keep's index space, strictly increasing, each kept and still dense) of
//    tokens that stay dense and exact (sinks, OjaKV's high-error tokens); only with an epoch.
//  appends_dense (only with an epoch): tokens appended after this plan stay dense until a later
//    plan re-encodes them (OjaKV's decode buffer); false = appended tokens are encoded with the
//    head's current epoch at once (compressed throughout). Epochs with channels always append
//    dense (a token's channels are chosen by a press). An epoch plan on an empty head only sets
//    its current encoding.
// A cache that cannot apply a field must throw, never ignore it.
struct HeadPlan {
  bool keep_all = true;
  std::vector<int32_t> keep;
  SideSpec key, value;
  std::vector<int32_t> anchors;
  bool appends_dense = false;
  int64_t buffer = 0;
  bool has_epoch() const { return key.set() || value.set(); }
  bool planned() const {
    return !keep_all || has_epoch() || !anchors.empty() || appends_dense || buffer != 0;
  }
};

// Per-token rows of `width` floats (a statistic aligned with a head's stored tokens) through
// the plan: the rows of the kept tokens, in order (all of them when keep_all).
std::vector<float> kept_rows(const std::vector<float>& rows, const HeadPlan& h, size_t width);

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

// What validation needs to know about the head a plan is for.
struct HeadShape {
  int il = 0, ih = 0;          // for messages
  int head_dim_k = 0, head_dim_v = 0;
  int64_t n_tokens = 0;        // tokens the head stores now
  // dense[t]: token t (position order) is stored dense (anchors must be); empty = all dense
  std::vector<char> dense;
};

// Throws Error naming (layer, kv head), the field and the value when the plan cannot be applied
// to a head of this shape; checks every field of every stage.
void validate_head_plan(const HeadPlan& hp, const HeadShape& shape);

// The plan of `second` (made on the cache as seen through `first`: its indices count first's
// kept tokens) applied after `first`, as one plan on the cache. Each axis combines separately:
// tokens compose (second's indices mapped through first's), anchors are mapped and kept where
// still kept, appends_dense is or-ed, and each side's stages come from the plan that sets them.
// Only real conflicts throw: both plans setting a basis, or channels, or different precisions on
// the same side, or one setting a basis and the other channels on the same side (the channels
// would be chosen in coordinates the other plan changes).
CompressionPlan compose_plans(const CompressionPlan& first, const CompressionPlan& second);

}  // namespace kvtrim
