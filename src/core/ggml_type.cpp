#include "core/ggml_type.h"

#include "core/error.h"

namespace kvtrim {

namespace {
constexpr GgmlTypeTraits kTraits[] = {
    {GgmlType::F32, "f32", 1, 4, true},      {GgmlType::F16, "f16", 1, 2, true},
    {GgmlType::Q4_0, "q4_0", 32, 18, true},  {GgmlType::Q4_1, "q4_1", 32, 20, true},
    {GgmlType::Q5_0, "q5_0", 32, 22, true},  {GgmlType::Q5_1, "q5_1", 32, 24, true},
    {GgmlType::Q8_0, "q8_0", 32, 34, true},  {GgmlType::Q8_1, "q8_1", 32, 36, false},
    {GgmlType::Q2_K, "q2_K", 256, 84, true}, {GgmlType::Q3_K, "q3_K", 256, 110, true},
    {GgmlType::Q4_K, "q4_K", 256, 144, true}, {GgmlType::Q5_K, "q5_K", 256, 176, true},
    {GgmlType::Q6_K, "q6_K", 256, 210, true}, {GgmlType::Q8_K, "q8_K", 256, 292, false},
    {GgmlType::I8, "i8", 1, 1, false},       {GgmlType::I16, "i16", 1, 2, false},
    {GgmlType::I32, "i32", 1, 4, false},     {GgmlType::I64, "i64", 1, 8, false},
    {GgmlType::F64, "f64", 1, 8, false},     {GgmlType::BF16, "bf16", 1, 2, true},
    {GgmlType::IQ4_NL, "iq4_nl", 32, 18, true}, {GgmlType::IQ4_XS, "iq4_xs", 256, 136, true},
    // the other i-quants and ternary types: known geometry (a file with them opens and `kvtrim
    // inspect` lists them), no kernels
    {GgmlType::IQ2_XXS, "iq2_xxs", 256, 66, false}, {GgmlType::IQ2_XS, "iq2_xs", 256, 74, false},
    {GgmlType::IQ3_XXS, "iq3_xxs", 256, 98, false}, {GgmlType::IQ1_S, "iq1_s", 256, 50, false},
    {GgmlType::IQ3_S, "iq3_s", 256, 110, false},    {GgmlType::IQ2_S, "iq2_s", 256, 82, false},
    {GgmlType::IQ1_M, "iq1_m", 256, 56, false},     {GgmlType::TQ1_0, "tq1_0", 256, 54, false},
    {GgmlType::TQ2_0, "tq2_0", 256, 66, false},
};
}  // namespace

std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t id) {
  for (const auto& t : kTraits)
    if (static_cast<uint32_t>(t.type) == id) return t;
  return std::nullopt;
}

const GgmlTypeTraits& ggml_traits(GgmlType t) {
  for (const auto& tr : kTraits)
    if (tr.type == t) return tr;
  fail("unknown ggml type id %u", static_cast<unsigned>(t));
}

std::string_view ggml_type_name(GgmlType t) { return ggml_traits(t).name; }

size_t ggml_row_size(GgmlType t, int64_t n_elements) {
  const auto& tr = ggml_traits(t);
  KVTRIM_CHECK(n_elements % tr.block_size == 0, "row of %lld elements is not a multiple of the %s block size %lld",
               static_cast<long long>(n_elements), std::string(tr.name).c_str(),
               static_cast<long long>(tr.block_size));
  return static_cast<size_t>(n_elements / tr.block_size) * tr.type_size;
}

}  // namespace kvtrim
