// Bad GGUF input: each validation of GgufFile::open gets a test built by writing a small
// valid file with GgufWriter and corrupting or truncating its bytes; plus a truncation
// sweep over every byte offset and a seeded random-corruption fuzz. Every case must throw
// kvtrim::Error whose message starts with the file path and names the problem.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
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

using Bytes = std::vector<uint8_t>;

Bytes read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

void write_all(const std::string& path, const Bytes& b, size_t n) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(n));
}

template <typename T>
void put(Bytes& b, size_t pos, T v) {
  ASSERT_LE(pos + sizeof(T), b.size());
  std::memcpy(b.data() + pos, &v, sizeof(T));
}

// Position just after the length-prefixed string s (unique in the file).
size_t after_string(const Bytes& b, const std::string& s) {
  const uint64_t n = s.size();
  Bytes pat(reinterpret_cast<const uint8_t*>(&n), reinterpret_cast<const uint8_t*>(&n) + 8);
  pat.insert(pat.end(), s.begin(), s.end());
  size_t found = SIZE_MAX;
  for (size_t i = 0; i + pat.size() <= b.size(); ++i) {
    if (std::memcmp(b.data() + i, pat.data(), pat.size()) == 0) {
      EXPECT_EQ(found, SIZE_MAX) << "string '" << s << "' occurs twice";
      found = i + pat.size();
    }
  }
  EXPECT_NE(found, SIZE_MAX) << "string '" << s << "' not found";
  return found;
}

class GgufCorrupt : public ::testing::Test {
 protected:
  // tensor.a: q4_0 [64, 2] (144 bytes, padded to 160); tensor.b: f32 [8] (32 bytes, last,
  // so the file ends exactly at its last data byte and every truncation loses data).
  void SetUp() override {
    dir_ = test::temp_dir("gguf_corrupt");
    const std::string p = dir_ + "/valid.gguf";
    GgufWriter w;
    w.set_string("general.architecture", "llama");
    w.set_u32("test.ka", 7);
    w.set_u32("test.kb", 8);
    w.set_array_i32("test.arr", {1, 2, 3});
    w.set_bool("test.flag", true);
    GgufArray inner1{GgufValueType::I32, {{GgufValueType::I32, int64_t{1}}}};
    GgufArray inner2{GgufValueType::I32, {{GgufValueType::I32, int64_t{2}}, {GgufValueType::I32, int64_t{3}}}};
    w.set_value("test.nest", {GgufValueType::ARRAY, GgufArray{GgufValueType::ARRAY,
                                                              {{GgufValueType::ARRAY, inner1},
                                                               {GgufValueType::ARRAY, inner2}}}});
    std::vector<float> xa(128), xb(8);
    for (size_t k = 0; k < xa.size(); ++k) xa[k] = static_cast<float>(k % 13) - 6.0f;
    for (size_t k = 0; k < xb.size(); ++k) xb[k] = static_cast<float>(k);
    Bytes qa(ggml_row_size(GgmlType::Q4_0, 128));
    quantize_row(GgmlType::Q4_0, xa.data(), qa.data(), 128);
    w.add_tensor("tensor.a", GgmlType::Q4_0, {64, 2}, qa.data(), qa.size());
    w.add_tensor("tensor.b", GgmlType::F32, {8}, xb.data(), xb.size() * 4);
    w.write(p);
    valid_ = read_all(p);
    ASSERT_NO_THROW(GgufFile::open(p));
    ta_ = after_string(valid_, "tensor.a");
    tb_ = after_string(valid_, "tensor.b");
    ASSERT_EQ(valid_.size() % 32, 0u);
  }

