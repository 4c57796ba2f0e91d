// Presses: KV-cache compression policies (DESIGN.md §2, §3). A press PLANS what each
// (layer, kv head) keeps; the cache APPLIES the plan (only the cache mutates storage).
//
// What a press sees is a PressContext: the cache (read one head at a time, never a dense
// copy of the whole cache), the model's hyper-parameters, and the observations the session
// captured for it during the forward pass (the last W post-RoPE queries of each layer with
// their positions; optionally the queries of a task/question, for query-aware mode;
// optionally per-token statistics, each keyed by a TokenStat and read through
// PressContext::token_stat: the cumulative attention each stored token received, for H2O;
// the running max / sum of the attention every context query gave each stored token, for
// KVCompose; KVzip's reconstruction scores). What the session must capture is declared by
// Press::needs().
//
// Budgets follow kvpress: `ratio` is the fraction of tokens REMOVED, in [0, 1); a head with
// n tokens keeps int(n * (1 - ratio)) as kvpress computes it (Budget::keep_count). An
// absolute budget (`budget=N`) keeps N tokens per (layer, kv head).
//
// Press strings (make_press; parsed by press_spec.h):
//   name[:opt=value,opt=value,...][+name[:...]]...
//   snapkv:ratio=0.5,window=32+streamingllm:sinks=4     composition: applied in sequence,
//                                                      each on what the previous one left
//   snapkv:0.5                                         a bare first value sets `ratio`
//   adakv(snapkv:ratio=0.5,window=32):alpha=0.2        a wrapper takes its inner press in ()
// Errors (Error, message names press / option / value and lists what is valid): unknown
// press, unknown option, bad value, ratio outside [0, 1), a wrapper without an inner press.
//
// Adding a press: one file in src/press/<axis>/ (token, basis, channel) defining the Press (a
// token press is usually a ScorerPress: score every token, the base keeps the top-k) and a
// `PressInfo xxx_press_info()` naming its axis; one line in src/press/builtin_presses.cpp. The
// sweep of its axis then covers it (docs/HOWTO-add-press.md).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kv/kv_cache.h"
#include "model/model.h"

