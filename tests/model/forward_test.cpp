// Tiny random models of every architecture: the loader (hyper-parameters, errors that name
// the problem), the optimized forward against forward_reference, chunked prefill against
// one batch, decode after prefill, and the context limits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "../common/test_util.h"
#include "../common/tiny_model.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "kv/kv_cache.h"
#include "model/gguf_writer.h"
#include "model/model.h"

namespace kvtrim {
namespace {

// Logits agree when max |a - b| <= tol · max(1, max |b|) (b = reference).
// With quantized weights the optimized matvec (and matmul below 16 tokens) quantizes the
// activations to 8 bits for its integer dot products, while the reference and the sgemm
// prefill path stay in f32; on these random models (peaky attention, logits up to ~30)
// that moves logits by up to ~4% of the largest one. f16 K/V adds ~0.1%.
constexpr double kTolQuantized = 6e-2;
// With f32 weights and an f32 cache every path computes the same sums in another order.
constexpr double kTolFloat = 1e-4;

class TinyForward : public ::testing::TestWithParam<Arch> {
 protected:
  static std::string path_for(Arch a) {
    static const std::string dir = test::temp_dir("tiny_forward");
    return test::write_tiny_model(test::tiny_spec(a, 11), dir);
  }
};

TEST_P(TinyForward, LoadsHyperParameters) {
  const Arch a = GetParam();
  const test::TinyModelSpec spec = test::tiny_spec(a, 11);
  auto m = Model::load(path_for(a));
  const HParams& hp = m->hparams();
  EXPECT_EQ(hp.arch, a);
  EXPECT_EQ(hp.n_layer, spec.n_layer);
  EXPECT_EQ(hp.n_embd, spec.n_embd);
  EXPECT_EQ(hp.n_head, spec.n_head);
  EXPECT_EQ(hp.n_head_kv, spec.n_head_kv);
  EXPECT_EQ(hp.head_dim_k, spec.head_dim);
  EXPECT_EQ(hp.head_dim_v, spec.head_dim);
  EXPECT_EQ(hp.n_rot, spec.head_dim);
  EXPECT_EQ(hp.n_ff, spec.n_ff);
  EXPECT_EQ(hp.n_vocab, test::tiny_vocab_size());
  EXPECT_EQ(hp.n_ctx_train, spec.n_ctx_train);
  EXPECT_FLOAT_EQ(hp.attn_scale, 1.f / std::sqrt(static_cast<float>(spec.head_dim)));
  EXPECT_EQ(hp.rope_neox, a != Arch::kLlama);
  ASSERT_EQ(static_cast<int>(hp.sliding_window.size()), spec.n_layer);
  for (int il = 0; il < spec.n_layer; ++il) {
    const bool local = (a == Arch::kGemma3 && (il + 1) % 6 != 0) || (a == Arch::kGemma2 && il % 2 == 0) ||
                       a == Arch::kPhi3;
    EXPECT_EQ(hp.sliding_window[il], local ? spec.sliding_window : 0) << "layer " << il;
  }
  EXPECT_FLOAT_EQ(hp.embd_scale, a == Arch::kGemma3 || a == Arch::kGemma2 ? 8.f : 1.f);
  EXPECT_FLOAT_EQ(hp.attn_softcap, a == Arch::kGemma2 ? 5.f : 0.f);
  EXPECT_FLOAT_EQ(hp.final_softcap, a == Arch::kGemma2 ? 4.f : 0.f);
  EXPECT_EQ(m->output().data == m->tok_embd().data, spec.tied_output);
  EXPECT_EQ(m->layers()[0].bq.data != nullptr, a == Arch::kQwen2);
  EXPECT_EQ(m->layers()[0].q_norm.data != nullptr, a == Arch::kGemma3 || a == Arch::kQwen3 || a == Arch::kQwen3Moe);
  EXPECT_EQ(hp.n_expert, a == Arch::kQwen3Moe ? spec.n_expert : 0);
  EXPECT_EQ(m->layers()[0].gate_exps.size(), a == Arch::kQwen3Moe ? static_cast<size_t>(spec.n_expert) : 0u);
  EXPECT_EQ(m->tokenizer().n_vocab(), test::tiny_vocab_size());
  const KvCacheConfig cc = m->cache_config(64);
  EXPECT_EQ(cc.n_layer, spec.n_layer);
  EXPECT_EQ(cc.sliding_window, hp.sliding_window);
}

TEST_P(TinyForward, OptimizedMatchesReference) {
  auto m = Model::load(path_for(GetParam()));
  const int n_vocab = m->hparams().n_vocab;
  const int n = 20;
  const std::vector<int32_t> toks = test::random_tokens(n, n_vocab, 5);
  std::vector<float> ref(static_cast<size_t>(n) * n_vocab);
  forward_reference(*m, toks.data(), n, ref.data());
  ThreadPool pool(2);
  for (KvDtype dt : {KvDtype::kF32, KvDtype::kF16}) {
    for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
      KvCacheConfig cc = m->cache_config(64);
      cc.dtype = dt;
      auto cache = make_dense_cache(cc);
      std::vector<float> got(ref.size());
      m->forward(toks.data(), n, 0, *cache, got.data(), /*all_logits=*/true, p);
      EXPECT_EQ(cache->n_past(), n);
      for (int i = 0; i < n; ++i) {
        const float* g = got.data() + static_cast<size_t>(i) * n_vocab;
        const float* r = ref.data() + static_cast<size_t>(i) * n_vocab;
        EXPECT_LT(test::rel_err(g, r, n_vocab), kTolQuantized)
            << "token " << i << " kv " << kv_dtype_name(dt);
        EXPECT_EQ(test::argmax(g, n_vocab), test::argmax(r, n_vocab)) << "token " << i;
      }
    }
  }
}

TEST_P(TinyForward, ChunkedPrefillMatchesOneBatch) {
  auto m = Model::load(path_for(GetParam()));
  const int n_vocab = m->hparams().n_vocab;
  const int n = 17;
  const std::vector<int32_t> toks = test::random_tokens(n, n_vocab, 9);
  ThreadPool pool(2);
  auto run = [&](int chunk, bool all) {
    auto cache = make_dense_cache(m->cache_config(64));
    std::vector<float> logits(static_cast<size_t>(all ? n : 1) * n_vocab);
    for (int i = 0; i < n; i += chunk) {
      const int c = std::min(chunk, n - i);
      float* out = all ? logits.data() + static_cast<size_t>(i) * n_vocab : logits.data();
      m->forward(toks.data() + i, c, cache->n_past(), *cache, out, all, &pool);
    }
    return logits;
  };
  for (bool all : {false, true}) {
    const std::vector<float> one = run(n, all);
    for (int chunk : {1, 3, 8}) {
      const std::vector<float> got = run(chunk, all);
      const int rows = all ? n : 1;
      for (int r = 0; r < rows; ++r) {
        EXPECT_LT(test::rel_err(got.data() + static_cast<size_t>(r) * n_vocab,
                                one.data() + static_cast<size_t>(r) * n_vocab, n_vocab),
                  kTolQuantized)
            << "chunk " << chunk << " row " << r;
      }
    }
  }
}

TEST_P(TinyForward, DecodeAfterPrefillMatchesReference) {
  auto m = Model::load(path_for(GetParam()));
  const int n_vocab = m->hparams().n_vocab;
  const int n_prompt = 9, n = 16;
  const std::vector<int32_t> toks = test::random_tokens(n, n_vocab, 3);
  std::vector<float> ref(static_cast<size_t>(n) * n_vocab);
  forward_reference(*m, toks.data(), n, ref.data());
  auto cache = make_dense_cache(m->cache_config(32));
  std::vector<float> logits(n_vocab);
  m->forward(toks.data(), n_prompt, 0, *cache, logits.data(), false, nullptr);
  EXPECT_LT(
      test::rel_err(logits.data(), ref.data() + static_cast<size_t>(n_prompt - 1) * n_vocab, n_vocab),
      kTolQuantized);
  for (int i = n_prompt; i < n; ++i) {
    m->forward(&toks[i], 1, i, *cache, logits.data(), false, nullptr);
    EXPECT_LT(test::rel_err(logits.data(), ref.data() + static_cast<size_t>(i) * n_vocab, n_vocab),
              kTolQuantized)
        << "decode step at position " << i;
  }
  // truncating and re-running the tail reproduces the same logits
  cache->truncate(n - 1);
  std::vector<float> again(n_vocab);
  m->forward(&toks[n - 1], 1, n - 1, *cache, again.data(), false, nullptr);
  EXPECT_LT(test::rel_err(again.data(), logits.data(), n_vocab), 1e-6);
}

TEST_P(TinyForward, EnforcesContextLimits) {
  auto m = Model::load(path_for(GetParam()));
  const int n_vocab = m->hparams().n_vocab;
  std::vector<int32_t> toks = test::random_tokens(8, n_vocab, 5);
  std::vector<float> logits(n_vocab);
  auto cache = make_dense_cache(m->cache_config(8));
  m->forward(toks.data(), 8, 0, *cache, logits.data(), false, nullptr);
  try {
    m->forward(toks.data(), 1, 8, *cache, logits.data(), false, nullptr);
    FAIL() << "no error past the cache's n_ctx";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("context"), std::string::npos) << e.what();
  }
  // past the model's trained context (cache larger than the model allows)
  const int train = m->hparams().n_ctx_train;
  auto big = make_dense_cache(m->cache_config(train + 10));
  EXPECT_THROW(m->forward(toks.data(), 1, train, *big, logits.data(), false, nullptr), Error);
  toks[0] = n_vocab;  // out-of-range token id
  auto c2 = make_dense_cache(m->cache_config(8));
  EXPECT_THROW(m->forward(toks.data(), 1, 0, *c2, logits.data(), false, nullptr), Error);
}

