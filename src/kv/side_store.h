// Storage of one side (keys or values) of one segment of a (layer, kv head): the precision
// stage's byte layout (docs/kv-cache.md has it byte by byte).
//
// Dense rows (channels all or a per-head subset; s = elements per row = SideEncoding::stored()):
//   keys, tiled: tiles of kKeyTile = 16 tokens, transposed inside the tile, element (t, i) at
//     key_tile_index(t, i, s) (attn_kernels.h); q4 packs two tokens per byte (quant_formats.h);
//   values, row-major [n, s]; q4 packs two elements per byte.
//   q8 / fp8: one f32 scale per row (scale [cap]); q4: one f16 scale per block of 32 elements
//   of a row (keys: [cap/16][n_blk][16], values: [cap][n_blk]).
// Per-token rows (channels chosen per token, keys and values alike): row t keeps cnt_t entries
//   (value, coordinate), packed row-major from entry off_t: vals [entries] in the dtype
//   (q8 / fp8 / q4 codes with one f32 scale per row), idx [entries] uint8 (width <= 256) or
//   uint16 — or, bitmask layout, idx [n][ceil(w / 8)] with bit i of a row set for each kept
//   coordinate i (the entries in increasing coordinate order) —; vals keeps kMaskedSlack bytes of
//   readable slack after its capacity (the masked kernels' whole-vector loads), not counted —,
//   off [n + 1] uint32 only for a variable count (fixed: off_t = t·T); fills [n] f32
//   (keys with recovery: sqrt(μ_t), or μ_t[, σ_t] for a sampled recovery; values with fill: the fill value), signs (keys with
//   recovery): one bit per coordinate of the row, bit i = 1 if coordinate i is negative (the
//   kept ones too, so that scoring reads the pruned signs as one masked word, with no per-bit
//   unpacking), ceil(w / 8) bytes per row, fixed or variable count.
#pragma once
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "kv/encoding.h"
#include "kv/kv_types.h"

namespace kvtrim::kv {

// An uninitialised byte buffer: pages are touched (made resident) only when written.
struct Buf {
  std::unique_ptr<uint8_t[]> p;
  size_t n = 0;
  Buf() = default;
  Buf(const Buf& o) { *this = o; }  // deep copy (KvCache::clone)
  Buf& operator=(const Buf& o) {
    if (this != &o) {
      alloc(o.n);
      if (o.n) std::memcpy(p.get(), o.p.get(), o.n);
    }
    return *this;
  }
  Buf(Buf&&) noexcept = default;
  Buf& operator=(Buf&&) noexcept = default;
  void alloc(size_t bytes) {
    p = bytes ? std::make_unique_for_overwrite<uint8_t[]>(bytes) : nullptr;
    n = bytes;
  }
  template <typename T>
  T* as() {
    return reinterpret_cast<T*>(p.get());
  }
  template <typename T>
  const T* as() const {
    return reinterpret_cast<const T*>(p.get());
  }
};

// Bytes held by a side store, by part (kv_cache.h KvBytes).
struct SideBytes {
  size_t elems = 0, scales = 0, indices = 0, bitmasks = 0, fills = 0;
};

class SideStore {
 public:
  // Layout for an encoding's side; keys = tiled dense rows.
  void init(const SideEncoding& e, bool keys);

  int64_t n() const { return n_; }
  KvDtype dtype() const { return dtype_; }
  bool sparse() const { return sparse_; }
  bool tiled() const { return tiled_; }  // keys' dense rows: tiles of kKeyTile rows, not row-major
  int row_elems() const { return s_; }  // dense: elements per row