namespace kvtrim {

class ThreadPool;
struct PressSpec;

// ---------------------------------------------------------------------------------------
// Budget

struct Budget {
  double ratio = 0;    // fraction of tokens removed, [0, 1) (kvpress compression_ratio)
  int64_t n_keep = 0;  // > 0: absolute tokens kept per (layer, kv head); overrides ratio
  // Tokens a head holding n_tok tokens keeps: n_keep > 0 ? min(n_keep, n_tok)
  // : int(n_tok * (1 - ratio)), clamped to [min(1, n_tok), n_tok] (a head never goes empty).
  int64_t keep_count(int64_t n_tok) const;
  bool is_noop() const { return n_keep <= 0 && ratio <= 0; }
  std::string describe() const;  // "ratio=0.5" / "budget=128"
};

// ---------------------------------------------------------------------------------------
// Observations (captured by the session's observer during forward)

// Post-RoPE queries of one layer: q [n, n_head, head_dim_k], pos [n] (increasing).
struct ObservedQueries {
  int64_t n = 0;
  std::vector<float> q;
  std::vector<int32_t> pos;
  // The question's only (Observations::question): [n, n_head], log Σ_j exp(scale · q·k_j) over
  // the question's own keys visible to each query (causal, sliding window): the part of its
  // softmax denominator that is gone with the question's tokens when the press plans. Empty
  // elsewhere.
  std::vector<float> self_lse;
  const float* query(int64_t i, int h, int n_head, int head_dim) const {
    return q.data() + (static_cast<size_t>(i) * static_cast<size_t>(n_head) + static_cast<size_t>(h)) * static_cast<size_t>(head_dim);
  }
};

// The per-token statistics the observer can capture for a press, one key each. Every one is
// held as [n_layer * n_head_kv] rows (index il * n_head_kv + ih), each [n_tokens(il, ih) *
// width] aligned with the head's stored tokens: width 1, or the GQA group (row c = stored token
// c, column g = query head ih * group + g) for those that keep one value per query head.
//   kCumAttn   H2O (PressNeeds::cum_attn): attention received by each stored token, summed over
//              every query that saw it (all query heads of the kv group).
//   kCumCount  with kCumAttn: how many queries could see each token (causal).
//   kTaskMax,  task-causal KVCompose (PressNeeds::task_attn, eq. 14 online): the running max /
//   kTaskSum   running sum over every context query m (not the question's) of A[h, c, m] =
//              softmax over m's visible tokens (causal, sliding window) of scale · q_m·k_c.
//              Memory: 2 · n_tokens · n_head floats per layer, never the queries.
//   kRefeedMax, as kTaskMax / kTaskSum over the queries of the re-fed context (PressNeeds::refeed
//   kRefeedSum  .context: KVCompose's T = {C}, the authors' KVComposePress).
//   kKvzip     KVzip's score of each stored token (PressNeeds::refeed.kvzip): the max over the
//              group's query heads and every query of the reconstruction chunk that holds it of
//              the softmax over (sinks, the chunk's stored tokens, the reconstruction's own
//              tokens); the first `sinks` positions score 1.
enum class TokenStat : uint8_t {
  kCumAttn,
  kCumCount,
  kTaskMax,
  kTaskSum,
  kRefeedMax,
  kRefeedSum,
  kKvzip
};
inline constexpr size_t kTokenStatCount = 7;

// What PressContext::token_stat says about a statistic, and its row width.
struct TokenStatInfo {
  TokenStat stat;       // the row's key (kTokenStatInfo[i].stat == TokenStat(i))
  const char* needs;    // what a press lacks, in "press '<who>' needs <needs>"
  const char* missing;  // why, in "..., but <missing>" (which capture produces it)
  const char* covers;   // the size error's "press '<who>': <covers> layer %d head %d ..."
  bool per_query_head;  // rows of group() floats (one per query head of the kv group), else 1
};

inline constexpr TokenStatInfo kTokenStatInfo[kTokenStatCount] = {
    {TokenStat::kCumAttn, "the cumulative attention of every token", "it was not captured",
     "cumulative attention of", false},
    {TokenStat::kCumCount, "the cumulative attention of every token", "it was not captured",
     "cumulative query counts of", false},
    {TokenStat::kTaskMax, "the task attention accumulators", "they were not captured",
     "task attention of", true},
    {TokenStat::kTaskSum, "the task attention accumulators", "they were not captured",
     "task attention of", true},
    {TokenStat::kRefeedMax, "the re-feed of the context (a second pass after the prefill)",
     "it did not run: compress through the session (Session::compress / prepare_compress)",
     "the re-feed of", true},
    {TokenStat::kRefeedSum, "the re-feed of the context (a second pass after the prefill)",
     "it did not run: compress through the session (Session::compress / prepare_compress)",
     "the re-feed of", true},
    {TokenStat::kKvzip, "the context reconstruction pass (a second pass after the prefill)",
     "it did not run: compress through the session (Session::compress / prepare_compress)",
     "the reconstruction scoring of", false},
};
constexpr bool token_stat_table_complete() {
  for (size_t i = 0; i < kTokenStatCount; ++i)
    if (static_cast<size_t>(kTokenStatInfo[i].stat) != i || kTokenStatInfo[i].needs == nullptr)
      return false;
  return static_cast<size_t>(TokenStat::kKvzip) + 1 == kTokenStatCount;
}
static_assert(token_stat_table_complete(), "kTokenStatInfo: one row per TokenStat, in order");

constexpr const TokenStatInfo& token_stat_info(TokenStat s) {
  return kTokenStatInfo[static_cast<size_t>(s)];
}
// Floats per stored token of statistic s for a model with `group` query heads per kv head.
constexpr size_t token_stat_width(TokenStat s, int group) {
  return token_stat_info(s).per_query_head ? static_cast<size_t>(group) : 1;
}

struct Observations {
  // [n_layer]: the last W queries of each layer seen by forward (prefill and decode).
  std::vector<ObservedQueries> window;
  // [n_layer]: the queries of the task/question (query-aware mode); empty when not captured.
  std::vector<ObservedQueries> question;
  // The per-token statistics (TokenStat), each [n_layer * n_head_kv] rows of [n_tokens(il, ih)
  // * token_stat_width] floats aligned with the head's stored tokens; empty when not captured.
  std::array<std::vector<std::vector<float>>, kTokenStatCount> stats;
  std::vector<std::vector<float>>& stat(TokenStat s) { return stats[static_cast<size_t>(s)]; }
  const std::vector<std::vector<float>>& stat(TokenStat s) const {
    return stats[static_cast<size_t>(s)];
  }
  bool has(TokenStat s) const { return !stat(s).empty(); }
  // With kTaskMax / kTaskSum: [n_layer] the positions of the queries accumulated at each layer
  // (M = their count).
  std::vector<std::vector<int32_t>> task_pos;
  // The re-feed (PressNeeds::refeed, Session::prepare_compress): the context run through the
  // model a second time after itself, chunk by chunk, reading the cache and keeping none of
  // its own tokens (src/engine/refeed.h); it fills kRefeedMax / kRefeedSum / kKvzip. Valid for
  // the context as it was when the pass ran: any token appended afterwards clears them (the
  // next compress re-feeds again). refeed_m [n_layer]: how many re-fed queries (M).
  std::vector<int64_t> refeed_m;
  bool refeed_current = false;  // the re-feed results above hold for the context as stored
  bool has_window() const { return !window.empty(); }
  bool has_refeed() const { return has(TokenStat::kRefeedMax); }
  bool has_kvzip() const { return has(TokenStat::kKvzip); }
  bool has_task_attn() const { return has(TokenStat::kTaskMax); }
  bool has_question() const { return !question.empty() && question[0].n > 0; }
  bool has_cum_attn() const { return has(TokenStat::kCumAttn); }
};

// The re-feed passes a press needs (src/engine/refeed.h). Chunk sizes bound the pass's extra
// memory: a chunk's own tokens are in the cache only while it runs (0 = the whole context in
// one chunk, the reference implementations' 2x peak).
struct RefeedNeeds {
  bool context = false;       // KVCompose: the context itself re-fed (TokenStat::kRefeedMax / Sum)
  int64_t context_chunk = 0;  //   tokens per chunk
  bool kvzip = false;         // KVzip: "Repeat the previous context" reconstruction (kKvzip)
  int64_t kvzip_chunk = 2048; //   context tokens per chunk (the reference's 2048)
  int kvzip_sinks = 4;        //   sink tokens in every chunk's softmax, scored 1
  bool any() const { return context || kvzip; }
};

// What a press needs the session to capture.
struct PressNeeds {
  static constexpr int64_t kAllQueries = std::numeric_limits<int64_t>::max();
  int64_t window = 0;     // last W queries per layer (0 = none; kAllQueries = every query)
  bool cum_attn = false;  // cumulative attention received per stored token (H2O)
  bool question = false;  // queries of the question (query-aware mode)
  bool task_attn = false; // running max / sum of every context query's attention per token
  RefeedNeeds refeed;
  // Throws Error when both need the same re-feed with different settings (a sweep holding
  // kvcompose:refeed_chunk=512 and kvcompose:refeed_chunk=0 would score one of them wrongly).
  void merge(const PressNeeds& o);
};

// ---------------------------------------------------------------------------------------
// PressContext: what a press sees.

// One head's stored tokens as f32 (the view applied): k [n, head_dim_k], v [n, head_dim_v],
// pos [n]; idx [n] = index of each token among the head's tokens IN THE CACHE (before view).
struct HeadData {
  int64_t n = 0;
  std::vector<float> k, v;
  std::vector<int32_t> pos;
  std::vector<int32_t> idx;
};

class PressContext {
 public:
  // obs may be nullptr (presses that need nothing: knorm, random, streamingllm).
  PressContext(const KvCache& cache, const HParams& hp, const Observations* obs = nullptr,
               ThreadPool* pool = nullptr);

