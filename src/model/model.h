// A loaded model: hyper-parameters and weights read from a GGUF file (weights stay in the
// memory mapping, in their quantized types), its tokenizer, and the forward pass.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/memory.h"
#include "kv/kv_types.h"
#include "model/chat_template.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "ops/matmul.h"
#include "ops/weight_pack.h"

namespace kvtrim {

class KvCache;
class ThreadPool;
struct KvCacheConfig;

enum class Arch { kLlama, kQwen2, kQwen3, kQwen3Moe, kPhi3, kGemma2, kGemma3 };
const char* arch_name(Arch a);

struct HParams {
  Arch arch;
  std::string name;         // general.name
  int n_vocab = 0;
  int n_ctx_train = 0;      // <arch>.context_length: the context limit
  int n_embd = 0;
  int n_layer = 0;
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim_k = 0;       // <arch>.attention.key_length (default n_embd / n_head)
  int head_dim_v = 0;
  int n_ff = 0;
  int n_rot = 0;            // rotary dims
  float norm_eps = 1e-5f;
  float rope_base = 10000.f;       // global layers
  float rope_base_swa = 10000.f;   // sliding-window layers (gemma3)
  bool rope_swa_plain = false;     // sliding-window layers rotate with rope_base_swa and no scaling (gemma3)
  float rope_freq_scale = 1.f;     // 1 / <arch>.rope.scaling.factor (linear, YaRN)
  bool rope_neox = false;
  // [n_rot / 2] per-frequency divisors (Llama 3 `rope_freqs.weight`, Phi-3 LongRoPE's factors for
  // the context in use), shared by copies of HParams; nullptr: none.
  std::shared_ptr<const std::vector<float>> rope_freq_factors;
  float rope_ext_factor = 0.f;     // YaRN extrapolation mix (1 for rope.scaling.type = yarn)
  float rope_attn_factor = 1.f;    // cos / sin magnitude (rope.scaling.attn_factor; LongRoPE's)
  float rope_beta_fast = 32.f, rope_beta_slow = 1.f;  // YaRN ramp (llama.cpp's defaults)
  int rope_n_ctx_orig = 0;         // rope.scaling.original_context_length (YaRN's ramp, LongRoPE's switch)
  // Phi-3 LongRoPE: [n_rot / 2] divisors for a context up to rope_n_ctx_orig (short) and past it
  // (long); which one a sequence uses depends on its context (layer_rope's n_ctx). nullptr: none.
  std::shared_ptr<const std::vector<float>> rope_factors_short, rope_factors_long;
  float attn_scale = 0;            // multiplies q·k (1/sqrt(head_dim) or gemma's query_pre_attn_scalar)
  std::vector<int> sliding_window; // per layer, 0 = global
  float embd_scale = 1.f;          // gemma: sqrt(n_embd)
  float attn_softcap = 0;          // gemma2: scores s -> c·tanh(s / c) before the softmax (0 = none)
  float final_softcap = 0;         // gemma2: logits z -> c·tanh(z / c) (0 = none)
  // Mixture of experts (qwen3moe; 0 = a dense FFN): every layer's FFN is n_expert_used of n_expert
  // SwiGLU experts of width n_ff_exp, chosen per token by the router's softmax top-k, their
  // outputs summed with the top-k probabilities renormalised to sum 1 (norm_topk_prob).
  int n_expert = 0;
  int n_expert_used = 0;
  int n_ff_exp = 0;
};

// How the model rotates positions, for people: "rope base 10000, llama3 frequency factors",
// "rope base 1e+06, yarn x4 from 32768 positions", "rope base 10000".
std::string rope_description(const HParams& hp);

// The rotary embedding of layer il's queries and keys (every scaling, ops/rope.h) for a sequence
// whose context (its KV cache's n_ctx; a reference pass's length) is n_ctx: with rope_swa_plain,
// sliding-window layers use their own base and no scaling (gemma3); LongRoPE's long factors iff
// n_ctx > rope_n_ctx_orig (llama.cpp's rule: the choice is fixed per context, not per position).
RopeSpec layer_rope(const HParams& hp, int il, int64_t n_ctx);

// Weights of one decoder layer (views into the mapping; data == nullptr when absent).
// Shapes are [n_rows, n_cols] as WeightView (y = W x), vectors are f32 [n] (type F32,
// n_rows = 1, n_cols = n).
struct LayerWeights {
  WeightView attn_norm;    // [n_embd]
  WeightView wq, wk, wv;   // [n_head*head_dim_k, n_embd], [n_head_kv*head_dim_k, n_embd], [n_head_kv*head_dim_v, n_embd]
  WeightView bq, bk, bv;   // qwen2 biases [n_head*hd], [n_head_kv*hd], [n_head_kv*hd]
  WeightView q_norm, k_norm;     // gemma3 per-head RMSNorm [head_dim_k]
  WeightView wo;           // [n_embd, n_head*head_dim_v]
  WeightView post_attn_norm;     // gemma3 [n_embd]
  WeightView ffn_norm;     // [n_embd]
  WeightView ffn_gate, ffn_up;   // [n_ff, n_embd]
  WeightView ffn_down;     // [n_embd, n_ff]
  WeightView post_ffn_norm;      // gemma3 [n_embd]
  // Mixture of experts (hp.n_expert > 0; ffn_gate / ffn_up / ffn_down are then absent):
  WeightView ffn_gate_inp;                     // router [n_expert, n_embd]
  std::vector<WeightView> gate_exps, up_exps;  // per expert [n_ff_exp, n_embd] (slices of one tensor)
  std::vector<WeightView> down_exps;           // per expert [n_embd, n_ff_exp]
};

// Sees each layer's queries, keys and values during a forward pass (after RoPE, before the
// cache stores K/V): how presses observe what they score with (e.g. the last W queries).
class ForwardObserver {
 public:
  virtual ~ForwardObserver() = default;
  // q: [n, n_head, head_dim_k], k: [n, n_head_kv, head_dim_k], v: [n, n_head_kv, head_dim_v],
  // pos: [n]. Called once per layer per forward call, on the calling thread.
  virtual void on_qkv(int il, int64_t n, const float* q, const float* k, const float* v,
                      const int32_t* pos) = 0;

