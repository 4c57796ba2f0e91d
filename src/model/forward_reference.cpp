// The scalar reference forward pass (llama2.c's run.c style): one token at a time, the
// ops::ref kernels only, and its own dense f32 KV arrays with textbook attention. It is
// slow on purpose and shares no code with the optimized path beyond the ref kernels, so
// the optimized forward and every cache layout can be tested against it.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "model/arch/arch.h"
#include "model/model.h"
#include "ops/dequant.h"
#include "ops/matmul.h"
#include "ops/nn.h"

namespace kvtrim {

void forward_reference(const Model& m, const int32_t* tokens, int64_t n, float* logits) {
  const HParams& hp = m.hparams();
  const ArchInfo& ai = arch_info(hp.arch);
  KVTRIM_CHECK(n <= hp.n_ctx_train,
               "forward_reference: %lld tokens exceed the model's context limit of %d",
               static_cast<long long>(n), hp.n_ctx_train);
  const int64_t dim = hp.n_embd, n_ff = hp.n_ff, hdk = hp.head_dim_k, hdv = hp.head_dim_v;
  const int64_t n_group = hp.n_head / hp.n_head_kv;  // query heads per kv head
  const int64_t kv_dim_k = hp.n_head_kv * hdk, kv_dim_v = hp.n_head_kv * hdv;
  auto f32 = [](const WeightView& w) { return static_cast<const float*>(w.data); };

  std::vector<float> x(dim);                    // [dim] residual stream
  std::vector<float> xb(dim);                   // [dim] normed input / sublayer output
  std::vector<float> q(hp.n_head * hdk);        // [n_head, hdk]
  std::vector<float> att_out(hp.n_head * hdv);  // [n_head, hdv]
  std::vector<float> hb(n_ff), hb2(n_ff);       // [n_ff]
  std::vector<float> att(n);                    // [n] scores of one head
  // key_cache (layer, pos, n_head_kv * hdk), value_cache (layer, pos, n_head_kv * hdv)
  std::vector<float> key_cache(hp.n_layer * n * kv_dim_k), value_cache(hp.n_layer * n * kv_dim_v);

  for (int64_t pos = 0; pos < n; ++pos) {
    // x = token embedding row (gemma: · sqrt(dim))
    const WeightView& te = m.tok_embd();
    KVTRIM_CHECK(tokens[pos] >= 0 && tokens[pos] < hp.n_vocab, "token id %d out of range",
                 tokens[pos]);
    dequantize_row(te.type, static_cast<const uint8_t*>(te.data) + tokens[pos] * te.row_bytes,
                   x.data(), dim);
    for (int64_t i = 0; i < dim; ++i) x[i] *= hp.embd_scale;

    for (int il = 0; il < hp.n_layer; ++il) {
      const LayerWeights& w = m.layers()[il];
      const int window = hp.sliding_window[il];
      const RopeSpec rs = layer_rope(hp, il, n);  // (the pass's length is its context)
      float* k =
          key_cache.data() + (il * n + pos) * kv_dim_k;  // this token's keys [n_head_kv, hdk]
      float* v =
          value_cache.data() + (il * n + pos) * kv_dim_v;  // this token's values [n_head_kv, hdv]

      // attention rmsnorm: xb = x / rms(x) · attn_norm
      ref::rms_norm(x.data(), f32(w.attn_norm), xb.data(), dim, hp.norm_eps);
      // q = Wq·xb (+bq), k = Wk·xb (+bk), v = Wv·xb (+bv)
      ref::matvec(w.wq, xb.data(), q.data());
      ref::matvec(w.wk, xb.data(), k);
      ref::matvec(w.wv, xb.data(), v);
      if (w.bq.data) {
        for (int64_t i = 0; i < hp.n_head * hdk; ++i) q[i] += f32(w.bq)[i];
        for (int64_t i = 0; i < kv_dim_k; ++i) k[i] += f32(w.bk)[i];
        for (int64_t i = 0; i < kv_dim_v; ++i) v[i] += f32(w.bv)[i];
      }
      // gemma3: q = rmsnorm(q_h)·q_norm, k = rmsnorm(k_h)·k_norm per head
      if (w.q_norm.data) {
        for (int h = 0; h < hp.n_head; ++h)
          ref::rms_norm(&q[h * hdk], f32(w.q_norm), &q[h * hdk], hdk, hp.norm_eps);
        for (int h = 0; h < hp.n_head_kv; ++h)
          ref::rms_norm(k + h * hdk, f32(w.k_norm), k + h * hdk, hdk, hp.norm_eps);
      }
      // RoPE: rotate q and k of every head by position pos
      for (int h = 0; h < hp.n_head; ++h)
        ref::rope(&q[h * hdk], rs, static_cast<int32_t>(pos));
      for (int h = 0; h < hp.n_head_kv; ++h)
        ref::rope(k + h * hdk, rs, static_cast<int32_t>(pos));

      // multi-head attention over positions t <= pos (and pos - t < window)
      for (int h = 0; h < hp.n_head; ++h) {
        const int64_t hk = h / n_group;  // GQA: kv head of query head h
        const int64_t t0 = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
        const int64_t n_vis = pos - t0 + 1;
        for (int64_t t = t0; t <= pos; ++t) {
          const float* kt = key_cache.data() + (il * n + t) * kv_dim_k + hk * hdk;
          att[t - t0] = ref::dot(&q[h * hdk], kt, hdk) * hp.attn_scale;  // score = q·k · scale
          // gemma2: score = c·tanh(score / c)
          if (hp.attn_softcap > 0) att[t - t0] = hp.attn_softcap * std::tanh(att[t - t0] / hp.attn_softcap);
        }
        ref::softmax(att.data(), n_vis);
        float* o = &att_out[h * hdv];
        for (int64_t i = 0; i < hdv; ++i) o[i] = 0;
        for (int64_t t = t0; t <= pos; ++t) {  // o = Σ_t a_t v_t
          const float* vt = value_cache.data() + (il * n + t) * kv_dim_v + hk * hdv;
          for (int64_t i = 0; i < hdv; ++i) o[i] += att[t - t0] * vt[i];
        }
      }
      // xb = Wo·att_out; gemma3: xb = rmsnorm(xb)·post_attention_norm; residual x += xb
      ref::matvec(w.wo, att_out.data(), xb.data());
      if (w.post_attn_norm.data)
        ref::rms_norm(xb.data(), f32(w.post_attn_norm), xb.data(), dim, hp.norm_eps);
      for (int64_t i = 0; i < dim; ++i) x[i] += xb[i];

      // ffn rmsnorm, then F.silu(w1(x)) * w3(x) (llama, qwen2) or gelu_tanh(w1(x)) * w3(x) (gemma3)
      ref::rms_norm(x.data(), f32(w.ffn_norm), xb.data(), dim, hp.norm_eps);
      if (w.ffn_gate_inp.data) {
        // qwen3moe: p = softmax(router·xb); the n_used largest p (lower index first on a tie),
        // renormalised; xb = Σ_e (p_e / Σ p) · down_e(silu(gate_e·xb) ⊙ up_e·xb), e ascending
        std::vector<float> p(static_cast<size_t>(hp.n_expert));
        ref::matvec(w.ffn_gate_inp, xb.data(), p.data());
        ref::softmax(p.data(), hp.n_expert);
        std::vector<int> order(static_cast<size_t>(hp.n_expert));
        for (int e = 0; e < hp.n_expert; ++e) order[static_cast<size_t>(e)] = e;
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[static_cast<size_t>(a)] > p[static_cast<size_t>(b)]; });
        order.resize(static_cast<size_t>(hp.n_expert_used));
        std::sort(order.begin(), order.end());
        double psum = 0;
        for (int e : order) psum += p[static_cast<size_t>(e)];
        std::vector<float> g(static_cast<size_t>(hp.n_ff_exp)), u(g.size()), y(static_cast<size_t>(dim)), acc(static_cast<size_t>(dim), 0.f);
        for (int e : order) {
          ref::matvec(w.gate_exps[static_cast<size_t>(e)], xb.data(), g.data());
          ref::matvec(w.up_exps[static_cast<size_t>(e)], xb.data(), u.data());
          ref::swiglu(g.data(), u.data(), g.data(), hp.n_ff_exp);
          ref::matvec(w.down_exps[static_cast<size_t>(e)], g.data(), y.data());
          const float we = static_cast<float>(p[static_cast<size_t>(e)] / psum);
          for (int64_t i = 0; i < dim; ++i) acc[static_cast<size_t>(i)] += we * y[static_cast<size_t>(i)];
        }
        for (int64_t i = 0; i < dim; ++i) x[i] += acc[static_cast<size_t>(i)];
        continue;
      }
      ref::matvec(w.ffn_gate, xb.data(), hb.data());
      ref::matvec(w.ffn_up, xb.data(), hb2.data());
      if (ai.ffn_act == FfnAct::kSilu) {
        ref::swiglu(hb.data(), hb2.data(), hb.data(), n_ff);
      } else {
        ref::geglu_tanh(hb.data(), hb2.data(), hb.data(), n_ff);
      }
      // xb = w2(hb); gemma3: xb = rmsnorm(xb)·post_ffw_norm; residual x += xb
      ref::matvec(w.ffn_down, hb.data(), xb.data());
      if (w.post_ffn_norm.data)
        ref::rms_norm(xb.data(), f32(w.post_ffn_norm), xb.data(), dim, hp.norm_eps);
      for (int64_t i = 0; i < dim; ++i) x[i] += xb[i];
    }

    // final rmsnorm and the classifier into logits[pos]
    ref::rms_norm(x.data(), f32(m.output_norm()), xb.data(), dim, hp.norm_eps);
    ref::matvec(m.output(), xb.data(), logits + pos * hp.n_vocab);
    // gemma2: logits = c·tanh(logits / c)
    if (hp.final_softcap > 0)
      for (int64_t i = 0; i < hp.n_vocab; ++i)
        logits[pos * hp.n_vocab + i] = hp.final_softcap * std::tanh(logits[pos * hp.n_vocab + i] / hp.final_softcap);
  }
}

}  // namespace kvtrim
