// The cache's storage types (the precision axis, DESIGN.md §3): one table, an entry per type, with
// everything the rest of kvtrim needs to know of a type — its names, its codes' width, its scales,
// whether a rotation helps it, its codec and the attention kernels that read it. The CLI, the
// server, the cache, the byte counts and the kernels' dispatch all read this table; no other place
// lists the types. Adding a type: a KvDtype value, its row in kv_type.cpp, and its kernels
// (attn_kernels*.cpp) if none of the existing ones reads its codes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kv/kv_dtype.h"

namespace kvtrim {


// How a type's codes are scaled.
enum class KvScale : uint8_t {
  kNone,   // codes are the values
  kRow,    // one f32 scale per stored vector (and per per-token channel row)
  kBlock,  // one f16 scale per kKvBlock elements of a dense vector; per-token channel rows
           // have one f32 scale per row instead
};
inline constexpr int64_t kKvBlock = 32;  // elements per block scale (kBlock types)

// The codec and kernels of one type. Element index `at` counts codes: elements for types of 8 or
// more bits, nibbles for 4-bit types (byte at / 2, the high nibble when odd).
struct KvTypeOps {
  // codes[0 .. n) (one code per slot of the type's width; 4-bit codes one per byte, 0..15) of
  // x [n] under one scale, which it returns (1 for kNone). round_f16: the scale is stored as f16
  // (dense block scales), so its choice accounts for the rounding.
  float (*encode)(const float* x, int64_t n, uint8_t* codes, bool round_f16);
  // Element `at` of codes under `scale`.
  float (*decode)(const uint8_t* codes, int64_t at, float scale);
  // Dense keys (transposed tiles, quant_formats.h): s[g, t − b] (rows ld apart) = qs_g · k_t for
  // t in [b, b + nb); row_scale / block_scale: the store's scales (nullptr where it has none).
  void (*scores)(const float* qs, int G, int64_t d, const uint8_t* tiles, const float* row_scale,
                 const uint16_t* block_scale, int64_t b, int64_t nb, float* s, int64_t ld);
  // Dense values: acc[g, :] += Σ_t p[g, t] v_t over rows [0, nb) starting at `rows` (block
  // scales from `block_scale`); kRow types get p with the row scales already folded in.
  void (*accum)(const float* p, int G, int64_t ldp, const uint8_t* rows, const uint16_t* block_scale,
                int64_t nb, int64_t dv, float* acc);
};

struct KvTypeInfo {
  KvDtype type;
  const char* name;   // canonical name: the CLI, the server, results tags
  const char* alias;  // the name llama.cpp or the format uses, or nullptr
  int code_bits;      // bits per stored element: 32, 16, 8 or 4
  KvScale scale;
  // Codes on a uniform integer grid: a Hadamard rotation before encoding spreads outlier
  // channels over the grid and lowers the error (fp8's floating grid already follows the
  // magnitudes: measured on Gemma3-270M, the rotation raised fp8's ΔPPL from +0.05 to +0.27).
  bool integer_grid;
  // Per-token channel rows of this type have list / masked kernels (attn_kernels.h SparseRows,
  // MaskedRows); without them those rows go through the generic path.
  bool sparse_kernels;
  KvTypeOps ops;

  // Bytes of `count` codes stored contiguously (without scales).
  size_t code_bytes(int64_t count) const {
    return (static_cast<size_t>(count) * static_cast<size_t>(code_bits) + 7) / 8;
  }
  // Bytes of one dense vector of d elements with its scales (the uncompressed reference of
  // compression ratios).
  size_t dense_row_bytes(int d) const;
};

// The entry of a type (every KvDtype has one).
const KvTypeInfo& kv_type(KvDtype t);
// Every entry, in KvDtype order.
const std::vector<KvTypeInfo>& kv_types();
const char* kv_dtype_name(KvDtype t);
// Parses a cache type name or alias. Throws Error naming the accepted names otherwise.
KvDtype kv_dtype_from_name(std::string_view name);
// "f16" when both sides share a type, else "k=q8,v=f16" (results tags, the server's slots).
std::string kv_pair_name(KvDtype k, KvDtype v);
// Every accepted name and alias (for a command line's choice check).
std::vector<std::string> kv_type_names();
// "f32, f16, bf16, q8 (= q8_0), ..." for help texts and errors.
std::string kv_type_list();
// Whether the cache rotates vectors of this type and width by a Hadamard matrix before encoding
// (when rotation is on): integer grids of a power-of-two width (the fast transform's size).
bool kv_rotation_applies(KvDtype t, int d);

}  // namespace kvtrim
