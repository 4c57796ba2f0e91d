// One side's storage of a segment (side_store.h).
#include "kv/side_store.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/fp16.h"
#include "kv/attn_kernels.h"
#include "kv/kv_type.h"
#include "kv/quant_formats.h"

namespace kvtrim::kv {
namespace {

int n_blocks(int s) { return static_cast<int>(q4_blocks(s)); }

// Where element i of a stored vector goes: elem index (f32/f16/bf16/q8/fp8: element units;
// q4: nibble units, byte = idx / 2, high nibble if odd).
struct Slot {
  bool tiled;
  int s;
  int64_t at(int64_t t, int64_t i) const {
    return tiled ? key_tile_index(t, i, s) : t * s + i;
  }
  // q4 nibble index: tiled keys pack two tokens per byte, rows two elements per byte.
  int64_t nib(int64_t t, int64_t i) const {
    if (tiled) return ((t / kKeyTile) * s * (kKeyTile / 2) + i * (kKeyTile / 2) + (t % kKeyTile) / 2) * 2 + (t & 1);
    return t * ((s + 1) / 2) * 2 + i;
  }
};

void put_nibble(uint8_t* base, int64_t nib, int code) {
  uint8_t& b = base[nib >> 1];
  b = (nib & 1) ? static_cast<uint8_t>((b & 0x0F) | (code << 4)) : static_cast<uint8_t>((b & 0xF0) | code);
}
int get_nibble(const uint8_t* base, int64_t nib) {
  return (nib & 1) ? base[nib >> 1] >> 4 : base[nib >> 1] & 0x0F;
}

// Encodes x[n] under one scale (the type's codec, kv_type.h) into dst's element slots at(j)
// (nibble slots for 4-bit types); returns the scale (1 for unscaled types). The codes are made
// as a contiguous row first (SIMD conversions: the element-wise f16 conversion was ~2 % of a
// SmolLM2 prefill), then placed.
template <class At>
float encode_elems(KvDtype t, const float* x, int64_t n, uint8_t* dst, At at, bool round_f16 = false) {
  const KvTypeInfo& tt = kv_type(t);
  thread_local std::vector<uint8_t> codes;  // (no allocation per appended row)
  const size_t width = tt.code_bits >= 8 ? static_cast<size_t>(tt.code_bits / 8) : 1;
  codes.resize(static_cast<size_t>(n) * width);
  const float sc = tt.ops.encode(x, n, codes.data(), round_f16);
  switch (tt.code_bits) {
    case 32:
      for (int64_t j = 0; j < n; ++j) std::memcpy(dst + 4 * at(j), codes.data() + 4 * j, 4);
      break;
    case 16:
      for (int64_t j = 0; j < n; ++j) std::memcpy(dst + 2 * at(j), codes.data() + 2 * j, 2);
      break;
    case 8:
      for (int64_t j = 0; j < n; ++j) dst[at(j)] = codes[static_cast<size_t>(j)];
      break;
    default:  // 4
      for (int64_t j = 0; j < n; ++j) put_nibble(dst, at(j), codes[static_cast<size_t>(j)]);
  }
  return sc;
}

float decode_elem(KvDtype t, const uint8_t* src, int64_t at, float scale) {
  return kv_type(t).ops.decode(src, at, scale);
}

bool has_row_scale(KvDtype t) { return kv_type(t).scale == KvScale::kRow; }
bool block_scaled(KvDtype t) { return kv_type(t).scale == KvScale::kBlock; }

}  // namespace

void SideStore::init(const SideEncoding& e, bool keys) {
  dtype_ = e.dtype;
  w_ = e.width();
  sparse_ = e.per_token();
  tiled_ = keys && !sparse_;
  s_ = e.stored();
  T_ = sparse_ ? e.topk() : 0;
  var_ = sparse_ && T_ == 0;
  rec_ = sparse_ && keys && e.recovers();
  fill_ = sparse_ && (rec_ || (!keys && e.fill()));
  isz_ = sparse_ ? (w_ <= 256 ? 1 : 2) : 0;
  mask_ = sparse_ && e.bitmask();
  mb_ = mask_ ? (w_ + 7) / 8 : 0;
  sb_ = rec_ ? (w_ + 7) / 8 : 0;
  nf_ = fill_ ? (rec_ ? e.fill_params() : 1) : 0;
  n_ = cap_ = cap_ent_ = 0;
  off_.clear();
  if (var_) off_.push_back(0);
}

size_t SideStore::elem_bytes(int64_t count) const { return kv_type(dtype_).code_bytes(count); }

void SideStore::realloc_to(int64_t cap, int64_t cap_ent, bool grow, const int32_t* keep,
                           int64_t n_keep) {
  SideStore N = std::move(*this);  // layout fields copied below; buffers moved
  *this = SideStore();
  dtype_ = N.dtype_;
  tiled_ = N.tiled_;
  sparse_ = N.sparse_;
  var_ = N.var_;
  rec_ = N.rec_;
  fill_ = N.fill_;
  w_ = N.w_;
  s_ = N.s_;
  T_ = N.T_;
  isz_ = N.isz_;
  mask_ = N.mask_;
  mb_ = N.mb_;
  sb_ = N.sb_;
  nf_ = N.nf_;
  cap_ = cap;
  cap_ent_ = cap_ent;
  // grow: the stored prefix is copied; else rows keep[0 .. n_keep) are gathered
  const int64_t rows = grow ? N.n_ : n_keep;
  if (sparse_) {
    // slack: the masked-row kernels load whole SIMD groups at a row's last values
    data_.alloc(elem_bytes(cap_ent) + kMaskedSlack);
    std::memset(data_.p.get() + elem_bytes(cap_ent), 0, kMaskedSlack);
    idx_.alloc(mask_ ? static_cast<size_t>(cap) * static_cast<size_t>(mb_)
                     : static_cast<size_t>(cap_ent) * static_cast<size_t>(isz_));
    if (has_row_scale(dtype_) || block_scaled(dtype_)) scale_.alloc(static_cast<size_t>(cap) * 4);
    if (fill_) fills_.alloc(static_cast<size_t>(cap * nf_) * 4);
    if (rec_) signs_.alloc(static_cast<size_t>(cap * sb_));
    if (var_) off_.assign(1, 0);
    int64_t ent = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = grow ? r : keep[r];
      const int64_t b = N.row_begin(t), c = N.row_count(t);
      if (block_scaled(dtype_)) {
        for (int64_t j = 0; j < c; ++j) put_nibble(data_.p.get(), ent + j, get_nibble(N.data_.p.get(), b + j));
      } else {
        const size_t es = elem_bytes(1);
        std::memcpy(data_.p.get() + ent * es, N.data_.p.get() + b * es, static_cast<size_t>(c) * es);
      }
      if (mask_) {
        std::memcpy(idx_.p.get() + r * mb_, N.idx_.p.get() + t * mb_, static_cast<size_t>(mb_));
      } else {
        std::memcpy(idx_.p.get() + ent * isz_, N.idx_.p.get() + b * N.isz_, static_cast<size_t>(c * isz_));
      }
      if (scale_.n) scale_.as<float>()[r] = N.scale_.as<float>()[t];
      for (int j = 0; j < nf_; ++j) fills_.as<float>()[r * nf_ + j] = N.fills_.as<float>()[t * nf_ + j];
      if (rec_) std::memcpy(signs_.p.get() + r * sb_, N.signs_.p.get() + t * sb_, static_cast<size_t>(sb_));
      ent += c;
      if (var_) off_.push_back(static_cast<uint32_t>(ent));
    }
    n_ = rows;
    return;
  }
  // dense rows
  const int nblk = n_blocks(s_);
  if (tiled_) {
    data_.alloc(elem_bytes(cap * s_));
  } else {
    data_.alloc(block_scaled(dtype_) ? static_cast<size_t>(cap) * ((s_ + 1) / 2)
                                       : elem_bytes(cap * s_));
  }
  if (has_row_scale(dtype_)) scale_.alloc(static_cast<size_t>(cap) * 4);
  if (block_scaled(dtype_)) scale_.alloc(static_cast<size_t>(cap) * nblk * 2);
  if (grow && rows > 0) {  // the stored prefix (whole key tiles) copied as is
    const int64_t up = tiled_ ? (rows + kKeyTile - 1) / kKeyTile * kKeyTile : rows;
    const size_t nbytes = tiled_ ? elem_bytes(up * s_)
                                 : (block_scaled(dtype_) ? static_cast<size_t>(up) * ((s_ + 1) / 2)
                                                           : elem_bytes(up * s_));
    std::memcpy(data_.p.get(), N.data_.p.get(), nbytes);
    if (scale_.n) {
      const size_t sbytes = block_scaled(dtype_) ? static_cast<size_t>(up) * nblk * 2 : static_cast<size_t>(rows) * 4;
      std::memcpy(scale_.p.get(), N.scale_.p.get(), sbytes);
    }
  } else if (rows > 0) {
    for (int64_t r = 0; r < rows; ++r) copy_dense_row(N, keep[r], r);
  }
  n_ = rows;
}

