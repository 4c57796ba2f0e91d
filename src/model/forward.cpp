// The optimized forward pass: the n tokens of a call go through each layer together
// (prefill chunks use matmul; a single decode token uses matvec), keys and values are
// appended to the cache after RoPE (at their original positions), and the cache computes
// attention over whatever layout it holds. Scratch buffers live in a per-thread workspace
// that is resized per call (no allocation per layer, none at all for repeated sizes).
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <vector>

#include "core/error.h"
#include "core/item_bins.h"
#include "core/thread_pool.h"
#include "kv/kv_cache.h"
#include "model/arch/arch.h"
#include "model/model.h"
#include "ops/nn.h"

namespace kvtrim {
namespace {

struct Workspace {
  std::vector<float> x;      // [n, n_embd] residual stream
  std::vector<float> xb;     // [n, n_embd] normed input / sublayer output
  std::vector<float> q;      // [n, n_head, head_dim_k]
  std::vector<float> k;      // [n, n_head_kv, head_dim_k]
  std::vector<float> v;      // [n, n_head_kv, head_dim_v]
  std::vector<float> att;    // [n, n_head, head_dim_v] attention output
  std::vector<float> gate;   // [n, n_ff]
  std::vector<float> up;     // [n, n_ff]
  std::vector<int32_t> pos;  // [n] positions
  std::vector<float> x_in;   // [n, n_embd] a layer's input (only for ForwardObserver::on_layer_io)
  std::vector<float> logits; // [rows needing logits, n_vocab] of a batch of several sequences
  std::vector<float> rope_cs;  // [n, n_rot] per row: cos [n_rot / 2], then sin, for rope_spec
  RopeSpec rope_spec;          // the angles in rope_cs (n_rot 0: none this call)
  // mixture of experts
  std::vector<float> router;         // [n, n_expert] logits, then probabilities
  std::vector<int32_t> sel;          // [n, n_expert_used] chosen experts, ascending
  std::vector<float> sel_w;          // [n, n_expert_used] their renormalised weights
  std::vector<float> ex, eg, eu, ed; // a group's (row, expert) pairs by expert: in [pairs, n_embd], gate / up [pairs, n_ff_exp], out [pairs, n_embd]
  std::vector<MatmulJob> ex_jobs;    // the experts' products of one step
  std::vector<int64_t> ex_start;     // [n_expert + 1] expert e's rows are ex_rows[ex_start[e], ex_start[e+1])
  std::vector<int64_t> ex_fill;      // [n_expert] the counting sort's next slot per expert
  std::vector<int64_t> ex_rows;      // a group's rows by expert, in row order within each
  std::vector<float> ex_w;           // and their weights
  std::vector<float> moe_out;        // [n, n_embd] the layer's FFN output
};

// From this many rows on the forward pass's element-wise work (norms, RoPE, activations, the
// residual adds) is split over the pool; a decode step's few rows stay on the caller (a pool
// round trip costs more than they do). In a 96-token SmolLM2 prefill chunk that work on the
// caller alone was ~10 % of the samples while the other thread waited (perf, docs/results/perf §9).
constexpr int64_t kRowsPoolMin = 16;

// fn(r0, r1) over the n rows: split over the pool for a chunk, on the caller for a few rows.
template <typename Fn>
void rows_job(ThreadPool* pool, int64_t n, const Fn& fn) {
  for_range(n >= kRowsPoolMin ? pool : nullptr, n, 4, fn);
}

// y[n, n_rows] = x[n, n_cols] · Wᵀ: matvec for one token, matmul for a chunk.
void project(const WeightView& w, const float* x, int64_t n, float* y, ThreadPool* pool) {
  if (n == 1) {
    matvec(w, x, y, pool);
  } else {
    matmul(w, x, n, y, pool);
  }
}

// The products of a batch of sequences (forward_batch) run per group of rows so that every
// sequence gets the numbers it would get alone: the single-token sequences (decode steps) in
// runs of fewer than kMatmulGemmMinTokens rows (the decode kernel, the weights read once per
// run), every longer sequence (a prefill chunk) on its own, as forward() would run it. Where
// the model's products give every token its own result at any token count (token_exact: 8-bit
// prefill and an integer kernel for every weight), all rows are one group: a server step that
// prefills a chunk beside decoding streams reads the weights once instead of twice.
struct RowGroups {
  std::vector<std::pair<int64_t, int64_t>> ranges;  // [r0, r1) in row order
};

RowGroups row_groups(const std::vector<ForwardSeq>& seqs, const std::vector<int64_t>& row0, bool token_exact) {
  RowGroups g;
  if (token_exact) {
    g.ranges.emplace_back(row0.front(), row0.back());
    return g;
  }
  bool open_run = false;  // the last range is a run of single-token sequences with room left
  for (size_t s = 0; s < seqs.size(); ++s) {
    const bool single = seqs[s].n == 1;
    if (single && open_run) {
      g.ranges.back().second = row0[s + 1];
    } else {
      g.ranges.emplace_back(row0[s], row0[s + 1]);
    }
    open_run = single && g.ranges.back().second - g.ranges.back().first < kMatmulGemmMinTokens - 1;
  }
  return g;
}

// project() over each group: y[r, :] = x[r, :] · Wᵀ for every row r.
void project_groups(const WeightView& w, const float* x, const RowGroups& g, float* y, ThreadPool* pool) {
  for (const auto& [r0, r1] : g.ranges) project(w, x + r0 * w.n_cols, r1 - r0, y + r0 * w.n_rows, pool);
}

// project_groups for weights that read the same x (q/k/v, gate/up): each group's decode rows
// go through all of them in one job of the pool (matmul_many).
void project_groups_many(std::initializer_list<std::pair<const WeightView*, float*>> wy, const float* x,
                         const RowGroups& g, ThreadPool* pool) {
  const WeightView* w[8];
  float* y[8];
  int nw = 0;
  for (const auto& [wi, yi] : wy) {
    w[nw] = wi;
    y[nw++] = yi;
  }
  for (const auto& [r0, r1] : g.ranges) {
    float* yr[8];
    for (int i = 0; i < nw; ++i) yr[i] = y[i] + r0 * w[i]->n_rows;
    matmul_many(w, yr, nw, x + r0 * w[0]->n_cols, r1 - r0, pool);
  }
}

// y[i, :] += b for each of the n rows of width d (b == nullptr: nothing).
void add_bias(const WeightView& b, float* y, int64_t n, int64_t d) {
  if (!b.data) return;
  const float* bd = static_cast<const float*>(b.data);
  for (int64_t i = 0; i < n; ++i) add(y + i * d, bd, d);
}

// Row-wise RMSNorm of n rows of width d with weight w[d].
void rms_norm_rows(const float* x, const WeightView& w, float* y, int64_t n, int64_t d, float eps,
                   ThreadPool* pool = nullptr) {
  const float* wd = static_cast<const float*>(w.data);
  rows_job(pool, n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) rms_norm(x + i * d, wd, y + i * d, d, eps);
  });
}

