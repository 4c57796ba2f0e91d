// GgufWriter -> GgufFile round trips: every metadata value type (nested arrays included),
// several tensor types and shapes, alignments, v2 files, the typed getters, and the
// writer's own argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../common/test_util.h"
#include "core/error.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "ops/dequant.h"

namespace kvtrim {
namespace {

bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

GgufValue u(GgufValueType t, uint64_t v) { return {t, v}; }
GgufValue i(GgufValueType t, int64_t v) { return {t, v}; }
GgufValue f(GgufValueType t, double v) { return {t, v}; }
GgufValue s(const std::string& v) { return {GgufValueType::STRING, v}; }
GgufValue arr(GgufValueType et, std::vector<GgufValue> vs) { return {GgufValueType::ARRAY, GgufArray{et, std::move(vs)}}; }

void expect_same(const GgufValue& a, const GgufValue& b, const std::string& where) {
  ASSERT_EQ(a.type, b.type) << where;
  ASSERT_EQ(a.v.index(), b.v.index()) << where;
  if (a.type == GgufValueType::ARRAY) {
    const auto& x = a.as_array();
    const auto& y = b.as_array();
    ASSERT_EQ(x.elem_type, y.elem_type) << where;
    ASSERT_EQ(x.values.size(), y.values.size()) << where;
    for (size_t k = 0; k < x.values.size(); ++k) expect_same(x.values[k], y.values[k], where + "[" + std::to_string(k) + "]");
  } else if (a.type == GgufValueType::F32 || a.type == GgufValueType::F64) {
    EXPECT_EQ(std::get<double>(a.v), std::get<double>(b.v)) << where;
  } else if (a.type == GgufValueType::STRING) {
    EXPECT_EQ(a.as_string(), b.as_string()) << where;
  } else if (a.type == GgufValueType::BOOL) {
    EXPECT_EQ(a.as_bool(), b.as_bool()) << where;
  } else if (const auto* x = std::get_if<uint64_t>(&a.v)) {
    EXPECT_EQ(*x, std::get<uint64_t>(b.v)) << where;
  } else {
    EXPECT_EQ(std::get<int64_t>(a.v), std::get<int64_t>(b.v)) << where;
  }
}

// One value of every type, scalar and array, with extreme values.
std::vector<std::pair<std::string, GgufValue>> all_values() {
  using T = GgufValueType;
  std::vector<std::pair<std::string, GgufValue>> kv = {
      {"t.u8", u(T::U8, 255)},
      {"t.i8", i(T::I8, -128)},
      {"t.u16", u(T::U16, 65535)},
      {"t.i16", i(T::I16, -32768)},
      {"t.u32", u(T::U32, 4294967295u)},
      {"t.i32", i(T::I32, std::numeric_limits<int32_t>::min())},
      {"t.f32", f(T::F32, 1.5)},
      {"t.f32.neg", f(T::F32, static_cast<double>(-3.14159274101257324f))},
      {"t.bool.true", {T::BOOL, true}},
      {"t.bool.false", {T::BOOL, false}},
      {"t.string", s("héllo \"world\"\n")},
      {"t.string.empty", s("")},
      {"t.string.nul", s(std::string("a\0b", 3))},
      {"t.u64", u(T::U64, std::numeric_limits<uint64_t>::max())},
      {"t.i64", i(T::I64, std::numeric_limits<int64_t>::min())},
      {"t.f64", f(T::F64, 3.141592653589793)},
      {"t.arr.u8", arr(T::U8, {u(T::U8, 0), u(T::U8, 7), u(T::U8, 255)})},
      {"t.arr.i8", arr(T::I8, {i(T::I8, -1), i(T::I8, 127)})},
      {"t.arr.u16", arr(T::U16, {u(T::U16, 1)})},
      {"t.arr.i16", arr(T::I16, {i(T::I16, -2), i(T::I16, 3)})},
      {"t.arr.u32", arr(T::U32, {u(T::U32, 10), u(T::U32, 20)})},
      {"t.arr.i32", arr(T::I32, {i(T::I32, -10), i(T::I32, 20), i(T::I32, 30)})},
      {"t.arr.f32", arr(T::F32, {f(T::F32, 0.25), f(T::F32, static_cast<double>(-1e30f))})},
      {"t.arr.bool", arr(T::BOOL, {{T::BOOL, true}, {T::BOOL, false}, {T::BOOL, true}})},
      {"t.arr.string", arr(T::STRING, {s("a"), s(""), s("<|im_start|>")})},
      {"t.arr.u64", arr(T::U64, {u(T::U64, 1ull << 40)})},
      {"t.arr.i64", arr(T::I64, {i(T::I64, -(1ll << 40))})},
      {"t.arr.f64", arr(T::F64, {f(T::F64, 1e-300), f(T::F64, 2.5)})},
      {"t.arr.empty", arr(T::I32, {})},
      {"t.arr.nested", arr(T::ARRAY, {arr(T::I32, {i(T::I32, 1), i(T::I32, 2)}), arr(T::I32, {}),
                                      arr(T::I32, {i(T::I32, 3)})})},
      {"t.arr.nested.str", arr(T::ARRAY, {arr(T::STRING, {s("x"), s("yz")}),
                                          arr(T::STRING, {s("")})})},
      {"t.arr.nested3", arr(T::ARRAY, {arr(T::ARRAY, {arr(T::F64, {f(T::F64, 1.0)})})})},
  };
  return kv;
}

struct TensorSpec {
  std::string name;
  GgmlType type;
  std::vector<int64_t> ne;
};

std::vector<uint8_t> random_tensor_bytes(const TensorSpec& t, std::mt19937& rng) {
  int64_t n = 1;
  for (auto d : t.ne) n *= d;
  std::normal_distribution<float> nd;
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = nd(rng);
  std::vector<uint8_t> bytes(ggml_row_size(t.type, t.ne[0]) * static_cast<size_t>(n / t.ne[0]));
  quantize_row(t.type, x.data(), bytes.data(), n);  // rows are contiguous: one long row
  return bytes;
}

const std::vector<TensorSpec>& tensor_specs() {
  static const std::vector<TensorSpec> specs = {
      {"token_embd.weight", GgmlType::Q4_K, {256, 3}},
      {"blk.0.attn_q.weight", GgmlType::Q8_0, {64, 5}},
      {"blk.0.attn_norm.weight", GgmlType::F32, {7}},
      {"blk.0.ffn_down.weight", GgmlType::Q6_K, {512, 2}},
      {"blk.0.x3", GgmlType::F16, {3, 2, 2}},
      {"blk.0.x4", GgmlType::BF16, {2, 3, 1, 2}},
      {"blk.0.q4_0", GgmlType::Q4_0, {32, 1, 1, 1}},
      {"blk.0.q5_1", GgmlType::Q5_1, {96, 2}},
      {"blk.0.q4_1", GgmlType::Q4_1, {32, 3}},
      {"blk.0.q5_0", GgmlType::Q5_0, {64}},
      {"blk.0.q5_K", GgmlType::Q5_K, {256}},
  };
  return specs;
}

class GgufRoundTrip : public ::testing::TestWithParam<uint32_t> {};

TEST_P(GgufRoundTrip, MetadataAndTensors) {
  const uint32_t alignment = GetParam();
  const std::string path = test::temp_dir("gguf_rt") + "/rt.gguf";
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set_u32("llama.block_count", 2);
  w.set_i32("t.setter.i32", -7);
  w.set_u64("t.setter.u64", 1ull << 50);
  w.set_f32("t.setter.f32", 1e-5f);
  w.set_bool("t.setter.bool", true);
  w.set_array_string("tokenizer.ggml.tokens", {"<s>", "</s>", "hello", ""});
  w.set_array_f32("tokenizer.ggml.scores", {0.0f, -1.5f, 2.25f, -0.0f});
  w.set_array_i32("tokenizer.ggml.token_type", {3, 3, 1, 1});
  for (const auto& [k, v] : all_values()) w.set_value(k, v);
  std::mt19937 rng(7);
  std::vector<std::vector<uint8_t>> datas;
  for (const auto& t : tensor_specs()) {
    datas.push_back(random_tensor_bytes(t, rng));
    w.add_tensor(t.name, t.type, t.ne, datas.back().data(), datas.back().size());
  }
  w.write(path, alignment);

  auto g = GgufFile::open(path);
  EXPECT_EQ(g->path(), path);
  EXPECT_EQ(g->version(), 3u);
  EXPECT_EQ(g->alignment(), alignment);
  const size_t n_expected = 9 + all_values().size() + (alignment != 32 ? 1 : 0);
  EXPECT_EQ(g->metadata().size(), n_expected);
  for (const auto& [k, v] : all_values()) {
    const GgufValue* got = g->find(k);
    ASSERT_NE(got, nullptr) << k;
    expect_same(*got, v, k);
  }
  if (alignment != 32) {
    EXPECT_EQ(g->get_int("general.alignment"), alignment);
  }
  EXPECT_EQ(g->get_string("general.architecture"), "llama");
  EXPECT_EQ(g->get_int("llama.block_count"), 2);
  EXPECT_EQ(g->get_int("t.setter.i32"), -7);
  EXPECT_EQ(g->get_int("t.setter.u64"), int64_t{1} << 50);
  EXPECT_EQ(g->get_float("t.setter.f32"), static_cast<double>(1e-5f));
  EXPECT_TRUE(g->get_bool("t.setter.bool", false));
  const auto& toks = g->get_array("tokenizer.ggml.tokens");
  ASSERT_EQ(toks.values.size(), 4u);
  EXPECT_EQ(toks.elem_type, GgufValueType::STRING);
  EXPECT_EQ(toks.values[2].as_string(), "hello");
  EXPECT_EQ(g->get_array("tokenizer.ggml.scores").values[2].as_float(), 2.25);
  EXPECT_EQ(g->get_array("tokenizer.ggml.token_type").values[0].as_int(), 3);

  ASSERT_EQ(g->tensors().size(), tensor_specs().size());
  for (size_t k = 0; k < tensor_specs().size(); ++k) {
    const auto& spec = tensor_specs()[k];
    const GgufTensor& t = g->tensors()[k];  // file order is preserved
    EXPECT_EQ(t.name, spec.name);
    EXPECT_EQ(t.type, spec.type) << spec.name;
    EXPECT_EQ(t.ne, spec.ne) << spec.name;
    EXPECT_EQ(t.n_bytes, datas[k].size()) << spec.name;
    EXPECT_EQ(t.offset % alignment, 0u) << spec.name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % alignment, 0u) << spec.name;
    EXPECT_EQ(std::memcmp(t.data, datas[k].data(), t.n_bytes), 0) << spec.name;
    EXPECT_EQ(t.n_rows() * spec.ne[0], t.n_elements()) << spec.name;
    EXPECT_EQ(&g->tensor(spec.name), &t);
    EXPECT_EQ(g->find_tensor(spec.name), &t);
  }
  EXPECT_EQ(g->tensor("blk.0.x4").n_elements(), 12);
  EXPECT_EQ(g->tensor("blk.0.x4").n_rows(), 6);
  EXPECT_EQ(g->find_tensor("nope"), nullptr);
}

INSTANTIATE_TEST_SUITE_P(Alignments, GgufRoundTrip, ::testing::Values(32u, 64u, 1u, 4096u));

std::string write_small(const std::string& tag, const std::function<void(GgufWriter&)>& fill) {
  const std::string path = test::temp_dir(tag) + "/f.gguf";
  GgufWriter w;
  fill(w);
  w.write(path);
  return path;
}

TEST(GgufRead, NoTensorsAndNoMetadata) {
  const std::string p = write_small("gguf_empty", [](GgufWriter&) {});
  auto g = GgufFile::open(p);
  EXPECT_TRUE(g->metadata().empty());
  EXPECT_TRUE(g->tensors().empty());
  EXPECT_EQ(g->file_size(), 24u);
}

TEST(GgufRead, Version2IsAccepted) {
  const std::string p = write_small("gguf_v2", [](GgufWriter& w) {
    w.set_string("general.name", "v2");
    const float x[32] = {1.0f};
    w.add_tensor("t", GgmlType::F32, {32}, x, sizeof x);
  });
  std::fstream io(p, std::ios::in | std::ios::out | std::ios::binary);
  io.seekp(4);
  const uint32_t v2 = 2;
  io.write(reinterpret_cast<const char*>(&v2), 4);
  io.close();
  auto g = GgufFile::open(p);
  EXPECT_EQ(g->version(), 2u);
  EXPECT_EQ(g->get_string("general.name"), "v2");
  float y = 0;
  dequantize_row(g->tensor("t").type, g->tensor("t").data, &y, 1);
  EXPECT_EQ(y, 1.0f);
}

TEST(GgufRead, GettersCheckTypesAndNameTheKey) {
  const std::string p = write_small("gguf_getters", [](GgufWriter& w) {
    w.set_u32("a.u32", 5);
    w.set_value("a.u64.big", {GgufValueType::U64, std::numeric_limits<uint64_t>::max()});
    w.set_string("a.str", "x");
    w.set_f32("a.f32", 0.5f);
    w.set_bool("a.bool", false);
    w.set_array_i32("a.arr", {1, 2});
  });
  auto g = GgufFile::open(p);
  EXPECT_EQ(g->get_int("a.u32"), 5);
  EXPECT_EQ(g->get_float("a.u32"), 5.0);  // integers read as floats
  EXPECT_EQ(g->get_float("a.f32"), 0.5);
  EXPECT_FALSE(g->get_bool("a.bool", true));
  EXPECT_EQ(g->get_int("missing", 42), 42);
  EXPECT_EQ(g->get_float("missing", 2.5), 2.5);
  EXPECT_EQ(g->get_string("missing", "dflt"), "dflt");
  EXPECT_TRUE(g->get_bool("missing", true));
  EXPECT_EQ(g->get_int("a.u32", 9), 5);
  EXPECT_EQ(g->get_string("a.str", "d"), "x");

  auto expect_err = [&](auto fn, const std::string& sub) {
    try {
      fn();
      ADD_FAILURE() << "expected an error containing '" << sub << "'";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.rfind(p, 0), 0u) << m;
      EXPECT_TRUE(contains(m, sub)) << m;
    }
  };
  expect_err([&] { g->get_int("nope"); }, "missing metadata key 'nope'");
  expect_err([&] { g->get_string("nope"); }, "missing metadata key 'nope'");
  expect_err([&] { g->get_array("nope"); }, "missing metadata key 'nope'");
  expect_err([&] { g->get_float("nope"); }, "missing metadata key 'nope'");
  expect_err([&] { g->get_int("a.str"); }, "'a.str'");
  expect_err([&] { g->get_int("a.str"); }, "not an integer");
  expect_err([&] { g->get_int("a.u64.big"); }, "does not fit");
  expect_err([&] { g->get_string("a.u32"); }, "not a string");
  expect_err([&] { g->get_array("a.u32"); }, "not an array");
  expect_err([&] { g->get_float("a.str"); }, "not a number");
  expect_err([&] { g->get_bool("a.u32", false); }, "not a bool");
  expect_err([&] { g->get_int("a.str", 1); }, "not an integer");  // present, wrong type
  expect_err([&] { g->tensor("w"); }, "missing tensor 'w'");
}