  // Writes `b` (first n bytes) and expects open() to fail with a message that starts with
  // the path and contains each of `subs`.
  void expect_error(const Bytes& b, std::initializer_list<std::string> subs, size_t n = SIZE_MAX) {
    const std::string p = dir_ + "/bad.gguf";
    write_all(p, b, std::min(n, b.size()));
    try {
      GgufFile::open(p);
      ADD_FAILURE() << "open succeeded; expected an error containing '" << *subs.begin() << "'";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.rfind(p + ": ", 0), 0u) << "message does not start with the path: " << m;
      for (const auto& s : subs) EXPECT_NE(m.find(s), std::string::npos) << "'" << s << "' not in: " << m;
    }
  }

  // Offsets of tensor-table fields (n_dims = 1 or 2 as written).
  size_t tensor_type_pos(size_t after_name, uint32_t n_dims) const { return after_name + 4 + 8 * n_dims; }
  size_t tensor_offset_pos(size_t after_name, uint32_t n_dims) const { return after_name + 8 + 8 * n_dims; }

  std::string dir_;
  Bytes valid_;
  size_t ta_ = 0, tb_ = 0;  // just after the names "tensor.a" / "tensor.b" in the table
};

// ---- header -----------------------------------------------------------------------------

TEST_F(GgufCorrupt, WrongMagic) {
  Bytes b = valid_;
  b[0] = 'X';
  expect_error(b, {"not a GGUF file", "magic"});
}

TEST_F(GgufCorrupt, Version1Rejected) {
  Bytes b = valid_;
  put<uint32_t>(b, 4, 1);
  expect_error(b, {"unsupported GGUF version 1"});
}

TEST_F(GgufCorrupt, VersionAbove3Rejected) {
  Bytes b = valid_;
  put<uint32_t>(b, 4, 4);
  expect_error(b, {"unsupported GGUF version 4"});
  put<uint32_t>(b, 4, 0xffffffffu);
  expect_error(b, {"unsupported GGUF version 4294967295"});
}

TEST_F(GgufCorrupt, BigEndianNamed) {
  Bytes b = valid_;
  put<uint32_t>(b, 4, 0x03000000u);
  expect_error(b, {"big-endian"});
}

TEST_F(GgufCorrupt, TruncatedHeader) {
  expect_error(valid_, {"truncated", "empty"}, 0);
  expect_error(valid_, {"truncated", "magic"}, 3);
  expect_error(valid_, {"truncated", "version"}, 6);
  expect_error(valid_, {"truncated", "tensor count"}, 12);
  expect_error(valid_, {"truncated", "metadata count"}, 20);
}

TEST_F(GgufCorrupt, AbsurdCounts) {
  Bytes b = valid_;
  put<uint64_t>(b, 8, uint64_t{1} << 60);
  expect_error(b, {"tensor count 1152921504606846976"});
  b = valid_;
  put<uint64_t>(b, 8, 1000);  // more tensors than the remaining bytes could describe
  expect_error(b, {"tensor count 1000"});
  b = valid_;
  put<uint64_t>(b, 16, ~uint64_t{0});
  expect_error(b, {"metadata count 18446744073709551615"});
  b = valid_;
  put<uint64_t>(b, 16, 7);  // passes the count check; entry #6 is read from the tensor table
  expect_error(b, {""});
}

// ---- metadata ---------------------------------------------------------------------------

TEST_F(GgufCorrupt, TruncatedMetadata) {
  // Cut early, the up-front count check already fails, naming the possible truncation.
  expect_error(valid_, {"metadata count 6", "truncated"}, 40);
  // With n_tensors = 0 the count check passes and the cut is found while reading.
  Bytes b = valid_;
  put<uint64_t>(b, 8, 0);
  const size_t arr_data = after_string(valid_, "test.arr") + 16;  // type, elem type, count
  expect_error(b, {"truncated", "metadata key 'test.arr'"}, arr_data + 5);
  expect_error(b, {"truncated", "metadata key 'test.arr' (array length)"}, arr_data - 3);
  const size_t entry3 = after_string(valid_, "test.kb") + 4 + 4;
  expect_error(b, {"truncated", "metadata entry #3 key"}, entry3 + 3);
  expect_error(b, {"truncated", "metadata entry #3 key", "string length"}, entry3 + 8 + 2);
}