// The experts each row uses: softmax over the router's logits, the n_used largest probabilities
// (the lower index first on a tie), renormalised to sum 1 (qwen3moe's norm_topk_prob); the chosen
// experts stored in ascending order so that their outputs are summed in a fixed order.
void route_rows(const float* logits, int64_t n, int n_expert, int n_used, int32_t* sel, float* sel_w) {
  std::vector<float> p(static_cast<size_t>(n_expert));
  std::vector<int32_t> idx(static_cast<size_t>(n_expert));
  for (int64_t i = 0; i < n; ++i) {
    std::copy_n(logits + i * n_expert, n_expert, p.data());
    softmax(p.data(), n_expert);
    for (int e = 0; e < n_expert; ++e) idx[static_cast<size_t>(e)] = e;
    std::partial_sort(idx.begin(), idx.begin() + n_used, idx.end(), [&](int32_t a, int32_t b) {
      return p[static_cast<size_t>(a)] > p[static_cast<size_t>(b)] || (p[static_cast<size_t>(a)] == p[static_cast<size_t>(b)] && a < b);
    });
    std::sort(idx.begin(), idx.begin() + n_used);
    float sum = 0;
    for (int j = 0; j < n_used; ++j) sum += p[static_cast<size_t>(idx[static_cast<size_t>(j)])];
    for (int j = 0; j < n_used; ++j) {
      sel[i * n_used + j] = idx[static_cast<size_t>(j)];
      sel_w[i * n_used + j] = p[static_cast<size_t>(idx[static_cast<size_t>(j)])] / sum;
    }
  }
}