  const KvCache& cache() const { return *cache_; }
  const HParams& hparams() const { return *hp_; }
  ThreadPool* pool() const { return pool_; }
  int n_layer() const { return cache_->config().n_layer; }
  int n_head_kv() const { return cache_->config().n_head_kv; }
  int n_head() const { return hp_->n_head; }
  int group() const { return hp_->n_head / cache_->config().n_head_kv; }  // query heads per kv head
  int head_dim_k() const { return cache_->config().head_dim_k; }
  int head_dim_v() const { return cache_->config().head_dim_v; }
  int32_t n_past() const { return cache_->n_past(); }

  // Tokens of (il, ih) as the press sees them (through the view, see with_view).
  int64_t n_tokens(int il, int ih) const;
  // Reads (il, ih) through the view; any of want_k / want_v may be false to skip.
  void read_head(int il, int ih, HeadData* out, bool want_k = true, bool want_v = false) const;
  // k / v of selected tokens of (il, ih) only (KvCache::read_head_rows): rows index the
  // tokens as read_head numbers them (through the view), increasing; k [rows.size(),
  // head_dim_k], v [rows.size(), head_dim_v] (either may be nullptr).
  void read_head_rows(int il, int ih, const std::vector<int32_t>& rows, std::vector<float>* k,
                      std::vector<float>* v) const;

