// What differs between the supported architectures (private to src/model): the GGUF name,
// the arch-specific hyper-parameters, which optional tensors a layer has, and the few
// switches of the shared decoder layer (RoPE pairing, biases, q/k norms, sandwich norms,
// FFN activation). One arch/<name>.cpp per architecture defines its ArchInfo; adding a model
// family = one file + one line in arch_registry.cpp (+ its tensors in model.cpp if new).
#pragma once
#include <set>
#include <string>
#include <string_view>

#include "model/model.h"

namespace kvtrim {

enum class FfnAct { kSilu, kGeluTanh };  // SwiGLU: silu(gate)·up; GeGLU: gelu_tanh(gate)·up

// The `<arch>.*` metadata keys of a file, read through one place that remembers which were read:
// after loading, a key of the file that no one read and that is not listed as harmless
// (model.cpp kHarmlessKeys) is an error naming it — a key kvtrim does not understand may change
// the arithmetic (a window, a soft-cap, a scaling), and running without it would be silently wrong.
class ArchKeys {
 public:
  ArchKeys(const GgufFile& f, std::string prefix) : f_(f), prefix_(std::move(prefix)) {}
  const GgufFile& file() const { return f_; }
  const char* path() const { return f_.path().c_str(); }
  std::string key(std::string_view suffix) const { return prefix_ + "." + std::string(suffix); }
  // The value of <arch>.<suffix>, or nullptr; marks the key read.
  const GgufValue* find(std::string_view suffix);
  int64_t get_int(std::string_view suffix);  // required
  int64_t get_int(std::string_view suffix, int64_t def);
  double get_float(std::string_view suffix);
  double get_float(std::string_view suffix, double def);
  std::string get_string(std::string_view suffix, const std::string& def);
  bool get_bool(std::string_view suffix, bool def);
  // Full names of the keys read so far.
  const std::set<std::string>& read() const { return read_; }

 private:
  const GgufFile& f_;
  std::string prefix_;
  std::set<std::string> read_;
};

struct ArchInfo {
  Arch arch;
  const char* gguf_name;  // general.architecture
  bool rope_neox;         // RoPE pairs (i, i+n_rot/2) instead of (2i, 2i+1)
  bool qkv_bias;          // attn_{q,k,v}.bias present (qwen2)
  bool qk_norm;           // per-head RMSNorm of q and k before RoPE (gemma3, qwen3)
  bool post_norms;        // post_attention_norm / post_ffw_norm before each residual add (gemma3)
  bool rope_freqs;        // may carry rope_freqs.weight: per-frequency RoPE divisors (Llama 3.x)
  bool moe;               // the FFN is a mixture of experts (ffn_gate_inp + ffn_{gate,up,down}_exps)
  FfnAct ffn_act;
  // Reads the arch-specific keys after the common ones (<arch>.block_count, ...) are in hp:
  // sliding windows, rope bases, attention and embedding scales.
  void (*load_hparams)(ArchKeys& keys, HParams& hp);
  bool longrope = false;       // may carry rope_factors_short / rope_factors_long (Phi-3 LongRoPE)
  bool gate_up_fused = false;  // ffn_up holds gate and up ([2·n_ff, n_embd], gate first), no ffn_gate
};

extern const ArchInfo kArchLlama;
extern const ArchInfo kArchQwen2;
extern const ArchInfo kArchQwen3;
extern const ArchInfo kArchQwen3Moe;
extern const ArchInfo kArchPhi3;
extern const ArchInfo kArchGemma2;
extern const ArchInfo kArchGemma3;

const ArchInfo& arch_info(Arch a);
const ArchInfo* find_arch(std::string_view gguf_name);  // nullptr if unsupported
std::string supported_archs();                          // "llama, qwen2, qwen3, qwen3moe, phi3, gemma2, gemma3"

}  // namespace kvtrim