// out[r, :] = Σ over row r's experts e (ascending) of w_e · down_e(silu(gate_e · xn_r) ⊙ (up_e · xn_r)).
// Per group of rows (the same groups as every other product, so a sequence gets what it gets alone)
// and per expert, the rows that chose it go through its matrices together: a prefill chunk's
// tokens batched by expert, a decode step reading only its n_used experts.
void moe_ffn(const HParams& hp, const LayerWeights& w, const float* xn, const RowGroups& g, int64_t n, float* out,
             Workspace& ws, ThreadPool* pool) {
  const int n_exp = hp.n_expert, k = hp.n_expert_used;
  const int64_t n_embd = hp.n_embd, dff = hp.n_ff_exp;
  ws.router.resize(static_cast<size_t>(n * n_exp));
  ws.sel.resize(static_cast<size_t>(n * k));
  ws.sel_w.resize(ws.sel.size());
  project_groups(w.ffn_gate_inp, xn, g, ws.router.data(), pool);
  route_rows(ws.router.data(), n, n_exp, k, ws.sel.data(), ws.sel_w.data());
  std::fill(out, out + n * n_embd, 0.f);
  for (const auto& [r0, r1] : g.ranges) {
    // the group's rows by expert, in row order: a counting sort of the (row, choice) pairs
    ws.ex_start.assign(static_cast<size_t>(n_exp) + 1, 0);
    for (int64_t i = r0 * k; i < r1 * k; ++i) ++ws.ex_start[static_cast<size_t>(ws.sel[static_cast<size_t>(i)]) + 1];
    for (int e = 0; e < n_exp; ++e) ws.ex_start[static_cast<size_t>(e) + 1] += ws.ex_start[static_cast<size_t>(e)];
    ws.ex_rows.resize(static_cast<size_t>((r1 - r0) * k));
    ws.ex_w.resize(ws.ex_rows.size());
    ws.ex_fill.assign(ws.ex_start.begin(), ws.ex_start.end() - 1);
    for (int64_t i = r0 * k; i < r1 * k; ++i) {
      const size_t at = static_cast<size_t>(ws.ex_fill[static_cast<size_t>(ws.sel[static_cast<size_t>(i)])]++);
      ws.ex_rows[at] = i / k;
      ws.ex_w[at] = ws.sel_w[static_cast<size_t>(i)];
    }
    // every routed expert's rows through its gate and up in one product batch, then every
    // expert's down in another: the threads meet twice per group, not twice per expert
    const int64_t n_pairs = (r1 - r0) * k;
    ws.ex.resize(static_cast<size_t>(n_pairs * n_embd));
    ws.eg.resize(static_cast<size_t>(n_pairs * dff));
    ws.eu.resize(ws.eg.size());
    ws.ed.resize(ws.ex.size());
    ws.ex_jobs.clear();
    for (int e = 0; e < n_exp; ++e) {
      const int64_t e0 = ws.ex_start[static_cast<size_t>(e)];
      const int64_t m = ws.ex_start[static_cast<size_t>(e) + 1] - e0;
      if (m == 0) continue;
      // one row: read in place (a decode step's experts then share one input, quantized once);
      // several: gathered
      const float* x = xn + ws.ex_rows[static_cast<size_t>(e0)] * n_embd;
      if (m > 1) {
        for (int64_t i = e0; i < e0 + m; ++i)
          std::copy_n(xn + ws.ex_rows[static_cast<size_t>(i)] * n_embd, n_embd, ws.ex.data() + i * n_embd);
        x = ws.ex.data() + e0 * n_embd;
      }
      ws.ex_jobs.push_back(MatmulJob{&w.gate_exps[static_cast<size_t>(e)], x, m, ws.eg.data() + e0 * dff});
      ws.ex_jobs.push_back(MatmulJob{&w.up_exps[static_cast<size_t>(e)], x, m, ws.eu.data() + e0 * dff});
    }
    matmul_jobs(ws.ex_jobs.data(), static_cast<int>(ws.ex_jobs.size()), pool);
    swiglu(ws.eg.data(), ws.eu.data(), ws.eg.data(), n_pairs * dff);
    ws.ex_jobs.clear();
    for (int e = 0; e < n_exp; ++e) {
      const int64_t e0 = ws.ex_start[static_cast<size_t>(e)];
      const int64_t m = ws.ex_start[static_cast<size_t>(e) + 1] - e0;
      if (m > 0)
        ws.ex_jobs.push_back(
            MatmulJob{&w.down_exps[static_cast<size_t>(e)], ws.eg.data() + e0 * dff, m, ws.ed.data() + e0 * n_embd});
    }
    matmul_jobs(ws.ex_jobs.data(), static_cast<int>(ws.ex_jobs.size()), pool);
    // summed per row in ascending expert order (the pairs are sorted by expert)
    for (int64_t i = 0; i < n_pairs; ++i)
      axpy(out + ws.ex_rows[static_cast<size_t>(i)] * n_embd, ws.ex_w[static_cast<size_t>(i)],
           ws.ed.data() + i * n_embd, n_embd);
  }
}

}  // namespace

