// Qwen3-MoE (Qwen3-30B-A3B, 235B-A22B): Qwen3's attention; every layer's FFN a mixture of
// expert_count SwiGLU experts of width expert_feed_forward_length, expert_used_count per token
// (router softmax, top-k, weights renormalised — llama.cpp always renormalises for qwen3moe, as
// the released configs' norm_topk_prob = true do). No shared expert; no dense layers
// (decoder_sparse_step 1, mlp_only_layers empty in every release).
#include "core/error.h"
#include "model/arch/arch.h"

namespace kvtrim {

static void load_qwen3moe(ArchKeys& keys, HParams& hp) {
  hp.rope_base_swa = hp.rope_base;
  hp.sliding_window.assign(static_cast<size_t>(hp.n_layer), 0);
  const int64_t n_expert = keys.get_int("expert_count"), n_used = keys.get_int("expert_used_count");
  const int64_t n_ff_exp = keys.get_int("expert_feed_forward_length");
  KVTRIM_CHECK(n_expert > 0 && n_expert <= 4096 && n_used > 0 && n_used <= n_expert,
               "%s: qwen3moe.expert_used_count = %lld must be in [1, expert_count = %lld] (and expert_count <= 4096)",
               keys.path(), static_cast<long long>(n_used), static_cast<long long>(n_expert));
  KVTRIM_CHECK(n_ff_exp > 0 && n_ff_exp <= (int64_t{1} << 20), "%s: qwen3moe.expert_feed_forward_length = %lld is not a valid size",
               keys.path(), static_cast<long long>(n_ff_exp));
  hp.n_expert = static_cast<int>(n_expert);
  hp.n_expert_used = static_cast<int>(n_used);
  hp.n_ff_exp = static_cast<int>(n_ff_exp);
  const int64_t shared = keys.get_int("expert_shared_feed_forward_length", 0);
  KVTRIM_CHECK(shared == 0, "%s: qwen3moe.expert_shared_feed_forward_length = %lld: a shared expert is not implemented",
               keys.path(), static_cast<long long>(shared));
}

const ArchInfo kArchQwen3Moe = {Arch::kQwen3Moe,     "qwen3moe",
                                /*rope_neox=*/true,  /*qkv_bias=*/false,
                                /*qk_norm=*/true,    /*post_norms=*/false,
                                /*rope_freqs=*/false, /*moe=*/true,
                                FfnAct::kSilu,       load_qwen3moe, /*longrope=*/false,
                             /*gate_up_fused=*/false};

}  // namespace kvtrim