void SideStore::copy_dense_row(const SideStore& src, int64_t t, int64_t r) {
  const Slot sl{tiled_, s_};
  const int nblk = n_blocks(s_);
  const uint8_t* from = src.data_.p.get();
  uint8_t* to = data_.p.get();
  if (block_scaled(dtype_)) {
    for (int i = 0; i < s_; ++i) put_nibble(to, sl.nib(r, i), get_nibble(from, sl.nib(t, i)));
    for (int b = 0; b < nblk; ++b) {
      const int64_t fr = tiled_ ? ((t / kKeyTile) * nblk + b) * kKeyTile + t % kKeyTile : t * nblk + b;
      const int64_t at = tiled_ ? ((r / kKeyTile) * nblk + b) * kKeyTile + r % kKeyTile : r * nblk + b;
      scale_.as<uint16_t>()[at] = src.scale_.as<uint16_t>()[fr];
    }
    return;
  }
  const size_t es = elem_bytes(1);
  if (tiled_) {
    for (int i = 0; i < s_; ++i) std::memcpy(to + sl.at(r, i) * es, from + sl.at(t, i) * es, es);
  } else {
    std::memmove(to + r * s_ * es, from + t * s_ * es, static_cast<size_t>(s_) * es);
  }
  if (scale_.n) scale_.as<float>()[r] = src.scale_.as<float>()[t];
}

