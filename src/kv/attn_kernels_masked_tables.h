// The lookup tables of the masked-row kernels (attn_kernels_masked.cpp and its AVX-512 part,
// attn_kernels_masked_zmm-inl.h): built at compile time, shared by every SIMD target.
#pragma once
#include <cstdint>

namespace kvtrim::kv::masked {

// Per mask byte v (8 lanes) and nibble v (4 lanes): perm[v][i] = the number of set bits of v
// below bit i (the packed entry lane i reads when bit i is set; 0 otherwise), lanes[v][i] = -1
// where bit i is set (a lane mask), cnt[v] = the set bits (a table: __builtin_popcount is a
// library call without -mpopcnt).
struct Tables {
  alignas(32) int32_t perm8[256][8];
  alignas(32) int32_t lanes8[256][8];
  alignas(
      32) int32_t permk8[256][8];  // perm8[v] | 0x80000000 on the kept lanes (x86: index + mask)
  alignas(32) uint32_t sign8[256][8];  // 0x80000000 where bit i of v is set (a sign flip)
  alignas(16) int32_t perm4[16][4];
  alignas(16) int32_t lanes4[16][4];
  uint8_t cnt[256];
};
constexpr Tables make_tables() {
  Tables t{};
  for (int v = 0; v < 256; ++v) {
    int k = 0;
    for (int i = 0; i < 8; ++i) {
      const bool on = (v >> i) & 1;
      t.perm8[v][i] = on ? k : 0;
      t.lanes8[v][i] = on ? -1 : 0;
      t.permk8[v][i] = on ? static_cast<int32_t>(static_cast<uint32_t>(k) | 0x80000000u) : 0;
      t.sign8[v][i] = on ? 0x80000000u : 0u;
      if (v < 16 && i < 4) {
        t.perm4[v][i] = on ? k : 0;
        t.lanes4[v][i] = on ? -1 : 0;
      }
      k += on;
    }
    t.cnt[v] = static_cast<uint8_t>(k);
  }
  return t;
}
inline constexpr Tables kTables = make_tables();
constexpr uint8_t kZeroSigns[64] = {};  // the sign row of rows without signs (dim <= 512)
constexpr int64_t kChunkRows = 64;      // rows expanded at once for the accumulation

}  // namespace kvtrim::kv::masked