void Model::forward(const int32_t* tokens, int64_t n, int32_t pos0, KvCache& cache, float* logits,
                    bool all_logits, ThreadPool* pool, ForwardObserver* observer) const {
  forward_batch({ForwardSeq{tokens, n, pos0, &cache, logits, all_logits, observer}}, pool);
}

void Model::check_seq(const ForwardSeq& s) const {
  const HParams& hp = hp_;
  KVTRIM_CHECK(s.cache != nullptr && s.logits != nullptr, "forward: a sequence without a cache or logits");
  const KvCacheConfig& cc = s.cache->config();
  const int64_t n = s.n;
  const int32_t pos0 = s.pos0;
  KVTRIM_CHECK(n > 0, "forward: no tokens");
  KVTRIM_CHECK(pos0 >= 0, "forward: negative position %d", pos0);
  KVTRIM_CHECK(
      cc.n_layer == hp.n_layer && cc.n_head_kv == hp.n_head_kv && cc.head_dim_k == hp.head_dim_k &&
          cc.head_dim_v == hp.head_dim_v,
      "forward: the KV cache (%d layers, %d kv heads, head dims %d/%d) does not match the model "
      "(%d layers, %d kv heads, head dims %d/%d)",
      cc.n_layer, cc.n_head_kv, cc.head_dim_k, cc.head_dim_v, hp.n_layer, hp.n_head_kv,
      hp.head_dim_k, hp.head_dim_v);
  const int64_t pos_end = int64_t{pos0} + n;  // one past the last position of this call
  KVTRIM_CHECK(pos_end <= cc.n_ctx,
               "context full: positions %d..%lld do not fit the KV cache's context of %lld tokens",
               pos0, static_cast<long long>(pos_end - 1), static_cast<long long>(cc.n_ctx));
  KVTRIM_CHECK(pos_end <= hp.n_ctx_train,
               "context full: positions %d..%lld exceed the model's context limit of %d tokens "
               "(%s.context_length)",
               pos0, static_cast<long long>(pos_end - 1), hp.n_ctx_train, arch_info(hp.arch).gguf_name);
  KVTRIM_CHECK(pos0 >= s.cache->n_past(),
               "forward: position %d is before the cache's end (n_past %d); truncate first", pos0,
               s.cache->n_past());
  for (int64_t i = 0; i < n; ++i) {
    KVTRIM_CHECK(s.tokens[i] >= 0 && s.tokens[i] < hp.n_vocab,
                 "forward: token id %d out of range [0, %d)", s.tokens[i], hp.n_vocab);
  }
}

