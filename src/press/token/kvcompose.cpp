// KVCompose: attention-guided composite tokens with one global budget spread over layers.
// Paper: Akulov et al. 2025, "KVCompose: Efficient Structured KV Cache Compression with
// Composite Tokens" (arXiv:2509.05165, papers/kvcompose.txt); DESIGN.md §4.4.
//
// For every layer il and kv head ih (one head read at a time, through ctx.read_head):
//   1. A[h, c, m]: attention of task token m to stored token c, per query head h of the group
//      (eq. 3: softmax(scale · q·k) over the tokens m may see: causal, sliding window);
//      Agg_task over m (eq. 14), online over blocks of queries: only [n_tok, group] kept;
//   2. optional weight of token c (appendix A.1.3): ‖v_c‖ (vnorm) or ‖W_O^(h) v_c‖ (vonorm);
//   3. Agg_group over the group's query heads (eq. 15);
//   4. + the mean over the layer's kv heads (eq. 16, mean_heads=1);
// then kvcompose_core's select_structured (eqs. 17-24: per-head argsort, composite score
// per rank = Agg_head of each head's k-th best, global top-B_total over all (layer, rank)
// gives N_l, each head keeps its own top-N_l) or select_unstructured (appendix A.2).
//
// Task (the paper's task set T, §3.2.1):
//   task=agnostic (default): T = {C}, the context is its own task, read as the authors'
//     implementation does (their KVComposePress in NVIDIA/kvpress): after the prefill the
//     context is fed a second time after itself and A is the attention of those re-fed
//     queries to the stored context (M = N). The session runs this pass before planning
//     (PressNeeds::refeed, src/engine/refeed.h): chunked (refeed_chunk tokens, default 512),
//     reading the cache and keeping none of its tokens, so the cache holds at most the context
//     plus one chunk (the reference runs one chunk: 2x); the observer folds each chunk's
//     softmax into a running max and sum per (token, query head), eq. 14.
//   task=causal: kvtrim's first reading, no second pass: A is the prefill's own causal
//     self-attention (PressNeeds::task_attn, accumulated online while the forward pass runs).
//     It scores a token by how much the REST of the context attends to it, which loses needles
//     (docs/presses-kvcompose.md, measured); kept as a named option. Observations that hold the
//     context's queries instead (no accumulators) are scored from the queries.
//   task=aware (or query_aware=true): the question's queries (captured by the session when it
//     runs the question); A is their softmax over the stored (context) tokens.
//
// Budget (eq. 21 over what the press sees: E = entries of all (layer, kv head)):
//   ratio r: B_total = floor((1 - r) · E / n_head_kv) composite tokens (= floor((1-r)·L·N));
//   budget=n: B_total = n · n_layer (n tokens per layer on average, the same bytes as a
//     uniform press with budget=n); total=B: B_total = B. Unstructured: B_total · n_head_kv
//     entries. A head never goes empty: each layer's best composite token (each head's best
//     token, unstructured) is always kept and counts toward the budget.
// Sliding-window layers (gemma3): a stored token with position <= n_past - window can never
//   be seen again by any future query; it is dropped and is not a candidate, but it counts in
//   E (eq. 6 counts every cache entry), so the measured ratio is at least r.
//
// Hyper-parameters (defaults): ratio = 0.5, budget = 0, total = 0, mode = structured,
// task = agnostic, query_aware = false, refeed_chunk = 512, agg_task = max, agg_group = mean,
// agg_head = mean, mean_heads = 1, weight = none (the paper's defaults, §4.2); layer0_max = 0
// and keep_min = 0 (the reference code's layer-0 boost and lower bound, off: the paper has
// neither).
#include "press/token/kvcompose.h"

#include <cmath>

#include "core/error.h"

