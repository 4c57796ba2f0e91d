// Element types of the KV cache (the precision axis, DESIGN.md §3) and their names.
#pragma once
#include <cstddef>
#include <string>

#include "ops/rope.h"  // RopeSpec: a key basis with one describes the key before RoPE (Palu, plan.h)

namespace kvtrim {

// Precision of stored K or V elements (keys and values may differ: KvCacheConfig::dtype_k /
// dtype_v, and each epoch of a plan may set its own).
//  kF32 / kF16 / kBF16: IEEE float, half, bfloat16 (round to nearest even).
//  kQ8:  int8 codes, one f32 scale per stored vector (scale = max|x| / 127).
//  kFP8: fp8 E4M3 codes (OCP), one f32 scale per stored vector (scale = max|x| / 448).
//  kQ4:  4-bit codes in blocks of 32 elements, one f16 scale per block (llama.cpp's q4_0 rule);
//        in per-token channel rows (sparse) one f32 scale per row instead.
enum class KvDtype { kF32, kF16, kBF16, kQ8, kFP8, kQ4 };

// How a pruned key coordinate with recovery reads (plan.h ChannelSpec): one fill per token, or a
// draw per coordinate from a distribution with the token's parameters (SPARK's F).
enum class RecoveryDist : unsigned char { kFill, kGaussian, kExponential };

// How per-token channel rows record which coordinates they keep (plan.h ChannelSpec::index):
//  kList: one index per kept entry (uint8, uint16 when the width is over 256) — the papers' layout;
//  kBitmask: one bit per coordinate, ceil(w / 8) bytes per row (any per-token rows: fixed or
//            variable counts, with or without recovery / fill; the masked kernels read it);
//  kAuto: the bitmask where it is smaller (ceil(w / 8) < T · index size; variable counts: against
//         the plan's mean count), else a list.
enum class IndexLayout : unsigned char { kAuto, kList, kBitmask };

const char* kv_dtype_name(KvDtype t);
// Parses a cache type name: f32, f16, bf16, q8 (also q8_0, llama.cpp's name), fp8 (also
// fp8_e4m3), q4 (also q4_0). Throws Error naming the accepted names otherwise.
KvDtype kv_dtype_from_name(const std::string& name);

}  // namespace kvtrim
