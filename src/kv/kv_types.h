// Small enums of the cache's encodings (plan.h), and its storage types (kv_type.h).
#pragma once
#include <cstddef>
#include <string>

#include "kv/kv_type.h"
#include "ops/rope.h"  // RopeSpec: a key basis with one describes the key before RoPE (Palu, plan.h)

namespace kvtrim {

// How a pruned key coordinate with recovery reads (channel_stage.h KeyRecovery): one fill per
// token, or a draw per coordinate from a distribution with the token's parameters (SPARK's F).
enum class RecoveryDist : unsigned char { kFill, kGaussian, kExponential };

// How per-token channel rows record which coordinates they keep (channel_stage.h, per-token kinds):
//  kList: one index per kept entry (uint8, uint16 when the width is over 256) — the papers' layout;
//  kBitmask: one bit per coordinate, ceil(w / 8) bytes per row (any per-token rows: fixed or
//            variable counts, with or without recovery / fill; the masked kernels read it);
//  kAuto: the bitmask where it is smaller (ceil(w / 8) < T · index size; variable counts: against
//         the plan's mean count), else a list.
enum class IndexLayout : unsigned char { kAuto, kList, kBitmask };

}  // namespace kvtrim
