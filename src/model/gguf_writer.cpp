// GGUF v3 writer (little-endian). Layout written:
//   "GGUF" | u32 version=3 | u64 n_tensors | u64 n_kv
//   n_kv x (string key | u32 value type | value)            strings: u64 length + bytes
//   n_tensors x (string name | u32 n_dims | n_dims x u64 ne | u32 type | u64 offset)
//   zero padding to `alignment` | tensor data, each tensor padded to `alignment` (as ggml).
// general.alignment (u32) is written when the alignment is not the default 32. Values are
// validated when they are set (type consistency, integer ranges), tensors when added
// (1..4 dims, each > 0, whole blocks per row, byte count), so write() only serialises.
#include "model/gguf_writer.h"

#include <filesystem>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>

#include "core/error.h"

namespace kvtrim {

namespace {

constexpr uint32_t kGgufVersion = 3;


// Checks that v holds the variant alternative its type calls for, with an in-range value.
void check_value(const std::string& key, const GgufValue& v) {
  const char* tn = gguf_value_type_name(v.type);
  auto unsigned_max = [&](uint64_t mx) {
    const auto* p = std::get_if<uint64_t>(&v.v);
    KVTRIM_CHECK(p, "GgufWriter: key '%s': %s value must be held as uint64_t", key.c_str(), tn);
    KVTRIM_CHECK(*p <= mx, "GgufWriter: key '%s': value %llu does not fit in %s", key.c_str(),
                 static_cast<unsigned long long>(*p), tn);
  };
  auto signed_range = [&](int64_t mn, int64_t mx) {
    const auto* p = std::get_if<int64_t>(&v.v);
    KVTRIM_CHECK(p, "GgufWriter: key '%s': %s value must be held as int64_t", key.c_str(), tn);
    KVTRIM_CHECK(*p >= mn && *p <= mx, "GgufWriter: key '%s': value %lld does not fit in %s", key.c_str(),
                 static_cast<long long>(*p), tn);
  };
  switch (v.type) {
    case GgufValueType::U8: return unsigned_max(std::numeric_limits<uint8_t>::max());
    case GgufValueType::U16: return unsigned_max(std::numeric_limits<uint16_t>::max());
    case GgufValueType::U32: return unsigned_max(std::numeric_limits<uint32_t>::max());
    case GgufValueType::U64: return unsigned_max(std::numeric_limits<uint64_t>::max());
    case GgufValueType::I8: return signed_range(INT8_MIN, INT8_MAX);
    case GgufValueType::I16: return signed_range(INT16_MIN, INT16_MAX);
    case GgufValueType::I32: return signed_range(INT32_MIN, INT32_MAX);
    case GgufValueType::I64: return signed_range(INT64_MIN, INT64_MAX);
    case GgufValueType::F32:
    case GgufValueType::F64:
      KVTRIM_CHECK(std::holds_alternative<double>(v.v), "GgufWriter: key '%s': %s value must be held as double",
                   key.c_str(), tn);
      return;
    case GgufValueType::BOOL:
      KVTRIM_CHECK(std::holds_alternative<bool>(v.v), "GgufWriter: key '%s': bool value must be held as bool",
                   key.c_str());
      return;
    case GgufValueType::STRING:
      KVTRIM_CHECK(std::holds_alternative<std::string>(v.v),
                   "GgufWriter: key '%s': string value must be held as std::string", key.c_str());
      return;
    case GgufValueType::ARRAY: {
      const auto* a = std::get_if<GgufArray>(&v.v);
      KVTRIM_CHECK(a, "GgufWriter: key '%s': array value must be held as GgufArray", key.c_str());
      for (const auto& e : a->values) {
        KVTRIM_CHECK(e.type == a->elem_type, "GgufWriter: key '%s': array of %s holds an element of type %s",
                     key.c_str(), gguf_value_type_name(a->elem_type), gguf_value_type_name(e.type));
        check_value(key, e);
      }
      return;
    }
  }
  fail("GgufWriter: key '%s': unknown value type %u", key.c_str(), static_cast<unsigned>(v.type));
}

// Buffered little-endian output to a FILE*, tracking the position for padding.
class Out {
 public:
  explicit Out(const std::string& path) : path_(path), f_(std::fopen(path.c_str(), "wb")) {
    if (!f_) fail("%s: cannot create file: %s", path.c_str(), std::strerror(errno));
  }
  ~Out() {
    if (f_) std::fclose(f_);
  }
  Out(const Out&) = delete;
  Out& operator=(const Out&) = delete;

