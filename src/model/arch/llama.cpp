// Llama (SmolLM2, Llama 2 / 3.x, Mistral 7B v0.3, Ministral / Mistral-Nemo files): pre-norm decoder,
// RMSNorm, GQA, RoPE on (2i, 2i+1) pairs (the GGUF converter permutes the Q/K rows for it), SwiGLU
// FFN, optionally tied output. Llama 3.1+ files carry `rope_freqs.weight`, the "llama3" RoPE
// scaling's per-frequency divisors (model.cpp applies them). head_dim may differ from
// n_embd / n_head (attention.key_length: Mistral-Nemo's 128 with n_embd 5120, 32 heads).
#include "model/arch/arch.h"

namespace kvtrim {

static void load_llama(ArchKeys&, HParams& hp) {
  hp.rope_base_swa = hp.rope_base;
  hp.sliding_window.assign(static_cast<size_t>(hp.n_layer), 0);
}

const ArchInfo kArchLlama = {Arch::kLlama,        "llama",
                             /*rope_neox=*/false, /*qkv_bias=*/false,
                             /*qk_norm=*/false,   /*post_norms=*/false,
                             /*rope_freqs=*/true, /*moe=*/false, FfnAct::kSilu,
                             load_llama, /*longrope=*/false,
                             /*gate_up_fused=*/false};

}  // namespace kvtrim
