// Model loading: architecture from general.architecture, hyper-parameters from <arch>.*
// keys (validated), weights as views into the GGUF mapping (only f16/bf16 norm and bias vectors
// are widened to f32, and the matrices of the types with packed kernels on this CPU get a packed
// copy, ops/weight_pack.h), every tensor's shape checked against the hyper-parameters, and the
// tokenizer.
#include "model/model.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <set>

#include "core/error.h"
#include "core/fp16.h"
#include "kv/kv_cache.h"
#include "model/arch/arch.h"

namespace kvtrim {

// <arch>.* keys a file may carry that kvtrim does not read because they do not change what it
// computes: each with the reason. Any other unread key is an error (check_keys).
struct HarmlessKey {
  const char* suffix;
  const char* why;
};
constexpr HarmlessKey kHarmlessKeys[] = {
    {"rope.scaling.finetuned", "a note that the model was fine-tuned at the scaled length"},
};

class ModelLoader {
 public:
  ModelLoader(Model& m, const ArchInfo& ai) : m_(m), f_(*m.file_), ai_(ai), keys_(f_, ai.gguf_name) {}

  void load_hparams();
  void load_tensors();
  // Every <arch>.* key read or harmless, every tensor consumed: else an error naming the first
  // key / tensor kvtrim would silently ignore.
  void check_everything_used() const;

 private:
  std::string key(const char* suffix) const { return keys_.key(suffix); }
  // A required positive integer hyper-parameter.
  int get_dim(const char* suffix);
  int get_dim(const char* suffix, int def);
  void load_rope_scaling();
  static std::string shape_str(const std::vector<int64_t>& ne);
  const GgufTensor* find(const std::string& name, bool required);
  // A weight matrix [n_rows, n_cols] (GGUF ne = [n_cols, n_rows]); `what` names the dims.
  WeightView matrix(const std::string& name, int64_t n_rows, int64_t n_cols, const char* what,
                    bool required);
  // The n_expert matrices [n_rows, n_cols] of a 3-D expert tensor (GGUF ne = [n_cols, n_rows,
  // n_expert]), one view per expert into its slice.
  std::vector<WeightView> experts(const std::string& name, int64_t n_rows, int64_t n_cols, const char* what);
  // Rows [r0, r0 + n) of a matrix (a fused projection's part): a view into the same bytes.
  static WeightView row_slice(const WeightView& w, int64_t r0, int64_t n) {
    return WeightView{w.type, static_cast<const uint8_t*>(w.data) + static_cast<size_t>(r0) * w.row_bytes, n, w.n_cols,
                      w.row_bytes};
  }
  // A per-frequency RoPE divisor tensor [n_rot / 2], checked finite and positive (nullptr if absent).
  std::shared_ptr<const std::vector<float>> rope_divisors(const std::string& name);
  // An f32 vector [n] (converted from f16 / bf16 if needed).
  WeightView vector(const std::string& name, int64_t n, const char* what, bool required);