void SideStore::erase_rows(int64_t first, int64_t count) {
  KVTRIM_ASSERT(!sparse_ && first >= 0 && count >= 0 && first + count <= n_);
  if (count == 0) return;
  const int64_t moved = n_ - first - count;  // rows after the erased ones, moved down by count
  if (block_scaled(dtype_)) {
    for (int64_t r = 0; r < moved; ++r) copy_dense_row(*this, first + count + r, first + r);
  } else if (tiled_) {
    // element i of consecutive tokens is contiguous inside a tile: move runs that stay inside
    // one tile on both sides (increasing rows: a source is never overwritten before it is read)
    const Slot sl{tiled_, s_};
    const size_t es = elem_bytes(1);
    uint8_t* d = data_.p.get();
    for (int64_t r = 0; r < moved;) {
      const int64_t to = first + r, from = first + count + r;
      const int64_t run = std::min({kKeyTile - to % kKeyTile, kKeyTile - from % kKeyTile, moved - r});
      for (int i = 0; i < s_; ++i)
        std::memmove(d + sl.at(to, i) * es, d + sl.at(from, i) * es, static_cast<size_t>(run) * es);
      r += run;
    }
    if (scale_.n)
      std::memmove(scale_.as<float>() + first, scale_.as<float>() + first + count,
                   static_cast<size_t>(moved) * sizeof(float));
  } else {
    const size_t es = elem_bytes(1), row = static_cast<size_t>(s_) * es;
    std::memmove(data_.p.get() + first * row, data_.p.get() + (first + count) * row,
                 static_cast<size_t>(moved) * row);
    if (scale_.n)
      std::memmove(scale_.as<float>() + first, scale_.as<float>() + first + count,
                   static_cast<size_t>(moved) * sizeof(float));
  }
  n_ -= count;
}

void SideStore::reserve(int64_t rows, int64_t entries, int64_t min_step, int64_t max_rows) {
  if (rows <= cap_ && entries <= cap_ent_) return;
  int64_t cap = cap_;
  if (rows > cap_) {
    cap = std::max({rows, 2 * cap_, min_step});
    cap = std::min(cap, std::max(rows, max_rows));
    cap = (cap + kKeyTile - 1) / kKeyTile * kKeyTile;  // whole key tiles
  }
  int64_t ce = cap_ent_;
  if (sparse_ && entries > cap_ent_) ce = std::max({entries, 2 * cap_ent_, min_step * std::max(1, T_)});
  realloc_to(cap, ce, /*grow=*/true, nullptr, n_);
}