  // Optional taps (calibration, later methods); each costs nothing unless wanted.
  // Pre-RoPE queries and keys of layer il (after bias and QK-norm): q [n, n_head, head_dim_k],
  // k [n, n_head_kv, head_dim_k]. Called before on_qkv.
  virtual bool wants_pre_rope() const { return false; }
  virtual void on_qk_pre_rope(int il, int64_t n, const float* q, const float* k) {}
  // The residual stream entering layer il and leaving it: x_in, x_out [n, n_embd].
  virtual bool wants_layer_io() const { return false; }
  virtual void on_layer_io(int il, int64_t n, const float* x_in, const float* x_out) {}
  // Called after layer il's new keys / values were appended to the cache and before attention
  // reads it: a press may re-encode them here (e.g. OjaKV compressing during prefill, so the
  // prefill's own attention reads the compressed cache).
  virtual void after_append(int il, KvCache& cache) {}
};

// One sequence of a batched forward call (Model::forward_batch): its tokens at positions
// pos0 .. pos0+n-1 go into its own cache. logits: [n, n_vocab] if all_logits, else [n_vocab]
// for its last token. observer (may be nullptr) sees this sequence's rows only.
struct ForwardSeq {
  const int32_t* tokens = nullptr;
  int64_t n = 0;
  int32_t pos0 = 0;
  KvCache* cache = nullptr;
  float* logits = nullptr;
  bool all_logits = false;
  ForwardObserver* observer = nullptr;
};

class Model {
 public:
  // Loads a GGUF file; throws Error for unsupported architectures, missing or mis-shaped
  // tensors, or inconsistent hyper-parameters.
  static std::unique_ptr<Model> load(const std::string& path);
  // The same over an opened file (GgufFile::from_memory: the fuzz targets).
  static std::unique_ptr<Model> load(std::unique_ptr<GgufFile> file);