  // Capacity for `rows` rows (and, per-token, `entries` entries); grows geometrically from
  // `min_step` rows, never past `max_rows` (unless more are needed); the stored prefix is kept.
  void reserve(int64_t rows, int64_t entries, int64_t min_step, int64_t max_rows);
  // Dense: row n() <- x [row_elems()] (the kept coordinates), encoded in the dtype.
  void push_dense(const float* x);
  // Per-token: row n() <- the coordinates ch [cnt] (increasing) of c [width], fill [fill_params()]
  // (recovery / value fill parameters; ignored without).
  void push_sparse(const float* c, const int32_t* ch, int cnt, const float* fill);
  // Row t reconstructed in coordinates: c [width] (dense subset / per-token: pruned coordinates
  // zero, or their recovery / fill).
  void get(const SideEncoding& e, int64_t t, float* c) const;
  // Keeps rows keep[0..) (increasing), reallocated to exactly that many (whole key tiles).
  // Returns false (and does nothing) when keep is every row and storage is already exact.
  bool select(const std::vector<int32_t>& keep);
  void truncate(int64_t n);
  // Dense rows only: drops rows [first, first + count) and moves the later rows down, in place
  // (capacity kept; SWAN's buffer hands its oldest rows to the sparse store at every step).
  void erase_rows(int64_t first, int64_t count);
  SideBytes bytes() const;

  // Raw views for the attention kernels.
  const uint8_t* data() const { return data_.p.get(); }
  const float* row_scale() const { return scale_.as<float>(); }
  const uint16_t* block_scale() const { return scale_.as<uint16_t>(); }
  // List layout: entry e's coordinate at idx()[e · idx_bytes()] (uint8 or uint16).
  const uint8_t* idx() const { return idx_.p.get(); }
  int idx_bytes() const { return isz_; }
  // Bitmask layout: row t's kept coordinates as bits (bit i of byte i / 8), mask_bytes() per row.
  bool bitmask() const { return mask_; }
  int mask_bytes() const { return mb_; }
  const uint8_t* mask_row(int64_t t) const { return idx_.p.get() + t * mb_; }
  // Row t's kept coordinates, increasing, into ch [row_count(t)] (either layout).
  void row_channels(int64_t t, int32_t* ch) const;
  // Bytes of one stored element (not q4).
  size_t elem_size() const { return elem_bytes(1); }
  const uint32_t* offsets() const { return var_ ? off_.data() : nullptr; }
  int topk() const { return T_; }
  const float* fills() const { return fills_.as<float>(); }  // [n, fill_params()]
  int fill_params() const { return nf_; }
  int64_t row_begin(int64_t t) const { return var_ ? off_[static_cast<size_t>(t)] : t * T_; }
  int row_count(int64_t t) const {
    return var_ ? static_cast<int>(off_[static_cast<size_t>(t) + 1] - off_[static_cast<size_t>(t)]) : T_;
  }
  // Row t's sign bytes (recovery): sign_bytes() per row, bit i of the row = coordinate i < 0.
  const uint8_t* sign_row(int64_t t) const { return signs_.p.get() + t * sb_; }
  int sign_bytes() const { return sb_; }
  // Element j of a dense row t / entry e of the per-token entries, as f32 (scales applied).
  float dense_at(int64_t t, int j) const;
  float entry_at(int64_t t, int64_t e) const;

 private:
  size_t elem_bytes(int64_t count) const;  // bytes of `count` stored elements
  // Dense row t of src -> row r of this store (same layout; src may be this store, t != r).
  void copy_dense_row(const SideStore& src, int64_t t, int64_t r);
  void realloc_to(int64_t cap, int64_t cap_ent, bool grow, const int32_t* keep, int64_t n_keep);
  int64_t entries() const { return sparse_ ? row_begin(n_) : 0; }

  KvDtype dtype_ = KvDtype::kF16;
  bool tiled_ = false, sparse_ = false, var_ = false, rec_ = false, fill_ = false;
  int w_ = 0;    // coordinates (width)
  int s_ = 0;    // dense: elements per row
  int T_ = 0;    // per-token fixed count (0: variable)
  int isz_ = 0;  // per-token index bytes (list layout)
  bool mask_ = false;  // per-token rows: kept coordinates as a bitmask of mb_ bytes per row
  int mb_ = 0;
  int sb_ = 0;   // per-token rows with recovery: sign bytes per row, ceil(w / 8)
  int nf_ = 0;   // fill / recovery parameters per row (0: none)
  int64_t n_ = 0, cap_ = 0, cap_ent_ = 0;
  Buf data_, scale_, idx_, fills_, signs_;
  std::vector<uint32_t> off_;  // variable per-token rows: [n + 1]
};

}  // namespace kvtrim::kv
