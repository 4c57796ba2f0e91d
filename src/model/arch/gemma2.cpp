// Gemma 2: Gemma 3's layer without the QK-norm, with soft-capping instead — attention scores
// s -> c_a·tanh(s / c_a) before the softmax (attn_logit_softcapping, 50 in the releases) and the
// final logits z -> c_f·tanh(z / c_f) (final_logit_softcapping, 30); sandwich norms
// (post_attention_norm, post_ffw_norm); GeGLU (tanh GELU); embeddings times sqrt(n_embd); NeoX
// RoPE, one base for every layer; a sliding window on every other layer, starting with the first
// (transformers' layer_types: sliding iff (il + 1) % 2; llama.cpp's swa pattern 2).
// Attention scale: the converter writes no query_pre_attn_scalar; the released configs have 256
// (= head_dim) for 2B / 9B and 144 (= n_embd / n_head) for 27B, which llama.cpp tells apart by
// the 27B's 46 layers. kvtrim reads attention.query_pre_attn_scalar when a file has it, else
// follows llama.cpp's rule.
#include <cmath>

#include "core/error.h"
#include "model/arch/arch.h"

namespace kvtrim {

static constexpr int kGemma2SwaPattern = 2;  // layers 0, 2, 4, ... slide
static constexpr int kGemma2_27bLayers = 46;

static float positive_float(ArchKeys& keys, const char* suffix) {
  const double v = keys.get_float(suffix);
  KVTRIM_CHECK(std::isfinite(v) && v > 0, "%s: %s = %g must be positive", keys.path(), keys.key(suffix).c_str(), v);
  return static_cast<float>(v);
}

static void load_gemma2(ArchKeys& keys, HParams& hp) {
  const int64_t window = keys.get_int("attention.sliding_window");
  KVTRIM_CHECK(window > 0, "%s: gemma2.attention.sliding_window must be positive (got %lld)", keys.path(),
               static_cast<long long>(window));
  hp.sliding_window.assign(static_cast<size_t>(hp.n_layer), 0);
  for (int il = 0; il < hp.n_layer; ++il)
    if (il % kGemma2SwaPattern == 0) hp.sliding_window[static_cast<size_t>(il)] = static_cast<int>(window);
  hp.rope_base_swa = hp.rope_base;
  hp.attn_softcap = positive_float(keys, "attn_logit_softcapping");
  hp.final_softcap = positive_float(keys, "final_logit_softcapping");
  const double qpas_default = hp.n_layer == kGemma2_27bLayers ? static_cast<double>(hp.n_embd) / hp.n_head
                                                              : static_cast<double>(hp.head_dim_k);
  const double qpas = keys.get_float("attention.query_pre_attn_scalar", qpas_default);
  KVTRIM_CHECK(qpas > 0, "%s: gemma2.attention.query_pre_attn_scalar must be positive", keys.path());
  hp.attn_scale = static_cast<float>(1.0 / std::sqrt(qpas));
  hp.embd_scale = std::sqrt(static_cast<float>(hp.n_embd));
}

const ArchInfo kArchGemma2 = {Arch::kGemma2,       "gemma2",
                              /*rope_neox=*/true,  /*qkv_bias=*/false,
                              /*qk_norm=*/false,   /*post_norms=*/true,
                              /*rope_freqs=*/false, /*moe=*/false, FfnAct::kGeluTanh,
                              load_gemma2, /*longrope=*/false,
                             /*gate_up_fused=*/false};

}  // namespace kvtrim
