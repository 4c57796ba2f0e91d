// Builds tiny random GGUF models (see tiny_model.h).
#include "tiny_model.h"

#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "model/gguf_writer.h"
#include "ops/dequant.h"

namespace kvtrim::test {
namespace {

// GPT-2 byte-level BPE: byte b is written as the unicode code point bytes_to_unicode()[b].
std::string byte_token(int b) {
  int cp;
  if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) {
    cp = b;
  } else {
    // the remaining bytes map, in order, to 256, 257, ...
    int n = 0;
    for (int c = 0; c < b; ++c) {
      if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255))) ++n;
    }
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// Merges as (left, right) pieces in the byte alphabet; "Ġ" is the space byte.
const std::vector<std::pair<std::string, std::string>>& merges() {
  static const std::vector<std::pair<std::string, std::string>> m = {
      {"t", "h"}, {"Ġ", "t"},   {"h", "e"}, {"i", "n"}, {"e", "r"}, {"a", "n"}, {"Ġ", "a"},
      {"o", "n"}, {"Ġt", "he"}, {"r", "e"}, {"Ġ", "s"}, {"e", "n"}, {"l", "l"}, {"o", "u"},
  };
  return m;
}

const char* const kSpecials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};

struct Writer {
  GgufWriter w;
  std::mt19937 rng;
  const TinyModelSpec* spec = nullptr;

  bool skip(const std::string& name) const {
    return name == spec->omit_key || name == spec->omit_tensor;
  }
  void u32(const std::string& key, int v) {
    if (!skip(key)) w.set_u32(key, static_cast<uint32_t>(v));
  }
  void f32(const std::string& key, float v) {
    if (!skip(key)) w.set_f32(key, v);
  }

  // A [n_rows, n_cols] matrix of N(0, gain²/n_cols) values quantized row by row.
  void matrix(const std::string& name, GgmlType t, int64_t n_rows, int64_t n_cols, float gain) {
    std::normal_distribution<float> nd(0.f, gain / std::sqrt(static_cast<float>(n_cols)));
    std::vector<float> row(static_cast<size_t>(n_cols));
    const size_t rb = ggml_row_size(t, n_cols);
    std::vector<uint8_t> data(rb * static_cast<size_t>(n_rows));
    for (int64_t r = 0; r < n_rows; ++r) {
      for (float& x : row) x = nd(rng);
      quantize_row(t, row.data(), data.data() + static_cast<size_t>(r) * rb, n_cols);
    }
    if (!skip(name)) w.add_tensor(name, t, {n_cols, n_rows}, data.data(), data.size());
  }
  // n_expert matrices [n_rows, n_cols] as one 3-D tensor (GGUF ne = [n_cols, n_rows, n_expert]).
  void experts(const std::string& name, GgmlType t, int64_t n_rows, int64_t n_cols, int64_t n_expert, float gain) {
    std::normal_distribution<float> nd(0.f, gain / std::sqrt(static_cast<float>(n_cols)));
    std::vector<float> row(static_cast<size_t>(n_cols));
    const size_t rb = ggml_row_size(t, n_cols);
    std::vector<uint8_t> data(rb * static_cast<size_t>(n_rows * n_expert));
    for (int64_t r = 0; r < n_rows * n_expert; ++r) {
      for (float& x : row) x = nd(rng);
      quantize_row(t, row.data(), data.data() + static_cast<size_t>(r) * rb, n_cols);
    }
    if (!skip(name)) w.add_tensor(name, t, {n_cols, n_rows, n_expert}, data.data(), data.size());
  }
  // A vector [n] of mean + N(0, sd²), f32 or f16.
  void vec(const std::string& name, int64_t n, float mean, float sd, GgmlType t = GgmlType::F32) {
    std::normal_distribution<float> nd(mean, sd);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = nd(rng);
    const size_t rb = ggml_row_size(t, n);
    std::vector<uint8_t> data(rb);
    quantize_row(t, v.data(), data.data(), n);
    if (!skip(name)) w.add_tensor(name, t, {n}, data.data(), data.size());
  }
};

}  // namespace

