// The scalar reference forward pass (llama2.c's run.c style): the ops::ref kernels only, and
// its own dense f32 KV arrays with textbook attention. It is slow on purpose and shares no code
// with the optimized path beyond the ref kernels, so the optimized forward and every cache layout
// can be tested against it.
// It runs layer by layer over all the tokens: each projection is one ref::matmul, which
// dequantizes a weight row once for every token instead of once per token (ref::matvec is
// ref::matmul of one token: the numbers are identical to a token-at-a-time pass); attention,
// norms and RoPE stay per token and read only positions t <= pos.
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
namespace {

const float* f32(const WeightView& w) {
  return static_cast<const float*>(w.data);
}

// out[pos] = rmsnorm(x[pos]) · weight for every one of the n rows of dim.
void ref_norm_rows(const float* x, const WeightView& weight, float* out, int64_t n, int64_t dim,
                   float eps) {
  for (int64_t pos = 0; pos < n; ++pos)
    ref::rms_norm(x + pos * dim, f32(weight), out + pos * dim, dim, eps);
}

// One query head at position pos over the layer's keys / values of positions t <= pos (and
// pos - t < window): o = Σ_t softmax(q·k_t · scale)_t v_t. k / v: [n, kv_dim] of this layer.
void attend_head(const HParams& hp, const float* q, const float* k, const float* v,
                 int64_t kv_dim_k, int64_t kv_dim_v, int64_t hk, int64_t pos, int window,
                 float* att, float* o) {
  const int64_t hdk = hp.head_dim_k, hdv = hp.head_dim_v;
  const int64_t t0 = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
  for (int64_t t = t0; t <= pos; ++t) {
    att[t - t0] =
        ref::dot(q, k + t * kv_dim_k + hk * hdk, hdk) * hp.attn_scale;  // score = q·k · scale
    // gemma2: score = c·tanh(score / c)
    if (hp.attn_softcap > 0)
      att[t - t0] = hp.attn_softcap * std::tanh(att[t - t0] / hp.attn_softcap);
  }
  ref::softmax(att, pos - t0 + 1);
  for (int64_t i = 0; i < hdv; ++i) o[i] = 0;
  for (int64_t t = t0; t <= pos; ++t) {  // o = Σ_t a_t v_t
    const float* vt = v + t * kv_dim_v + hk * hdv;
    for (int64_t i = 0; i < hdv; ++i) o[i] += att[t - t0] * vt[i];
  }
}

// The attention block of layer il for every token: k / v (this layer's [n, kv_dim]) are
// written, out[n, dim] = Wo·attention (gemma3: post-attention norm), before the residual add.
void attention_layer(const Model& m, int il, const float* xb, int64_t n, float* k, float* v,
                     float* out) {
  const HParams& hp = m.hparams();
  const LayerWeights& w = m.layers()[il];
  const int64_t hdk = hp.head_dim_k, hdv = hp.head_dim_v;
  const int64_t n_group = hp.n_head / hp.n_head_kv;  // query heads per kv head
  const int64_t q_dim = hp.n_head * hdk, kv_dim_k = hp.n_head_kv * hdk,
                kv_dim_v = hp.n_head_kv * hdv;
  const RopeSpec rs = layer_rope(hp, il, n);  // (the pass's length is its context)
  // q = Wq·xb (+bq), k = Wk·xb (+bk), v = Wv·xb (+bv)
  std::vector<float> q(static_cast<size_t>(n * q_dim));
  ref::matmul(w.wq, xb, n, q.data());
  ref::matmul(w.wk, xb, n, k);
  ref::matmul(w.wv, xb, n, v);
  std::vector<float> att(static_cast<size_t>(n)), att_out(static_cast<size_t>(n * hp.n_head * hdv));
  for (int64_t pos = 0; pos < n; ++pos) {
    float* qp = q.data() + pos * q_dim;
    float* kp = k + pos * kv_dim_k;
    float* vp = v + pos * kv_dim_v;
    if (w.bq.data) {
      for (int64_t i = 0; i < q_dim; ++i) qp[i] += f32(w.bq)[i];
      for (int64_t i = 0; i < kv_dim_k; ++i) kp[i] += f32(w.bk)[i];
      for (int64_t i = 0; i < kv_dim_v; ++i) vp[i] += f32(w.bv)[i];
    }
    // gemma3: q = rmsnorm(q_h)·q_norm, k = rmsnorm(k_h)·k_norm per head
    if (w.q_norm.data) {
      for (int h = 0; h < hp.n_head; ++h)
        ref::rms_norm(qp + h * hdk, f32(w.q_norm), qp + h * hdk, hdk, hp.norm_eps);
      for (int h = 0; h < hp.n_head_kv; ++h)
        ref::rms_norm(kp + h * hdk, f32(w.k_norm), kp + h * hdk, hdk, hp.norm_eps);
    }
    // RoPE: rotate q and k of every head by position pos
    for (int h = 0; h < hp.n_head; ++h) ref::rope(qp + h * hdk, rs, static_cast<int32_t>(pos));
    for (int h = 0; h < hp.n_head_kv; ++h) ref::rope(kp + h * hdk, rs, static_cast<int32_t>(pos));
    // multi-head attention over positions t <= pos (keys of later positions are never read)
    for (int h = 0; h < hp.n_head; ++h)
      attend_head(hp, qp + h * hdk, k, v, kv_dim_k, kv_dim_v, h / n_group, pos,
                  hp.sliding_window[il], att.data(), att_out.data() + (pos * hp.n_head + h) * hdv);
  }
  // out = Wo·att_out; gemma3: out = rmsnorm(out)·post_attention_norm
  ref::matmul(w.wo, att_out.data(), n, out);
  if (w.post_attn_norm.data) ref_norm_rows(out, w.post_attn_norm, out, n, hp.n_embd, hp.norm_eps);
}

// qwen3moe, one token: p = softmax(router·xb); the n_used largest p (lower index first on a
// tie), renormalised; out = Σ_e (p_e / Σ p) · down_e(silu(gate_e·xb) ⊙ up_e·xb), e ascending.
void moe_token(const Model& m, const LayerWeights& w, const float* xb, float* out) {
  const HParams& hp = m.hparams();
  const int64_t dim = hp.n_embd;
  std::vector<float> p(static_cast<size_t>(hp.n_expert));
  ref::matvec(w.ffn_gate_inp, xb, p.data());
  ref::softmax(p.data(), hp.n_expert);
  std::vector<int> order(static_cast<size_t>(hp.n_expert));
  for (int e = 0; e < hp.n_expert; ++e) order[static_cast<size_t>(e)] = e;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return p[static_cast<size_t>(a)] > p[static_cast<size_t>(b)];
  });
  order.resize(static_cast<size_t>(hp.n_expert_used));
  std::sort(order.begin(), order.end());
  double psum = 0;
  for (int e : order) psum += p[static_cast<size_t>(e)];
  std::vector<float> g(static_cast<size_t>(hp.n_ff_exp)), u(g.size()), y(static_cast<size_t>(dim));
  for (int64_t i = 0; i < dim; ++i) out[i] = 0.f;
  for (int e : order) {
    ref::matvec(w.gate_exps[static_cast<size_t>(e)], xb, g.data());
    ref::matvec(w.up_exps[static_cast<size_t>(e)], xb, u.data());
    ref::swiglu(g.data(), u.data(), g.data(), hp.n_ff_exp);
    ref::matvec(w.down_exps[static_cast<size_t>(e)], g.data(), y.data());
    const float we = static_cast<float>(p[static_cast<size_t>(e)] / psum);
    for (int64_t i = 0; i < dim; ++i) out[i] += we * y[static_cast<size_t>(i)];
  }
}