  void bytes(const void* p, size_t n) {
    if (n == 0) return;
    if (std::fwrite(p, 1, n, f_) != n) fail("%s: write failed: %s", path_.c_str(), std::strerror(errno));
    pos_ += n;
  }
  template <typename T>
  void pod(T v) {
    bytes(&v, sizeof v);  // the format is little-endian, as are the hosts kvtrim targets
  }
  void str(const std::string& s) {
    pod<uint64_t>(s.size());
    bytes(s.data(), s.size());
  }
  void pad_to(uint64_t alignment) {
    static const uint8_t kZeros[256] = {};
    uint64_t n = (alignment - pos_ % alignment) % alignment;
    while (n > 0) {
      const size_t k = n < sizeof kZeros ? static_cast<size_t>(n) : sizeof kZeros;
      bytes(kZeros, k);
      n -= k;
    }
  }
  void close() {
    FILE* f = f_;
    f_ = nullptr;
    if (std::fclose(f) != 0) fail("%s: write failed on close: %s", path_.c_str(), std::strerror(errno));
  }

 private:
  std::string path_;
  FILE* f_;
  uint64_t pos_ = 0;
};

// The payload of a value (without its type tag).
void write_payload(Out& out, const GgufValue& v) {
  switch (v.type) {
    case GgufValueType::U8: return out.pod(static_cast<uint8_t>(std::get<uint64_t>(v.v)));
    case GgufValueType::U16: return out.pod(static_cast<uint16_t>(std::get<uint64_t>(v.v)));
    case GgufValueType::U32: return out.pod(static_cast<uint32_t>(std::get<uint64_t>(v.v)));
    case GgufValueType::U64: return out.pod(std::get<uint64_t>(v.v));
    case GgufValueType::I8: return out.pod(static_cast<int8_t>(std::get<int64_t>(v.v)));
    case GgufValueType::I16: return out.pod(static_cast<int16_t>(std::get<int64_t>(v.v)));
    case GgufValueType::I32: return out.pod(static_cast<int32_t>(std::get<int64_t>(v.v)));
    case GgufValueType::I64: return out.pod(std::get<int64_t>(v.v));
    case GgufValueType::F32: return out.pod(static_cast<float>(std::get<double>(v.v)));
    case GgufValueType::F64: return out.pod(std::get<double>(v.v));
    case GgufValueType::BOOL: return out.pod(static_cast<uint8_t>(std::get<bool>(v.v) ? 1 : 0));
    case GgufValueType::STRING: return out.str(std::get<std::string>(v.v));
    case GgufValueType::ARRAY: {
      const auto& a = std::get<GgufArray>(v.v);
      out.pod(static_cast<uint32_t>(a.elem_type));
      out.pod<uint64_t>(a.values.size());
      for (const auto& e : a.values) write_payload(out, e);
      return;
    }
  }
}

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

}  // namespace

void GgufWriter::set_value(const std::string& key, const GgufValue& v) {
  for (const auto& kv : kvs_)
    KVTRIM_CHECK(kv.key != key, "GgufWriter: duplicate metadata key '%s'", key.c_str());
  check_value(key, v);
  kvs_.push_back({key, v});
}

void GgufWriter::set_u32(const std::string& key, uint32_t v) {
  set_value(key, GgufValue{GgufValueType::U32, uint64_t{v}});
}
void GgufWriter::set_i32(const std::string& key, int32_t v) {
  set_value(key, GgufValue{GgufValueType::I32, int64_t{v}});
}
void GgufWriter::set_u64(const std::string& key, uint64_t v) { set_value(key, GgufValue{GgufValueType::U64, v}); }
void GgufWriter::set_f32(const std::string& key, float v) {
  set_value(key, GgufValue{GgufValueType::F32, static_cast<double>(v)});
}
void GgufWriter::set_bool(const std::string& key, bool v) { set_value(key, GgufValue{GgufValueType::BOOL, v}); }
void GgufWriter::set_string(const std::string& key, const std::string& v) {
  set_value(key, GgufValue{GgufValueType::STRING, v});
}

void GgufWriter::set_array_string(const std::string& key, const std::vector<std::string>& v) {
  GgufArray a{GgufValueType::STRING, {}};
  a.values.reserve(v.size());
  for (const auto& s : v) a.values.push_back(GgufValue{GgufValueType::STRING, s});
  set_value(key, GgufValue{GgufValueType::ARRAY, std::move(a)});
}
void GgufWriter::set_array_f32(const std::string& key, const std::vector<float>& v) {
  GgufArray a{GgufValueType::F32, {}};
  a.values.reserve(v.size());
  for (float x : v) a.values.push_back(GgufValue{GgufValueType::F32, static_cast<double>(x)});
  set_value(key, GgufValue{GgufValueType::ARRAY, std::move(a)});
}
void GgufWriter::set_array_i32(const std::string& key, const std::vector<int32_t>& v) {
  GgufArray a{GgufValueType::I32, {}};
  a.values.reserve(v.size());
  for (int32_t x : v) a.values.push_back(GgufValue{GgufValueType::I32, int64_t{x}});
  set_value(key, GgufValue{GgufValueType::ARRAY, std::move(a)});
}

void GgufWriter::add_tensor(const std::string& name, GgmlType type, const std::vector<int64_t>& ne,
                            const void* data, size_t n_bytes) {
  for (const auto& t : tensors_)
    KVTRIM_CHECK(t.name != name, "GgufWriter: duplicate tensor name '%s'", name.c_str());
  KVTRIM_CHECK(!ne.empty() && ne.size() <= 4, "GgufWriter: tensor '%s' has %zu dims (1..4 allowed)", name.c_str(),
               ne.size());
  const auto tr = ggml_type_traits(static_cast<uint32_t>(type));
  KVTRIM_CHECK(tr.has_value(), "GgufWriter: tensor '%s' has unknown type id %u", name.c_str(),
               static_cast<unsigned>(type));
  int64_t n_rows = 1;
  for (size_t i = 0; i < ne.size(); ++i) {
    KVTRIM_CHECK(ne[i] > 0, "GgufWriter: tensor '%s' has dim %zu = %lld (must be > 0)", name.c_str(), i,
                 static_cast<long long>(ne[i]));
    if (i > 0)
      KVTRIM_CHECK(!__builtin_mul_overflow(n_rows, ne[i], &n_rows), "GgufWriter: tensor '%s' is too large",
                   name.c_str());
  }
  KVTRIM_CHECK(ne[0] % tr->block_size == 0,
               "GgufWriter: tensor '%s': row length %lld is not a multiple of the %s block size %lld",
               name.c_str(), static_cast<long long>(ne[0]), std::string(tr->name).c_str(),
               static_cast<long long>(tr->block_size));
  size_t expect = 0;
  KVTRIM_CHECK(!__builtin_mul_overflow(ggml_row_size(type, ne[0]), static_cast<size_t>(n_rows), &expect),
               "GgufWriter: tensor '%s' is too large", name.c_str());
  KVTRIM_CHECK(n_bytes == expect, "GgufWriter: tensor '%s' (%s) needs %zu bytes, got %zu", name.c_str(),
               std::string(tr->name).c_str(), expect, n_bytes);
  const auto* p = static_cast<const uint8_t*>(data);
  tensors_.push_back({name, type, ne, std::vector<uint8_t>(p, p + n_bytes)});
}

void GgufWriter::write(const std::string& path, uint32_t alignment) const {
  KVTRIM_CHECK(alignment > 0 && (alignment & (alignment - 1)) == 0,
               "%s: GGUF alignment %u is not a power of two", path.c_str(), alignment);
  bool has_alignment_key = false;
  for (const auto& kv : kvs_) {
    if (kv.key != "general.alignment") continue;
    has_alignment_key = true;
    KVTRIM_CHECK(kv.value.type == GgufValueType::U32 && std::get<uint64_t>(kv.value.v) == alignment,
                 "%s: metadata general.alignment disagrees with the alignment %u passed to write()", path.c_str(),
                 alignment);
  }
  const bool add_alignment_key = !has_alignment_key && alignment != kGgufDefaultAlignment;

  Out out(path);
  out.bytes("GGUF", 4);
  out.pod<uint32_t>(kGgufVersion);
  out.pod<uint64_t>(tensors_.size());
  out.pod<uint64_t>(kvs_.size() + (add_alignment_key ? 1 : 0));
  if (add_alignment_key) {
    out.str("general.alignment");
    out.pod(static_cast<uint32_t>(GgufValueType::U32));
    out.pod<uint32_t>(alignment);
  }
  for (const auto& kv : kvs_) {
    out.str(kv.key);
    out.pod(static_cast<uint32_t>(kv.value.type));
    write_payload(out, kv.value);
  }
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    out.str(t.name);
    out.pod<uint32_t>(static_cast<uint32_t>(t.ne.size()));
    for (int64_t d : t.ne) out.pod<uint64_t>(static_cast<uint64_t>(d));
    out.pod(static_cast<uint32_t>(t.type));
    out.pod<uint64_t>(offset);
    offset = align_up(offset + t.bytes.size(), alignment);
  }
  if (!tensors_.empty()) {
    out.pad_to(alignment);
    for (const auto& t : tensors_) {
      out.bytes(t.bytes.data(), t.bytes.size());
      out.pad_to(alignment);
    }
  }
  out.close();
}

void GgufWriter::write_atomic(const std::string& path, const char* what) const {
  const std::string tmp = path + ".tmp";
  write(tmp);
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    fail("cannot write %s '%s' (rename from '%s' failed)", what, path.c_str(), tmp.c_str());
  }
}

}  // namespace kvtrim
