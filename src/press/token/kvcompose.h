// KVCompose's press class (the maths is in kvcompose_core.h; the method, its options and
// its memory cost are described at the top of kvcompose.cpp and in docs/presses-kvcompose.md).
#pragma once
#include "press/press.h"
#include "press/token/kvcompose_core.h"

namespace kvtrim {

struct KVComposeOptions {
  enum class Weight { kNone, kVNorm, kVoNorm };
  Budget budget;              // ratio (fraction of entries removed) or budget (tokens per layer on average)
  int64_t total = 0;          // > 0: B_total, composite tokens kept over all layers (overrides budget)
  bool structured = true;     // mode=structured (composite tokens) | unstructured (appendix A.2)
  // task (the paper's T, §3.2.1): agnostic = the context re-fed after itself (the authors'
  // implementation; a second pass, src/engine/refeed.h), causal = the prefill's own causal
  // self-attention (kvtrim's first reading), aware = the question's queries.
  enum class Task { kAgnostic, kCausal, kAware };
  Task task = Task::kAgnostic;
  int64_t refeed_chunk = 512; // agnostic: re-fed tokens per chunk (0 = one chunk: the reference, 2x the cache)
  // aware: the question's own keys in each softmax's denominator (the authors' code feeds the
  // question with the cache; ObservedQueries::self_lse), else the softmax over the context only
  bool question_keys = true;
  kvcompose::StructuredOptions select;  // the reference's layer-0 boost and lower bound (off)
  kvcompose::Agg agg_task = kvcompose::Agg::kMax;   // eq. 14
  kvcompose::Agg agg_group = kvcompose::Agg::kMean; // eq. 15
  kvcompose::Agg agg_head = kvcompose::Agg::kMean;  // eq. 19
  bool mean_heads = true;     // eq. 16 (add the mean over kv heads)
  Weight weight = Weight::kNone;  // appendix A.1.3: none | vnorm | vonorm
};

class KVComposePress : public Press {
 public:
  explicit KVComposePress(KVComposeOptions o) : o_(o) {}
  std::string name() const override { return "kvcompose"; }
  PressNeeds needs() const override;
  CompressionPlan plan(const PressContext& ctx) const override;
  const KVComposeOptions& options() const { return o_; }
  // total= is an absolute B_total over all layers, not restated per head
  const Budget* token_budget() const override { return o_.total > 0 ? nullptr : &o_.budget; }
  // weight=vonorm needs W_O (model.layers()[il].wo, [n_embd, n_head * head_dim_v]), which
  // the PressContext does not carry: bind the model (or the per-layer W_O views) before
  // planning; plan() throws a clear Error otherwise.
  void bind_model(const Model& m);
  void bind_wo(std::vector<WeightView> wo) { wo_ = std::move(wo); }

  // The final scores S (eq. 16) of every (layer, kv head) token as the press sees them
  // (through ctx's view): [n_layer][n_head_kv][n_tokens]; -inf = not a candidate (a
  // sliding-window layer's token no future query can see). Exposed for tests and tools.
  std::vector<std::vector<std::vector<float>>> scores(const PressContext& ctx) const;

 private:
  KVComposeOptions o_;
  std::vector<WeightView> wo_;  // [n_layer] W_O per layer (vonorm only)
};

PressInfo kvcompose_press_info();

}  // namespace kvtrim
