// Writes the binary seeds of the fuzz corpora: tiny models of every architecture (the same
// writer as the tests, tests/common/tiny_model.cpp), small enough that mutations stay fast.
// fuzz/make_seeds.sh runs it, then calibrates those models with `kvtrim calibrate` for the
// calibration target's seeds; and a GGUF holding every metadata value type (nested arrays
// included) and one small tensor of each type kvtrim dequantizes, for the gguf target.
// Usage: fuzz_make_seeds OUT_DIR
#include <cstdio>
#include <filesystem>
#include <string>

#include "core/ggml_type.h"
#include "model/gguf_writer.h"
#include "ops/dequant.h"
#include "tiny_model.h"

using namespace kvtrim;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  const std::string out = argv[1];
  std::filesystem::create_directories(out);
  // Each architecture, plus the RoPE scalings' variants (Llama 3 factors, YaRN): the fuzzer
  // mutates their hyper-parameters and tensors too.
  struct Seed {
    Arch arch;
    const char* name;
    bool rope_freqs;
    float yarn;
  };
  for (const Seed& sd : {Seed{Arch::kLlama, "tiny_llama.gguf", false, 0.f}, Seed{Arch::kQwen2, "tiny_qwen2.gguf", false, 0.f},
                         Seed{Arch::kQwen3, "tiny_qwen3.gguf", false, 0.f}, Seed{Arch::kGemma3, "tiny_gemma3.gguf", false, 0.f},
                         Seed{Arch::kGemma2, "tiny_gemma2.gguf", false, 0.f}, Seed{Arch::kQwen3Moe, "tiny_qwen3moe.gguf", false, 0.f},
                         Seed{Arch::kPhi3, "tiny_phi3.gguf", false, 0.f},
                         Seed{Arch::kLlama, "tiny_llama3_rope_freqs.gguf", true, 0.f},
                         Seed{Arch::kQwen2, "tiny_qwen2_yarn.gguf", false, 4.f}}) {
    test::TinyModelSpec s = test::tiny_spec(sd.arch, 1);
    s.n_layer = 2;
    s.n_embd = 32;
    s.n_head = 2;
    s.n_head_kv = 1;
    s.head_dim = 16;
    s.n_ff = 256;
    s.n_ctx_train = 128;
    s.rope_freqs = sd.rope_freqs;
    s.rope_yarn_factor = sd.yarn;
    if (sd.arch == Arch::kQwen3) s.t_ffn = GgmlType::Q8_0;  // rows of 32
    const std::string p = test::write_tiny_model(s, out);
    const std::string name = sd.name;
    std::filesystem::rename(p, out + "/" + name);
    std::printf("%s/%s (%ju bytes)\n", out.c_str(), name.c_str(),
                static_cast<uintmax_t>(std::filesystem::file_size(out + "/" + name)));
  }
  // Every value type, and small tensors of the weight types (one 256-element row each).
  GgufWriter w;
  w.set_string("general.architecture", "seed");
  w.set_u32("general.alignment", 32);
  w.set_value("u8", {GgufValueType::U8, uint64_t{200}});
  w.set_value("i8", {GgufValueType::I8, int64_t{-5}});
  w.set_value("u16", {GgufValueType::U16, uint64_t{60000}});
  w.set_value("i16", {GgufValueType::I16, int64_t{-30000}});
  w.set_i32("i32", -7);
  w.set_u64("u64", 1ull << 40);
  w.set_value("i64", {GgufValueType::I64, int64_t{-(1ll << 40)}});
  w.set_f32("f32", 0.5f);
  w.set_value("f64", {GgufValueType::F64, 0.25});
  w.set_bool("bool", true);
  w.set_array_string("strings", {"a", "bc", ""});
  w.set_array_f32("floats", {1.f, -2.f});
  GgufArray inner{GgufValueType::I32, {{GgufValueType::I32, int64_t{1}}, {GgufValueType::I32, int64_t{2}}}};
  GgufArray outer{GgufValueType::ARRAY, {{GgufValueType::ARRAY, inner}, {GgufValueType::ARRAY, inner}}};
  w.set_value("nested", {GgufValueType::ARRAY, outer});
  std::vector<float> x(256);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(static_cast<int>(i % 17) - 8) / 4.f;
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0,
                     GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
    const auto tr = ggml_type_traits(static_cast<uint32_t>(t));
    std::vector<uint8_t> bytes(256 / tr->block_size * tr->type_size);
    quantize_row(t, x.data(), bytes.data(), 256);
    w.add_tensor(std::string("t.") + std::string(tr->name), t, {256}, bytes.data(), bytes.size());
  }
  w.write(out + "/all_types.gguf");
  std::printf("%s/all_types.gguf\n", out.c_str());
  return 0;
}