namespace kvtrim {

using kvcompose::Agg;

void KVComposePress::bind_model(const Model& m) {
  wo_.clear();
  for (const LayerWeights& lw : m.layers()) wo_.push_back(lw.wo);
}

PressNeeds KVComposePress::needs() const {
  PressNeeds n;
  switch (o_.task) {
    case KVComposeOptions::Task::kAware: n.question = true; break;
    case KVComposeOptions::Task::kCausal: n.task_attn = true; break;  // accumulated during the forward pass
    case KVComposeOptions::Task::kAgnostic:
      n.refeed.context = true;  // the session re-feeds the context before planning
      n.refeed.context_chunk = o_.refeed_chunk;
      break;
  }
  return n;
}

std::vector<std::vector<std::vector<float>>> KVComposePress::scores(const PressContext& ctx) const {
  const HParams& hp = ctx.hparams();
  const int n_layer = ctx.n_layer(), n_head_kv = ctx.n_head_kv(), group = ctx.group();
  const int n_head = ctx.n_head(), dk = ctx.head_dim_k(), dv = ctx.head_dim_v();
  const float scale = hp.attn_scale > 0 ? hp.attn_scale : 1.f / std::sqrt(static_cast<float>(dk));
  const bool want_v = o_.weight != KVComposeOptions::Weight::kNone;
  // W_O per layer: bound explicitly (bind_model / bind_wo), else from the context's model.
  std::vector<WeightView> wo = wo_;
  if (wo.empty() && ctx.model())
    for (const LayerWeights& lw : ctx.model()->layers()) wo.push_back(lw.wo);
  KVTRIM_CHECK(o_.weight != KVComposeOptions::Weight::kVoNorm || static_cast<int>(wo.size()) == n_layer,
               "press 'kvcompose': weight=vonorm needs the model's output projection W_O of each layer "
               "(%zu available for %d layers); run it through a session (which passes the model), bind "
               "the model with KVComposePress::bind_model, or use weight=vnorm / none", wo.size(), n_layer);
  std::vector<std::vector<std::vector<float>>> s(static_cast<size_t>(n_layer));
  HeadData hd;
  std::vector<float> acc, w;
  std::vector<double> gram;
  // Task-agnostic: the re-feed's accumulators (TokenStat::kRefeedMax / kRefeedSum, M = the re-fed
  // queries). Causal: the running max / sum the observer kept during the prefill. Otherwise
  // (task-aware, or causal with observations holding the context's queries instead, e.g. built
  // by hand) the attention is computed here from the queries.
  using Task = KVComposeOptions::Task;
  const bool refeed = o_.task == Task::kAgnostic;
  const bool from_acc = refeed || (o_.task == Task::kCausal && ctx.has_task_attn());
  const bool self_keys = o_.task == Task::kAware && o_.question_keys;  // the question's own keys too
  const bool want_max = o_.agg_task == Agg::kMax;
  const TokenStat acc_stat = refeed ? (want_max ? TokenStat::kRefeedMax : TokenStat::kRefeedSum)
                                    : (want_max ? TokenStat::kTaskMax : TokenStat::kTaskSum);
  for (int il = 0; il < n_layer; ++il) {
    const ObservedQueries* q = from_acc ? nullptr : &ctx.queries(il, o_.task == Task::kAware, "kvcompose");
    KVTRIM_CHECK(!self_keys || q->self_lse.size() == static_cast<size_t>(q->n) * static_cast<size_t>(n_head),
                 "press 'kvcompose': question_keys=1 needs the question's own attention (captured by "
                 "Session::observe_question); use question_keys=0 for the softmax over the context only");
    const int64_t n_task = refeed ? ctx.refeed_count(il) : from_acc ? ctx.task_count(il) : q->n;
    const int window = il < static_cast<int>(hp.sliding_window.size()) ? hp.sliding_window[static_cast<size_t>(il)] : 0;
    if (o_.weight == KVComposeOptions::Weight::kVoNorm) {
      gram = kvcompose::vo_gram(wo[static_cast<size_t>(il)], n_head, dv);
    }
    std::vector<std::vector<int32_t>> pos(static_cast<size_t>(n_head_kv));
    auto& sl = s[static_cast<size_t>(il)];
    sl.resize(static_cast<size_t>(n_head_kv));
    for (int ih = 0; ih < n_head_kv; ++ih) {
      ctx.read_head(il, ih, &hd, !from_acc, want_v);  // the accumulators need no keys
      const size_t n = static_cast<size_t>(hd.n);
      if (from_acc) {
        acc = ctx.token_stat(acc_stat, il, ih, "kvcompose");
      } else {
        acc.assign(n * static_cast<size_t>(group), 0.f);
        kvcompose::accumulate_task_attention(q->q.data(), q->pos.data(), q->n, n_head, ih, group, dk, hd.k.data(),
                                             hd.pos.data(), hd.n, scale, window, o_.agg_task, acc.data(), ctx.pool(),
                                             self_keys ? q->self_lse.data() : nullptr);
      }
      if (want_v) {
        w.resize(n * static_cast<size_t>(group));
        for (size_t c = 0; c < n; ++c) {
          const float* v = hd.v.data() + c * static_cast<size_t>(dv);
          for (int g = 0; g < group; ++g) {
            const size_t h = static_cast<size_t>(ih * group + g);
            w[c * static_cast<size_t>(group) + static_cast<size_t>(g)] =
                o_.weight == KVComposeOptions::Weight::kVNorm
                    ? kvcompose::v_norm(v, dv)
                    : kvcompose::vo_norm(gram.data() + h * static_cast<size_t>(dv) * static_cast<size_t>(dv), v, dv);
          }
        }
      }
      auto& sh = sl[static_cast<size_t>(ih)];
      sh.resize(n);
      kvcompose::group_scores(acc.data(), hd.n, group, n_task, o_.agg_task, o_.agg_group, want_v ? w.data() : nullptr,
                              sh.data());
      if (window > 0) {  // tokens no future query can see (q_pos >= n_past) are not candidates
        for (size_t c = 0; c < n; ++c) {
          if (static_cast<int64_t>(hd.pos[c]) <= static_cast<int64_t>(ctx.n_past()) - window) sh[c] = -INFINITY;
        }
      }
      pos[static_cast<size_t>(ih)] = std::move(hd.pos);
    }
    if (o_.mean_heads) kvcompose::add_head_mean(&sl, pos);
  }
  return s;
}

CompressionPlan KVComposePress::plan(const PressContext& ctx) const {
  const int n_layer = ctx.n_layer(), n_head_kv = ctx.n_head_kv();
  CompressionPlan p(n_layer, n_head_kv);
  const Budget& b = ctx.budget_override() ? *ctx.budget_override() : o_.budget;
  if (b.is_noop() && o_.total <= 0) return p;
  int64_t n_entries = 0;
  for (int il = 0; il < n_layer; ++il) {
    for (int ih = 0; ih < n_head_kv; ++ih) n_entries += ctx.n_tokens(il, ih);
  }
  // B_total in composite tokens (eq. 21)
  int64_t b_total;
  if (o_.total > 0 && !ctx.budget_override()) b_total = o_.total;
  else if (b.n_keep > 0) b_total = b.n_keep * n_layer;
  else b_total = kvcompose::budget_from_ratio(b.ratio, n_entries / n_head_kv);
  const auto s = scores(ctx);
  const kvcompose::Selection sel = o_.structured ? kvcompose::select_structured(s, o_.agg_head, b_total, o_.select)
                                                 : kvcompose::select_unstructured(s, b_total * n_head_kv);
  for (int il = 0; il < n_layer; ++il) {
    for (int ih = 0; ih < n_head_kv; ++ih) {
      HeadPlan& hp = p.at(il, ih);
      const auto& keep = sel.keep[static_cast<size_t>(il * n_head_kv + ih)];
      if (static_cast<int64_t>(keep.size()) >= ctx.n_tokens(il, ih)) continue;  // keep_all
      hp.keep_all = false;
      hp.keep = keep;
    }
  }
  return p;
}

namespace {

Agg parse_agg(const PressArgs& a, const std::string& opt) {
  const std::string v = a.get_string(opt);
  if (v == "max") return Agg::kMax;
  if (v == "mean" || v == "avg") return Agg::kMean;
  fail("press '%s': option '%s' = '%s' must be max or mean", a.press().c_str(), opt.c_str(), v.c_str());
}

std::unique_ptr<Press> make_kvcompose(const PressArgs& a) {
  KVComposeOptions o;
  o.budget = a.get_budget();
  o.total = a.get_int_min("total", 0);
  const std::string mode = a.get_string("mode");
  KVTRIM_CHECK(mode == "structured" || mode == "unstructured",
               "press '%s': option 'mode' = '%s' must be structured or unstructured", a.press().c_str(), mode.c_str());
  o.structured = mode == "structured";
  using Task = KVComposeOptions::Task;
  o.task = a.get_choice<Task>("task", {{"agnostic", Task::kAgnostic}, {"causal", Task::kCausal}, {"aware", Task::kAware}});
  if (a.get_bool("query_aware")) o.task = Task::kAware;
  o.refeed_chunk = a.get_int_min("refeed_chunk", 0);
  o.question_keys = a.get_bool("question_keys");
  o.select.layer0_max = a.get_bool("layer0_max");
  o.select.keep_min = a.get_int_min("keep_min", 0);
  KVTRIM_CHECK(o.structured || (!o.select.layer0_max && o.select.keep_min == 0),
               "press '%s': layer0_max and keep_min apply to mode=structured only", a.press().c_str());
  o.agg_task = parse_agg(a, "agg_task");
  o.agg_group = parse_agg(a, "agg_group");
  o.agg_head = parse_agg(a, "agg_head");
  o.mean_heads = a.get_bool("mean_heads");
  const std::string w = a.get_string("weight");
  if (w == "none") o.weight = KVComposeOptions::Weight::kNone;
  else if (w == "vnorm") o.weight = KVComposeOptions::Weight::kVNorm;
  else if (w == "vonorm") o.weight = KVComposeOptions::Weight::kVoNorm;
  else fail("press '%s': option 'weight' = '%s' must be none, vnorm or vonorm", a.press().c_str(), w.c_str());
  return std::make_unique<KVComposePress>(o);
}

}  // namespace

PressInfo kvcompose_press_info() {
  PressInfo i;
  i.name = "kvcompose";
  i.description = "attention-guided composite tokens; one global budget spread over layers (N_l per layer)";
  i.paper = "Akulov et al. 2025, KVCompose: Efficient Structured KV Cache Compression with Composite Tokens "
            "(arXiv:2509.05165)";
  i.options = budget_options();
  i.options[1].help = "tokens kept per layer on average: B_total = budget * n_layer (> 0 overrides ratio)";
  i.options.push_back({"total", "0", "B_total: composite tokens kept over all layers (> 0 overrides ratio/budget)"});
  i.options.push_back({"mode", "structured", "structured (same N_l for every head of a layer) | unstructured"});
  i.options.push_back({"task", "agnostic",
                        "agnostic (the context re-fed after itself, as the authors' code: a second pass) | causal (the "
                        "prefill's own causal self-attention, no second pass) | aware (the question's queries)"});
  i.options.push_back(query_aware_option());
  i.options.push_back({"refeed_chunk", "512",
                       "task=agnostic: re-fed tokens per chunk; the cache holds the context + one chunk (0 = one "
                       "chunk, the reference exactly, 2x the cache)"});
  i.options.push_back({"question_keys", "1",
                       "task=aware: the question's own keys in each softmax's denominator, as the authors' code "
                       "(which feeds the question with the cache): 1 | 0 (the softmax over the context only)"});
  i.options.push_back({"layer0_max", "0", "the reference code's layer-0 boost (layer 0 keeps at least as many as any layer): 1 | 0"});
  i.options.push_back({"keep_min", "0", "the reference code's keep_token_lower_bound: each layer keeps at least N composite tokens"});
  i.options.push_back({"agg_task", "max", "aggregation over task tokens (eq. 14): max | mean"});
  i.options.push_back({"agg_group", "mean", "aggregation over a kv head's query heads (eq. 15): mean | max"});
  i.options.push_back({"agg_head", "mean", "composite score over kv heads (eq. 19): mean | max"});
  i.options.push_back({"mean_heads", "1", "add the mean over kv heads to each score (eq. 16): 1 | 0"});
  i.options.push_back({"weight", "none", "weight attention by the value norm: none | vnorm | vonorm (needs W_O)"});
  i.axis = PressAxis::kToken;
  i.per_layer_budget = true;  // one global top-k over (layer, rank) pairs
  i.make = make_kvcompose;
  return i;
}

}  // namespace kvtrim
