// The GGUF reader and dequantize_row on the real models, against the independent reference
// in tests/data/dequant_refs.json (written by scripts/ref/make_dequant_refs.py with the
// `gguf` Python package): the same metadata keys / types / values, the same tensor table,
// and the same dequantized values and whole-tensor sums for every tensor type present.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "../common/test_util.h"
#include "core/error.h"
#include "model/gguf.h"
#include "ops/dequant.h"

namespace kvtrim {
namespace {

using nlohmann::json;

const json& refs() {
  static const json j = [] {
    const std::string p = test::data_dir() + "/dequant_refs.json";
    std::ifstream in(p);
    if (!in) throw Error(p + ": cannot open (run scripts/ref/make_dequant_refs.py)");
    return json::parse(in);
  }();
  return j;
}

const char* vt_name(GgufValueType t) {
  static const char* const kNames[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32",
                                       "bool", "string", "array", "u64", "i64", "f64"};
  const auto i = static_cast<size_t>(t);
  return i < std::size(kNames) ? kNames[i] : "?";
}

std::string hex_prefix(const std::string& s, size_t n) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < n; ++i) out += strprintf("%02x", static_cast<unsigned char>(s[i]));
  return out;
}

void expect_scalar(const GgufValue& v, const json& ref, const std::string& where) {
  switch (v.type) {
    case GgufValueType::STRING:
      EXPECT_EQ(v.as_string().size(), ref.at("len").get<size_t>()) << where;
      EXPECT_EQ(hex_prefix(v.as_string(), 32), ref.at("hex").get<std::string>()) << where;
      break;
    case GgufValueType::BOOL: EXPECT_EQ(v.as_bool(), ref.get<bool>()) << where; break;
    case GgufValueType::F32:
    case GgufValueType::F64: EXPECT_EQ(v.as_float(), ref.get<double>()) << where; break;
    case GgufValueType::U64: EXPECT_EQ(std::get<uint64_t>(v.v), ref.get<uint64_t>()) << where; break;
    default: EXPECT_EQ(v.as_int(), ref.get<int64_t>()) << where; break;
  }
}

class RealModel : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string path = test::require_model(GetParam());
    ASSERT_TRUE(refs().at("models").contains(GetParam()));
    ref_ = &refs().at("models").at(GetParam());
    file_ = GgufFile::open(path);
  }
  const json* ref_ = nullptr;
  std::unique_ptr<GgufFile> file_;
};

TEST_P(RealModel, MetadataMatchesReference) {
  const json& meta = ref_->at("metadata");
  EXPECT_EQ(file_->alignment(), ref_->at("alignment").get<uint64_t>());
  std::set<std::string> ours, theirs;
  for (const auto& [k, v] : file_->metadata()) ours.insert(k);
  for (const auto& [k, v] : meta.items()) theirs.insert(k);
  EXPECT_EQ(ours, theirs);
  for (const auto& [k, r] : meta.items()) {
    const GgufValue* v = file_->find(k);
    if (!v) continue;  // reported above
    ASSERT_EQ(vt_name(v->type), r.at("type").get<std::string>()) << k;
    if (v->type == GgufValueType::ARRAY) {
      const GgufArray& a = v->as_array();
      EXPECT_EQ(vt_name(a.elem_type), r.at("elem_type").get<std::string>()) << k;
      ASSERT_EQ(a.values.size(), r.at("len").get<size_t>()) << k;
      const json& first = r.at("first");
      for (size_t i = 0; i < first.size(); ++i) expect_scalar(a.values.at(i), first[i], k + "[" + std::to_string(i) + "]");
    } else {
      expect_scalar(*v, r.at("value"), k);
    }
  }
}

TEST_P(RealModel, TensorTableMatchesReference) {
  const json& tensors = ref_->at("tensors");
  ASSERT_EQ(file_->tensors().size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const GgufTensor& t = file_->tensors()[i];
    const json& r = tensors[i];
    EXPECT_EQ(t.name, r.at(0).get<std::string>()) << i;
    EXPECT_EQ(std::string(ggml_type_name(t.type)), r.at(1).get<std::string>()) << t.name;
    EXPECT_EQ(t.ne, r.at(2).get<std::vector<int64_t>>()) << t.name;
    EXPECT_EQ(t.n_bytes, ggml_row_size(t.type, t.ne[0]) * static_cast<size_t>(t.n_rows())) << t.name;
  }
}

TEST_P(RealModel, DequantizeMatchesReference) {
  const json& list = ref_->at("refs");
  ASSERT_FALSE(list.empty());
  std::set<std::string> types_seen;
  for (const json& r : list) {
    const std::string name = r.at("name").get<std::string>();
    SCOPED_TRACE(GetParam() + ": " + name);
    const GgufTensor& t = file_->tensor(name);
    ASSERT_EQ(std::string(ggml_type_name(t.type)), r.at("type").get<std::string>());
    types_seen.insert(r.at("type").get<std::string>());
    const int64_t ne0 = t.ne[0];
    const size_t row_bytes = ggml_row_size(t.type, ne0);
    std::vector<float> row(static_cast<size_t>(ne0));
    // Selected rows: the first N values, element by element.
    for (const json& rr : r.at("rows")) {
      const int64_t ir = rr.at("row").get<int64_t>();
      ASSERT_LT(ir, t.n_rows());
      dequantize_row(t.type, t.data + static_cast<size_t>(ir) * row_bytes, row.data(), ne0);
      const auto vals = rr.at("values").get<std::vector<double>>();
      double max_rel = 0;
      for (size_t i = 0; i < vals.size(); ++i) {
        const double diff = std::fabs(row[i] - vals[i]);
        max_rel = std::max(max_rel, diff / std::max(std::fabs(vals[i]), 1e-30));
        ASSERT_LE(diff, 1e-6 * std::fabs(vals[i]) + 1e-30) << "row " << ir << " element " << i;
      }
      EXPECT_LE(max_rel, 1e-6);
    }
    // Whole tensor: float64 sums.
    double sum = 0, sumsq = 0, sumabs = 0;
    for (int64_t ir = 0; ir < t.n_rows(); ++ir) {
      dequantize_row(t.type, t.data + static_cast<size_t>(ir) * row_bytes, row.data(), ne0);
      for (float v : row) {
        ASSERT_TRUE(std::isfinite(v)) << "row " << ir;
        sum += v;
        sumsq += double{v} * v;
        sumabs += std::fabs(double{v});
      }
    }
    const double ref_sumabs = r.at("sumabs").get<double>();
    EXPECT_NEAR(sumabs, ref_sumabs, 1e-9 * ref_sumabs);
    EXPECT_NEAR(sum, r.at("sum").get<double>(), 1e-9 * ref_sumabs);
    EXPECT_NEAR(sumsq, r.at("sumsq").get<double>(), 1e-9 * r.at("sumsq").get<double>());
  }
  // Every tensor type in the file is covered by the reference.
  std::set<std::string> types_in_file;
  for (const auto& t : file_->tensors()) types_in_file.insert(std::string(ggml_type_name(t.type)));
  EXPECT_EQ(types_seen, types_in_file);
}

INSTANTIATE_TEST_SUITE_P(Models, RealModel, ::testing::Values("smollm2", "qwen2.5-coder-1.5b", "gemma3-270m"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

}  // namespace
}  // namespace kvtrim
