// Shared parts of the KV cache interface (kv_cache.h): dtype names and the uncompressed
// byte count that compression ratios are measured against.
#include "kv/kv_cache.h"

#include <unordered_set>

#include "core/error.h"

namespace kvtrim {

const char* kv_dtype_name(KvDtype t) {
  switch (t) {
    case KvDtype::kF32:
      return "f32";
    case KvDtype::kF16:
      return "f16";
    case KvDtype::kBF16:
      return "bf16";
    case KvDtype::kQ8:
      return "q8";
    case KvDtype::kFP8:
      return "fp8";
    case KvDtype::kQ4:
      return "q4";
  }
  return "?";
}

KvDtype kv_dtype_from_name(const std::string& name) {
  if (name == "f32") return KvDtype::kF32;
  if (name == "f16") return KvDtype::kF16;
  if (name == "bf16") return KvDtype::kBF16;
  if (name == "q8" || name == "q8_0") return KvDtype::kQ8;
  if (name == "fp8" || name == "fp8_e4m3") return KvDtype::kFP8;
  if (name == "q4" || name == "q4_0") return KvDtype::kQ4;
  throw Error("unknown KV cache type '" + name +
              "' (expected one of: f32, f16, bf16, q8 (= q8_0), fp8 (= fp8_e4m3), q4 (= q4_0))");
}

namespace {
// One stored row of d elements (side_store.h): plain types, q8 / fp8 with an f32 row scale,
// q4 two elements a byte with an f16 scale per block of 32.
size_t dense_row_bytes(KvDtype t, int d) {
  const size_t n = static_cast<size_t>(d);
  switch (t) {
    case KvDtype::kF32: return 4 * n;
    case KvDtype::kF16:
    case KvDtype::kBF16: return 2 * n;
    case KvDtype::kQ8:
    case KvDtype::kFP8: return n + 4;
    case KvDtype::kQ4: return (n + 1) / 2 + 2 * ((n + 31) / 32);
  }
  return 4 * n;
}
}  // namespace

size_t KvCacheConfig::dense_bytes_per_token() const {
  const size_t head = dense_row_bytes(type_k(), head_dim_k) + dense_row_bytes(type_v(), head_dim_v);
  return static_cast<size_t>(n_layer) * (static_cast<size_t>(n_head_kv) * head + sizeof(int32_t));
}

size_t KvCache::dense_bytes_f16() const {
  // f16 K and V for every position 0 .. n_past()-1, in every layer and KV head.
  const size_t per_token = static_cast<size_t>(cfg_.n_head_kv) *
                           static_cast<size_t>(cfg_.head_dim_k + cfg_.head_dim_v) *
                           sizeof(uint16_t);
  return static_cast<size_t>(cfg_.n_layer) * static_cast<size_t>(n_past_) * per_token;
}

size_t held_once(const std::vector<KvBytes>& caches, size_t* bases_once) {
  std::unordered_set<const void*> seen;
  size_t rest = 0, bases = 0;
  for (const KvBytes& b : caches) {
    rest += b.total() - b.bases;
    for (const auto& [id, n] : b.basis_ids)
      if (seen.insert(id).second) bases += n;
  }
  if (bases_once) *bases_once = bases;
  return rest + bases;
}

}  // namespace kvtrim
