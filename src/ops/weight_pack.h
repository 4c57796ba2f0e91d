// Weights repacked once at load into the order of the 16-row tile kernels (as llama.cpp's CPU
// "repack" buffers do for Q4_0): a second copy of a legacy-type matrix whose blocks a zmm load
// takes with the rows already in the SIMD lanes.
//
// Why: the kernels of ops/legacy_strips-inl.h and ops/kquant_tiles-inl.h read the GGUF rows in
// place and pay, per 32-column block, gathers and an in-register transpose to put 8 or 16 rows in
// the lanes. A batched decode step (the server's 4 streams) is bound by that decode work, not by
// the weight bytes. From the packed copy a block of 16 rows is 4 loads (Q4, Q5; 8 for Q8_0) and
// the nibble split (Q5: plus its 16 rows' fifth bits from one load), so the same tile kernel runs
// from 1 token on.
//
// Layout (PackedWeight::kTileRows = 16 rows per tile; rows past n_rows in the last tile are zero):
// tile g of a matrix with nb blocks per row occupies tile_bytes(t, n_cols) bytes at
// g * tile_bytes, in up to four parts:
//   qs: nb records of 256 (Q4_0, Q4_1, Q5_0, Q5_1) or 512 (Q8_0) bytes; record i, bytes
//       64 j + 4 r .. +3 = row 16 g + r's block i bytes 4 j .. 4 j + 3 (Q4, Q5: the packed nibble
//       bytes as in GGUF, so the low nibbles are columns 4 j .. 4 j + 3 and the high ones
//       16 + 4 j ..; Q8_0: the quants XOR 0x80, i.e. w + 128 as an unsigned byte);
//   qh: (Q5_0, Q5_1) nb records of 64 bytes, bytes 4 r .. 4 r + 3 = row r's qh (bit c: column
//       c's fifth bit);
//   d:  nb x 16 f16, [i * 16 + r] = row r's block-i scale;
//   m:  (Q4_1, Q5_1) nb x 16 f16, the block mins.
// Same bytes as the GGUF rows (plus the last tile's padding). The GGUF copy stays the reference
// for everything else that reads weights (get_row, the f32 prefill path, calibration).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/ggml_type.h"
#include "core/memory.h"
#include "ops/matmul.h"

namespace kvtrim {

class PackedWeight {
 public:
  static constexpr int kTileRows = 16;

  // True when this CPU's kernels read weights of type t from a packed copy (AVX-512 VNNI; Q4_0,
  // Q4_1, Q5_0, Q5_1, Q8_0); elsewhere packing is not offered and matrices stay as they are.
  static bool available(GgmlType t);
  // Bytes of one tile of 16 rows of n_cols columns of type t (t packable).
  static size_t tile_bytes(GgmlType t, int64_t n_cols);
  static size_t bytes(GgmlType t, int64_t n_rows, int64_t n_cols);

  // Packs w (a packable type, any row count >= 1) into a 64-byte aligned buffer of its own.
  explicit PackedWeight(const WeightView& w);
  // Packs w into dst (bytes(w.type, w.n_rows, w.n_cols) bytes, 64-byte aligned, owned by the
  // caller and outliving this object): Model::load packs every matrix into one huge-page buffer.
  PackedWeight(const WeightView& w, uint8_t* dst);
  // ws (each packable) packed one after another, each at a 64-byte boundary, into a new
  // HugePageBuffer put in *buf; result i is ws[i]'s copy (Model::load's layout).
  static std::vector<PackedWeight> pack_all(const std::vector<WeightView>& ws, HugePageBuffer* buf);
  PackedWeight(PackedWeight&&) noexcept = default;
  PackedWeight& operator=(PackedWeight&&) noexcept = default;

  const void* data() const { return buf_; }
  size_t size() const { return size_; }
  // w with its `packed` pointer set to this copy.
  WeightView view(const WeightView& w) const;

 private:
  struct Free {
    void operator()(void* p) const;
  };
  static size_t bytes_checked(const WeightView& w);
  void pack(const WeightView& w);
  std::unique_ptr<uint8_t, Free> own_;  // the buffer, unless the caller gave one
  uint8_t* buf_ = nullptr;
  size_t size_ = 0;
};

// Whether Model::load packs the matrices of the packable types (process-wide; default on).
// Off: the kernels read the GGUF rows in place (the memory of one copy of the weights, and the
// A/B of docs/results/perf). kvtrim's --no-repack turns it off.
void set_weight_packing(bool on);
bool weight_packing();

}  // namespace kvtrim
