// How one segment (epoch) of a head stores its keys and its values (DESIGN.md §3): per side,
// basis -> channels -> precision. Immutable once built and shared by pointer (a segment, the
// head's current encoding, clones of the cache).
//
//   x [d] --basis--> c [w] = Uᵀx (w = rank; identity: c = x, w = d)
//         --channels--> all of c | c[S] (a per-head subset) | per token (c_j, j) for j in the
//                       token's own list (+ recovery / fill for the others) (channel_stage.h)
//         --precision--> f32 | f16 | bf16 | q8 | fp8 | q4 elements (side_store.h)
//
// Attention reads each stage directly: the query is projected once per segment (q·D_k, D_k =
// the decoder or U), the values are accumulated in the stored space and lifted once per
// segment ((Σ a ṽ) scattered back to w coordinates, then ·D_vᵀ).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "kv/channel_stage.h"
#include "kv/kv_types.h"

namespace kvtrim::kv {

// A basis matrix, stored once however many heads, epochs, caches or sessions use it
// (intern_basis): encoder U [d, r] row-major f32 and, for oblique bases, decoder D [d, r].
// A dictionary (sparse-coded sides) is a basis with r = N atoms, possibly more than d.
struct BasisMat {
  int d = 0, r = 0;
  std::vector<float> enc;  // [d, r]
  std::vector<float> dec;  // [d, r] (empty: the encoder itself)
  const std::vector<float>& decoder() const { return dec.empty() ? enc : dec; }
  size_t bytes() const { return (enc.size() + dec.size()) * sizeof(float); }
};
// The one shared instance with this content (a process-wide table of weak references: two
// plans giving equal matrices get the same pointer; freed with its last user).
std::shared_ptr<const BasisMat> intern_basis(int d, int r, const std::vector<float>& enc,
                                             const std::vector<float>& dec);

// The normalised Hadamard matrix H_d / sqrt(d) (Sylvester order; symmetric, orthonormal) as an
// interned basis; d a power of two.
std::shared_ptr<const BasisMat> hadamard_basis(int d);

// Rotates the first n_rot coordinates of each row of x [n, rows ldx apart] by the RoPE of r at
// the row's position pos[j] >= 0 (inverse: back), as ops/nn.h rope does; its cos / sin come from
// two float tables per thread (within ~1e-6 of rope's).
void rope_rows(const RopeSpec& r, float* x, int64_t n, int64_t ldx, const int32_t* pos, bool inverse);
// The same on column-major data: token j is column j of xt [d rows, ldx apart], j < n (the
// attention's reconstructed key blocks, rotated with SIMD lanes over tokens).
void rope_cols(const RopeSpec& r, float* xt, int64_t ldx, int64_t n, const int32_t* pos, bool inverse);

// One side (keys or values) of an encoding. Equality is defaulted and complete: the basis is
// interned (intern_basis), so equal pointers mean equal matrices.
struct SideEncoding {
  int d = 0;                              // head dim of the side
  std::shared_ptr<const BasisMat> basis;  // null: identity
  // the plan's stage (channel_stage.h), with the per-token index resolved to kList / kBitmask
  ChannelStage channels;
  KvDtype dtype = KvDtype::kF16;
  // keys with a basis and all channels: the basis describes the key before RoPE (plan.h
  // SideSpec::rope, Palu): to_coords undoes each token's rotation, from_coords redoes it, and
  // attention reconstructs the keys (segment_attend.cpp) instead of projecting the query.
  std::optional<RopeSpec> rope;
  bool operator==(const SideEncoding&) const = default;

  int width() const { return basis ? basis->r : d; }
  // Elements of a dense stored row: width(), or |subset|; per-token rows have their own count.
  int stored() const {
    const ChannelSubset* s = channels.subset();
    return s ? static_cast<int>(s->channels.size()) : width();
  }
  bool identity() const { return !basis && channels.all(); }
  bool per_token() const { return channels.per_token(); }
  int topk() const { return channels.topk(); }  // per token: fixed count; 0 = variable
  bool bitmask() const { return channels.index() == IndexLayout::kBitmask; }
  bool fill() const { return channels.fill(); }  // values: a per-token fill for pruned coords
  // keys: the recovery of pruned coordinates (null: they read zero)
  const KeyRecovery* recovery() const { return channels.recovery(); }
  bool recovers() const { return recovery() != nullptr; }
  // A recovery drawn per coordinate (Gaussian / exponential): no masked kernel reads it.
  bool sampled_recovery() const { return recovers() && recovery()->dist != RecoveryDist::kFill; }
  // Encodes tokens by itself: channels all, or per token chosen by the cache.
  bool self_encoding() const { return channels.self_encoding(); }
  // MagnitudeChannels: the topk coordinates of c [width()] with the largest |c_j| (ties: the
  // lower index), increasing, into ch [topk].
  void magnitude_channels(const float* c, int32_t* ch) const;
  // Floats stored per token for its fill / recovery parameters (when it has any).
  int fill_params() const {
    return recovers() && recovery()->dist == RecoveryDist::kGaussian ? 2 : 1;
  }
  // The magnitude pruned coordinate i of a token with parameters f [fill_params()] reads, before
  // the recovery scale r[i] and the sign.
  float pruned_magnitude(const float* f, int i) const;
  // Bytes held once per encoding (not per token): subset indices (uint16) and the recovery
  // scale (f32); bases are counted separately (shared).
  size_t subset_bytes() const {
    const ChannelSubset* s = channels.subset();
    return s ? s->channels.size() * sizeof(uint16_t) : 0;
  }
  size_t recovery_bytes() const {
    return recovers() ? recovery()->scale.size() * sizeof(float) : 0;
  }

  // SparseCodeChannels: the OMP codes of x [n, d] (rows ldx apart) over the basis's atoms:
  // idx [n, topk] (increasing) and coef [n, topk].
  void sparse_encode(const float* x, int64_t n, int64_t ldx, int32_t* idx, float* coef) const;
  // c [n, width()] = x [n, d] (rows ldx apart) through the basis. pos [n]: the tokens'
  // positions, needed (and only read) with a rope: c = Uᵀ R_pos⁻¹ x.
  void to_coords(const float* x, int64_t n, int64_t ldx, float* c, const int32_t* pos = nullptr) const;
  // The query seen by stored coordinates: qc [n, width()] = q [n, d] · D (D = decoder or U).
  // Not for rope sides (their attention sees the whole query).
  void query_coords(const float* q, int64_t n, float* qc) const;
  // x [n, d] = D · c [n, width()] (rows ldx apart): back from coordinates (values, read_head);
  // with a rope, x = R_pos (D · c) at the positions pos [n].
  void from_coords(const float* c, int64_t n, float* x, int64_t ldx, const int32_t* pos = nullptr) const;
};

// The encoding of one segment of a head: keys and values. id: the epoch id (unique in the
// cache; -1 = the dense rows).
struct SegmentEncoding {
  int32_t id = -1;
  SideEncoding k, v;
  bool appends_dense = false;  // tokens appended after it stay dense (press-chosen channels always)
  int64_t buffer = 0;          // the newest `buffer` tokens stay dense (HeadPlan::buffer)
  bool dense() const { return id < 0; }
  bool appends_here() const { return !appends_dense && k.self_encoding() && v.self_encoding(); }
};

}  // namespace kvtrim::kv