TEST(GgufRead, ToString) {
  using T = GgufValueType;
  EXPECT_EQ(u(T::U32, 7).to_string(), "7");
  EXPECT_EQ(i(T::I8, -3).to_string(), "-3");
  EXPECT_EQ(f(T::F32, 0.5).to_string(), "0.5");
  EXPECT_EQ(GgufValue({T::BOOL, true}).to_string(), "true");
  EXPECT_EQ(s("a\"b\n").to_string(), "\"a\\\"b\\n\"");
  EXPECT_EQ(arr(T::I32, {i(T::I32, 1), i(T::I32, 2)}).to_string(), "[1, 2]");
  std::vector<GgufValue> many;
  for (int k = 0; k < 20; ++k) many.push_back(i(T::I32, k));
  const std::string m = arr(T::I32, many).to_string(3);
  EXPECT_EQ(m, "[0, 1, 2, ... (20 i32)]");
  EXPECT_EQ(s(std::string(1000, 'x')).to_string().size(), 205u);  // quotes + 200 chars + "..."
}

TEST(GgufWriterChecks, RejectsBadArguments) {
  GgufWriter w;
  w.set_u32("k", 1);
  EXPECT_THROW(w.set_u32("k", 2), Error);  // duplicate key
  EXPECT_THROW(w.set_value("u8", {GgufValueType::U8, uint64_t{256}}), Error);
  EXPECT_THROW(w.set_value("i16", {GgufValueType::I16, int64_t{40000}}), Error);
  EXPECT_THROW(w.set_value("wrongalt", {GgufValueType::U32, int64_t{1}}), Error);
  EXPECT_THROW(w.set_value("mixed", arr(GgufValueType::I32, {i(GgufValueType::I32, 1), s("x")})), Error);
  const float x[64] = {};
  w.add_tensor("t", GgmlType::F32, {64}, x, sizeof x);
  EXPECT_THROW(w.add_tensor("t", GgmlType::F32, {64}, x, sizeof x), Error);           // duplicate
  EXPECT_THROW(w.add_tensor("b", GgmlType::F32, {32}, x, sizeof x), Error);           // wrong size
  EXPECT_THROW(w.add_tensor("c", GgmlType::F32, {1, 1, 1, 1, 64}, x, sizeof x), Error);  // 5 dims
  EXPECT_THROW(w.add_tensor("d", GgmlType::F32, {}, x, 0), Error);                   // 0 dims
  EXPECT_THROW(w.add_tensor("e", GgmlType::F32, {0}, x, 0), Error);                  // empty dim
  EXPECT_THROW(w.add_tensor("f", GgmlType::Q4_0, {16}, x, 9), Error);                // partial block
  const std::string dir = test::temp_dir("gguf_wchk");
  EXPECT_THROW(w.write(dir + "/a.gguf", 48), Error);  // not a power of two
  try {
    w.write(dir + "/no/such/dir/a.gguf");
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), dir + "/no/such/dir/a.gguf")) << e.what();
  }
  GgufWriter w2;
  w2.set_u32("general.alignment", 64);
  EXPECT_THROW(w2.write(dir + "/b.gguf", 32), Error);  // key disagrees with the argument
  w2.write(dir + "/b.gguf", 64);
  EXPECT_EQ(GgufFile::open(dir + "/b.gguf")->alignment(), 64u);
}

// Known-but-unsupported tensor types are listed; using them fails with the type's name.
TEST(GgufRead, KnownUnsupportedTypesAreListed) {
  const std::string p = write_small("gguf_unsup", [](GgufWriter& w) {
    std::vector<uint8_t> q2(66, 0);
    w.add_tensor("q2", GgmlType::IQ2_XXS, {256}, q2.data(), q2.size());
    const int32_t ids[4] = {1, 2, 3, 4};
    w.add_tensor("ids", GgmlType::I32, {4}, ids, sizeof ids);
  });
  auto g = GgufFile::open(p);
  ASSERT_EQ(g->tensors().size(), 2u);
  EXPECT_EQ(g->tensor("q2").type, GgmlType::IQ2_XXS);
  EXPECT_EQ(g->tensor("q2").n_bytes, 66u);
  EXPECT_FALSE(ggml_traits(g->tensor("q2").type).supported);
  EXPECT_EQ(g->tensor("ids").type, GgmlType::I32);
  std::vector<float> y(256);
  try {
    dequantize_row(g->tensor("q2").type, g->tensor("q2").data, y.data(), 256);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "iq2_xxs")) << e.what();
  }
}

}  // namespace
}  // namespace kvtrim
