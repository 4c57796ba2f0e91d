// Tiny random GGUF models for fast tests: the real tensor names, metadata keys and quant
// types of each supported architecture, a few layers of a few heads, random weights
// (deterministic by seed) and a minimal valid byte-level BPE ("gpt2") tokenizer: the 256
// byte tokens, a few merges and the specials <|endoftext|>, <|im_start|>, <|im_end|>.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/ggml_type.h"
#include "model/model.h"

namespace kvtrim::test {

struct TinyModelSpec {
  Arch arch = Arch::kLlama;
  uint32_t seed = 1;
  int n_layer = 2;  // gemma3 defaults to 6 (5 local + 1 global) in tiny_spec()
  int n_embd = 64;
  int n_head = 4;
  int n_head_kv = 2;
  int head_dim = 16;  // written as attention.key_length / value_length for gemma3
  int n_ff = 256;     // a multiple of 256 so ffn_down can be a k-quant
  int n_ctx_train = 256;
  int sliding_window = 4;   // gemma3 local layers
  bool tied_output = true;  // no output.weight: logits use token_embd
  // weight types (matrices); norms are f32 except gemma3's post_ffw_norm (f16, widened at load)
  GgmlType t_embd = GgmlType::Q8_0;
  GgmlType t_attn = GgmlType::Q4_1;    // wq, wk, wo
  GgmlType t_v = GgmlType::Q8_0;       // wv
  GgmlType t_ffn = GgmlType::Q4_1;     // gate, up
  GgmlType t_down = GgmlType::Q4_K;    // ffn_down (rows of n_ff)
  GgmlType t_output = GgmlType::Q8_0;  // output.weight when untied
  // Fault injection for loader tests.
  std::string omit_key;       // metadata key not written
  std::string omit_tensor;    // tensor not written
  std::string arch_override;  // general.architecture written instead of the arch's name
  int n_ff_meta = 0;          // feed_forward_length written (0 = n_ff): tensors then mismatch
  std::string extra_key;      // an <arch>.<extra_key> = 1 (u32) kvtrim does not know
  std::string extra_tensor;   // an extra [n_embd] f32 tensor of this name
  // RoPE scaling (llama, qwen2 / qwen3):
  //  rope_freqs: rope_freqs.weight = Llama 3's factors for factor 8, low / high frequency factors
  //              1 / 4, original context rope_orig_ctx (tiny_llama3_factors) — llama only;
  //  rope_yarn_factor > 0: rope.scaling.type = yarn, that factor, original context rope_orig_ctx.
  // qwen3moe: expert count, experts per token, expert width, expert matrices' type
  int n_expert = 4;
  int n_expert_used = 2;
  int n_ff_exp = 64;
  GgmlType t_exps = GgmlType::Q8_0;
  bool rope_freqs = false;
  float rope_yarn_factor = 0.f;
  int rope_orig_ctx = 16;
};

// Llama 3's RoPE divisors ("llama3" rope_type, transformers' _compute_llama3_parameters) for
// head_dim / 2 frequencies of base `base`: factor 8, low_freq_factor 1, high_freq_factor 4.
std::vector<float> tiny_llama3_factors(int n_rot, float base, int orig_ctx);

// Default spec of each architecture (different quant types per arch, qwen2 untied).
TinyModelSpec tiny_spec(Arch arch, uint32_t seed = 1);

// Writes the model to <dir>/tiny_<arch>_<seed>.gguf and returns the path.
std::string write_tiny_model(const TinyModelSpec& spec, const std::string& dir);

// The tiny tokenizer's vocabulary size (256 bytes + merges + 3 specials).
int tiny_vocab_size();

// A prompt of n token ids below 250 (inside every tiny vocabulary); salt gives another prompt.
inline std::vector<int32_t> tiny_tokens(int n, int salt = 0) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back((i * 37 + salt * 11 + 5) % 250);
  return t;
}

}  // namespace kvtrim::test