  bool has_observations() const { return obs_ != nullptr; }
  // The queries to score with at layer il: the question's when query_aware, else the
  // window's. Throws Error naming what is missing (e.g. "snapkv needs the last 32 queries").
  const ObservedQueries& queries(int il, bool query_aware, const char* who) const;
  // Statistic s of (il, ih) through the view: [n_tokens(il, ih) * token_stat_width(s, group())]
  // (TokenStat says what each holds). Throws Error naming `who` and what is missing when it was
  // not captured (or its pass did not run), or when it does not cover the cache's tokens.
  bool has_token_stat(TokenStat s) const { return obs_ != nullptr && obs_->has(s); }
  std::vector<float> token_stat(TokenStat s, int il, int ih, const char* who) const;
  bool has_task_attn() const { return has_token_stat(TokenStat::kTaskMax); }
  bool has_refeed() const { return has_token_stat(TokenStat::kRefeedMax); }
  // M of the task accumulators (kTaskMax / kTaskSum) and of the re-feed's (kRefeedMax /
  // kRefeedSum): how many queries were accumulated at layer il (0 when not captured).
  int64_t task_count(int il) const;
  int64_t refeed_count(int il) const;

  // The model whose cache this is, for presses that need its weights (e.g. kvcompose's
  // vo-norm uses each layer's W_O); nullptr when the caller has none.
  const Model* model() const { return model_; }
  void set_model(const Model* m) { model_ = m; }

  // Where the tokens not yet seen by the press begin (low-rank presses, DESIGN.md §4.5): every
  // stored token at a position >= new_from() was appended since the press last planned (the
  // chunk of a forward call in plan_after_append, OjaKV's decode buffer in plan_decode); -1 =
  // unknown (plan(): the press decides from the cache alone). decode_step(): decode steps since
  // the prefill when the session calls plan_decode (0 otherwise).
  int32_t new_from() const { return new_from_; }
  void set_new_from(int32_t pos) { new_from_ = pos; }
  int64_t decode_step() const { return decode_step_; }
  void set_decode_step(int64_t s) { decode_step_ = s; }

  // A budget that replaces every press's own (decode-time compression to a target size).
  const Budget* budget_override() const { return override_.n_keep > 0 || override_.ratio > 0 ? &override_ : nullptr; }
  void set_budget_override(const Budget& b) { override_ = b; }

  // The view: a selection (plan) already decided by an earlier press in a composition.
  // Indices a press returns refer to the tokens as seen through the view; compose_plans maps
  // them back. Default: no view (the cache as stored).
  PressContext with_view(const CompressionPlan& selection) const;
  const CompressionPlan* view() const { return view_.heads.empty() ? nullptr : &view_; }