TEST_F(GgufCorrupt, HugeStringLength) {
  Bytes b = valid_;
  put<uint64_t>(b, 24, uint64_t{1} << 62);  // length of the first key
  expect_error(b, {"string length 4611686018427387904", "exceeds"});
  b = valid_;
  put<uint64_t>(b, after_string(valid_, "general.architecture") + 4, ~uint64_t{0});  // value length
  expect_error(b, {"general.architecture", "string length 18446744073709551615"});
  b = valid_;
  put<uint64_t>(b, ta_ - 8 - 8, uint64_t{1} << 40);  // tensor name length
  expect_error(b, {"tensor #0 name", "string length"});
}

TEST_F(GgufCorrupt, HugeArrayCount) {
  const size_t count_pos = after_string(valid_, "test.arr") + 8;
  Bytes b = valid_;
  put<uint64_t>(b, count_pos, uint64_t{1} << 40);
  expect_error(b, {"test.arr", "array of 1099511627776 i32 elements cannot fit"});
  b = valid_;
  put<uint64_t>(b, count_pos, ~uint64_t{0});
  expect_error(b, {"test.arr", "cannot fit"});
  // nested: the inner array's count
  const size_t inner_count = after_string(valid_, "test.nest") + 4 + 4 + 8 + 4;
  b = valid_;
  put<uint64_t>(b, inner_count, uint64_t{1} << 50);
  expect_error(b, {"test.nest", "cannot fit"});
}

TEST_F(GgufCorrupt, ArrayElementBudget) {
  // 2^24 + 1 u8 elements really present: the total-elements cap stops it before parsing.
  Bytes b;
  auto app = [&b](const void* p, size_t n) { b.insert(b.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n); };
  const uint32_t magic = 0x46554747, version = 3, t_arr = 9, t_u8 = 0;
  const uint64_t n_tensors = 0, n_kv = 1, klen = 3, count = (uint64_t{1} << 24) + 1;
  app(&magic, 4);
  app(&version, 4);
  app(&n_tensors, 8);
  app(&n_kv, 8);
  app(&klen, 8);
  app("big", 3);
  app(&t_arr, 4);
  app(&t_u8, 4);
  app(&count, 8);
  b.resize(b.size() + count, 0);
  expect_error(b, {"'big'", "more than 16777216 elements"});
}

TEST_F(GgufCorrupt, UnknownValueType) {
  Bytes b = valid_;
  put<uint32_t>(b, after_string(valid_, "test.ka"), 13);
  expect_error(b, {"metadata key 'test.ka' has unknown value type 13"});
}

TEST_F(GgufCorrupt, UnknownArrayElementType) {
  Bytes b = valid_;
  put<uint32_t>(b, after_string(valid_, "test.arr") + 4, 99);
  expect_error(b, {"test.arr", "unknown array element type 99"});
}

TEST_F(GgufCorrupt, BoolNotZeroOrOne) {
  Bytes b = valid_;
  b[after_string(valid_, "test.flag") + 4] = 2;
  expect_error(b, {"test.flag", "bool value 2"});
}

TEST_F(GgufCorrupt, DuplicateKey) {
  Bytes b = valid_;
  b[after_string(valid_, "test.kb") - 1] = 'a';  // "test.kb" -> "test.ka"
  expect_error(b, {"duplicate metadata key 'test.ka'"});
}

TEST_F(GgufCorrupt, NestingTooDeep) {
  GgufValue v{GgufValueType::I32, int64_t{1}};
  for (int d = 0; d < 12; ++d) v = GgufValue{GgufValueType::ARRAY, GgufArray{v.type, {v}}};
  GgufWriter w;
  w.set_value("deep", v);
  const std::string p = dir_ + "/deep.gguf";
  w.write(p);
  expect_error(read_all(p), {"'deep'", "nested deeper"});
}