void SideStore::push_dense(const float* x) {
  KVTRIM_ASSERT(!sparse_ && n_ < cap_);
  const int64_t t = n_;
  const Slot sl{tiled_, s_};
  if (block_scaled(dtype_)) {
    const int nblk = n_blocks(s_);
    for (int b = 0; b < nblk; ++b) {
      const int i0 = b * static_cast<int>(kQ4Block), nb = std::min(static_cast<int>(kQ4Block), s_ - i0);
      const float sc = encode_elems(dtype_, x + i0, nb, data_.p.get(), [&](int64_t j) { return sl.nib(t, i0 + j); },
                                    /*round_f16=*/true);
      const int64_t at = tiled_ ? ((t / kKeyTile) * nblk + b) * kKeyTile + t % kKeyTile : t * nblk + b;
      scale_.as<uint16_t>()[at] = fp32_to_fp16(sc);
    }
  } else if (tiled_) {
    const float sc = encode_elems(dtype_, x, s_, data_.p.get(), [&](int64_t j) { return sl.at(t, j); });
    if (has_row_scale(dtype_)) scale_.as<float>()[t] = sc;
  } else {  // a contiguous row of whole-byte codes: encoded in place
    const float sc = kv_type(dtype_).ops.encode(x, s_, data_.p.get() + elem_bytes(t * s_), false);
    if (has_row_scale(dtype_)) scale_.as<float>()[t] = sc;
  }
  ++n_;
}

void SideStore::push_sparse(const float* c, const int32_t* ch, int cnt, const float* fill) {
  KVTRIM_ASSERT(sparse_ && n_ < cap_);
  const int64_t t = n_, e0 = entries();
  KVTRIM_ASSERT(e0 + cnt <= cap_ent_);
  std::vector<float> vals(static_cast<size_t>(cnt));
  for (int j = 0; j < cnt; ++j) vals[static_cast<size_t>(j)] = c[ch[j]];
  const float sc = encode_elems(dtype_, vals.data(), cnt, data_.p.get(), [&](int64_t j) { return e0 + j; });
  if (scale_.n) scale_.as<float>()[t] = sc;
  if (mask_) {
    uint8_t* m = idx_.p.get() + t * mb_;
    std::fill(m, m + mb_, uint8_t{0});
    for (int j = 0; j < cnt; ++j) m[ch[j] >> 3] = static_cast<uint8_t>(m[ch[j] >> 3] | (1u << (ch[j] & 7)));
  } else {
    for (int j = 0; j < cnt; ++j) {
      if (isz_ == 1) {
        idx_.p[e0 + j] = static_cast<uint8_t>(ch[j]);
      } else {
        idx_.as<uint16_t>()[e0 + j] = static_cast<uint16_t>(ch[j]);
      }
    }
  }
  for (int j = 0; j < nf_; ++j) fills_.as<float>()[t * nf_ + j] = fill[j];
  if (var_) off_.push_back(static_cast<uint32_t>(e0 + cnt));
  if (rec_) {  // one sign bit per coordinate (the kept ones too: a whole-word mask at scoring)
    uint8_t* o = signs_.p.get() + t * sb_;  // (sign_row's writable view)
    std::fill(o, o + sb_, uint8_t{0});
    for (int i = 0; i < w_; ++i)
      if (c[i] < 0) o[i >> 3] = static_cast<uint8_t>(o[i >> 3] | (1u << (i & 7)));
  }
  ++n_;
}

float SideStore::dense_at(int64_t t, int j) const {
  const Slot sl{tiled_, s_};
  if (block_scaled(dtype_)) {
    const int nblk = n_blocks(s_), b = j / static_cast<int>(kQ4Block);
    const int64_t at = tiled_ ? ((t / kKeyTile) * nblk + b) * kKeyTile + t % kKeyTile : t * nblk + b;
    return decode_elem(dtype_, data_.p.get(), sl.nib(t, j), fp16_to_fp32(scale_.as<uint16_t>()[at]));
  }
  const float sc = has_row_scale(dtype_) ? scale_.as<float>()[t] : 1.f;
  return decode_elem(dtype_, data_.p.get(), sl.at(t, j), sc);
}