std::vector<float> tiny_llama3_factors(int n_rot, float base, int orig_ctx) {
  // wavelength 2π/ω_i: above orig_ctx / low_freq_factor divided by the factor, below
  // orig_ctx / high_freq_factor kept, smoothly between (the converter's rope_freqs = 1 / that scale)
  const double factor = 8, low = 1, high = 4;
  const double low_wl = orig_ctx / low, high_wl = orig_ctx / high;
  std::vector<float> ff(static_cast<size_t>(n_rot / 2));
  for (int i = 0; i < n_rot / 2; ++i) {
    const double freq = std::pow(static_cast<double>(base), -2.0 * i / n_rot);
    const double wl = 2 * M_PI / freq;
    double f;
    if (wl < high_wl) {
      f = 1;
    } else if (wl > low_wl) {
      f = factor;
    } else {
      const double smooth = (orig_ctx / wl - low) / (high - low);
      f = 1 / ((1 - smooth) / factor + smooth);
    }
    ff[static_cast<size_t>(i)] = static_cast<float>(f);
  }
  return ff;
}

int tiny_vocab_size() {
  return 256 + static_cast<int>(merges().size()) + 3;
}

TinyModelSpec tiny_spec(Arch arch, uint32_t seed) {
  TinyModelSpec s;
  s.arch = arch;
  s.seed = seed;
  switch (arch) {
    case Arch::kLlama:  // SmolLM2-like: Q4_1 projections, tied Q8_0 embeddings
      break;
    case Arch::kQwen2:  // biases, untied output, k-quants
      s.n_layer = 3;
      s.t_embd = GgmlType::F16;
      s.t_attn = GgmlType::Q8_0;
      s.t_v = GgmlType::F16;
      s.t_ffn = GgmlType::Q5_0;
      s.t_down = GgmlType::Q6_K;
      s.tied_output = false;
      s.t_output = GgmlType::Q8_0;
      break;
    case Arch::kQwen3:  // QK-norm, no biases, head_dim 32 (n_head*head_dim != n_embd, as Qwen3's 128), untied
      s.head_dim = 32;
      s.t_embd = GgmlType::Q8_0;
      s.t_attn = GgmlType::Q8_0;
      s.t_v = GgmlType::Q8_0;
      s.t_ffn = GgmlType::Q4_0;
      s.t_down = GgmlType::Q5_K;
      s.tied_output = false;
      s.t_output = GgmlType::Q8_0;
      break;
    case Arch::kQwen3Moe:  // qwen3's attention, 4 experts of width 64, 2 per token
      s.head_dim = 32;
      s.t_embd = GgmlType::Q8_0;
      s.t_attn = GgmlType::Q8_0;
      s.t_v = GgmlType::Q8_0;
      s.tied_output = false;
      s.t_output = GgmlType::Q8_0;
      break;
    case Arch::kPhi3:  // fused qkv and gate-up, LongRoPE (original context 8), window 12 on every layer
      s.sliding_window = 12;
      s.rope_orig_ctx = 8;  // every test pass (>= 9 tokens, caches >= 32) uses the long factors
      s.t_attn = GgmlType::Q8_0;
      s.t_ffn = GgmlType::Q5_1;
      break;
    case Arch::kGemma2:  // soft-capping, 4 layers alternating local / global, head_dim 32
      s.n_layer = 4;
      s.head_dim = 32;
      s.t_embd = GgmlType::Q8_0;
      s.t_attn = GgmlType::Q8_0;
      s.t_v = GgmlType::F16;
      s.t_ffn = GgmlType::Q4_1;
      s.t_down = GgmlType::Q4_K;
      break;
    case Arch::kGemma3:  // head_dim 32 (n_head*head_dim != n_embd), 5 local + 1 global layers
      s.n_layer = 6;
      s.n_head_kv = 1;
      s.head_dim = 32;
      s.t_embd = GgmlType::Q8_0;
      s.t_attn = GgmlType::Q5_0;
      s.t_v = GgmlType::F32;
      s.t_ffn = GgmlType::Q8_0;
      s.t_down = GgmlType::Q4_K;
      break;
  }
  return s;
}