TEST_F(GgufCorrupt, AlignmentChecks) {
  GgufWriter w;
  w.set_string("general.name", "x");
  const float x[8] = {};
  w.add_tensor("t", GgmlType::F32, {8}, x, sizeof x);
  const std::string p = dir_ + "/al.gguf";
  w.write(p, 64);
  const Bytes good = read_all(p);
  ASSERT_EQ(GgufFile::open(p)->alignment(), 64u);
  const size_t val = after_string(good, "general.alignment") + 4;
  Bytes b = good;
  put<uint32_t>(b, val, 48);
  expect_error(b, {"general.alignment = 48 is not a power of two"});
  put<uint32_t>(b, val, 0);
  expect_error(b, {"general.alignment = 0 is not a power of two"});
  b = good;
  put<uint32_t>(b, val - 4, 5);  // u32 -> i32
  expect_error(b, {"general.alignment must be u32, not i32"});
  b = good;
  put<uint32_t>(b, val, 1u << 31);  // a valid power of two pushing the data section out
  expect_error(b, {"data section starts at offset"});
}

// ---- tensor table -----------------------------------------------------------------------

TEST_F(GgufCorrupt, TruncatedTensorTable) {
  expect_error(valid_, {"truncated", "tensor 'tensor.b'"}, tb_ + 6);
  expect_error(valid_, {"truncated", "tensor 'tensor.a' (dims)"}, ta_ + 4 + 3);
  expect_error(valid_, {"truncated", "tensor #1 name"}, tb_ - 10);
}

TEST_F(GgufCorrupt, UnknownTensorTypeNamesTensorAndId) {
  Bytes b = valid_;
  put<uint32_t>(b, tensor_type_pos(ta_, 2), 99);
  expect_error(b, {"tensor 'tensor.a' has unknown type id 99"});
  put<uint32_t>(b, tensor_type_pos(ta_, 2), 4);  // id 4 (removed q4_2): unknown too
  expect_error(b, {"tensor 'tensor.a' has unknown type id 4"});
}

TEST_F(GgufCorrupt, NDims) {
  Bytes b = valid_;
  put<uint32_t>(b, tb_, 5);
  expect_error(b, {"tensor 'tensor.b' has n_dims = 5"});
  put<uint32_t>(b, tb_, 0);
  expect_error(b, {"tensor 'tensor.b' has n_dims = 0"});
  put<uint32_t>(b, tb_, 0xffffffffu);
  expect_error(b, {"n_dims = 4294967295"});
}

TEST_F(GgufCorrupt, NonPositiveDims) {
  Bytes b = valid_;
  put<int64_t>(b, tb_ + 4, 0);
  expect_error(b, {"tensor 'tensor.b' has dim 0 = 0"});
  put<int64_t>(b, tb_ + 4, -8);
  expect_error(b, {"tensor 'tensor.b' has dim 0 = -8"});
  b = valid_;
  put<int64_t>(b, ta_ + 4 + 8, -1);
  expect_error(b, {"tensor 'tensor.a' has dim 1 = -1"});
}

TEST_F(GgufCorrupt, ElementCountOverflow) {
  Bytes b = valid_;
  put<int64_t>(b, ta_ + 4 + 8, int64_t{1} << 62);  // 64 * 2^62 overflows int64
  expect_error(b, {"tensor 'tensor.a'", "overflow"});
  b = valid_;
  put<int64_t>(b, ta_ + 4 + 8, int64_t{1} << 56);  // 2^62 elements: fits, far out of bounds
  expect_error(b, {"tensor 'tensor.a'", "out of the file's bounds"});
}

TEST_F(GgufCorrupt, RowNotMultipleOfBlockSize) {
  Bytes b = valid_;
  put<int64_t>(b, ta_ + 4, 48);
  expect_error(b, {"tensor 'tensor.a' (q4_0): row length 48 is not a multiple of the block size 32"});
}

