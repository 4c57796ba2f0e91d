// Phi-3 / Phi-3.5 / Phi-4 (general.architecture = phi3): Llama's layer with the Q/K/V projections
// fused into one attn_qkv matrix (rows: q, then k, then v) and the gate / up projections into one
// ffn_up of 2·n_ff rows (gate first: ggml_swiglu's and transformers' chunk order), NeoX RoPE on
// rope.dimension_count dims (Phi-4-mini rotates 3/4 of each head), and LongRoPE where the file
// has rope_factors_short / rope_factors_long (Phi-3-*-128k, Phi-3.5, Phi-4-mini): per-frequency
// divisors chosen by the context (layer_rope) and the magnitude rope.scaling.attn_factor
// (sqrt(1 + ln(scale) / ln(original context)), written by the converter).
// Sliding window: attention.sliding_window > 0 (2047 in Phi-3-mini-4k; 0 for Phi-4) limits every
// layer's attention as transformers' Phi3Attention does. llama.cpp (b7xxx, src/models/phi3.cpp)
// disables Phi's sliding window and attends globally: the two differ only past the window.
#include "core/error.h"
#include "model/arch/arch.h"

namespace kvtrim {

static void load_phi3(ArchKeys& keys, HParams& hp) {
  hp.rope_base_swa = hp.rope_base;
  const int64_t window = keys.get_int("attention.sliding_window", 0);
  KVTRIM_CHECK(window >= 0 && window <= (int64_t{1} << 30), "%s: phi3.attention.sliding_window = %lld is not a valid window",
               keys.path(), static_cast<long long>(window));
  // a window as long as the context is no window
  const int w = window >= hp.n_ctx_train ? 0 : static_cast<int>(window);
  hp.sliding_window.assign(static_cast<size_t>(hp.n_layer), w);
}

const ArchInfo kArchPhi3 = {Arch::kPhi3,         "phi3",
                            /*rope_neox=*/true,  /*qkv_bias=*/false,
                            /*qk_norm=*/false,   /*post_norms=*/false,
                            /*rope_freqs=*/false, /*moe=*/false,
                            FfnAct::kSilu,       load_phi3,
                            /*longrope=*/true,   /*gate_up_fused=*/true};

}  // namespace kvtrim
