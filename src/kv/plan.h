// What a press decides, as data the cache applies (DESIGN.md §3): per (layer, KV head) a
// composition of per-axis specs. Validation (validate_head_plan) and composition of two
// presses' plans (compose_plans) live here, in one place; only the cache mutates storage.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "kv/channel_stage.h"
#include "kv/kv_types.h"

namespace kvtrim {

// One side's encoding of a new epoch: basis -> channels -> precision.
//  basis [d, rank] row-major (tokens are stored as coefficients c = basisᵀ x), orthonormal
//  columns (|UᵀU - I| <= 1e-4) unless an oblique decoder [d, rank] is given (KQ-SVD: the
//  attention then sees decoder·c; both must be finite). rank 0 with no matrix = identity.
//  With sparse-coded channels the basis is a dictionary: rank = N atoms (any N >= 1, more than d
//  allowed), columns of unit norm (| |D_j| - 1 | <= 1e-3), no decoder.
//  channels: the channel stage (channel_stage.h); rows: the per-token data of a TokenChannels
//  stage (its kept coordinates, counts, fills), empty otherwise.
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
  ChannelStage channels;
  TokenRows rows;
  std::optional<KvDtype> dtype;
  bool has_basis() const { return rank != 0 || !basis.empty() || !decoder.empty(); }
  bool channels_set() const { return !channels.all() || !rows.empty(); }
  bool set() const { return has_basis() || channels_set() || dtype.has_value(); }
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
