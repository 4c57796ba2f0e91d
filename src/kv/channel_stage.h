// The channel stage of one side (keys or values) of an encoding (DESIGN.md §3): which
// coordinates of a token are stored, after the basis stage (width w = the basis rank, or the
// head dim without a basis). One type for what a press's plan says (plan.h SideSpec::channels)
// and what a cache segment stores (encoding.h SideEncoding::channels); equality is defaulted.
//
// Adding a kind touches three files: here, its struct (with the members every kind has:
// kPerToken, kSelfEncoding, kName, and topk / index when per token) and its place in
// ChannelKind; plan.cpp, its validation (check_channels); cache_apply.cpp, how the cache
// encodes a token with it (push_side / push_rows, resolve_index). The store, the attention and
// the byte accounting read the kinds through ChannelStage's accessors only.
#pragma once
#include <concepts>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <variant>
#include <vector>

#include "kv/kv_types.h"

namespace kvtrim {

// Keys, per-token channels chosen by a press: what a pruned coordinate reads (SPARK).
//  kFill: coordinate c of token t reads sign(k_tc)·fill_t·r[c] (fill_t = sqrt(μ_t), one float
//    per token, TokenRows::fill; the sign bit of every pruned coordinate is stored);
//  kGaussian / kExponential: sign(k_tc)·m(w̃_tc)·r[c], w̃_tc = max(0, μ_t + σ_t·z) (z ~ N(0, 1))
//    or μ_t·e (e ~ Exp(1)), drawn by a counter-based hash of (seed, μ_t, σ_t, c) (kv/recovery.h:
//    the same draw at every read, nothing stored per coordinate), μ_t = TokenRows::fill,
//    σ_t = TokenRows::spread (Gaussian), m = sqrt when `sqrt`, else the identity.
struct KeyRecovery {
  std::vector<float> scale;  // r [w]
  RecoveryDist dist = RecoveryDist::kFill;
  uint32_t seed = 0;
  bool sqrt = false;
  bool operator==(const KeyRecovery&) const = default;
};

// Every coordinate is stored.
struct AllChannels {
  static constexpr bool kPerToken = false, kSelfEncoding = true;
  static constexpr const char* kName = "all";
  bool operator==(const AllChannels&) const = default;
};

// One subset of coordinates for every token of the head (ThinK).
struct ChannelSubset {
  static constexpr bool kPerToken = false, kSelfEncoding = false;
  static constexpr const char* kName = "per-head subset";
  std::vector<uint16_t> channels;  // kept coordinates, strictly increasing in [0, w)
  bool operator==(const ChannelSubset&) const = default;
};

// Each token keeps its own coordinates, chosen by a press (SPARK): the plan lists them
// (TokenRows::channels, a row per kept token). Fixed count: topk = T (1..w) per row; variable
// count (SPARK-p): topk = 0 and TokenRows::counts gives each row's length. Without a recovery
// (keys) or a fill (values) a pruned coordinate reads zero.
struct TokenChannels {
  static constexpr bool kPerToken = true, kSelfEncoding = false;
  static constexpr const char* kName = "per token";
  int topk = 0;
  std::optional<KeyRecovery> recovery = std::nullopt;  // keys only
  // values only: a pruned coordinate of token t reads TokenRows::fill[t] (its mean pruned value)
  bool fill = false;
  IndexLayout index = IndexLayout::kAuto;  // the cache's: kList or kBitmask
  bool operator==(const TokenChannels&) const = default;
};

// Each token keeps its topk = T (1..w) coordinates of largest |c_j| (ties: the lower index),
// chosen by the cache for every token it encodes (SWAN); pruned coordinates read zero.
struct MagnitudeChannels {
  static constexpr bool kPerToken = true, kSelfEncoding = true;
  static constexpr const char* kName = "by magnitude";
  int topk = 0;
  IndexLayout index = IndexLayout::kAuto;  // the cache's: kList or kBitmask
  bool operator==(const MagnitudeChannels&) const = default;
};

// Each token is coded by orthogonal matching pursuit over the side's basis, a dictionary
// (SideSpec::basis = D [d, N], N atoms of unit norm, N may exceed d, no decoder): x ≈ Σ_j c_j
// D[:, j] over topk = s (1..min(w, d)) atoms, stored as (c_j, j) in a list (kv/sparse_code.h);
// chosen by the cache for every token it encodes (Lexico).
struct SparseCodeChannels {
  static constexpr bool kPerToken = true, kSelfEncoding = true;
  static constexpr const char* kName = "by sparse coding";
  int topk = 0;
  static constexpr IndexLayout index = IndexLayout::kList;
  bool operator==(const SparseCodeChannels&) const = default;
};

using ChannelKind =
    std::variant<AllChannels, ChannelSubset, TokenChannels, MagnitudeChannels, SparseCodeChannels>;

// A side's channel stage: one kind (default: all channels), read through the accessors below
// (what the store, the attention and the byte accounting need, whatever the kind).
struct ChannelStage {
  ChannelKind kind;
  ChannelStage() = default;
  template <class K>
  requires std::constructible_from<ChannelKind, K> ChannelStage(K k)
      : kind(std::move(k)) {}  // NOLINT: a kind is a stage
  bool operator==(const ChannelStage&) const = default;

