// Packing of legacy-type weights into the 16-row tile order (layout in weight_pack.h).
#include "ops/weight_pack.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>

#include "core/error.h"
#include "core/quant_blocks.h"
#include "ops/matmul_internal.h"

namespace kvtrim {

namespace {

std::atomic<bool> g_packing{true};

constexpr int kR = PackedWeight::kTileRows;

size_t qs_record_bytes(GgmlType t) {
  return t == GgmlType::Q8_0 ? 512 : 256;  // 16 rows x 32 (Q8_0) or 16 (Q4, Q5) quant bytes
}
size_t qh_record_bytes(GgmlType t) {
  return t == GgmlType::Q5_0 || t == GgmlType::Q5_1 ? 64 : 0;  // 16 rows' fifth bits (u32 each)
}
bool has_min(GgmlType t) {
  return t == GgmlType::Q4_1 || t == GgmlType::Q5_1;
}

bool packable(GgmlType t) {
  return t == GgmlType::Q4_0 || t == GgmlType::Q4_1 || t == GgmlType::Q5_0 || t == GgmlType::Q5_1 ||
         t == GgmlType::Q8_0;
}

// Block i of one row, as its scale, min, quant bytes (Q4, Q5: 16 nibble bytes; Q8_0: 32 bytes of
// w + 128) and fifth bits (Q5).
struct RowBlock {
  uint16_t d = 0, m = 0;
  uint8_t q[32] = {};
  uint8_t qh[4] = {};
};

// Block i of a row of block type B: the fields the type has, copied.
template <class B>
RowBlock read_as(const uint8_t* row, int64_t i) {
  const B& blk = reinterpret_cast<const B*>(row)[i];
  RowBlock b;
  b.d = blk.d;
  if constexpr (requires { blk.m; }) b.m = blk.m;
  if constexpr (requires { blk.qh; }) std::memcpy(b.qh, blk.qh, sizeof(blk.qh));
  if constexpr (std::is_same_v<B, BlockQ8_0>) {
    for (int j = 0; j < kQK; ++j) b.q[j] = static_cast<uint8_t>(static_cast<uint8_t>(blk.qs[j]) ^ 0x80u);
  } else {
    std::memcpy(b.q, blk.qs, sizeof(blk.qs));
  }
  return b;
}

RowBlock read_block(GgmlType t, const uint8_t* row, int64_t i) {
  switch (t) {
    case GgmlType::Q4_0: return read_as<BlockQ4_0>(row, i);
    case GgmlType::Q4_1: return read_as<BlockQ4_1>(row, i);
    case GgmlType::Q5_0: return read_as<BlockQ5_0>(row, i);
    case GgmlType::Q5_1: return read_as<BlockQ5_1>(row, i);
    default: return read_as<BlockQ8_0>(row, i);
  }
}

}  // namespace

bool PackedWeight::available(GgmlType t) {
  return packable(t) && detail::has_packed_kernel(t);
}

size_t PackedWeight::tile_bytes(GgmlType t, int64_t n_cols) {
  const size_t nb = static_cast<size_t>(n_cols / kQK);
  const size_t scales = (has_min(t) ? 2 : 1) * kR * sizeof(uint16_t);
  return nb * (qs_record_bytes(t) + qh_record_bytes(t) + scales);
}

size_t PackedWeight::bytes(GgmlType t, int64_t n_rows, int64_t n_cols) {
  return static_cast<size_t>((n_rows + kR - 1) / kR) * tile_bytes(t, n_cols);
}

void PackedWeight::Free::operator()(void* p) const {
  std::free(p);
}

// The packed size of w after checking that it can be packed.
size_t PackedWeight::bytes_checked(const WeightView& w) {
  KVTRIM_CHECK(packable(w.type), "PackedWeight: type %s has no packed layout",
               std::string(ggml_type_name(w.type)).c_str());
  KVTRIM_CHECK(w.data && w.n_rows > 0 && w.n_cols > 0 && w.n_cols % kQK == 0 &&
                   w.row_bytes == ggml_row_size(w.type, w.n_cols),
               "PackedWeight: bad %s matrix %lld x %lld", std::string(ggml_type_name(w.type)).c_str(),
               static_cast<long long>(w.n_rows), static_cast<long long>(w.n_cols));
  return bytes(w.type, w.n_rows, w.n_cols);
}

PackedWeight::PackedWeight(const WeightView& w) {
  const size_t alloc = (bytes_checked(w) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, alloc);
  if (!p) throw std::bad_alloc();
  own_.reset(static_cast<uint8_t*>(p));
  buf_ = own_.get();
  pack(w);
}

PackedWeight::PackedWeight(const WeightView& w, uint8_t* dst) {
  bytes_checked(w);
  KVTRIM_CHECK(dst && reinterpret_cast<uintptr_t>(dst) % 64 == 0, "PackedWeight: destination not 64-byte aligned");
  buf_ = dst;
  pack(w);
}

std::vector<PackedWeight> PackedWeight::pack_all(const std::vector<WeightView>& ws, HugePageBuffer* buf) {
  std::vector<size_t> at(ws.size() + 1, 0);  // slice i is [at[i], at[i + 1]), 64-byte aligned
  for (size_t i = 0; i < ws.size(); ++i) at[i + 1] = at[i] + (bytes_checked(ws[i]) + 63) / 64 * 64;
  *buf = HugePageBuffer(at.back());
  std::vector<PackedWeight> out;
  out.reserve(ws.size());
  for (size_t i = 0; i < ws.size(); ++i) out.emplace_back(ws[i], buf->data() + at[i]);
  return out;
}

void PackedWeight::pack(const WeightView& w) {
  const GgmlType t = w.type;
  const int64_t nb = w.n_cols / kQK;
  const size_t qs_rec = qs_record_bytes(t), qh_rec = qh_record_bytes(t), tb = tile_bytes(t, w.n_cols);
  const int64_t n_tiles = (w.n_rows + kR - 1) / kR;
  size_ = static_cast<size_t>(n_tiles) * tb;
  std::memset(buf_, 0, size_);  // the last tile's padding rows: zero quants, zero scales
  const auto* src = static_cast<const uint8_t*>(w.data);
  for (int64_t g = 0; g < n_tiles; ++g) {
    uint8_t* tile = buf_ + static_cast<size_t>(g) * tb;
    uint8_t* qs = tile;
    uint8_t* qh = tile + static_cast<size_t>(nb) * qs_rec;
    auto* d = reinterpret_cast<uint16_t*>(qh + static_cast<size_t>(nb) * qh_rec);
    uint16_t* m = d + nb * kR;
    const int rows = static_cast<int>(std::min<int64_t>(kR, w.n_rows - g * kR));
    for (int r = 0; r < rows; ++r) {
      const uint8_t* row = src + static_cast<size_t>(g * kR + r) * w.row_bytes;
      for (int64_t i = 0; i < nb; ++i) {
        const RowBlock b = read_block(t, row, i);
        uint8_t* rec = qs + static_cast<size_t>(i) * qs_rec;
        const int dwords = static_cast<int>(qs_rec / (4 * kR));  // 4 (Q4) or 8 (Q8_0)
        for (int j = 0; j < dwords; ++j) std::memcpy(rec + 64 * j + 4 * r, b.q + 4 * j, 4);
        if (qh_rec) std::memcpy(qh + static_cast<size_t>(i) * qh_rec + 4 * r, b.qh, 4);
        d[i * kR + r] = b.d;
        if (has_min(t)) m[i * kR + r] = b.m;
      }
    }
  }
}

WeightView PackedWeight::view(const WeightView& w) const {
  WeightView v = w;
  v.packed = buf_;
  return v;
}

void set_weight_packing(bool on) {
  g_packing.store(on, std::memory_order_relaxed);
}

bool weight_packing() {
  return g_packing.load(std::memory_order_relaxed);
}

}  // namespace kvtrim
