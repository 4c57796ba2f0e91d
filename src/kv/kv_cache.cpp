// Shared parts of the KV cache interface (kv_cache.h): dtype names and the uncompressed
// byte count that compression ratios are measured against.
#include "kv/kv_cache.h"

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
  }
  return "?";
}

size_t KvCache::dense_bytes_f16() const {
  // f16 K and V for every position 0 .. n_past()-1, in every layer and KV head.
  const size_t per_token = static_cast<size_t>(cfg_.n_head_kv) *
                           static_cast<size_t>(cfg_.head_dim_k + cfg_.head_dim_v) *
                           sizeof(uint16_t);
  return static_cast<size_t>(cfg_.n_layer) * static_cast<size_t>(n_past_) * per_token;
}

}  // namespace kvtrim