bool Model::token_exact_products() const {
  if (!matmul_token_exact(output_)) return false;
  for (const LayerWeights& lw : layers_)
    for (const WeightView* w : {&lw.wq, &lw.wk, &lw.wv, &lw.wo, &lw.ffn_gate, &lw.ffn_up, &lw.ffn_down})
      if (!matmul_token_exact(*w)) return false;
  return true;
}

void Model::forward_batch(const std::vector<ForwardSeq>& seqs, ThreadPool* pool) const {
  const HParams& hp = hp_;
  const ArchInfo& ai = arch_info(hp.arch);
  KVTRIM_CHECK(!seqs.empty(), "forward: no sequences");
  // Every check before any work: a refused batch leaves every cache untouched.
  std::vector<int64_t> row0(seqs.size() + 1, 0);  // sequence s owns rows [row0[s], row0[s+1])
  for (size_t s = 0; s < seqs.size(); ++s) {
    check_seq(seqs[s]);
    for (size_t t = 0; t < s; ++t)
      KVTRIM_CHECK(seqs[t].cache != seqs[s].cache, "forward: sequences %zu and %zu share a KV cache", t, s);
    row0[s + 1] = row0[s] + seqs[s].n;
  }
  const int64_t n = row0.back();
  // The RoPE of every row is the same spec per layer: sequences whose contexts would choose other
  // LongRoPE factors cannot share a call (the server's slots share one context size).
  const int64_t rope_ctx = seqs[0].cache->config().n_ctx;
  for (const ForwardSeq& sq : seqs)
    KVTRIM_CHECK(layer_rope(hp, 0, sq.cache->config().n_ctx) == layer_rope(hp, 0, rope_ctx),
                 "forward: sequences with contexts %lld and %lld use different RoPE factors (LongRoPE); run them apart",
                 static_cast<long long>(sq.cache->config().n_ctx), static_cast<long long>(rope_ctx));

  const int64_t n_embd = hp.n_embd, n_ff = hp.n_ff;
  const int64_t hdk = hp.head_dim_k, hdv = hp.head_dim_v;
  const int64_t n_q = hp.n_head * hdk, n_k = hp.n_head_kv * hdk, n_v = hp.n_head_kv * hdv,
                n_o = hp.n_head * hdv;

  thread_local Workspace ws;
  ws.x.resize(static_cast<size_t>(n * n_embd));
  ws.xb.resize(static_cast<size_t>(n * n_embd));
  ws.q.resize(static_cast<size_t>(n * n_q));
  ws.k.resize(static_cast<size_t>(n * n_k));
  ws.v.resize(static_cast<size_t>(n * n_v));
  ws.att.resize(static_cast<size_t>(n * n_o));
  ws.gate.resize(static_cast<size_t>(n * n_ff));
  ws.up.resize(static_cast<size_t>(n * n_ff));
  ws.pos.resize(static_cast<size_t>(n));
  float* x = ws.x.data();
  float* xb = ws.xb.data();
  for (size_t s = 0; s < seqs.size(); ++s)
    for (int64_t i = 0; i < seqs[s].n; ++i) ws.pos[row0[s] + i] = static_cast<int32_t>(seqs[s].pos0 + i);
  ws.rope_spec = RopeSpec{};  // (n_rot 0: this call's angles not computed yet)

  // token embeddings (gemma: times sqrt(n_embd))
  for (size_t s = 0; s < seqs.size(); ++s) {
    for (int64_t i = 0; i < seqs[s].n; ++i) {
      float* xr = x + (row0[s] + i) * n_embd;
      get_row(tok_embd_, seqs[s].tokens[i], xr);
      if (hp.embd_scale != 1.f) scale(xr, hp.embd_scale, n_embd);
    }
  }
  const bool token_exact = seqs.size() > 1 && token_exact_products();
  const RowGroups groups = row_groups(seqs, row0, token_exact);
  bool any_layer_io = false;
  for (const ForwardSeq& sq : seqs) any_layer_io |= sq.observer && sq.observer->wants_layer_io();
  // The decode rows of sequences no press observes, when there are at least as many as threads:
  // their attention (append + attend) runs as one pool job, a sequence per thread at a time,
  // instead of one or two jobs per sequence and layer (the pool's round trips were ~20 % of a
  // 4-stream SmolLM2 step). Prefill chunks and observed sequences (their observers stay on the
  // caller's thread) attend one by one on the whole pool, as alone.
  auto joins_job = [](const ForwardSeq& sq) { return sq.n == 1 && !sq.observer; };
  std::vector<size_t> job_seqs;
  for (size_t s = 0; s < seqs.size(); ++s)
    if (joins_job(seqs[s])) job_seqs.push_back(s);
  if (!pool || pool->n_threads() < 2 || job_seqs.size() < static_cast<size_t>(pool->n_threads())) job_seqs.clear();
  // Which thread attends which of them (the pool's longest-first spread, core/item_bins.h): a
  // sequence's attention costs about its context length. A sequence is attended whole by one
  // thread either way, so the assignment does not change any result.
  ItemBins job_bins;
  if (!job_seqs.empty()) {
    std::vector<int64_t> cost;
    for (size_t s : job_seqs) cost.push_back(seqs[s].pos0 + 1);
    job_bins = longest_first_bins(cost, pool->n_threads());
    for (auto& bin : job_bins)
      for (size_t& i : bin) i = job_seqs[i];  // item index -> sequence index
  }

  for (int il = 0; il < hp.n_layer; ++il) {
    const LayerWeights& w = layers_[il];
    const RopeSpec rs = layer_rope(hp, il, rope_ctx);

    if (any_layer_io) ws.x_in.assign(x, x + n * n_embd);
    // --- attention: xb = rmsnorm(x); q, k, v = xb·Wqᵀ (+b), ...
    rms_norm_rows(x, w.attn_norm, xb, n, n_embd, hp.norm_eps, pool);
    project_groups_many({{&w.wq, ws.q.data()}, {&w.wk, ws.k.data()}, {&w.wv, ws.v.data()}}, xb, groups, pool);
    add_bias(w.bq, ws.q.data(), n, n_q);
    add_bias(w.bk, ws.k.data(), n, n_k);
    add_bias(w.bv, ws.v.data(), n, n_v);
    // gemma3: per-head RMSNorm of q and k
    if (w.q_norm.data)
      rms_norm_rows(ws.q.data(), w.q_norm, ws.q.data(), n * hp.n_head, hdk, hp.norm_eps, pool);
    if (w.k_norm.data)
      rms_norm_rows(ws.k.data(), w.k_norm, ws.k.data(), n * hp.n_head_kv, hdk, hp.norm_eps, pool);
    for (size_t s = 0; s < seqs.size(); ++s) {
      ForwardObserver* ob = seqs[s].observer;
      if (ob && ob->wants_pre_rope())
        ob->on_qk_pre_rope(il, seqs[s].n, ws.q.data() + row0[s] * n_q, ws.k.data() + row0[s] * n_k);
    }
    // RoPE at the original positions: the rows' angles once per call and RoPE spec (Gemma3
    // alternates two bases), then every head of every row
    {
      const int64_t nr = rs.n_rot, half = nr / 2;
      if (!(ws.rope_spec == rs)) {
        ws.rope_cs.resize(static_cast<size_t>(n * nr));
        float* cs = ws.rope_cs.data();
        const int32_t* pos = ws.pos.data();
        rows_job(pool, n, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) rope_angles(rs, pos[i], cs + i * nr, cs + i * nr + half);
        });
        ws.rope_spec = rs;
      }
      const float* cs = ws.rope_cs.data();
      float* const q = ws.q.data();
      float* const k = ws.k.data();
      rows_job(pool, n, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          const float* c = cs + i * nr;
          for (int ih = 0; ih < hp.n_head; ++ih) rope_rotate(q + i * n_q + ih * hdk, nr, rs.neox, c, c + half);
          for (int ih = 0; ih < hp.n_head_kv; ++ih) rope_rotate(k + i * n_k + ih * hdk, nr, rs.neox, c, c + half);
        }
      });
    }
    AttnParams ap;
    ap.n_head = hp.n_head;
    ap.scale = hp.attn_scale;
    ap.sliding_window = hp.sliding_window[il];
    ap.softcap = hp.attn_softcap;
    // per sequence: its cache stores its k, v, then attends over everything it holds
    // (the workspace by plain pointers: `ws` named inside a pool task would be the worker's own
    // thread_local instance)
    float* const wq = ws.q.data();
    const float* const wk = ws.k.data();
    const float* const wv = ws.v.data();
    const int32_t* const wpos = ws.pos.data();
    float* const watt = ws.att.data();
    auto seq_attention = [&](size_t s, ThreadPool* p, const AttnParams& a) {
      const ForwardSeq& sq = seqs[s];
      const int64_t r = row0[s];
      float* q = wq + r * n_q;
      const float* k = wk + r * n_k;
      const float* v = wv + r * n_v;
      const int32_t* pos = wpos + r;
      if (sq.observer) sq.observer->on_qkv(il, sq.n, q, k, v, pos);
      sq.cache->append(il, sq.n, k, v, pos, p);
      if (sq.observer) sq.observer->after_append(il, *sq.cache);
      sq.cache->attend(il, sq.n, q, pos, a, watt + r * n_o, p);
    };
    if (!job_seqs.empty()) {
      AttnParams one = ap;
      one.split_threads = pool->n_threads();
      run_item_bins(*pool, job_bins, [&](size_t s) { seq_attention(s, nullptr, one); });
    }
    for (size_t s = 0; s < seqs.size(); ++s)
      if (job_seqs.empty() || !joins_job(seqs[s])) seq_attention(s, pool, ap);
    // x += [post_norm](att·Woᵀ)
    project_groups(w.wo, ws.att.data(), groups, xb, pool);
    if (w.post_attn_norm.data) rms_norm_rows(xb, w.post_attn_norm, xb, n, n_embd, hp.norm_eps, pool);
    rows_job(pool, n, [&](int64_t b, int64_t e) { add(x + b * n_embd, xb + b * n_embd, (e - b) * n_embd); });

    // --- feed-forward: x += [post_norm](W_down · (act(W_gate·xb) ⊙ (W_up·xb))), xb = rmsnorm(x)
    rms_norm_rows(x, w.ffn_norm, xb, n, n_embd, hp.norm_eps, pool);
    if (w.ffn_gate_inp.data) {  // qwen3moe: the routed experts' outputs, weighted, into xb
      ws.moe_out.resize(static_cast<size_t>(n * n_embd));
      moe_ffn(hp, w, xb, groups, n, ws.moe_out.data(), ws, pool);
      std::copy_n(ws.moe_out.data(), n * n_embd, xb);
    } else {
    project_groups_many({{&w.ffn_gate, ws.gate.data()}, {&w.ffn_up, ws.up.data()}}, xb, groups, pool);
    {
      float* const g = ws.gate.data();
      const float* const u = ws.up.data();
      const bool silu = ai.ffn_act == FfnAct::kSilu;
      rows_job(pool, n, [&](int64_t b, int64_t e) {
        if (silu) {
          swiglu(g + b * n_ff, u + b * n_ff, g + b * n_ff, (e - b) * n_ff);
        } else {
          geglu_tanh(g + b * n_ff, u + b * n_ff, g + b * n_ff, (e - b) * n_ff);
        }
      });
    }
    project_groups(w.ffn_down, ws.gate.data(), groups, xb, pool);
    }
    if (w.post_ffn_norm.data) rms_norm_rows(xb, w.post_ffn_norm, xb, n, n_embd, hp.norm_eps, pool);
    rows_job(pool, n, [&](int64_t b, int64_t e) { add(x + b * n_embd, xb + b * n_embd, (e - b) * n_embd); });
    for (size_t s = 0; s < seqs.size(); ++s) {
      ForwardObserver* ob = seqs[s].observer;
      if (ob && ob->wants_layer_io())
        ob->on_layer_io(il, seqs[s].n, ws.x_in.data() + row0[s] * n_embd, x + row0[s] * n_embd);
    }
  }

  // final norm and logits: one product over the rows that need logits (every row of an
  // all_logits sequence, the last row of the others)
  const int64_t n_vocab = hp.n_vocab;
  if (seqs.size() == 1) {
    const ForwardSeq& sq = seqs[0];
    const int64_t first = sq.all_logits ? 0 : n - 1;
    rms_norm_rows(x + first * n_embd, out_norm_, xb, n - first, n_embd, hp.norm_eps);
    project(output_, xb, n - first, sq.logits, pool);
  } else {
    int64_t m = 0;  // rows gathered into xb
    for (size_t s = 0; s < seqs.size(); ++s) {
      const int64_t first = seqs[s].all_logits ? row0[s] : row0[s + 1] - 1;
      const int64_t cnt = row0[s + 1] - first;
      rms_norm_rows(x + first * n_embd, out_norm_, xb + m * n_embd, cnt, n_embd, hp.norm_eps);
      m += cnt;
    }
    ws.logits.resize(static_cast<size_t>(m * n_vocab));
    // the gathered rows: one per single-row or last-row sequence, all of an all_logits one
    std::vector<ForwardSeq> gathered(seqs.size());
    std::vector<int64_t> grow0(seqs.size() + 1, 0);
    for (size_t s = 0; s < seqs.size(); ++s) {
      gathered[s].n = seqs[s].all_logits ? seqs[s].n : 1;
      grow0[s + 1] = grow0[s] + gathered[s].n;
    }
    project_groups(output_, xb, row_groups(gathered, grow0, token_exact), ws.logits.data(), pool);
    m = 0;
    for (size_t s = 0; s < seqs.size(); ++s) {
      const int64_t cnt = seqs[s].all_logits ? seqs[s].n : 1;
      std::copy_n(ws.logits.data() + m * n_vocab, cnt * n_vocab, seqs[s].logits);
      m += cnt;
    }
  }
  if (hp.final_softcap > 0) {  // gemma2: logits = c·tanh(logits / c)
    const float c = hp.final_softcap;
    for (const ForwardSeq& sq : seqs) {
      const int64_t rows = sq.all_logits ? sq.n : 1;
      for (int64_t i = 0; i < rows * n_vocab; ++i) sq.logits[i] = c * std::tanh(sq.logits[i] / c);
    }
  }
  for (const ForwardSeq& sq : seqs) sq.cache->advance(static_cast<int32_t>(sq.pos0 + sq.n));
}

}  // namespace kvtrim
