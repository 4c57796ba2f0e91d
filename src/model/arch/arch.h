// What differs between the supported architectures (private to src/model): the GGUF name,
// the arch-specific hyper-parameters, which optional tensors a layer has, and the few
// switches of the shared decoder layer (RoPE pairing, biases, q/k norms, sandwich norms,
// FFN activation). One arch/<name>.cpp per architecture defines its ArchInfo; adding a model
// family = one file + one line in arch_registry.cpp (+ its tensors in model.cpp if new).
#pragma once
#include <string>
#include <string_view>

#include "model/model.h"

namespace kvtrim {

enum class FfnAct { kSilu, kGeluTanh };  // SwiGLU: silu(gate)·up; GeGLU: gelu_tanh(gate)·up

struct ArchInfo {
  Arch arch;
  const char* gguf_name;  // general.architecture
  bool rope_neox;         // RoPE pairs (i, i+n_rot/2) instead of (2i, 2i+1)
  bool qkv_bias;          // attn_{q,k,v}.bias present (qwen2)
  bool qk_norm;           // per-head RMSNorm of q and k before RoPE (gemma3)
  bool post_norms;        // post_attention_norm / post_ffw_norm before each residual add (gemma3)
  FfnAct ffn_act;
  // Reads the arch-specific keys after the common ones (<arch>.block_count, ...) are in hp:
  // sliding windows, rope bases, attention and embedding scales.
  void (*load_hparams)(const GgufFile& f, HParams& hp);
};

extern const ArchInfo kArchLlama;
extern const ArchInfo kArchQwen2;
extern const ArchInfo kArchGemma3;

const ArchInfo& arch_info(Arch a);
const ArchInfo* find_arch(std::string_view gguf_name);  // nullptr if unsupported
std::string supported_archs();                          // "llama, qwen2, gemma3"

}  // namespace kvtrim