 private:
  const KvCache* cache_;
  const HParams* hp_;
  const Observations* obs_;
  ThreadPool* pool_;
  const Model* model_ = nullptr;
  Budget override_;
  int32_t new_from_ = -1;
  int64_t decode_step_ = 0;
  CompressionPlan view_;  // empty heads = no view
};

// ---------------------------------------------------------------------------------------
// Press

class Press {
 public:
  virtual ~Press() = default;
  // Registry name ("snapkv") and the canonical spec it was made from ("snapkv:ratio=0.5,window=32").
  virtual std::string name() const = 0;
  const std::string& spec() const { return spec_; }
  void set_spec(std::string s) { spec_ = std::move(s); }
  virtual PressNeeds needs() const { return {}; }
  // The plan for the whole cache (as seen through ctx's view). Must not modify anything.
  virtual CompressionPlan plan(const PressContext& ctx) const = 0;

  // Decode-time updates (OjaKV's periodic basis update): the session calls plan_decode every
  // decode_interval() decode steps (0 = never; independent of PressSchedule::decode_every)
  // and applies the plan. Default: no decode behaviour (an unplanned plan).
  virtual int decode_interval() const { return 0; }
  virtual CompressionPlan plan_decode(const PressContext& ctx) const;
  // Prefill-time compression: when plans_after_append(), the session's observer calls
  // plan_after_append for layer il after each forward call appended that layer's new tokens
  // and before attention reads them, and applies the plan at once (so the prefill's own
  // attention reads the compressed cache: low-rank presses compressed throughout). The plan
  // must leave every other layer unplanned. ctx.new_from() = the first position of the chunk.
  virtual bool plans_after_append() const { return false; }
  virtual CompressionPlan plan_after_append(const PressContext& ctx, int il) const;
  // The token budget this press takes from the context it sees (a ratio or a count per
  // (layer, kv head)) and that a caller may restate through PressContext::budget_override
  // (the server: a follow-up turn keeps the ratio of the whole conversation, not of what the
  // earlier turns left); nullptr for presses without one.
  virtual const Budget* token_budget() const { return nullptr; }
  // What identifies the calibration this press reads with `model`: "" for a press that reads
  // none, else CalibrationSource::identity (the file's checksum); a composition joins its
  // presses' with '+'. Part of an evaluation's config, so results made with another
  // calibration at the same path (`kvtrim calibrate` run again) are not resumed as this run's.
  virtual std::string calibration_id(const Model& /*model*/) const { return ""; }

 private:
  std::string spec_;
};

// Score -> top-k. Subclasses score every (viewed) token of every kv head of a layer; the base
// keeps each head's keep_count top-scoring tokens (ties: the earlier token wins).
class ScorerPress : public Press {
 public:
  explicit ScorerPress(Budget b) : budget_(b) {}
  const Budget& budget() const { return budget_; }
  void set_budget(const Budget& b) { budget_ = b; }
  const Budget* token_budget() const override { return &budget_; }
  // The budget in force for ctx (its override if any, else this press's).
  const Budget& effective_budget(const PressContext& ctx) const {
    return ctx.budget_override() ? *ctx.budget_override() : budget_;
  }
  // scores[ih] = [n_tokens(il, ih)]: higher = more important. +inf = must keep.
  virtual void score_layer(const PressContext& ctx, int il, std::vector<std::vector<float>>* scores) const = 0;
  // Tokens kept per head of layer il holding n_tok tokens (PyramidKV overrides this).
  virtual int64_t keep_count(const PressContext& ctx, int il, int64_t n_tok) const {
    return effective_budget(ctx).keep_count(n_tok);
  }
  CompressionPlan plan(const PressContext& ctx) const override;

