// Qwen2 (Qwen2.5, Qwen2.5-Coder): Llama with biases on the Q/K/V projections and NeoX RoPE
// (pairs (i, i + n_rot/2)); every layer attends globally (use_sliding_window is off in every
// released config, and the converter writes no window). YaRN past 32k (rope.scaling.type = yarn)
// is read by model.cpp.
#include "model/arch/arch.h"

namespace kvtrim {

static void load_qwen2(ArchKeys&, HParams& hp) {
  hp.rope_base_swa = hp.rope_base;
  hp.sliding_window.assign(static_cast<size_t>(hp.n_layer), 0);
}

const ArchInfo kArchQwen2 = {Arch::kQwen2,        "qwen2",
                             /*rope_neox=*/true,  /*qkv_bias=*/true,
                             /*qk_norm=*/false,   /*post_norms=*/false,
                             /*rope_freqs=*/false, /*moe=*/false, FfnAct::kSilu,
                             load_qwen2, /*longrope=*/false,
                             /*gate_up_fused=*/false};

}  // namespace kvtrim
