// Per-target helpers shared by the sparse-row kernels (attn_kernels_sparse.cpp) and the masked-row
// kernels (attn_kernels_masked.cpp): the value types a per-token row may store and their widening
// to f32 in registers. Included from inside each kernel file's foreach_target pass (Highway's
// per-target header pattern: the guard toggles with HWY_TARGET_TOGGLE).
#if defined(KVTRIM_KV_SPARSE_VALUES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVTRIM_KV_SPARSE_VALUES_INL_H_
#undef KVTRIM_KV_SPARSE_VALUES_INL_H_
#else
#define KVTRIM_KV_SPARSE_VALUES_INL_H_
#endif

#include <cstdint>
#include <type_traits>

#include "core/fp16.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace kvtrim::kv {
namespace HWY_NAMESPACE {
namespace sv {
namespace hn = hwy::HWY_NAMESPACE;

struct Bf16 {  // tag: bf16 bits
  uint16_t b;
};

HWY_INLINE float scalar(float x) {
  return x;
}
HWY_INLINE float scalar(uint16_t h) {
  return fp16_to_fp32(h);
}
HWY_INLINE float scalar(Bf16 b) {
  return bf16_to_fp32(b.b);
}
HWY_INLINE float scalar(int8_t c) {
  return static_cast<float>(c);
}
HWY_INLINE float scalar(uint8_t b) {  // fp8 E4M3 · 2^-8
  return fp16_to_fp32(static_cast<uint16_t>(((b & 0x80u) << 8) | ((b & 0x7fu) << 7)));
}
// 2^8 for fp8 (undoing scalar / convert's 2^-8), else 1.
template <typename V>
constexpr float kValMul = std::is_same_v<V, uint8_t> ? 256.f : 1.f;
// Value types that carry one f32 scale per row (q8 codes, fp8 codes).
template <typename V>
constexpr bool kScaled = std::is_same_v<V, int8_t> || std::is_same_v<V, uint8_t>;

// Values as stored: Raw<V>::T elements (bf16 as uint16 bits).
template <typename V>
struct Raw {
  using T = V;
};
template <>
struct Raw<Bf16> {
  using T = uint16_t;
};
// Lanes(df) raw elements -> f32 (fp8: · 2^-8, exact: the E4M3 code's bits placed in an f16).
template <typename V, class DF, class VR>
HWY_INLINE hn::Vec<DF> convert(DF df, VR raw) {
  if constexpr (std::is_same_v<V, float>) {
    return raw;
  } else if constexpr (std::is_same_v<V, uint16_t>) {
    return hn::PromoteTo(df, hn::BitCast(hn::Rebind<hwy::float16_t, DF>(), raw));
  } else if constexpr (std::is_same_v<V, Bf16>) {
    return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(hn::Rebind<uint32_t, DF>(), raw)));
  } else if constexpr (std::is_same_v<V, int8_t>) {
    return hn::ConvertTo(df, hn::PromoteTo(hn::Rebind<int32_t, DF>(), raw));
  } else {  // fp8 E4M3 via f16 bits sign << 15 | (code & 0x7F) << 7
    const hn::Rebind<uint16_t, DF> du16;
    const auto w = hn::ShiftLeft<7>(hn::PromoteTo(du16, raw));
    return hn::PromoteTo(df, hn::BitCast(hn::Rebind<hwy::float16_t, DF>(),
                                         hn::Add(w, hn::And(w, hn::Set(du16, 0x4000)))));
  }
}
// Lanes(df) stored values from p, as f32.
template <class DF, typename V>
HWY_INLINE hn::Vec<DF> decode(DF df, const V* p) {
  const hn::Rebind<typename Raw<V>::T, DF> dr;
  return convert<V>(df, hn::LoadU(dr, reinterpret_cast<const typename Raw<V>::T*>(p)));
}

}  // namespace sv
}  // namespace HWY_NAMESPACE
}  // namespace kvtrim::kv
HWY_AFTER_NAMESPACE();

#endif  // KVTRIM_KV_SPARSE_VALUES_INL_H_