// All-f32 weights and an f32 cache: the optimized forward (batch, chunks, decode) must
// agree with the reference to float rounding — this pins the forward's logic exactly.
TEST_P(TinyForward, FloatWeightsMatchReferenceTightly) {
  test::TinyModelSpec spec = test::tiny_spec(GetParam(), 23);
  spec.t_embd = spec.t_attn = spec.t_v = spec.t_ffn = spec.t_down = spec.t_output = spec.t_exps = GgmlType::F32;
  auto m = Model::load(test::write_tiny_model(spec, test::temp_dir("tiny_f32")));
  const int n_vocab = m->hparams().n_vocab;
  const int n = 20;
  const std::vector<int32_t> toks = test::random_tokens(n, n_vocab, 17);
  std::vector<float> ref(static_cast<size_t>(n) * n_vocab);
  forward_reference(*m, toks.data(), n, ref.data());
  ThreadPool pool(2);
  for (int chunk : {n, 7, 1}) {
    KvCacheConfig cc = m->cache_config(64);
    cc.dtype = KvDtype::kF32;
    auto cache = make_dense_cache(cc);
    std::vector<float> got(ref.size());
    for (int i = 0; i < n; i += chunk) {
      const int c = std::min(chunk, n - i);
      m->forward(toks.data() + i, c, i, *cache, got.data() + static_cast<size_t>(i) * n_vocab, true,
                 &pool);
    }
    for (int i = 0; i < n; ++i) {
      EXPECT_LT(test::rel_err(got.data() + static_cast<size_t>(i) * n_vocab,
                              ref.data() + static_cast<size_t>(i) * n_vocab, n_vocab),
                kTolFloat)
          << "chunk " << chunk << " token " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllArchs, TinyForward,
                         ::testing::Values(Arch::kLlama, Arch::kQwen2, Arch::kQwen3, Arch::kQwen3Moe, Arch::kPhi3,
                                           Arch::kGemma2, Arch::kGemma3),
                         [](const ::testing::TestParamInfo<Arch>& i) {
                           return std::string(arch_name(i.param));
                         });

// The low-bit weight types in a whole forward pass: IQ4_NL projections (32-blocks, n_embd 64)
// and a Q2_K / Q3_K / IQ4_XS ffn_down (rows of n_ff = 256), optimized (integer decode kernels,
// the sgemm prefill from 16 tokens) against forward_reference, as OptimizedMatchesReference.
TEST(TinyForwardLowBit, OptimizedMatchesReference) {
  for (GgmlType down : {GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::IQ4_XS}) {
    SCOPED_TRACE(std::string(ggml_type_name(down)));
    test::TinyModelSpec spec = test::tiny_spec(Arch::kLlama, 11);
    spec.t_attn = spec.t_v = spec.t_ffn = spec.t_embd = GgmlType::IQ4_NL;
    spec.t_down = down;
    auto m = Model::load(test::write_tiny_model(spec, test::temp_dir("tiny_lowbit_" + std::string(ggml_type_name(down)))));
    const int n_vocab = m->hparams().n_vocab;
    for (int n : {5, 20}) {
      const std::vector<int32_t> toks = test::random_tokens(n, n_vocab, 5);
      std::vector<float> ref(static_cast<size_t>(n) * n_vocab), got(ref.size());
      forward_reference(*m, toks.data(), n, ref.data());
      ThreadPool pool(2);
      auto cache = make_dense_cache(m->cache_config(64));
      m->forward(toks.data(), n, 0, *cache, got.data(), /*all_logits=*/true, &pool);
      for (int i = 0; i < n; ++i) {
        const float* g = got.data() + static_cast<size_t>(i) * n_vocab;
        const float* r = ref.data() + static_cast<size_t>(i) * n_vocab;
        EXPECT_LT(test::rel_err(g, r, n_vocab), kTolQuantized) << n << " tokens, token " << i;
        EXPECT_EQ(test::argmax(g, n_vocab), test::argmax(r, n_vocab)) << n << " tokens, token " << i;
      }
    }
  }
}

// Loader errors name the problem: the key and file, the tensor and shapes, the archs.
std::string load_error(const test::TinyModelSpec& spec, const std::string& tag) {
  const std::string path = test::write_tiny_model(spec, test::temp_dir("tiny_err_" + tag));
  try {
    Model::load(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ModelLoad, MissingKeyNamesKeyAndFile) {
  test::TinyModelSpec s = test::tiny_spec(Arch::kLlama);
  s.omit_key = "llama.block_count";
  const std::string e = load_error(s, "key");
  EXPECT_NE(e.find("llama.block_count"), std::string::npos) << e;
  EXPECT_NE(e.find("tiny_llama"), std::string::npos) << e;
}

TEST(ModelLoad, MissingTensorIsNamed) {
  test::TinyModelSpec s = test::tiny_spec(Arch::kGemma3);
  s.omit_tensor = "blk.1.attn_k_norm.weight";
  const std::string e = load_error(s, "tensor");
  EXPECT_NE(e.find("blk.1.attn_k_norm.weight"), std::string::npos) << e;
}

TEST(ModelLoad, WrongShapeNamesTensorAndShapes) {
  test::TinyModelSpec s = test::tiny_spec(Arch::kQwen2);
  s.n_ff_meta = 512;
  const std::string e = load_error(s, "shape");
  EXPECT_NE(e.find("blk.0.ffn_gate.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("[64, 256]"), std::string::npos) << e;
  EXPECT_NE(e.find("[64, 512]"), std::string::npos) << e;
}

// A weight of a type kvtrim has no kernels for is refused at load, naming the tensor and the type:
// a Q3_K ffn_down relabelled IQ3_S in the file (both 110 bytes per 256 elements, so the file is
// otherwise valid and opens).
TEST(ModelLoad, UnsupportedWeightTypeNamesTensorAndType) {
  test::TinyModelSpec s = test::tiny_spec(Arch::kLlama);
  s.t_down = GgmlType::Q3_K;
  const std::string path = test::write_tiny_model(s, test::temp_dir("tiny_err_type"));
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  // tensor info: name, n_dims (u32), dims (i64 each), type (u32)
  const std::string name = "blk.1.ffn_down.weight";
  const size_t at = bytes.find(name);
  ASSERT_NE(at, std::string::npos);
  uint32_t n_dims = 0, type = 0;
  std::memcpy(&n_dims, bytes.data() + at + name.size(), 4);
  const size_t type_at = at + name.size() + 4 + 8 * n_dims;
  std::memcpy(&type, bytes.data() + type_at, 4);
  ASSERT_EQ(type, static_cast<uint32_t>(GgmlType::Q3_K));
  type = static_cast<uint32_t>(GgmlType::IQ3_S);
  std::memcpy(bytes.data() + type_at, &type, 4);
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  try {
    Model::load(path);
    ADD_FAILURE() << "expected a load error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("iq3_s"), std::string::npos) << e.what();
  }
}

TEST(ModelLoad, UnsupportedArchListsSupported) {
  test::TinyModelSpec s = test::tiny_spec(Arch::kLlama);
  s.arch_override = "mamba";
  const std::string e = load_error(s, "arch");
  EXPECT_NE(e.find("mamba"), std::string::npos) << e;
  EXPECT_NE(e.find("llama, qwen2, qwen3, qwen3moe, phi3, gemma2, gemma3"), std::string::npos) << e;
}

TEST(ModelLoad, HeadsNotMultipleOfKvHeads) {
  test::TinyModelSpec s = test::tiny_spec(Arch::kLlama);
  s.n_head_kv = 3;
  const std::string e = load_error(s, "gqa");
  EXPECT_NE(e.find("head_count_kv"), std::string::npos) << e;
}

// A file kvtrim would run wrong is refused before any token, naming what it does not know.
TEST(ModelLoad, UnknownTensorIsRefusedByName) {
  test::TinyModelSpec s = test::tiny_spec(Arch::kLlama);
  s.extra_tensor = "blk.0.attn_sinks.weight";
  const std::string e = load_error(s, "extra_tensor");
  EXPECT_NE(e.find("blk.0.attn_sinks.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("not used"), std::string::npos) << e;
}

TEST(ModelLoad, UnknownArchKeyIsRefusedByName) {
  test::TinyModelSpec s = test::tiny_spec(Arch::kQwen2);
  s.extra_key = "attn_logit_softcapping";
  const std::string e = load_error(s, "extra_key");
  EXPECT_NE(e.find("qwen2.attn_logit_softcapping"), std::string::npos) << e;
  s = test::tiny_spec(Arch::kLlama);
  s.extra_key = "attention.sliding_window";  // a window kvtrim's llama does not apply
  EXPECT_NE(load_error(s, "extra_key2").find("llama.attention.sliding_window"), std::string::npos);
}

TEST(ModelLoad, RopeFreqsOnlyWhereTheArchitectureAppliesThem) {
  test::TinyModelSpec s = test::tiny_spec(Arch::kQwen2);
  s.extra_tensor = "rope_freqs.weight";  // qwen2 in llama.cpp never reads it: refused, not ignored
  const std::string e = load_error(s, "rope_freqs_qwen2");
  EXPECT_NE(e.find("rope_freqs.weight"), std::string::npos) << e;
}

TEST(ModelLoad, UnsupportedRopeScalingNamesKeyAndValue) {
  test::TinyModelSpec s = test::tiny_spec(Arch::kLlama);
  s.rope_yarn_factor = 4;
  const std::string path = test::write_tiny_model(s, test::temp_dir("tiny_longrope"));
  // rewrite the type to one kvtrim does not implement: a file with the same keys but "longrope"
  GgufWriter w;
  auto f = GgufFile::open(path);
  for (const auto& [k, v] : f->metadata())
    if (k != "llama.rope.scaling.type") w.set_value(k, v);
  w.set_string("llama.rope.scaling.type", "longrope");
  for (const GgufTensor& t : f->tensors()) w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
  const std::string bad = test::temp_dir("tiny_longrope2") + "/bad.gguf";
  w.write(bad);
  try {
    Model::load(bad);
    FAIL() << "loaded a longrope file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("llama.rope.scaling.type = 'longrope'"), std::string::npos) << e.what();
  }
}

// A RoPE-scaled model (f32 weights): its optimized forward over 40 tokens matches its reference
// tightly; returns how far the scaling moved the reference's logits from the same weights without
// it (`plain`).
double scaled_rope_check(const Model& m, const Model& plain, uint32_t seed) {
  const int n_vocab = m.hparams().n_vocab, n = 40;
  const std::vector<int32_t> toks = test::random_tokens(n, n_vocab, seed);
  std::vector<float> ref(static_cast<size_t>(n) * n_vocab), ref_plain(ref.size()), got(ref.size());
  forward_reference(m, toks.data(), n, ref.data());
  forward_reference(plain, toks.data(), n, ref_plain.data());
  KvCacheConfig cc = m.cache_config(64);
  cc.dtype = KvDtype::kF32;
  auto cache = make_dense_cache(cc);
  ThreadPool pool(2);
  m.forward(toks.data(), n, 0, *cache, got.data(), true, &pool);
  double moved = 0;
  for (int i = 0; i < n; ++i) {
    const size_t o = static_cast<size_t>(i) * n_vocab;
    EXPECT_LT(test::rel_err(got.data() + o, ref.data() + o, n_vocab), kTolFloat) << "token " << i;
    moved = std::max(moved, test::rel_err(ref_plain.data() + o, ref.data() + o, n_vocab));
  }
  return moved;
}

// Llama 3's rope_freqs.weight changes the computation (it was silently ignored before): the
// factors are read, applied by the optimized and reference passes alike, and change the logits.
TEST(RopeScaling, Llama3FactorsAreAppliedByBothPasses) {
  test::TinyModelSpec s = test::tiny_spec(Arch::kLlama, 31);
  s.t_embd = s.t_attn = s.t_v = s.t_ffn = s.t_down = s.t_output = GgmlType::F32;
  const std::string dir = test::temp_dir("tiny_llama3");
  auto plain = Model::load(test::write_tiny_model(s, dir));
  s.rope_freqs = true;
  auto m = Model::load(test::write_tiny_model(s, test::temp_dir("tiny_llama3b")));
  ASSERT_TRUE(m->hparams().rope_freq_factors);
  const std::vector<float> want = test::tiny_llama3_factors(s.head_dim, 10000.f, s.rope_orig_ctx);
  EXPECT_EQ(*m->hparams().rope_freq_factors, want);
  EXPECT_GT(want.back(), 7.9f);  // the tiny model's factors really scale some frequencies
  const RopeSpec rs = layer_rope(m->hparams(), 0, 64);
  ASSERT_NE(rs.freq_factors, nullptr);
  EXPECT_GT(scaled_rope_check(*m, *plain, 3), 1e-2) << "the factors did not change the logits";
}

// Gemma 2's soft-caps bound what they cap: every logit within ±final_softcap (4 in the tiny
// model) and reaching into the bend of the tanh.
TEST(Gemma2, SoftCapsBoundTheLogits) {
  test::TinyModelSpec s = test::tiny_spec(Arch::kGemma2, 41);
  auto m = Model::load(test::write_tiny_model(s, test::temp_dir("tiny_gemma2_cap")));
  const int n_vocab = m->hparams().n_vocab, n = 24;
  const std::vector<int32_t> toks = test::random_tokens(n, n_vocab, 6);
  std::vector<float> got(static_cast<size_t>(n) * n_vocab);
  KvCacheConfig cc = m->cache_config(64);
  auto cache = make_dense_cache(cc);
  m->forward(toks.data(), n, 0, *cache, got.data(), true, nullptr);
  float hi = 0;
  for (float z : got) hi = std::max(hi, std::fabs(z));
  EXPECT_LT(hi, 4.f);
  EXPECT_GT(hi, 3.f) << "the tiny model's logits should reach into the cap's bend";
}

// Phi-3's LongRoPE: the short divisors for a context up to the original one, the long past it,
// and the magnitude rope.scaling.attn_factor; fused q/k/v and gate/up split into views.
TEST(RopeScaling, LongRopeChoosesFactorsByContext) {
  test::TinyModelSpec s = test::tiny_spec(Arch::kPhi3, 43);
  auto m = Model::load(test::write_tiny_model(s, test::temp_dir("tiny_phi3_rope")));
  const HParams& hp = m->hparams();
  ASSERT_TRUE(hp.rope_factors_short && hp.rope_factors_long);
  EXPECT_EQ(layer_rope(hp, 0, s.rope_orig_ctx).freq_factors, hp.rope_factors_short->data());
  EXPECT_EQ(layer_rope(hp, 0, s.rope_orig_ctx + 1).freq_factors, hp.rope_factors_long->data());
  EXPECT_FLOAT_EQ(layer_rope(hp, 1, 64).attn_factor, 1.19f);
  const LayerWeights& w = m->layers()[0];
  EXPECT_EQ(static_cast<const uint8_t*>(w.wk.data), static_cast<const uint8_t*>(w.wq.data) + w.wq.n_rows * w.wq.row_bytes);
  EXPECT_EQ(w.ffn_gate.n_rows, s.n_ff);
  EXPECT_EQ(w.ffn_up.n_rows, s.n_ff);
  // two caches of different contexts in one batch would need two rotations: refused
  auto a = make_dense_cache(m->cache_config(s.rope_orig_ctx));
  auto b = make_dense_cache(m->cache_config(64));
  const int32_t t = 5;
  std::vector<float> la(static_cast<size_t>(hp.n_vocab)), lb(la.size());
  EXPECT_THROW(m->forward_batch({ForwardSeq{&t, 1, 0, a.get(), la.data()}, ForwardSeq{&t, 1, 0, b.get(), lb.data()}}, nullptr),
               Error);
}

// YaRN (qwen2 with rope.scaling.type = yarn): both passes agree, and the scaling is not a no-op.
TEST(RopeScaling, YarnIsAppliedByBothPasses) {
  test::TinyModelSpec s = test::tiny_spec(Arch::kQwen2, 37);
  s.t_embd = s.t_attn = s.t_v = s.t_ffn = s.t_down = s.t_output = GgmlType::F32;
  auto plain = Model::load(test::write_tiny_model(s, test::temp_dir("tiny_yarn_a")));
  s.rope_yarn_factor = 4;
  auto m = Model::load(test::write_tiny_model(s, test::temp_dir("tiny_yarn_b")));
  const HParams& hp = m->hparams();
  EXPECT_FLOAT_EQ(hp.rope_freq_scale, 0.25f);
  EXPECT_FLOAT_EQ(hp.rope_ext_factor, 1.f);
  EXPECT_EQ(hp.rope_n_ctx_orig, s.rope_orig_ctx);
  EXPECT_GT(scaled_rope_check(*m, *plain, 4), 1e-2) << "YaRN did not change the logits";
}

}  // namespace
}  // namespace kvtrim
