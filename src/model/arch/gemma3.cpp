// Gemma 3: embeddings scaled by sqrt(n_embd); per-head RMSNorm of q and k before RoPE;
// sandwich norms (attn_norm → attention → post_attention_norm → +residual, ffn_norm → FFN →
// post_ffw_norm → +residual); GeGLU FFN with tanh GELU; NeoX RoPE; head_dim from
// attention.key_length; attention scale 1/sqrt(query_pre_attn_scalar), which is head_dim
// for the released sizes up to 12B (llama.cpp hard-codes it per size; we read the key when
// present); interleaved local/global attention: 5 sliding-window layers (RoPE base 10000)
// per global layer (rope.freq_base), layer il global iff (il + 1) % 6 == 0.
// The GGUF RMSNorm weights already include Gemma's "+1" (llama.cpp's converter adds it).
#include <cmath>

#include "core/error.h"
#include "model/arch/arch.h"

namespace kvtrim {

static constexpr int kGemma3SwaPattern = 6;  // every 6th layer is global
static constexpr float kGemma3RopeBaseLocal = 10000.f;

static void load_gemma3(ArchKeys& keys, HParams& hp) {
  const int64_t window = keys.get_int("attention.sliding_window");
  KVTRIM_CHECK(window > 0, "%s: gemma3.attention.sliding_window must be positive (got %lld)",
               keys.path(), static_cast<long long>(window));
  hp.sliding_window.assign(static_cast<size_t>(hp.n_layer), 0);
  for (int il = 0; il < hp.n_layer; ++il) {
    if ((il + 1) % kGemma3SwaPattern != 0) hp.sliding_window[il] = static_cast<int>(window);
  }
  hp.rope_base_swa = kGemma3RopeBaseLocal;
  hp.rope_swa_plain = true;
  const double qpas = keys.get_float("attention.query_pre_attn_scalar", static_cast<double>(hp.head_dim_k));
  KVTRIM_CHECK(qpas > 0, "%s: gemma3.attention.query_pre_attn_scalar must be positive", keys.path());
  hp.attn_scale = static_cast<float>(1.0 / std::sqrt(qpas));
  hp.embd_scale = std::sqrt(static_cast<float>(hp.n_embd));
}

const ArchInfo kArchGemma3 = {Arch::kGemma3,      "gemma3",
                              /*rope_neox=*/true, /*qkv_bias=*/false,
                              /*qk_norm=*/true,   /*post_norms=*/true,
                              /*rope_freqs=*/false, /*moe=*/false, FfnAct::kGeluTanh,
                              load_gemma3, /*longrope=*/false,
                             /*gate_up_fused=*/false};

}  // namespace kvtrim