 private:
  Budget budget_;
};

// Applies presses in sequence, each on what the previous left (savings multiply).
class ComposedPress : public Press {
 public:
  explicit ComposedPress(std::vector<std::unique_ptr<Press>> presses);
  std::string name() const override { return "composed"; }
  PressNeeds needs() const override;
  CompressionPlan plan(const PressContext& ctx) const override;
  // Forwarded to the children that have them (each on what the earlier ones planned); the
  // others contribute nothing (snapkv does not re-evict at every OjaKV update). The interval
  // is the gcd of the children's; a child with interval T is asked when decode_step % T == 0.
  int decode_interval() const override;
  CompressionPlan plan_decode(const PressContext& ctx) const override;
  bool plans_after_append() const override;
  CompressionPlan plan_after_append(const PressContext& ctx, int il) const override;
  std::string calibration_id(const Model& model) const override;
  const std::vector<std::unique_ptr<Press>>& presses() const { return presses_; }

 private:
  std::vector<std::unique_ptr<Press>> presses_;
};

// ---------------------------------------------------------------------------------------
// Helpers for presses

// Indices of the k largest scores, returned in increasing index order; ties: lower index wins.
std::vector<int32_t> top_k_indices(const std::vector<float>& scores, int64_t k);
// The last min(w, q.n) queries of q (a press needing fewer than the session captured).
ObservedQueries last_queries(const ObservedQueries& q, int64_t w);
// Plan for one head from its scores and keep count (keep_all when k >= n).
HeadPlan head_plan_from_scores(const std::vector<float>& scores, int64_t k);
// Sets +inf on the first n_sinks tokens and the last n_recent tokens (by stored order).
void protect_sinks_recent(std::vector<float>* scores, int64_t n_sinks, int64_t n_recent);
// compose_plans (kv/plan.h) joins the plans of a composition, axis by axis.
// True if any head of the plan is planned (HeadPlan::planned()).
bool plan_is_planned(const CompressionPlan& plan);
// Tokens kept by a plan for a head holding n_tok tokens.
int64_t plan_kept(const HeadPlan& h, int64_t n_tok);

// Attention probabilities of observed queries over one head's (viewed) tokens:
// probs [group, n_q, head.n] for the query heads h = ih*group .. ih*group+group-1:
// softmax(scale * q·k) over the tokens each query may see (k_pos <= q_pos, sliding window
// of layer il, softcap none); invisible tokens get 0. Needs head.k and head.pos.
void attention_probs(const PressContext& ctx, int il, int ih, const HeadData& head, const ObservedQueries& q,
                     std::vector<float>* probs);

// ---------------------------------------------------------------------------------------
// Registry and parser

struct PressOption {
  std::string name;
  std::string default_value;
  std::string help;
};

// The options given to one press: every declared option, given or default. Getters throw
// Error("press 'snapkv': option 'window' = 'x' is not an integer") on bad values.
class PressArgs {
 public:
  PressArgs(std::string press, std::map<std::string, std::string> values)
      : press_(std::move(press)), values_(std::move(values)) {}
  const std::string& press() const { return press_; }
  std::string get_string(const std::string& name) const;
  double get_double(const std::string& name) const;
  int64_t get_int(const std::string& name) const;
  bool get_bool(const std::string& name) const;
  // get_double with a range check: lo <= v (< or <=) hi.
  double get_double_in(const std::string& name, double lo, double hi, bool hi_inclusive) const;
  int64_t get_int_min(const std::string& name, int64_t lo) const;
  // An integer in [0, 2^32) (seeds).
  uint32_t get_uint32(const std::string& name) const;
  // `ratio` (in [0, 1)) and `budget` (>= 0) as a Budget.
  Budget get_budget() const;
  // A string option that must be one of `choices` (name, value); the error lists them.
  template <typename E>
  E get_choice(const std::string& name, std::initializer_list<std::pair<const char*, E>> choices) const {
    const std::string v = get_string(name);
    std::string valid;
    for (const auto& [n, e] : choices) {
      if (v == n) return e;
      valid += (valid.empty() ? "" : ", ") + std::string(n);
    }
    bad_choice(name, v, valid);
  }
  // Wrappers: the inner press (set by the parser; nullptr otherwise).
  std::unique_ptr<Press> take_inner() const { return std::move(inner_); }
  void set_inner(std::unique_ptr<Press> p) { inner_ = std::move(p); }

