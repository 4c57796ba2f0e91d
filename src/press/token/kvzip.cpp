// KVzip: query-agnostic KV eviction by context reconstruction.
// Paper: Kim et al. 2025, "KVzip: Query-Agnostic KV Cache Compression with Context
// Reconstruction" (arXiv:2505.23416); reference implementation: NVIDIA/kvpress KVzipPress
// (the scoring pass is described in src/engine/refeed.h).
//
// After the prefill the session runs the reconstruction pass (PressNeeds::refeed.kvzip): the
// model is asked to repeat the context chunk by chunk, and each stored KV pair is scored by
// the most attention any query of the reconstruction of its chunk pays it (max over the
// queries and the group's query heads, softmax over the sinks, the chunk's stored tokens and
// the reconstruction's own tokens). The first `sinks` positions score 1.
//
// Budget (kvpress's compress_post): layerwise=0 (default): one global pool of every (layer,
// kv head, token) entry; the floor(ratio · E) lowest-scoring entries go, wherever they are,
// so every layer and head gets its own budget. layerwise=1: each layer drops floor(ratio · E_l)
// of its entries (heads still compete within the layer). budget=n: n · n_layer · n_head_kv
// entries are kept (n per head on average). A head never goes empty (its best entry is kept
// and counts toward the budget). Ties: the later token, then the higher head / layer goes
// first, so plans are deterministic.
#include <algorithm>
#include <cmath>
#include <tuple>

#include "core/error.h"
#include "press/press.h"

namespace kvtrim {

namespace {

struct KvzipOptions {
  Budget budget;
  bool layerwise = false;
  int sinks = 4;
  int64_t chunk = 2048;
};

class KvzipPress : public Press {
 public:
  explicit KvzipPress(KvzipOptions o) : o_(o) {}
  std::string name() const override { return "kvzip"; }
  const Budget* token_budget() const override { return &o_.budget; }
  PressNeeds needs() const override {
    PressNeeds n;
    n.refeed.kvzip = true;
    n.refeed.kvzip_chunk = o_.chunk;
    n.refeed.kvzip_sinks = o_.sinks;
    return n;
  }

  CompressionPlan plan(const PressContext& ctx) const override {
    const int n_layer = ctx.n_layer(), n_head_kv = ctx.n_head_kv();
    CompressionPlan p(n_layer, n_head_kv);
    const Budget& b = ctx.budget_override() ? *ctx.budget_override() : o_.budget;
    if (b.is_noop()) return p;
    // (score, layer, head, token) of every entry but each head's best (kept: never empty)
    struct Entry {
      float s;
      int il, ih;
      int32_t c;
    };
    std::vector<std::vector<Entry>> per_layer(static_cast<size_t>(n_layer));
    std::vector<std::vector<char>> keep(static_cast<size_t>(n_layer * n_head_kv));
    int64_t n_entries = 0, n_forced = 0;
    for (int il = 0; il < n_layer; ++il)
      for (int ih = 0; ih < n_head_kv; ++ih) {
        const std::vector<float> s = ctx.token_stat(TokenStat::kKvzip, il, ih, "kvzip");
        const int64_t n = static_cast<int64_t>(s.size());
        auto& k = keep[static_cast<size_t>(il * n_head_kv + ih)];
        k.assign(static_cast<size_t>(n), 1);
        n_entries += n;
        if (n == 0) continue;
        const int32_t best = static_cast<int32_t>(std::max_element(s.begin(), s.end()) - s.begin());
        ++n_forced;
        for (int32_t c = 0; c < static_cast<int32_t>(n); ++c)
          if (c != best) per_layer[static_cast<size_t>(il)].push_back({s[static_cast<size_t>(c)], il, ih, c});
      }
    // lowest score first; ties: later token, then higher head, then higher layer
    auto lower = [](const Entry& a, const Entry& e) {
      return std::make_tuple(a.s, -a.c, -a.ih, -a.il) < std::make_tuple(e.s, -e.c, -e.ih, -e.il);
    };
    auto drop = [&](std::vector<Entry>& pool, int64_t n_drop) {
      n_drop = std::clamp<int64_t>(n_drop, 0, static_cast<int64_t>(pool.size()));
      if (n_drop == 0) return;
      std::nth_element(pool.begin(), pool.begin() + (n_drop - 1), pool.end(), lower);
      for (int64_t i = 0; i < n_drop; ++i) {
        const Entry& e = pool[static_cast<size_t>(i)];
        keep[static_cast<size_t>(e.il * n_head_kv + e.ih)][static_cast<size_t>(e.c)] = 0;
      }
    };
    if (b.n_keep > 0) {  // n per head on average, over every layer at once
      std::vector<Entry> pool;
      for (auto& v : per_layer) pool.insert(pool.end(), v.begin(), v.end());
      drop(pool, n_entries - std::max<int64_t>(n_forced, b.n_keep * n_layer * n_head_kv));
    } else if (o_.layerwise) {
      for (int il = 0; il < n_layer; ++il) {
        int64_t e_l = 0;
        for (int ih = 0; ih < n_head_kv; ++ih) e_l += static_cast<int64_t>(keep[static_cast<size_t>(il * n_head_kv + ih)].size());
        drop(per_layer[static_cast<size_t>(il)], static_cast<int64_t>(static_cast<double>(e_l) * b.ratio));
      }
    } else {
      std::vector<Entry> pool;
      for (auto& v : per_layer) pool.insert(pool.end(), v.begin(), v.end());
      drop(pool, static_cast<int64_t>(static_cast<double>(n_entries) * b.ratio));
    }
    for (int il = 0; il < n_layer; ++il)
      for (int ih = 0; ih < n_head_kv; ++ih) {
        const auto& k = keep[static_cast<size_t>(il * n_head_kv + ih)];
        if (std::all_of(k.begin(), k.end(), [](char x) { return x != 0; })) continue;
        HeadPlan& h = p.at(il, ih);
        h.keep_all = false;
        for (size_t c = 0; c < k.size(); ++c)
          if (k[c]) h.keep.push_back(static_cast<int32_t>(c));
      }
    return p;
  }

 private:
  KvzipOptions o_;
};

}  // namespace

PressInfo kvzip_press_info() {
  PressInfo i;
  i.name = "kvzip";
  i.description = "keep what the model attends to while it reconstructs the context (a second pass); per-head budgets";
  i.paper = "Kim et al. 2025, KVzip: Query-Agnostic KV Cache Compression with Context Reconstruction (arXiv:2505.23416)";
  i.options = budget_options();
  i.options[1].help = "entries kept per (layer, kv head) on average (> 0 overrides ratio; heads and layers still compete)";
  i.options.push_back({"layerwise", "0", "1: each layer drops the same fraction (heads compete within it); 0: one global pool"});
  i.options.push_back({"sinks", "4", "first positions kept (score 1) and in every reconstruction chunk's softmax"});
  i.options.push_back({"chunk", "2048", "context tokens reconstructed per chunk (the cache holds the context + one chunk)"});
  i.axis = PressAxis::kToken;
  i.per_layer_budget = true;  // heads and layers compete for one budget
  i.make = [](const PressArgs& a) -> std::unique_ptr<Press> {
    KvzipOptions o;
    o.budget = a.get_budget();
    o.layerwise = a.get_bool("layerwise");
    o.sinks = static_cast<int>(std::min<int64_t>(a.get_int_min("sinks", 0), 1 << 20));
    o.chunk = a.get_int_min("chunk", 1);
    return std::make_unique<KvzipPress>(o);
  };
  return i;
}

}  // namespace kvtrim
