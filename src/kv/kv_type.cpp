// The storage types' table (kv_type.h): names, widths, scales, codecs and kernels of each type.
#include "kv/kv_type.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/fp16.h"
#include "kv/attn_kernels.h"
#include "kv/quant_formats.h"

namespace kvtrim {
namespace {

using namespace kvtrim::kv;

template <class T>
const T* as(const uint8_t* p) {
  return reinterpret_cast<const T*>(p);
}

// ---- codecs ----
float encode_f32(const float* x, int64_t n, uint8_t* codes, bool) {
  std::memcpy(codes, x, static_cast<size_t>(n) * sizeof(float));
  return 1.f;
}
float encode_f16(const float* x, int64_t n, uint8_t* codes, bool) {  // SIMD row conversion
  f32_to_f16_row(x, reinterpret_cast<uint16_t*>(codes), n);
  return 1.f;
}
float encode_bf16(const float* x, int64_t n, uint8_t* codes, bool) {
  uint16_t* h = reinterpret_cast<uint16_t*>(codes);
  for (int64_t j = 0; j < n; ++j) h[j] = fp32_to_bf16(x[j]);
  return 1.f;
}
float encode_q8(const float* x, int64_t n, uint8_t* codes, bool) {
  return q8_encode(x, n, reinterpret_cast<int8_t*>(codes), 1);
}
float encode_fp8(const float* x, int64_t n, uint8_t* codes, bool) { return fp8_encode(x, n, codes, 1); }
float encode_q4(const float* x, int64_t n, uint8_t* codes, bool round_f16) {
  return q4_encode_search(x, n, codes, round_f16);
}

// f32 -> E5M2, round to nearest even, saturating (no infinities; NaN -> 0x7F). The codes are
// the top byte of the f16 of the same value, so the kernels widen them through f16.
float encode_e5m2(const float* x, int64_t n, uint8_t* codes, bool) {
  for (int64_t j = 0; j < n; ++j) {
    const uint32_t b = fp32_to_bits(x[j]), mag = b & 0x7fffffffu;
    const auto sign = static_cast<uint8_t>((b >> 24) & 0x80u);
    const float a = fp32_from_bits(mag);
    if (mag > 0x7f800000u) {
      codes[j] = sign | 0x7F;
    } else if (a >= 57344.f) {
      codes[j] = sign | 0x7B;   // the largest finite code, 1.75 · 2^15
    } else if (a < 0x1p-14f) {  // subnormal codes: steps of 2^-16 (4 steps reach 2^-14, code 4)
      codes[j] = sign | static_cast<uint8_t>(std::rint(a * 65536.f));
    } else {  // keep 2 of the 23 mantissa bits, ties to even; a carry lands in the exponent
      const uint32_t r = (mag + 0x000FFFFFu + ((mag >> 21) & 1u)) & 0xFFE00000u;
      const auto e = static_cast<uint32_t>(static_cast<int>(r >> 23) - 127 + 15);
      codes[j] = sign | static_cast<uint8_t>((e << 2) | ((r >> 21) & 3u));
    }
  }
  return 1.f;
}

float decode_f32(const uint8_t* c, int64_t at, float) { return as<float>(c)[at]; }
float decode_f16(const uint8_t* c, int64_t at, float) { return fp16_to_fp32(as<uint16_t>(c)[at]); }
float decode_bf16(const uint8_t* c, int64_t at, float) { return bf16_to_fp32(as<uint16_t>(c)[at]); }
float decode_q8(const uint8_t* c, int64_t at, float scale) {
  return static_cast<float>(as<int8_t>(c)[at]) * scale;
}
float decode_fp8(const uint8_t* c, int64_t at, float scale) { return fp8_e4m3_to_f32(c[at]) * scale; }
float decode_e5m2(const uint8_t* c, int64_t at, float) {
  return fp16_to_fp32(static_cast<uint16_t>(c[at] << 8));
}
float decode_q4(const uint8_t* c, int64_t at, float scale) {
  const int code = (at & 1) ? c[at >> 1] >> 4 : c[at >> 1] & 0x0F;
  return static_cast<float>(code - 8) * scale;
}

// ---- kernels, one signature for every type ----
// Element-coded types: attn_kernels.h's dense kernels, chosen by type.
template <KvDtype T>
void scores_dense(const float* qs, int G, int64_t d, const uint8_t* k, const float* row_scale,
                  const uint16_t*, int64_t b, int64_t nb, float* s, int64_t ld) {
  attn_scores_dense(T, qs, G, d, k, row_scale, b, nb, s, ld);
}
template <KvDtype T>
void accum_dense(const float* p, int G, int64_t ldp, const uint8_t* v, const uint16_t*, int64_t nb,
                 int64_t dv, float* acc) {
  attn_accum_dense(T, p, G, ldp, v, nb, dv, acc);
}
void scores_q4(const float* qs, int G, int64_t d, const uint8_t* k, const float*,
               const uint16_t* block_scale, int64_t b, int64_t nb, float* s, int64_t ld) {
  attn_scores_q4(qs, G, d, k, block_scale, b, nb, s, ld);
}

void accum_q4(const float* p, int G, int64_t ldp, const uint8_t* v, const uint16_t* block_scale,
              int64_t nb, int64_t dv, float* acc) {
  attn_accum_q4(p, G, ldp, v, block_scale, nb, dv, acc);
}

const std::vector<KvTypeInfo>& table() {
  static const std::vector<KvTypeInfo> t = {
      {KvDtype::kF32,
       "f32",
       nullptr,
       32,
       KvScale::kNone,
       false,
       true,
       {encode_f32, decode_f32, scores_dense<KvDtype::kF32>, accum_dense<KvDtype::kF32>}},
      {KvDtype::kF16,
       "f16",
       nullptr,
       16,
       KvScale::kNone,
       false,
       true,
       {encode_f16, decode_f16, scores_dense<KvDtype::kF16>, accum_dense<KvDtype::kF16>}},
      {KvDtype::kBF16,
       "bf16",
       nullptr,
       16,
       KvScale::kNone,
       false,
       true,
       {encode_bf16, decode_bf16, scores_dense<KvDtype::kBF16>, accum_dense<KvDtype::kBF16>}},
      {KvDtype::kQ8,
       "q8",
       "q8_0",
       8,
       KvScale::kRow,
       true,
       true,
       {encode_q8, decode_q8, scores_dense<KvDtype::kQ8>, accum_dense<KvDtype::kQ8>}},
      {KvDtype::kFP8,
       "fp8",
       "fp8_e4m3",
       8,
       KvScale::kRow,
       false,
       true,
       {encode_fp8, decode_fp8, scores_dense<KvDtype::kFP8>, accum_dense<KvDtype::kFP8>}},
      {KvDtype::kQ4,
       "q4",
       "q4_0",
       4,
       KvScale::kBlock,
       true,
       false,
       {encode_q4, decode_q4, scores_q4, accum_q4}},
      {KvDtype::kE5M2,
       "e5m2",
       "fp8_e5m2",
       8,
       KvScale::kNone,
       false,
       false,
       {encode_e5m2, decode_e5m2, scores_dense<KvDtype::kE5M2>, accum_dense<KvDtype::kE5M2>}},
  };
  return t;
}

}  // namespace

size_t KvTypeInfo::dense_row_bytes(int d) const {
  size_t scales = 0;
  if (scale == KvScale::kRow) scales = sizeof(float);
  if (scale == KvScale::kBlock) scales = sizeof(uint16_t) * static_cast<size_t>((d + kKvBlock - 1) / kKvBlock);
  return code_bytes(d) + scales;
}

const std::vector<KvTypeInfo>& kv_types() { return table(); }

const KvTypeInfo& kv_type(KvDtype t) {
  const auto i = static_cast<size_t>(t);
  KVTRIM_CHECK(i < table().size() && table()[i].type == t, "unknown KV cache type %d", static_cast<int>(t));
  return table()[i];
}

const char* kv_dtype_name(KvDtype t) { return kv_type(t).name; }

KvDtype kv_dtype_from_name(std::string_view name) {
  for (const KvTypeInfo& e : table())
    if (name == e.name || (e.alias && name == e.alias)) return e.type;
  throw Error("unknown KV cache type '" + std::string(name) + "' (expected one of: " + kv_type_list() + ")");
}

std::string kv_pair_name(KvDtype k, KvDtype v) {
  if (k == v) return kv_dtype_name(k);
  return std::string("k=") + kv_dtype_name(k) + ",v=" + kv_dtype_name(v);
}

std::vector<std::string> kv_type_names() {
  std::vector<std::string> names;
  for (const KvTypeInfo& e : table()) {
    names.emplace_back(e.name);
    if (e.alias) names.emplace_back(e.alias);
  }
  return names;
}

std::string kv_type_list() {
  std::string s;
  for (const KvTypeInfo& e : table()) {
    if (!s.empty()) s += ", ";
    s += e.name;
    if (e.alias) s += std::string(" (= ") + e.alias + ")";
  }
  return s;
}

bool kv_rotation_applies(KvDtype t, int d) { return kv_type(t).integer_grid && d > 0 && (d & (d - 1)) == 0; }

}  // namespace kvtrim