std::string write_tiny_model(const TinyModelSpec& s, const std::string& dir) {
  const std::string arch = arch_name(s.arch);
  Writer wr;
  wr.rng.seed(s.seed);
  wr.spec = &s;
  GgufWriter& w = wr.w;
  const int n_vocab = tiny_vocab_size();

  w.set_string("general.architecture", s.arch_override.empty() ? arch : s.arch_override);
  w.set_string("general.name", "tiny-" + arch);
  w.set_u32("general.quantization_version", 2);
  wr.u32(arch + ".context_length", s.n_ctx_train);
  wr.u32(arch + ".embedding_length", s.n_embd);
  wr.u32(arch + ".block_count", s.n_layer);
  wr.u32(arch + ".feed_forward_length", s.n_ff_meta > 0 ? s.n_ff_meta : s.n_ff);
  wr.u32(arch + ".attention.head_count", s.n_head);
  wr.u32(arch + ".attention.head_count_kv", s.n_head_kv);
  wr.f32(arch + ".attention.layer_norm_rms_epsilon", 1e-6f);
  wr.f32(arch + ".rope.freq_base", s.arch == Arch::kLlama ? 10000.f : 1000000.f);
  const bool gemma = s.arch == Arch::kGemma3 || s.arch == Arch::kGemma2;
  const bool qwen3 = s.arch == Arch::kQwen3 || s.arch == Arch::kQwen3Moe;
  if (s.arch == Arch::kPhi3) {
    wr.u32(arch + ".attention.sliding_window", s.sliding_window);
    wr.u32(arch + ".rope.scaling.original_context_length", s.rope_orig_ctx);
    wr.f32(arch + ".rope.scaling.attn_factor", 1.19f);
  }
  if (s.arch == Arch::kQwen3Moe) {
    wr.u32(arch + ".expert_count", s.n_expert);
    wr.u32(arch + ".expert_used_count", s.n_expert_used);
    wr.u32(arch + ".expert_feed_forward_length", s.n_ff_exp);
  }
  if (gemma || qwen3) {
    wr.u32(arch + ".attention.key_length", s.head_dim);
    wr.u32(arch + ".attention.value_length", s.head_dim);
    if (gemma) wr.u32(arch + ".attention.sliding_window", s.sliding_window);
    if (s.arch == Arch::kGemma2) {  // small caps, so the tiny model's scores and logits reach them
      wr.f32(arch + ".attn_logit_softcapping", 5.f);
      wr.f32(arch + ".final_logit_softcapping", 4.f);
    }
  } else {
    KVTRIM_CHECK(s.head_dim * s.n_head == s.n_embd,
                 "tiny %s model: head_dim * n_head must equal n_embd", arch.c_str());
    wr.u32(arch + ".rope.dimension_count", s.head_dim);
  }

  if (s.rope_yarn_factor > 0) {
    w.set_string(arch + ".rope.scaling.type", "yarn");
    wr.f32(arch + ".rope.scaling.factor", s.rope_yarn_factor);
    wr.u32(arch + ".rope.scaling.original_context_length", s.rope_orig_ctx);
  }
  if (!s.extra_key.empty()) w.set_u32(arch + "." + s.extra_key, 1);

  // tokenizer: byte tokens, merged tokens, specials
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(byte_token(b));
    types.push_back(1);  // normal
  }
  std::vector<std::string> merge_lines;
  for (const auto& [a, b] : merges()) {
    tokens.push_back(a + b);
    types.push_back(1);
    merge_lines.push_back(a + " " + b);
  }
  for (const char* sp : kSpecials) {
    tokens.push_back(sp);
    types.push_back(3);  // control
  }
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", "qwen2");
  w.set_array_string("tokenizer.ggml.tokens", tokens);
  w.set_array_i32("tokenizer.ggml.token_type", types);
  w.set_array_string("tokenizer.ggml.merges", merge_lines);
  w.set_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(n_vocab - 3));  // <|endoftext|>
  w.set_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(n_vocab - 1));  // <|im_end|>
  w.set_bool("tokenizer.ggml.add_bos_token", false);

  const int64_t n_embd = s.n_embd, n_ff = s.n_ff;
  const int64_t n_q = int64_t{s.n_head} * s.head_dim, n_kv = int64_t{s.n_head_kv} * s.head_dim;
  wr.matrix("token_embd.weight", s.t_embd, n_vocab, n_embd,
            gemma ? 1.f : std::sqrt(static_cast<float>(n_embd)));
  wr.vec("output_norm.weight", n_embd, 1.f, 0.1f);
  if (!s.tied_output) wr.matrix("output.weight", s.t_output, n_vocab, n_embd, 2.f);
  if (s.rope_freqs) {
    const std::vector<float> ff = tiny_llama3_factors(s.head_dim, 10000.f, s.rope_orig_ctx);
    if (!wr.skip("rope_freqs.weight"))
      w.add_tensor("rope_freqs.weight", GgmlType::F32, {static_cast<int64_t>(ff.size())}, ff.data(), ff.size() * sizeof(float));
  }
  if (!s.extra_tensor.empty()) wr.vec(s.extra_tensor, n_embd, 0.f, 1.f);
  if (s.arch == Arch::kPhi3) {  // LongRoPE divisors: short near 1, long growing to 6 with the wavelength
    std::vector<float> sh(static_cast<size_t>(s.head_dim / 2)), lo(sh.size());
    for (size_t i = 0; i < sh.size(); ++i) {
      sh[i] = 1.f + 0.05f * static_cast<float>(i);
      lo[i] = 1.f + 5.f * static_cast<float>(i) / static_cast<float>(sh.size() - 1);
    }
    for (const auto& [name, v] : {std::pair<const char*, const std::vector<float>*>{"rope_factors_short.weight", &sh},
                                  {"rope_factors_long.weight", &lo}})
      if (!wr.skip(name)) w.add_tensor(name, GgmlType::F32, {static_cast<int64_t>(v->size())}, v->data(), v->size() * sizeof(float));
  }
  for (int il = 0; il < s.n_layer; ++il) {
    const std::string b = "blk." + std::to_string(il) + ".";
    wr.vec(b + "attn_norm.weight", n_embd, 1.f, 0.1f);
    if (s.arch == Arch::kPhi3) {
      wr.matrix(b + "attn_qkv.weight", s.t_attn, n_q + 2 * n_kv, n_embd, 1.5f);
    } else {
      wr.matrix(b + "attn_q.weight", s.t_attn, n_q, n_embd, 1.5f);
      wr.matrix(b + "attn_k.weight", s.t_attn, n_kv, n_embd, 1.5f);
      wr.matrix(b + "attn_v.weight", s.t_v, n_kv, n_embd, 1.f);
    }
    wr.matrix(b + "attn_output.weight", s.t_attn, n_embd, n_q, 1.f);
    if (s.arch == Arch::kQwen2) {
      wr.vec(b + "attn_q.bias", n_q, 0.f, 0.2f);
      wr.vec(b + "attn_k.bias", n_kv, 0.f, 0.2f);
      wr.vec(b + "attn_v.bias", n_kv, 0.f, 0.2f);
    }
    if (s.arch == Arch::kGemma3 || qwen3) {
      wr.vec(b + "attn_q_norm.weight", s.head_dim, 1.f, 0.2f);
      wr.vec(b + "attn_k_norm.weight", s.head_dim, 1.f, 0.2f);
    }
    if (gemma) {
      wr.vec(b + "post_attention_norm.weight", n_embd, 1.f, 0.1f);
      wr.vec(b + "post_ffw_norm.weight", n_embd, 1.f, 0.1f, GgmlType::F16);
    }
    wr.vec(b + "ffn_norm.weight", n_embd, 1.f, 0.1f);
    if (s.arch == Arch::kQwen3Moe) {
      wr.matrix(b + "ffn_gate_inp.weight", GgmlType::F32, s.n_expert, n_embd, 3.f);
      wr.experts(b + "ffn_gate_exps.weight", s.t_exps, s.n_ff_exp, n_embd, s.n_expert, 1.f);
      wr.experts(b + "ffn_up_exps.weight", s.t_exps, s.n_ff_exp, n_embd, s.n_expert, 1.f);
      wr.experts(b + "ffn_down_exps.weight", s.t_exps, n_embd, s.n_ff_exp, s.n_expert, 1.f);
      continue;
    }
    if (s.arch == Arch::kPhi3) {
      wr.matrix(b + "ffn_up.weight", s.t_ffn, 2 * n_ff, n_embd, 1.f);
    } else {
      wr.matrix(b + "ffn_gate.weight", s.t_ffn, n_ff, n_embd, 1.f);
      wr.matrix(b + "ffn_up.weight", s.t_ffn, n_ff, n_embd, 1.f);
    }
    wr.matrix(b + "ffn_down.weight", s.t_down, n_embd, n_ff, 1.f);
  }
  const std::string path = dir + "/tiny_" + arch + "_" + std::to_string(s.seed) + ".gguf";
  w.write(path);
  return path;
}

}  // namespace kvtrim::test