  Model& m_;
  const GgufFile& f_;
  const ArchInfo& ai_;
  ArchKeys keys_;
  std::set<std::string, std::less<>> used_;  // tensors consumed
};

const GgufValue* ArchKeys::find(std::string_view suffix) {
  const std::string k = key(suffix);
  const GgufValue* v = f_.find(k);
  if (v) read_.insert(k);
  return v;
}
int64_t ArchKeys::get_int(std::string_view suffix) {
  find(suffix);
  return f_.get_int(key(suffix));
}
int64_t ArchKeys::get_int(std::string_view suffix, int64_t def) {
  return find(suffix) ? f_.get_int(key(suffix)) : def;
}
double ArchKeys::get_float(std::string_view suffix) {
  find(suffix);
  return f_.get_float(key(suffix));
}
double ArchKeys::get_float(std::string_view suffix, double def) {
  return find(suffix) ? f_.get_float(key(suffix)) : def;
}
std::string ArchKeys::get_string(std::string_view suffix, const std::string& def) {
  return find(suffix) ? f_.get_string(key(suffix)) : def;
}
bool ArchKeys::get_bool(std::string_view suffix, bool def) {
  return find(suffix) ? f_.get_bool(key(suffix), def) : def;
}

int ModelLoader::get_dim(const char* suffix) {
  const std::string k = key(suffix);
  const int64_t v = keys_.get_int(suffix);
  KVTRIM_CHECK(v > 0 && v <= (int64_t{1} << 30), "%s: metadata key '%s' = %lld is not a valid size",
               f_.path().c_str(), k.c_str(), static_cast<long long>(v));
  return static_cast<int>(v);
}

int ModelLoader::get_dim(const char* suffix, int def) {
  if (!keys_.find(suffix)) return def;
  return get_dim(suffix);
}

void ModelLoader::load_hparams() {
  HParams& hp = m_.hp_;
  const char* path = f_.path().c_str();
  hp.arch = ai_.arch;
  hp.name = f_.get_string("general.name", "");
  hp.n_ctx_train = get_dim("context_length");
  hp.n_embd = get_dim("embedding_length");
  hp.n_layer = get_dim("block_count");
  // Every layer has its own tensors: a count past the file's tensors is corrupt, and is refused
  // before anything is sized by it (found by fuzz/model: 2^30 layers sized an 80 GB vector).
  KVTRIM_CHECK(static_cast<size_t>(hp.n_layer) <= f_.tensors().size(),
               "%s: %s = %d, but the file has only %zu tensors (corrupt metadata?)", path,
               key("block_count").c_str(), hp.n_layer, f_.tensors().size());
  hp.n_ff = get_dim("feed_forward_length");
  hp.n_head = get_dim("attention.head_count");
  hp.n_head_kv = get_dim("attention.head_count_kv", hp.n_head);
  KVTRIM_CHECK(
      hp.n_head % hp.n_head_kv == 0,
      "%s: %s = %d is not a multiple of %s = %d (grouped-query attention needs whole groups)", path,
      key("attention.head_count").c_str(), hp.n_head, key("attention.head_count_kv").c_str(),
      hp.n_head_kv);
  KVTRIM_CHECK(f_.find(key("attention.key_length")) || hp.n_embd % hp.n_head == 0,
               "%s: %s is absent and n_embd %d is not a multiple of n_head %d", path,
               key("attention.key_length").c_str(), hp.n_embd, hp.n_head);
  hp.head_dim_k = get_dim("attention.key_length", hp.n_embd / hp.n_head);
  hp.head_dim_v = get_dim("attention.value_length", hp.head_dim_k);
  hp.n_rot = get_dim("rope.dimension_count", hp.head_dim_k);
  KVTRIM_CHECK(hp.n_rot % 2 == 0 && hp.n_rot <= hp.head_dim_k,
               "%s: %s = %d must be even and <= head_dim %d", path,
               key("rope.dimension_count").c_str(), hp.n_rot, hp.head_dim_k);
  const std::string eps_key = key("attention.layer_norm_rms_epsilon");
  hp.norm_eps = static_cast<float>(keys_.get_float("attention.layer_norm_rms_epsilon"));
  KVTRIM_CHECK(hp.norm_eps > 0 && hp.norm_eps < 1, "%s: %s = %g is not a valid epsilon", path,
               eps_key.c_str(), static_cast<double>(hp.norm_eps));
  hp.rope_base = static_cast<float>(keys_.get_float("rope.freq_base", 10000.0));
  KVTRIM_CHECK(hp.rope_base > 1, "%s: %s = %g is not a valid RoPE base", path,
               key("rope.freq_base").c_str(), static_cast<double>(hp.rope_base));
  hp.rope_neox = ai_.rope_neox;
  load_rope_scaling();
  hp.attn_scale = 1.f / std::sqrt(static_cast<float>(hp.head_dim_k));
  hp.embd_scale = 1.f;
  // A causal decoder only: attention.causal = false is an encoder (embeddings), not a generator.
  KVTRIM_CHECK(keys_.get_bool("attention.causal", true), "%s: %s = false (a non-causal encoder): kvtrim runs causal decoders only",
               path, key("attention.causal").c_str());
  // n_vocab: <arch>.vocab_size when present, else the rows of token_embd.
  const GgufTensor* te = f_.find_tensor("token_embd.weight");
  KVTRIM_CHECK(te, "%s: missing tensor 'token_embd.weight' (required by the %s architecture)", path, ai_.gguf_name);
  hp.n_vocab = keys_.find("vocab_size") ? get_dim("vocab_size")
                                        : static_cast<int>(te->ne.size() >= 2 ? te->ne[1] : 0);
  KVTRIM_CHECK(hp.n_vocab > 0, "%s: cannot determine the vocabulary size", path);
  ai_.load_hparams(keys_, hp);
  KVTRIM_CHECK(static_cast<int>(hp.sliding_window.size()) == hp.n_layer,
               "internal error: sliding windows");
}

// RoPE scaling (<arch>.rope.scaling.*): none; linear (positions divided by the factor); yarn
// (frequencies between extrapolated and interpolated by YaRN's ramp, magnitude 1 + 0.1 ln factor,
// as Qwen2.5 past 32k). Llama 3's scaling is no type: the converter writes its per-frequency
// divisors as rope_freqs.weight (load_tensors).
// Any other type, or a YaRN variant key kvtrim does not implement, is an error naming it.
void ModelLoader::load_rope_scaling() {
  HParams& hp = m_.hp_;
  const char* path = f_.path().c_str();
  const std::string type = keys_.get_string("rope.scaling.type", "none");
  // (rope.scale_linear: the key's name in older files, read by llama.cpp when the new one is absent)
  const double factor = keys_.get_float("rope.scaling.factor", keys_.get_float("rope.scale_linear", 1.0));
  KVTRIM_CHECK(std::isfinite(factor) && factor > 0, "%s: %s = %g is not a valid factor", path,
               key("rope.scaling.factor").c_str(), factor);
  hp.rope_n_ctx_orig = static_cast<int>(keys_.get_int("rope.scaling.original_context_length", hp.n_ctx_train));
  KVTRIM_CHECK(hp.rope_n_ctx_orig > 0, "%s: %s = %d is not a valid context length", path,
               key("rope.scaling.original_context_length").c_str(), hp.rope_n_ctx_orig);
  hp.rope_attn_factor = static_cast<float>(keys_.get_float("rope.scaling.attn_factor", 1.0));
  KVTRIM_CHECK(std::isfinite(hp.rope_attn_factor) && hp.rope_attn_factor > 0, "%s: %s = %g is not a valid factor",
               path, key("rope.scaling.attn_factor").c_str(), static_cast<double>(hp.rope_attn_factor));
  if (type == "none" || type == "linear") {
    // (a factor without a type scales linearly, as llama.cpp reads it)
    hp.rope_freq_scale = static_cast<float>(1.0 / factor);
  } else if (type == "yarn") {
    hp.rope_freq_scale = static_cast<float>(1.0 / factor);
    hp.rope_ext_factor = static_cast<float>(keys_.get_float("rope.scaling.yarn_ext_factor", 1.0));
    hp.rope_beta_fast = static_cast<float>(keys_.get_float("rope.scaling.yarn_beta_fast", 32.0));
    hp.rope_beta_slow = static_cast<float>(keys_.get_float("rope.scaling.yarn_beta_slow", 1.0));
    KVTRIM_CHECK(hp.rope_ext_factor >= 0 && hp.rope_ext_factor <= 1 && hp.rope_beta_fast > 0 && hp.rope_beta_slow > 0,
                 "%s: YaRN parameters out of range (ext_factor %g, beta_fast %g, beta_slow %g)", path,
                 static_cast<double>(hp.rope_ext_factor), static_cast<double>(hp.rope_beta_fast),
                 static_cast<double>(hp.rope_beta_slow));
    const double log_mul = keys_.get_float("rope.scaling.yarn_log_multiplier", 0.0);
    KVTRIM_CHECK(log_mul == 0.0, "%s: %s = %g (DeepSeek's YaRN magnitude variant) is not supported", path,
                 key("rope.scaling.yarn_log_multiplier").c_str(), log_mul);
  } else {
    fail("%s: %s = '%s' is not supported (supported: none, linear, yarn)", path,
         key("rope.scaling.type").c_str(), type.c_str());
  }
}

std::string ModelLoader::shape_str(const std::vector<int64_t>& ne) {
  std::string s = "[";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

const GgufTensor* ModelLoader::find(const std::string& name, bool required) {
  const GgufTensor* t = f_.find_tensor(name);
  if (t) used_.insert(name);
  KVTRIM_CHECK(t || !required, "%s: missing tensor '%s' (required by the %s architecture)",
               f_.path().c_str(), name.c_str(), ai_.gguf_name);
  return t;
}

WeightView ModelLoader::matrix(const std::string& name, int64_t n_rows, int64_t n_cols,
                               const char* what, bool required) {
  const GgufTensor* t = find(name, required);
  if (!t) return WeightView{GgmlType::F32, nullptr, 0, 0, 0};
  const std::vector<int64_t> want = {n_cols, n_rows};
  KVTRIM_CHECK(t->ne == want, "%s: tensor '%s' has shape %s, expected %s (%s)", f_.path().c_str(),
               name.c_str(), shape_str(t->ne).c_str(), shape_str(want).c_str(), what);
  const GgmlTypeTraits& tr = ggml_traits(t->type);
  KVTRIM_CHECK(tr.supported, "%s: tensor '%s' has type %s, which kvtrim cannot multiply",
               f_.path().c_str(), name.c_str(), std::string(tr.name).c_str());
  KVTRIM_CHECK(n_cols % tr.block_size == 0,
               "%s: tensor '%s': row length %lld is not a multiple of the %s block size %lld",
               f_.path().c_str(), name.c_str(), static_cast<long long>(n_cols),
               std::string(tr.name).c_str(), static_cast<long long>(tr.block_size));
  const size_t row_bytes = ggml_row_size(t->type, n_cols);
  KVTRIM_CHECK(t->n_bytes >= row_bytes * static_cast<size_t>(n_rows),
               "%s: tensor '%s' holds %zu bytes, expected %zu", f_.path().c_str(), name.c_str(),
               t->n_bytes, row_bytes * static_cast<size_t>(n_rows));
  return WeightView{t->type, t->data, n_rows, n_cols, row_bytes};
}

std::shared_ptr<const std::vector<float>> ModelLoader::rope_divisors(const std::string& name) {
  const int64_t n = m_.hp_.n_rot / 2;
  const WeightView rf = vector(name, n, "n_rot / 2", false);
  if (!rf.data) return nullptr;
  const float* p = static_cast<const float*>(rf.data);
  auto ff = std::make_shared<std::vector<float>>(p, p + n);
  for (size_t i = 0; i < ff->size(); ++i)
    KVTRIM_CHECK(std::isfinite((*ff)[i]) && (*ff)[i] > 0, "%s: tensor '%s'[%zu] = %g is not a valid divisor",
                 f_.path().c_str(), name.c_str(), i, static_cast<double>((*ff)[i]));
  return ff;
}

std::vector<WeightView> ModelLoader::experts(const std::string& name, int64_t n_rows, int64_t n_cols, const char* what) {
  const int64_t n_exp = m_.hp_.n_expert;
  const GgufTensor* t = find(name, true);
  const std::vector<int64_t> want = {n_cols, n_rows, n_exp};
  KVTRIM_CHECK(t->ne == want, "%s: tensor '%s' has shape %s, expected %s (%s)", f_.path().c_str(), name.c_str(),
               shape_str(t->ne).c_str(), shape_str(want).c_str(), what);
  const GgmlTypeTraits& tr = ggml_traits(t->type);
  KVTRIM_CHECK(tr.supported, "%s: tensor '%s' has type %s, which kvtrim cannot multiply", f_.path().c_str(),
               name.c_str(), std::string(tr.name).c_str());
  KVTRIM_CHECK(n_cols % tr.block_size == 0, "%s: tensor '%s': row length %lld is not a multiple of the %s block size %lld",
               f_.path().c_str(), name.c_str(), static_cast<long long>(n_cols), std::string(tr.name).c_str(),
               static_cast<long long>(tr.block_size));
  const size_t row_bytes = ggml_row_size(t->type, n_cols);
  const size_t slice = row_bytes * static_cast<size_t>(n_rows);
  KVTRIM_CHECK(t->n_bytes >= slice * static_cast<size_t>(n_exp), "%s: tensor '%s' holds %zu bytes, expected %zu",
               f_.path().c_str(), name.c_str(), t->n_bytes, slice * static_cast<size_t>(n_exp));
  std::vector<WeightView> v(static_cast<size_t>(n_exp));
  for (int64_t e = 0; e < n_exp; ++e)
    v[static_cast<size_t>(e)] = WeightView{t->type, t->data + static_cast<size_t>(e) * slice, n_rows, n_cols, row_bytes};
  return v;
}

WeightView ModelLoader::vector(const std::string& name, int64_t n, const char* what,
                               bool required) {
  const GgufTensor* t = find(name, required);
  if (!t) return WeightView{GgmlType::F32, nullptr, 0, 0, 0};
  KVTRIM_CHECK(t->ne == std::vector<int64_t>{n},
               "%s: tensor '%s' has shape %s, expected [%lld] (%s)", f_.path().c_str(),
               name.c_str(), shape_str(t->ne).c_str(), static_cast<long long>(n), what);
  const float* data = nullptr;
  if (t->type == GgmlType::F32) {
    data = reinterpret_cast<const float*>(t->data);
  } else if (t->type == GgmlType::F16 || t->type == GgmlType::BF16) {
    std::vector<float> v(static_cast<size_t>(n));
    const uint16_t* h = reinterpret_cast<const uint16_t*>(t->data);
    for (int64_t i = 0; i < n; ++i)
      v[i] = t->type == GgmlType::F16 ? fp16_to_fp32(h[i]) : bf16_to_fp32(h[i]);
    m_.owned_f32_.push_back(std::move(v));
    data = m_.owned_f32_.back().data();
  } else {
    fail("%s: tensor '%s' has type %s; a norm or bias vector must be f32, f16 or bf16",
         f_.path().c_str(), name.c_str(), std::string(ggml_type_name(t->type)).c_str());
  }
  return WeightView{GgmlType::F32, data, 1, n, static_cast<size_t>(n) * sizeof(float)};
}

void ModelLoader::load_tensors() {
  const HParams& hp = m_.hp_;
  const int64_t n_embd = hp.n_embd, n_ff = hp.n_ff, n_vocab = hp.n_vocab;
  const int64_t n_q = int64_t{hp.n_head} * hp.head_dim_k;     // query projection rows
  const int64_t n_k = int64_t{hp.n_head_kv} * hp.head_dim_k;  // key projection rows
  const int64_t n_v = int64_t{hp.n_head_kv} * hp.head_dim_v;  // value projection rows
  const int64_t n_o = int64_t{hp.n_head} * hp.head_dim_v;     // attention output width

  m_.tok_embd_ = matrix("token_embd.weight", n_vocab, n_embd, "n_embd, n_vocab", true);
  m_.out_norm_ = vector("output_norm.weight", n_embd, "n_embd", true);
  m_.output_ = matrix("output.weight", n_vocab, n_embd, "n_embd, n_vocab", false);
  if (!m_.output_.data) m_.output_ = m_.tok_embd_;  // tied embeddings

  // Llama 3.x: the "llama3" RoPE scaling's divisor per frequency, [n_rot / 2], every layer
  if (ai_.rope_freqs) m_.hp_.rope_freq_factors = rope_divisors("rope_freqs.weight");
  // Phi-3 LongRoPE: both sets or none
  if (ai_.longrope) {
    m_.hp_.rope_factors_short = rope_divisors("rope_factors_short.weight");
    m_.hp_.rope_factors_long = rope_divisors("rope_factors_long.weight");
    KVTRIM_CHECK(!m_.hp_.rope_factors_short == !m_.hp_.rope_factors_long,
                 "%s: LongRoPE needs both rope_factors_short.weight and rope_factors_long.weight", f_.path().c_str());
  }

  m_.layers_.resize(static_cast<size_t>(hp.n_layer));
  for (int il = 0; il < hp.n_layer; ++il) {
    LayerWeights& w = m_.layers_[il];
    const std::string b = "blk." + std::to_string(il) + ".";
    w.attn_norm = vector(b + "attn_norm.weight", n_embd, "n_embd", true);
    if (f_.find_tensor(b + "attn_qkv.weight") && !f_.find_tensor(b + "attn_q.weight")) {
      // fused (phi3; llama.cpp accepts it for every arch): rows q, then k, then v
      const WeightView qkv = matrix(b + "attn_qkv.weight", n_q + n_k + n_v, n_embd,
                                    "n_embd, (n_head + 2*n_head_kv)*head_dim", true);
      w.wq = row_slice(qkv, 0, n_q);
      w.wk = row_slice(qkv, n_q, n_k);
      w.wv = row_slice(qkv, n_q + n_k, n_v);
    } else {
      w.wq = matrix(b + "attn_q.weight", n_q, n_embd, "n_embd, n_head*head_dim_k", true);
      w.wk = matrix(b + "attn_k.weight", n_k, n_embd, "n_embd, n_head_kv*head_dim_k", true);
      w.wv = matrix(b + "attn_v.weight", n_v, n_embd, "n_embd, n_head_kv*head_dim_v", true);
    }
    w.wo = matrix(b + "attn_output.weight", n_embd, n_o, "n_head*head_dim_v, n_embd", true);
    w.bq = vector(b + "attn_q.bias", n_q, "n_head*head_dim_k", ai_.qkv_bias);
    w.bk = vector(b + "attn_k.bias", n_k, "n_head_kv*head_dim_k", ai_.qkv_bias);
    w.bv = vector(b + "attn_v.bias", n_v, "n_head_kv*head_dim_v", ai_.qkv_bias);
    if (ai_.qk_norm) {
      w.q_norm = vector(b + "attn_q_norm.weight", hp.head_dim_k, "head_dim_k", true);
      w.k_norm = vector(b + "attn_k_norm.weight", hp.head_dim_k, "head_dim_k", true);
    }
    if (ai_.post_norms) {
      w.post_attn_norm = vector(b + "post_attention_norm.weight", n_embd, "n_embd", true);
      w.post_ffn_norm = vector(b + "post_ffw_norm.weight", n_embd, "n_embd", true);
    }
    w.ffn_norm = vector(b + "ffn_norm.weight", n_embd, "n_embd", true);
    if (ai_.moe) {
      const int64_t n_exp = hp.n_expert, n_ff_exp = hp.n_ff_exp;
      w.ffn_gate_inp = matrix(b + "ffn_gate_inp.weight", n_exp, n_embd, "n_embd, n_expert", true);
      w.gate_exps = experts(b + "ffn_gate_exps.weight", n_ff_exp, n_embd, "n_embd, n_ff_exp, n_expert");
      w.up_exps = experts(b + "ffn_up_exps.weight", n_ff_exp, n_embd, "n_embd, n_ff_exp, n_expert");
      w.down_exps = experts(b + "ffn_down_exps.weight", n_embd, n_ff_exp, "n_ff_exp, n_embd, n_expert");
      continue;
    }
    if (ai_.gate_up_fused) {  // phi3: ffn_up = [gate; up]
      const WeightView gu = matrix(b + "ffn_up.weight", 2 * n_ff, n_embd, "n_embd, 2*n_ff (gate and up)", true);
      w.ffn_gate = row_slice(gu, 0, n_ff);
      w.ffn_up = row_slice(gu, n_ff, n_ff);
    } else {
      w.ffn_gate = matrix(b + "ffn_gate.weight", n_ff, n_embd, "n_embd, n_ff", true);
      w.ffn_up = matrix(b + "ffn_up.weight", n_ff, n_embd, "n_embd, n_ff", true);
    }
    w.ffn_down = matrix(b + "ffn_down.weight", n_embd, n_ff, "n_ff, n_embd", true);
  }
}

// Tensors a file may carry that kvtrim does not read, each with the reason (a name pattern: the
// part before and after the layer number of blk.N.<suffix>, or a whole name).
struct IgnoredTensor {
  const char* block_suffix;
  const char* why;
};
constexpr IgnoredTensor kIgnoredTensors[] = {
    {"attn_rot_embd.weight", "rotary tables some old converters stored; kvtrim computes RoPE itself (llama.cpp ignores them too)"},
};

void ModelLoader::check_everything_used() const {
  const std::string prefix = std::string(ai_.gguf_name) + ".";
  for (const auto& [k, v] : f_.metadata()) {
    if (k.compare(0, prefix.size(), prefix) != 0 || keys_.read().count(k)) continue;
    const std::string suffix = k.substr(prefix.size());
    bool harmless = false;
    for (const HarmlessKey& h : kHarmlessKeys) harmless |= suffix == h.suffix;
    KVTRIM_CHECK(harmless,
                 "%s: metadata key '%s' = %s is not implemented for the %s architecture; it may change the "
                 "computation, so kvtrim refuses the file rather than run it without it",
                 f_.path().c_str(), k.c_str(), v.to_string(4).c_str(), ai_.gguf_name);
  }
  for (const GgufTensor& t : f_.tensors()) {
    if (used_.count(t.name)) continue;
    bool ignored = false;
    if (t.name.compare(0, 4, "blk.") == 0) {
      const size_t dot = t.name.find('.', 4);
      for (const IgnoredTensor& it : kIgnoredTensors)
        ignored |= dot != std::string::npos && t.name.compare(dot + 1, std::string::npos, it.block_suffix) == 0;
    }
    KVTRIM_CHECK(ignored,
                 "%s: tensor '%s' is not used by kvtrim's %s architecture; it may change the computation, so "
                 "kvtrim refuses the file rather than run it without it",
                 f_.path().c_str(), t.name.c_str(), ai_.gguf_name);
  }
}

std::unique_ptr<Model> Model::load(const std::string& path) { return load(GgufFile::open(path)); }

std::unique_ptr<Model> Model::load(std::unique_ptr<GgufFile> file) {
  std::unique_ptr<Model> m(new Model());
  m->file_ = std::move(file);
  const std::string& path = m->file_->path();
  const std::string& arch = m->file_->get_string("general.architecture");
  const ArchInfo* ai = find_arch(arch);
  KVTRIM_CHECK(ai, "%s: unsupported architecture '%s' (supported: %s)", path.c_str(), arch.c_str(),
               supported_archs().c_str());
  ModelLoader loader(*m, *ai);
  loader.load_hparams();
  loader.load_tensors();
  loader.check_everything_used();
  if (weight_packing()) m->pack_weights();
  m->tok_ = Tokenizer::from_gguf(*m->file_);
  m->chat_ = ChatTemplate::from_gguf(*m->file_);
  return m;
}

void Model::pack_weights() {
  // Every packable matrix, in the order a decode step reads them, into one buffer of 2 MiB pages
  // (core/memory.h HugePageBuffer; SmolLM2's one-token products 7-14 % faster than with a 4 KiB
  // paged buffer per matrix, docs/results/perf §13).
  std::vector<WeightView*> ws;
  for (LayerWeights& l : layers_) {
    for (WeightView* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_gate, &l.ffn_up, &l.ffn_down}) ws.push_back(w);
  }
  ws.push_back(&output_);  // (tied: the embedding's rows are still read from the file by get_row)
  std::erase_if(ws, [](const WeightView* w) { return !w->data || !PackedWeight::available(w->type); });
  std::vector<WeightView> views;
  for (const WeightView* w : ws) views.push_back(*w);
  packed_ = PackedWeight::pack_all(views, &packed_buf_);
  for (size_t i = 0; i < ws.size(); ++i) {
    *ws[i] = packed_[i].view(*ws[i]);
    file_->release_pages(ws[i]->data, static_cast<size_t>(ws[i]->n_rows) * ws[i]->row_bytes);
  }
}

size_t Model::packed_weight_huge_page_bytes() const { return packed_buf_.huge_page_bytes(); }

size_t Model::packed_weight_bytes() const {
  size_t n = 0;
  for (const PackedWeight& p : packed_) n += p.size();
  return n;
}

size_t Model::decode_weight_bytes() const {
  auto b = [](const WeightView& w) { return w.data ? static_cast<size_t>(w.n_rows) * w.row_bytes : size_t{0}; };
  size_t n = 0;
  for (const LayerWeights& l : layers_) {
    for (const WeightView* w : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.bq, &l.bk, &l.bv, &l.q_norm, &l.k_norm, &l.wo,
                                &l.post_attn_norm, &l.ffn_norm, &l.ffn_gate, &l.ffn_up, &l.ffn_down, &l.post_ffn_norm})
      n += b(*w);
  }
  n += b(out_norm_) + b(output_) + (tok_embd_.data ? tok_embd_.row_bytes : 0);
  // a token reads its n_expert_used experts' matrices and the router (expert 0's size stands for all)
  for (const LayerWeights& l : layers_) {
    if (!l.ffn_gate_inp.data) continue;
    n += b(l.ffn_gate_inp) +
         static_cast<size_t>(hp_.n_expert_used) * (b(l.gate_exps[0]) + b(l.up_exps[0]) + b(l.down_exps[0]));
  }
  return n;
}