  template <class K>
  const K* get() const {
    return std::get_if<K>(&kind);
  }
  template <class K>
  K* get() {
    return std::get_if<K>(&kind);
  }
  bool all() const { return std::holds_alternative<AllChannels>(kind); }
  // The kind, for messages ("per-head subset", "by magnitude", ...).
  const char* name() const {
    return std::visit([](const auto& k) { return k.kName; }, kind);
  }
  const ChannelSubset* subset() const { return get<ChannelSubset>(); }
  // Per-token rows: each token stores its own (c_j, j) entries.
  bool per_token() const {
    return std::visit([](const auto& k) { return k.kPerToken; }, kind);
  }
  // The cache encodes any token by itself (no press choice needed): all, or per token chosen
  // by the cache.
  bool self_encoding() const {
    return std::visit([](const auto& k) { return k.kSelfEncoding; }, kind);
  }
  // Per-token channels the cache chooses for each token (by magnitude, sparse codes).
  bool codes_tokens() const { return per_token() && self_encoding(); }
  // Per-token rows: the count per row (0: a variable count); 0 otherwise.
  int topk() const {
    return std::visit(
        [](const auto& k) {
          if constexpr (std::decay_t<decltype(k)>::kPerToken) return k.topk;
          return 0;
        },
        kind);
  }
  // Per-token rows: how kept coordinates are recorded (kAuto in a plan; the cache resolves it).
  IndexLayout index() const {
    return std::visit(
        [](const auto& k) {
          if constexpr (std::decay_t<decltype(k)>::kPerToken) return k.index;
          return IndexLayout::kAuto;
        },
        kind);
  }
  const KeyRecovery* recovery() const {
    const TokenChannels* t = get<TokenChannels>();
    return t && t->recovery ? &*t->recovery : nullptr;
  }
  bool fill() const {
    const TokenChannels* t = get<TokenChannels>();
    return t && t->fill;
  }
};

// The per-token data of a plan's TokenChannels stage, one row per kept token in keep order
// (rows = keep.size(), or the head's token count with keep_all; rows of tokens that are not
// re-encoded — anchors, tokens of earlier epochs — are validated and ignored). Not part of an
// encoding: the cache stores it per token in the segment.
struct TokenRows {
  std::vector<int32_t> channels;  // each row's kept coordinates, strictly increasing in [0, w)
  std::vector<int32_t> counts;    // [rows] each row's length (variable counts, topk 0), 1..w
  std::vector<float> fill;        // [rows] recovery fill_t / μ_t (keys), fill (values)
  std::vector<float> spread;      // [rows] σ_t, Gaussian recovery only, >= 0
  bool empty() const {
    return channels.empty() && counts.empty() && fill.empty() && spread.empty();
  }
  bool operator==(const TokenRows&) const = default;
};

}  // namespace kvtrim