float SideStore::entry_at(int64_t t, int64_t e) const {
  const float sc = scale_.n ? scale_.as<float>()[t] : 1.f;
  return decode_elem(dtype_, data_.p.get(), e, sc);
}

void SideStore::row_channels(int64_t t, int32_t* ch) const {
  if (mask_) {
    const uint8_t* m = mask_row(t);
    int k = 0;
    for (int i = 0; i < mb_; ++i)
      for (unsigned v = m[i]; v; v &= v - 1) ch[k++] = 8 * i + __builtin_ctz(v);
    return;
  }
  const int64_t b = row_begin(t);
  const int cnt = row_count(t);
  for (int j = 0; j < cnt; ++j) ch[j] = isz_ == 1 ? idx_.p[b + j] : idx_.as<uint16_t>()[b + j];
}

void SideStore::get(const SideEncoding& e, int64_t t, float* c) const {
  if (!sparse_) {
    if (const ChannelSubset* sub = e.channels.subset()) {
      std::fill(c, c + w_, 0.f);
      for (int j = 0; j < s_; ++j) c[sub->channels[static_cast<size_t>(j)]] = dense_at(t, j);
    } else {
      for (int j = 0; j < s_; ++j) c[j] = dense_at(t, j);
    }
    return;
  }
  const int64_t b = row_begin(t);
  const int cnt = row_count(t);
  const float* fp = fill_ ? fills_.as<float>() + t * nf_ : nullptr;
  const float fill = fp ? fp[0] : 0.f;
  // pruned coordinates: value fill, key recovery ±fill·r[c], or zero
  thread_local std::vector<char> kept;
  thread_local std::vector<int32_t> chs;
  kept.assign(static_cast<size_t>(w_), 0);
  chs.resize(static_cast<size_t>(cnt));
  row_channels(t, chs.data());
  for (int j = 0; j < cnt; ++j) {
    const int ch = chs[static_cast<size_t>(j)];
    c[ch] = entry_at(t, b + j);
    kept[static_cast<size_t>(ch)] = 1;
  }
  const uint8_t* sg = rec_ ? sign_row(t) : nullptr;
  const float* r = rec_ ? e.recovery()->scale.data() : nullptr;  // [w_]
  for (int i = 0; i < w_; ++i) {
    if (kept[static_cast<size_t>(i)]) continue;
    if (rec_) {
      const float f = e.pruned_magnitude(fp, i) * r[i];
      c[i] = ((sg[i >> 3] >> (i & 7)) & 1) ? -f : f;
    } else {
      c[i] = fill_ ? fill : 0.f;
    }
  }
}

bool SideStore::select(const std::vector<int32_t>& keep) {
  const int64_t n_keep = static_cast<int64_t>(keep.size());
  const int64_t cap = (n_keep + kKeyTile - 1) / kKeyTile * kKeyTile;
  int64_t ent = 0;
  if (sparse_) {
    for (int32_t t : keep) ent += row_count(t);
  }
  if (n_keep == n_ && cap == cap_ && ent == cap_ent_) return false;  // every row, exact storage
  realloc_to(cap, ent, /*grow=*/false, keep.data(), n_keep);
  return true;
}

void SideStore::truncate(int64_t n) {
  if (n >= n_) return;
  n_ = n;
  if (var_) off_.resize(static_cast<size_t>(n) + 1);
}

SideBytes SideStore::bytes() const {
  SideBytes b;
  const size_t n = static_cast<size_t>(n_);
  if (sparse_) {
    const int64_t ent = entries();
    b.elems = elem_bytes(ent);
    b.indices = (mask_ ? n * static_cast<size_t>(mb_) : static_cast<size_t>(ent) * static_cast<size_t>(isz_)) +
                (var_ ? (n + 1) * 4 : 0);
    if (scale_.n) b.scales += n * 4;
    b.fills = n * static_cast<size_t>(nf_) * 4;
    if (rec_) b.bitmasks = n * static_cast<size_t>(sb_);
    return b;
  }
  b.elems = block_scaled(dtype_) && !tiled_ ? n * static_cast<size_t>((s_ + 1) / 2)
                                               : elem_bytes(n_ * s_);
  if (has_row_scale(dtype_)) b.scales = n * 4;
  if (block_scaled(dtype_)) b.scales = n * static_cast<size_t>(n_blocks(s_)) * 2;
  return b;
}

}  // namespace kvtrim::kv