  const HParams& hparams() const { return hp_; }
  const GgufFile& gguf() const { return *file_; }
  const Tokenizer& tokenizer() const { return *tok_; }
  // How conversations become prompts: the file's chat template (ChatTemplate::from_gguf) unless
  // replaced (--chat-template). Set before the model is shared between threads.
  const ChatTemplate& chat_template() const { return chat_; }
  void set_chat_template(ChatTemplate t) { chat_ = std::move(t); }
  const std::vector<LayerWeights>& layers() const { return layers_; }
  const WeightView& tok_embd() const { return tok_embd_; }   // [n_vocab, n_embd]
  const WeightView& output_norm() const { return out_norm_; }  // [n_embd]
  const WeightView& output() const { return output_; }       // [n_vocab, n_embd] (tied: tok_embd)

  // A cache config matching this model (layers, kv heads, head dims, sliding windows).
  KvCacheConfig cache_config(int64_t n_ctx) const;

  // Bytes of weights one decode step reads from memory: every layer tensor, the output norm
  // and the output matrix whole, and one row of the token embedding (as stored in the file:
  // quantized bytes, not the f32 they expand to). With the KV cache's bytes, the memory traffic
  // of one decoded token, which bounds decode speed at the machine's read bandwidth.
  size_t decode_weight_bytes() const;

  // Bytes of the packed weight copies Model::load made (ops/weight_pack.h; 0 where
  // weight_packing() was off or the CPU has no packed kernels). The GGUF pages of packed matrices
  // are released from the resident set after packing, so the resident weights stay about one copy.
  size_t packed_weight_bytes() const;
  // Of the packed copy, the bytes the kernel backs with 2 MiB pages now (0 without THP).
  size_t packed_weight_huge_page_bytes() const;

  // True if every weight product gives each token the result it gets alone, whatever the token
  // count (int8_prefill() and an integer kernel for every matrix's type on this CPU:
  // ops/matmul.h matmul_token_exact): forward_batch then runs all its rows through one product
  // per weight, a prefill chunk's and the decode steps' together.
  bool token_exact_products() const;

  // Runs n tokens (positions pos0 .. pos0+n-1) through the model, appending their K/V to
  // `cache`. logits: [n, n_vocab] if all_logits, else [n_vocab] for the last token.
  // Throws Error if a position would reach the cache's n_ctx.
  // observer (may be nullptr) sees every layer's q, k, v.
  void forward(const int32_t* tokens, int64_t n, int32_t pos0, KvCache& cache, float* logits,
               bool all_logits, ThreadPool* pool, ForwardObserver* observer = nullptr) const;
  // Several sequences, each with its own cache, in one pass (continuous batching: the decode
  // steps of a server's conversations, or decode steps next to a prefill chunk). The decode
  // steps' rows go through each weight matrix together, in runs of up to 15 rows on the decode
  // kernel (the weights are read once per run instead of once per sequence); a longer
  // sequence (a prefill chunk) has its own product, as forward() would run it — unless
  // token_exact_products(), where all rows share one product per weight. So every
  // sequence gets exactly, bit for bit, the logits forward() gives it alone. Attention runs
  // per sequence over its own cache. The caches must be distinct; every check of forward()
  // applies per sequence, before any work is done.
  void forward_batch(const std::vector<ForwardSeq>& seqs, ThreadPool* pool) const;

 private:
  Model() = default;
  void check_seq(const ForwardSeq& s) const;  // forward()'s checks of one sequence
  void pack_weights();                         // packed copies of the packable matrices
  std::unique_ptr<GgufFile> file_;
  std::unique_ptr<Tokenizer> tok_;
  ChatTemplate chat_;
  HParams hp_;
  std::vector<LayerWeights> layers_;
  WeightView tok_embd_{}, out_norm_{}, output_{};
  // f32 copies of norm / bias vectors stored as f16 or bf16 in the file (views point into
  // these; moving the outer vector keeps each inner buffer in place).
  std::vector<std::vector<float>> owned_f32_;
  HugePageBuffer packed_buf_;         // every packed matrix, one after another
  std::vector<PackedWeight> packed_;  // their slices of packed_buf_ (the views' `packed` point there)
  friend class ModelLoader;
};

// The scalar reference forward pass (llama2.c-style: one token at a time, ref kernels,
// its own dense f32 attention). Every optimized path is tested against it.
// logits: [n, n_vocab] for all tokens.
void forward_reference(const Model& m, const int32_t* tokens, int64_t n, float* logits);

}  // namespace kvtrim
