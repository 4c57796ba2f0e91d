// Qwen3 (dense): Qwen2 without the Q/K/V biases and with a per-head RMSNorm of q and k before
// RoPE (attn_q_norm / attn_k_norm, [head_dim], as Gemma 3's); NeoX RoPE; head_dim from
// attention.key_length (128 in every released size, so n_head·head_dim may differ from n_embd);
// no sliding window. (transformers: Qwen3Attention: q_norm(q_proj(x).view(..., head_dim)).)
#include "model/arch/arch.h"

namespace kvtrim {

static void load_qwen3(ArchKeys&, HParams& hp) {
  hp.rope_base_swa = hp.rope_base;
  hp.sliding_window.assign(static_cast<size_t>(hp.n_layer), 0);
}

const ArchInfo kArchQwen3 = {Arch::kQwen3,        "qwen3",
                             /*rope_neox=*/true,  /*qkv_bias=*/false,
                             /*qk_norm=*/true,    /*post_norms=*/false,
                             /*rope_freqs=*/false, /*moe=*/false,
                             FfnAct::kSilu, load_qwen3, /*longrope=*/false,
                             /*gate_up_fused=*/false};

}  // namespace kvtrim
