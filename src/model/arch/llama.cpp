// Llama (SmolLM2): pre-norm decoder, RMSNorm, GQA, RoPE on (2i, 2i+1) pairs (the GGUF
// converter permutes the Q/K rows for it), SwiGLU FFN, optionally tied output.
#include "model/arch/arch.h"

namespace kvtrim {

static void load_llama(const GgufFile& f, HParams& hp) {
  hp.rope_base_swa = hp.rope_base;
  hp.sliding_window.assign(static_cast<size_t>(hp.n_layer), 0);
}

const ArchInfo kArchLlama = {Arch::kLlama,        "llama",
                             /*rope_neox=*/false, /*qkv_bias=*/false,
                             /*qk_norm=*/false,   /*post_norms=*/false,
                             FfnAct::kSilu,       load_llama};

}  // namespace kvtrim
