// Shared parts of the KV cache interface (kv_cache.h): the uncompressed byte count that
// compression ratios are measured against.
#include "kv/kv_cache.h"

#include <unordered_set>

#include "core/error.h"

namespace kvtrim {

size_t KvCacheConfig::dense_bytes_per_token() const {
  const size_t head = kv_type(type_k()).dense_row_bytes(head_dim_k) + kv_type(type_v()).dense_row_bytes(head_dim_v);
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