// The feed-forward block of layer il for every token, from the normed input xb [n, dim]:
// out = w2(act(w1·xb) ⊙ w3·xb) (silu: llama, qwen2; gelu_tanh: gemma3; gemma3's post-FFN norm),
// or the mixture of experts, before the residual add.
void ffn_layer(const Model& m, int il, const float* xb, int64_t n, float* out) {
  const HParams& hp = m.hparams();
  const LayerWeights& w = m.layers()[il];
  if (w.ffn_gate_inp.data) {
    for (int64_t pos = 0; pos < n; ++pos)
      moe_token(m, w, xb + pos * hp.n_embd, out + pos * hp.n_embd);
    return;
  }
  const int64_t n_ff = hp.n_ff;
  std::vector<float> hb(static_cast<size_t>(n * n_ff)), hb2(hb.size());
  ref::matmul(w.ffn_gate, xb, n, hb.data());
  ref::matmul(w.ffn_up, xb, n, hb2.data());
  for (int64_t pos = 0; pos < n; ++pos) {
    float* h = hb.data() + pos * n_ff;
    if (arch_info(hp.arch).ffn_act == FfnAct::kSilu) {
      ref::swiglu(h, hb2.data() + pos * n_ff, h, n_ff);
    } else {
      ref::geglu_tanh(h, hb2.data() + pos * n_ff, h, n_ff);
    }
  }
  ref::matmul(w.ffn_down, hb.data(), n, out);
  if (w.post_ffn_norm.data) ref_norm_rows(out, w.post_ffn_norm, out, n, hp.n_embd, hp.norm_eps);
}

}  // namespace

