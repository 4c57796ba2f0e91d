// One decoder layer in f32, forward and backward with respect to low-rank K/V projectors
// (StiefAttention, DESIGN.md §4.3; docs/stiefattention.md). The layer map f_ℓ is the whole
// decoder layer (norms, attention, residuals, MLP) of llama, qwen2 and gemma3; f̂_ℓ is the
// same with every kv head's keys K_h replaced by K_h·P_k and values V_h by V_h·P_v,h, where
// P = U·Uᵀ is the orthogonal projector of a basis U [d, r].
//
// Only the K/V paths change with the bases, so everything upstream of them is computed once
// per calibration sequence (LayerSeq: the layer input, post-RoPE queries, keys, values, and
// the uncompressed output that is the target and the next layer's input). A training step
// then costs attention for the sampled query rows, the output projection and the MLP for those
// rows, and the same again backward (weight gradients are never needed: only the gradient
// with respect to the projectors).
//
// The attention and norm projections that precede the K/V paths run on the model's own
// (possibly quantized) weights through ops::matmul (the engine's prefill path); W_O and the
// MLP are dequantized once per layer to f32 (the backward pass needs their transposes).
#pragma once
#include <cstdint>
#include <vector>

#include "model/model.h"

namespace kvtrim {

class ThreadPool;

// One layer's weights after the attention projections, dequantized to f32 (row-major, y = W x).
struct LayerWeightsF32 {
  int n_embd = 0, n_ff = 0, n_head = 0, n_head_kv = 0, dk = 0, dv = 0;
  float norm_eps = 0, attn_scale = 0;
  int window = 0;     // sliding window of the layer (0 = global)
  bool gelu = false;  // GeGLU (gemma3) instead of SwiGLU
  std::vector<float> wo;                    // [n_embd, n_head*dv]
  std::vector<float> gate, up;              // [n_ff, n_embd]
  std::vector<float> down;                  // [n_embd, n_ff]
  std::vector<float> ffn_norm;              // [n_embd]
  std::vector<float> post_attn_norm, post_ffn_norm;  // [n_embd] (gemma3) or empty
};
LayerWeightsF32 layer_weights_f32(const Model& model, int il);

// A calibration sequence at one layer: what the bases cannot change, computed once.
struct LayerSeq {
  int64_t n = 0;            // tokens (positions 0 .. n-1)
  std::vector<float> x;     // [n, n_embd] layer input (residual stream)
  std::vector<float> q;     // [n, n_head*dk] post-RoPE queries
  std::vector<float> k;     // [n, n_head_kv*dk] post-RoPE keys
  std::vector<float> v;     // [n, n_head_kv*dv] values
  std::vector<float> y;     // [n, n_embd] the uncompressed layer output (target, next input)
};
// x: [n, n_embd] the layer's input for one sequence starting at position 0.
LayerSeq prepare_layer_seq(const Model& model, int il, const LayerWeightsF32& w,
                           std::vector<float> x, ThreadPool* pool);

// Projectors of one evaluation, per side: empty = identity (that side uncompressed), one entry
// = shared by the layer's kv heads (StiefAttention's keys), n_head_kv entries = one per kv head
// (nullptr = that head uncompressed). pk entries are [dk, dk], pv entries [dv, dv].
struct LayerProjectors {
  std::vector<const float*> pk, pv;
};

// Forward state of the rows of one sequence (kept for the backward pass).
struct LayerTape {
  std::vector<int32_t> rows;  // query positions evaluated, increasing
  int64_t n_keys = 0;         // keys read: positions 0 .. n_keys-1 (= rows.back() + 1)
  std::vector<float> kh, vh;  // [n_keys, n_head_kv*d] projected keys / values
  std::vector<float> qr;      // [R, n_head*dk] the rows' queries
  std::vector<float> att;     // [n_head, R, n_keys] attention probabilities (0 where masked)
  std::vector<float> o;       // [R, n_head*dv] attention output (heads concatenated)
  std::vector<float> a;       // [R, n_embd] W_O · o (before gemma3's post-attention norm)
  std::vector<float> x1;      // [R, n_embd] after the attention residual
  std::vector<float> h2;      // [R, n_embd] ffn_norm(x1)
  std::vector<float> g, u;    // [R, n_ff] gate and up projections
  std::vector<float> m;       // [R, n_ff] act(g)·u
  std::vector<float> dn;      // [R, n_embd] W_down · m (before gemma3's post-FFN norm)
  std::vector<float> out;     // [R, n_embd] the layer output f̂(x) at the rows
};

// f̂ at the given rows of s (positions, increasing, < s.n). Fills tape (for backward) and
// returns ‖f̂ − f‖²_F and ‖f‖²_F over the rows in *err2, *ref2.
void layer_forward(const LayerWeightsF32& w, const LayerSeq& s, const LayerProjectors& p,
                   const std::vector<int32_t>& rows, LayerTape* tape, double* err2, double* ref2);

// Backward from dout = ∂loss/∂out [R, n_embd]: accumulates ∂loss/∂P_k [dk, dk] of a shared key
// projector into *gpk (when non-null; summed over the kv heads) and ∂loss/∂P_v,h [dv, dv] into
// (*gpv)[h] (when non-null), for the projectors p that the forward used.
void layer_backward(const LayerWeightsF32& w, const LayerSeq& s, const LayerProjectors& p,
                    const LayerTape& tape, const std::vector<float>& dout,
                    std::vector<float>* gpk, std::vector<std::vector<float>>* gpv);

// The attention output (heads concatenated, before W_O) of the last forward: for the paper's
// attention-output error diagnostic (DESIGN.md §4.3, docs/stiefattention.md).
inline const std::vector<float>& tape_attention_output(const LayerTape& t) { return t.o; }

// P = U·Uᵀ [d, d] of U [d, r] (row-major); ∂loss/∂U = (G + Gᵀ)·U for G = ∂loss/∂P.
std::vector<float> projector(const float* U, int d, int r);
std::vector<float> projector_grad_to_basis(const std::vector<float>& gP, const float* U, int d,
                                           int r);

}  // namespace kvtrim