TEST_F(GgufCorrupt, DataOutOfBounds) {
  Bytes b = valid_;
  put<uint64_t>(b, tensor_offset_pos(tb_, 1), 1u << 20);
  expect_error(b, {"tensor 'tensor.b'", "out of the file's bounds"});
  put<uint64_t>(b, tensor_offset_pos(tb_, 1), ~uint64_t{31});  // aligned, near 2^64: no wrap
  expect_error(b, {"tensor 'tensor.b'", "out of the file's bounds"});
  put<uint64_t>(b, tensor_offset_pos(tb_, 1), 160 + 32);  // one tensor-size past the end
  expect_error(b, {"tensor 'tensor.b'", "out of the file's bounds"});
  b = valid_;
  put<int64_t>(b, tb_ + 4, 16);  // tensor.b grows to 64 bytes; only 32 are there
  expect_error(b, {"tensor 'tensor.b'", "out of the file's bounds"});
}

TEST_F(GgufCorrupt, MisalignedOffset) {
  Bytes b = valid_;
  put<uint64_t>(b, tensor_offset_pos(tb_, 1), 160 + 4);
  expect_error(b, {"tensor 'tensor.b': data offset 164 is not a multiple of the alignment 32"});
}

TEST_F(GgufCorrupt, DuplicateTensorName) {
  Bytes b = valid_;
  b[tb_ - 1] = 'a';  // "tensor.b" -> "tensor.a"
  expect_error(b, {"duplicate tensor name 'tensor.a'"});
}

TEST_F(GgufCorrupt, FileProblems) {
  try {
    GgufFile::open(dir_ + "/missing.gguf");
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(dir_ + "/missing.gguf: cannot open", 0), 0u) << e.what();
  }
  try {
    GgufFile::open(dir_);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
  }
  const std::string fifo = dir_ + "/fifo.gguf";  // must fail, not wait for a writer
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  try {
    GgufFile::open(fifo);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
  }
}

// ---- sweeps -----------------------------------------------------------------------------

TEST_F(GgufCorrupt, TruncationAtEveryOffsetThrows) {
  const std::string p = dir_ + "/trunc.gguf";
  for (size_t n = 0; n < valid_.size(); ++n) {
    write_all(p, valid_, n);
    try {
      GgufFile::open(p);
      ADD_FAILURE() << "truncation to " << n << " of " << valid_.size() << " bytes was accepted";
    } catch (const Error& e) {
      ASSERT_EQ(std::string(e.what()).rfind(p + ": ", 0), 0u) << e.what();
    }
  }
  write_all(p, valid_, valid_.size());
  EXPECT_NO_THROW(GgufFile::open(p));
}

// Random byte corruption of the header, metadata and tensor table: open() either throws
// kvtrim::Error or returns a file whose tensors all lie inside it (read them all).
TEST_F(GgufCorrupt, RandomCorruptionNeverCrashes) {
  const std::string p = dir_ + "/fuzz.gguf";
  const size_t meta_end = tb_ + 4 + 8 + 4 + 8;
  std::mt19937 rng(2024);
  constexpr int kIters = 1000;
  int accepted = 0;
  for (int iter = 0; iter < kIters; ++iter) {
    Bytes b = valid_;
    const int n_flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < n_flips; ++k) {
      const size_t pos = rng() % meta_end;
      switch (rng() % 3) {
        case 0: b[pos] = static_cast<uint8_t>(rng()); break;
        case 1: b[pos] ^= static_cast<uint8_t>(1u << (rng() % 8)); break;
        default: b[pos] = (rng() % 2) ? 0xff : 0x00; break;
      }
    }
    write_all(p, b, b.size());
    try {
      auto g = GgufFile::open(p);
      ++accepted;
      for (const auto& t : g->tensors()) {
        ASSERT_NE(t.data, nullptr);
        uint64_t sum = 0;
        for (size_t k = 0; k < t.n_bytes; ++k) sum += t.data[k];  // ASan: must be mapped
        (void)sum;
        if (ggml_traits(t.type).supported && t.n_elements() <= 4096) {
          std::vector<float> y(static_cast<size_t>(t.n_elements()));
          dequantize_row(t.type, t.data, y.data(), t.n_elements());
        }
      }
    } catch (const Error&) {
    }
  }
  EXPECT_LT(accepted, kIters);  // the corruption did hit something
}

}  // namespace
}  // namespace kvtrim