 private:
  const std::string& raw(const std::string& name) const;
  [[noreturn]] void bad_choice(const std::string& name, const std::string& v, const std::string& valid) const;
  std::string press_;
  std::map<std::string, std::string> values_;
  mutable std::unique_ptr<Press> inner_;
};

// The axis a press compresses along (DESIGN.md §3): what the generic sweeps check it on.
//  kToken: drops tokens (src/press/token/): the cache holds exactly the planned tokens, its
//    bytes drop with them (press_sweep_test).
//  kBasis: keeps every token, stores it as coefficients in a rank-r basis (src/press/basis/: the
//    low-rank presses, Palu); the K/V elements shrink with the rank (basis_sweep_test).
//  kChannel: keeps every token, stores fewer of its coordinates (src/press/channel/: ThinK, SPARK,
//    SWAN's per-token top-k after its rotation, Lexico's s atoms of a dictionary) (channel sweep in
//    channel_press_test).
//  kPrecision: keeps every token and coordinate, stores them in fewer bits (SideSpec::dtype). No
//    built-in press is one (a cache's type is --kv-cache-type); the generic sweeps skip it.
// A press that touches several axes (SWAN: rotation, top-k, fp8) takes the one its folder names.
enum class PressAxis { kToken, kBasis, kChannel, kPrecision };
const char* press_axis_name(PressAxis axis);  // "token", "basis", "channel", "precision"

struct PressInfo {
  std::string name;         // registry name (lower case): "snapkv"
  std::string description;  // one line
  std::string paper;        // "Li et al. 2024, SnapKV: LLM Knows What You are Looking for Before Generation"
  std::vector<PressOption> options;  // first option = the one a bare value sets (normally ratio)
  bool wrapper = false;     // takes an inner press: name(inner):opts
  PressAxis axis = PressAxis::kToken;
  // Spreads one budget unevenly over layers (PyramidKV's pyramid, KVCompose's and KVzip's global
  // top-k, StiefAttention's ranks under eps): a layer's heads keep a count of their own, so the
  // sweeps expect the ratio's count within a token per head (token axis) or ranks they do not
  // compute (basis axis) rather than exactly.
  bool per_layer_budget = false;
  // What the generic sweeps run (kvpress's tests/default_presses.py): two press strings of this
  // press alone, an easy setting (mild compression) and a hard one (strong compression, the
  // options that exercise the most code), which must run on the tests' tiny model (and its
  // in-memory calibration). The sweeps read the ratio from the string (press_spec_ratio). Left
  // empty, register_press sets "<name>:ratio=0.25" and "<name>:ratio=0.9" for a press with a
  // `ratio` option (none for a wrapper: the sweeps wrap every scoring press in it).
  std::string test_easy, test_hard;
  std::function<std::unique_ptr<Press>(const PressArgs&)> make;
};

// The common budget options: ratio (default `ratio_default`) and budget (0 = use ratio).
std::vector<PressOption> budget_options(const std::string& ratio_default = "0.5");
// The common query-aware option.
PressOption query_aware_option();

// Every registered press, in registration order (built-ins registered on first use).
const std::vector<PressInfo>& press_registry();
const PressInfo* find_press(const std::string& name);
// Adds a press (throws if the name is taken). For tests / out-of-tree presses.
void register_press(PressInfo info);

// Parses a press string (see the top of this file) into a press (a ComposedPress when it has
// '+'). Throws Error with a clear message on any mistake.
std::unique_ptr<Press> make_press(const std::string& spec);
// The same from a parsed press string (press_spec.h), e.g. one a sweep edited.
std::unique_ptr<Press> make_press(const PressSpec& spec);

// A multi-line listing of every press with its options, defaults and help (`kvtrim presses`).
std::string describe_presses();

}  // namespace kvtrim
