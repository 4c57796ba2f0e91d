// What one compression lost, estimated by the engine for any press (issue 40's quality guard;
// docs/presses.md "Loss estimate"). On the context's observation window — the last W = 32
// queries of each layer (post-RoPE), which the session's observer keeps when
// SessionParams::press_loss is on — before the plan is applied and again after:
//   o_full[il] = attention of the window queries over the cache as it is before the plan
//                (KvCache::attend: causal by position, the layer's sliding window),
//   o_comp[il] = the same over what the cache holds after, read through the cache's own
//                attention on the compressed data (dropped tokens, pruned channels, low-rank
//                or quantized storage all count),
//   e[il]      = ||o_full - o_comp||_F / ||o_full||_F over the window queries and query heads;
//   rel_err    = mean over layers of e[il]; rel_err_max = max over layers (and which layer).
// For presses that remove tokens also the evicted attention mass: the fraction of the window
// queries' softmax mass (before the plan, over all query heads) that fell on tokens the plan
// removed (0 when none was removed).
// Cost: 2 x W queries attending over the stored tokens of every layer, plus one read of every
// head's keys for the mass — about 2W/n_ctx of a prefill's attention, nothing of its matmuls.
#pragma once
#include <cstdint>
#include <vector>

#include "kv/kv_cache.h"
#include "model/model.h"
#include "press/press.h"

namespace kvtrim {

class ThreadPool;

// The window the estimate uses: the last W queries of each layer (the SnapKV window).
constexpr int64_t kLossWindow = 32;

struct PressLoss {
  bool measured = false;       // false: no estimate (off, or no window queries captured)
  int64_t n_queries = 0;       // window queries per layer it was measured on (<= kLossWindow)
  double rel_err = 0;          // mean over layers of the attention output's relative error
  double rel_err_max = 0;      // the largest layer's relative error ...
  int max_layer = -1;          // ... and that layer
  double evicted_mass = 0;     // fraction of the window's attention mass on removed tokens
  int64_t tokens_removed = 0;  // tokens the plan removed, all (layer, kv head)
  double seconds = 0;          // time the estimate took (before + after)
};

// Taken before the plan is applied (the reference outputs and each stored token's attention
// mass), finished after it (the outputs over the compressed cache).
class PressLossProbe {
 public:
  // Nothing is measured (active() false) unless every layer has window queries.
  PressLossProbe(const Model& model, const KvCache& cache, const Observations* obs,
                 ThreadPool* pool);
  bool active() const { return active_; }
  // The estimate against `cache` as it is now (the same cache, after its plan was applied).
  PressLoss finish(const KvCache& cache) const;

 private:
  AttnParams layer_params(int il) const;
  const Model& model_;
  ThreadPool* pool_;
  bool active_ = false;
  double seconds_ = 0;
  std::vector<ObservedQueries> q_;          // [n_layer]: the window queries
  std::vector<std::vector<float>> o_full_;  // [n_layer] each [n_q, n_head, head_dim_v]
  std::vector<std::vector<int32_t>> pos_;   // [n_layer * n_head_kv]: stored positions before
  std::vector<std::vector<float>> mass_;    // same layout: each token's summed attention
  double mass_total_ = 0;                   // n_layer * n_head * n_q (each row sums to 1)
};

}  // namespace kvtrim
