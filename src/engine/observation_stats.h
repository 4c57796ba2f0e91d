// The statistics the session's observer keeps for a press (engine/press_runner.h), one class
// each: what it records from the forward pass, and how it stays aligned with the cache when
// the cache applies a plan or is truncated. Each writes its own part of Observations (the
// press-facing data, press/press.h); the observer only decides which are active and routes
// the forward's calls to them. The per-token rows are Observations::stat(TokenStat), sized,
// grown, kept and truncated by the statistic's row width (token_stat_width).
//   RecentQueries        window            the last W post-RoPE queries per layer (SnapKV, ...)
//   CumulativeAttention  kCumAttn/Count    attention each stored token received (H2O)
//   TaskAttention        kTaskMax/Sum,     causal KVCompose's eq. 14, online
//                        task_pos
//   QuestionQueries      question          the question's queries and their self_lse
//   RefeedScores         kRefeedMax/Sum,   the re-feed passes (src/engine/refeed.h)
//                        kKvzip, refeed_m
#pragma once
#include <cstdint>
#include <vector>

#include "kv/kv_cache.h"
#include "model/model.h"
#include "press/press.h"

namespace kvtrim {

class ThreadPool;

// What every statistic works on: the model's shapes, the cache as stored (the chunk being
// observed is not in it yet), the observations it writes, the pool to run on.
struct StatContext {
  const Model& model;
  const KvCache& cache;
  Observations& obs;
  ThreadPool* pool = nullptr;
  const HParams& hp() const { return model.hparams(); }
};

// A statistic fed by the context's forward chunks.
class ObservationStat {
 public:
  virtual ~ObservationStat() = default;
  // Sized for the tokens stored now (zero rows), nothing recorded yet.
  virtual void reset(StatContext& c) = 0;
  // A context chunk of layer il: q [n, n_head, head_dim_k], k [n, n_head_kv, head_dim_k], pos
  // [n] (its tokens are appended to the cache after this call). accumulate == false: keep the
  // per-token rows aligned with the cache, add no attention (decode steps nobody will score).
  virtual void on_context(StatContext& c, int il, int64_t n, const float* q, const float* k, const int32_t* pos,
                          bool accumulate) = 0;
  // The cache applied `plan` (heads layer-major): keep the kept tokens' rows.
  virtual void on_apply(StatContext& c, const CompressionPlan& plan) = 0;
  // The cache was truncated to positions < pos.
  virtual void on_truncate(StatContext& c, int32_t pos) = 0;
};

class RecentQueries : public ObservationStat {
 public:
  explicit RecentQueries(int64_t window) : window_(window) {}
  void reset(StatContext& c) override;
  void on_context(StatContext& c, int il, int64_t n, const float* q, const float* k, const int32_t* pos,
                  bool accumulate) override;
  void on_apply(StatContext&, const CompressionPlan&) override {}  // queries, not token rows
  void on_truncate(StatContext& c, int32_t pos) override;

 private:
  int64_t window_;  // PressNeeds::window (kAllQueries: every query)
};

// H2O: attention of each chunk's queries over the stored tokens plus the chunk's own keys
// (causal, sliding window), summed over the GQA group into each token's cumulative attention;
// kCumCount counts the queries that could see the token.
class CumulativeAttention : public ObservationStat {
 public:
  void reset(StatContext& c) override;
  void on_context(StatContext& c, int il, int64_t n, const float* q, const float* k, const int32_t* pos,
                  bool accumulate) override;
  void on_apply(StatContext& c, const CompressionPlan& plan) override;
  void on_truncate(StatContext& c, int32_t pos) override;
};

// Task-causal KVCompose (eq. 14 online): each chunk's queries attend over the stored tokens
// plus the chunk's own keys, folded into the running max and sum of each (token, query head);
// task_pos holds the accumulated queries' positions (M).
class TaskAttention : public ObservationStat {
 public:
  void reset(StatContext& c) override;
  void on_context(StatContext& c, int il, int64_t n, const float* q, const float* k, const int32_t* pos,
                  bool accumulate) override;
  void on_apply(StatContext& c, const CompressionPlan& plan) override;
  void on_truncate(StatContext& c, int32_t pos) override;
};

// The question's queries (query-aware presses): replaced by each new question; for each query
// and head, the log-sum-exp of its logits over the question's own keys (self_lse), kept while
// the question's tokens are briefly in the cache.
class QuestionQueries {
 public:
  void begin(StatContext& c);
  void on_chunk(StatContext& c, int il, int64_t n, const float* q, const float* k, const int32_t* pos);
  void end();
  static void clear(StatContext& c);

 private:
  std::vector<char> started_;               // per layer: the current question's first chunk seen
  std::vector<std::vector<float>> k_;       // per layer: its keys [n, n_head_kv, head_dim_k]
  std::vector<std::vector<int32_t>> kpos_;  // and their positions
};

// The re-feed passes (src/engine/refeed.h; modes documented at PressObserver).
class RefeedScores {
 public:
  enum class Mode { kOff, kContext, kKvzip };
  void start(StatContext& c, bool context, bool kvzip, int kvzip_sinks);
  void begin(StatContext& c, Mode mode, int32_t lo, int32_t hi);
  void end() { mode_ = Mode::kOff; }
  bool active() const { return mode_ != Mode::kOff; }
  static void clear(StatContext& c);  // not current any more
  // A re-feed chunk of layer il: scores the stored context.
  void on_chunk(StatContext& c, int il, int64_t n, const float* q, const float* k, const int32_t* pos);
  // A context chunk: the context grows, the results go stale.
  void on_context(StatContext& c, int il) const;
  void on_apply(StatContext& c, const CompressionPlan& plan) const;
  void on_truncate(StatContext& c, int32_t pos) const;
  // Observations restored with the cache they were saved with (Session::restore_state).
  void on_restore(const KvCache& cache) {
    mode_ = Mode::kOff;
    n_past_ = cache.n_past();
  }

 private:
  Mode mode_ = Mode::kOff;
  int32_t n_past_ = 0;  // the context's length (n_context): the results belong to it
  int32_t lo_ = 0, hi_ = 0;
  int sinks_ = 0;
};

// Attention of layer il: its sliding window (0 = none) and scale.
int layer_window(const HParams& hp, int il);
float attention_scale(const HParams& hp);

}  // namespace kvtrim