RopeSpec layer_rope(const HParams& hp, int il, int64_t n_ctx) {
  const bool swa = il >= 0 && il < static_cast<int>(hp.sliding_window.size()) &&
                   hp.sliding_window[static_cast<size_t>(il)] > 0;
  RopeSpec r;
  r.n_rot = hp.n_rot;
  r.neox = hp.rope_neox;
  if (swa && hp.rope_swa_plain) {
    r.base = hp.rope_base_swa;
    return r;
  }
  r.base = hp.rope_base;
  r.freq_scale = hp.rope_freq_scale;
  r.freq_factors = hp.rope_freq_factors ? hp.rope_freq_factors->data() : nullptr;
  if (hp.rope_factors_long) {
    r.freq_factors = (n_ctx > hp.rope_n_ctx_orig ? hp.rope_factors_long : hp.rope_factors_short)->data();
  }
  r.ext_factor = hp.rope_ext_factor;
  r.attn_factor = hp.rope_attn_factor;
  r.beta_fast = hp.rope_beta_fast;
  r.beta_slow = hp.rope_beta_slow;
  r.n_ctx_orig = hp.rope_n_ctx_orig;
  return r;
}

std::string rope_description(const HParams& hp) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "rope base %g%s", static_cast<double>(hp.rope_base),
                hp.n_rot < hp.head_dim_k ? (", " + std::to_string(hp.n_rot) + " of " + std::to_string(hp.head_dim_k) + " dims").c_str() : "");
  std::string s = buf;
  if (hp.rope_freq_factors) s += ", llama3 frequency factors (rope_freqs.weight)";
  if (hp.rope_factors_long)
    s += ", LongRoPE factors (short up to " + std::to_string(hp.rope_n_ctx_orig) + " positions of context, long past it)";
  if (hp.rope_ext_factor != 0.f) {
    std::snprintf(buf, sizeof buf, ", yarn x%g from %d positions", 1.0 / static_cast<double>(hp.rope_freq_scale), hp.rope_n_ctx_orig);
    s += buf;
  } else if (hp.rope_freq_scale != 1.f) {
    std::snprintf(buf, sizeof buf, ", linear x%g", 1.0 / static_cast<double>(hp.rope_freq_scale));
    s += buf;
  }
  if (hp.rope_attn_factor != 1.f) {
    std::snprintf(buf, sizeof buf, ", attention factor %g", static_cast<double>(hp.rope_attn_factor));
    s += buf;
  }
  return s;
}

KvCacheConfig Model::cache_config(int64_t n_ctx) const {
  KvCacheConfig c;
  c.n_layer = hp_.n_layer;
  c.n_head_kv = hp_.n_head_kv;
  c.head_dim_k = hp_.head_dim_k;
  c.head_dim_v = hp_.head_dim_v;
  c.n_ctx = n_ctx;
  c.dtype = KvDtype::kF16;
  c.sliding_window = hp_.sliding_window;
  return c;
}

}  // namespace kvtrim