void forward_reference(const Model& m, const int32_t* tokens, int64_t n, float* logits) {
  const HParams& hp = m.hparams();
  KVTRIM_CHECK(n <= hp.n_ctx_train,
               "forward_reference: %lld tokens exceed the model's context limit of %d",
               static_cast<long long>(n), hp.n_ctx_train);
  const int64_t dim = hp.n_embd;
  const int64_t kv_dim_k = hp.n_head_kv * hp.head_dim_k, kv_dim_v = hp.n_head_kv * hp.head_dim_v;
  std::vector<float> x(static_cast<size_t>(n * dim));  // [n, dim] residual stream
  std::vector<float> xb(x.size()), sub(x.size());      // [n, dim] normed input, sublayer output
  std::vector<float> key(static_cast<size_t>(n * kv_dim_k)),
      value(static_cast<size_t>(n * kv_dim_v));  // one layer's

  // x = token embedding rows (gemma: · sqrt(dim))
  const WeightView& te = m.tok_embd();
  for (int64_t pos = 0; pos < n; ++pos) {
    KVTRIM_CHECK(tokens[pos] >= 0 && tokens[pos] < hp.n_vocab, "token id %d out of range",
                 tokens[pos]);
    float* xp = x.data() + pos * dim;
    dequantize_row(te.type, static_cast<const uint8_t*>(te.data) + tokens[pos] * te.row_bytes, xp,
                   dim);
    for (int64_t i = 0; i < dim; ++i) xp[i] *= hp.embd_scale;
  }
  for (int il = 0; il < hp.n_layer; ++il) {
    const LayerWeights& w = m.layers()[il];
    // x += attention(rmsnorm(x)·attn_norm); x += ffn(rmsnorm(x)·ffn_norm)
    ref_norm_rows(x.data(), w.attn_norm, xb.data(), n, dim, hp.norm_eps);
    attention_layer(m, il, xb.data(), n, key.data(), value.data(), sub.data());
    for (size_t i = 0; i < x.size(); ++i) x[i] += sub[i];
    ref_norm_rows(x.data(), w.ffn_norm, xb.data(), n, dim, hp.norm_eps);
    ffn_layer(m, il, xb.data(), n, sub.data());
    for (size_t i = 0; i < x.size(); ++i) x[i] += sub[i];
  }
  // final rmsnorm and the classifier into logits [n, n_vocab]
  ref_norm_rows(x.data(), m.output_norm(), xb.data(), n, dim, hp.norm_eps);
  ref::matmul(m.output(), xb.data(), n, logits);
  // gemma2: logits = c·tanh(logits / c)
  if (hp.final_softcap > 0)
    for (int64_t i = 0; i < n * hp.n_vocab; ++i)
      logits[i] = hp.final_softcap * std::tanh(logits[i] / hp.final_softcap);
}

}  // namespace kvtrim
