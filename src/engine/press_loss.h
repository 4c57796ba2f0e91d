// What one compression lost, estimated by the engine for any press (issue 40's quality guard;
// docs/presses.md "Loss estimate"). On probe queries Q — the question's when one was observed
// for this compression (Observations::question: Session::observe_question, the kvpress
// protocol's question after the compressed context), else the context's observation window
// (the last W = 32 queries of each layer, post-RoPE, which the session's observer keeps when
// SessionParams::press_loss is on); at most the last W of either — before the plan is applied
// and again after:
//   o_full[il] = attention of Q over the cache as it is before the plan (KvCache::attend:
//                causal by position, the layer's sliding window; a question's queries see the
//                context only, not the question's own keys),
//   o_comp[il] = the same over what the cache holds after, read through the cache's own
//                attention on the compressed data (dropped tokens, pruned channels, low-rank
//                or quantized storage all count),
//   e[il]      = ||o_full - o_comp||_F / ||o_full||_F over Q and the query heads;
//   rel_err    = mean over layers of e[il]; rel_err_max = max over layers (and which layer).
// The question is preferred because SnapKV-like presses choose what to keep from the very
// window queries: measured on them, their estimate is low by construction and does not rank
// them against other presses (docs/results/chat/press_loss.md). A question counts only while
// it lies after everything stored (its first position >= KvCache::n_past(): a question since
// prefilled, e.g. before a decode-time compression, is stale and the window is used).
// For presses that remove tokens also the evicted attention mass: the fraction of Q's softmax
// mass (before the plan, over all query heads) that fell on tokens the plan removed (0 when
// none was removed).
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

// The window the estimate uses: the last W queries of each layer (the SnapKV window); also the
// most of a question's queries it uses (its last W).
constexpr int64_t kLossWindow = 32;

// Which queries an estimate was measured on (PressLoss::queries).
enum class LossQueries { kWindow, kQuestion };
// "window" | "question" (the JSON value of press_loss_queries).
const char* loss_queries_name(LossQueries q);

struct PressLoss {
  bool measured = false;       // false: no estimate (off, or no queries captured)
  LossQueries queries = LossQueries::kWindow;  // the question's or the window's
  int64_t n_queries = 0;       // queries per layer it was measured on (<= kLossWindow)
  double rel_err = 0;          // mean over layers of the attention output's relative error
  double rel_err_max = 0;      // the largest layer's relative error ...
  int max_layer = -1;          // ... and that layer
  double evicted_mass = 0;     // fraction of the queries' attention mass on removed tokens
  int64_t tokens_removed = 0;  // tokens the plan removed, all (layer, kv head)
  double seconds = 0;          // time the estimate took (before + after)
};

// Taken before the plan is applied (the reference outputs and each stored token's attention
// mass), finished after it (the outputs over the compressed cache).
class PressLossProbe {
 public:
  // On obs->question when every layer has question queries after the stored context, else on
  // obs->window; nothing is measured (active() false) unless every layer has one of them.
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
  LossQueries which_ = LossQueries::kWindow;
  std::vector<ObservedQueries> q_;          // [n_layer]: the probe queries (last <= W)
  std::vector<std::vector<float>> o_full_;  // [n_layer] each [n_q, n_head, head_dim_v]
  std::vector<std::vector<int32_t>> pos_;   // [n_layer * n_head_kv]: stored positions before
  std::vector<std::vector<float>> mass_;    // same layout: each token's summed attention
  double mass_total_ = 0;                   // n_layer * n_head * n_q (each row sums to 1)
};

}  // namespace kvtrim
