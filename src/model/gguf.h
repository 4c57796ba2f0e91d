// GGUF v2/v3 reader: the file is memory-mapped read-only; metadata is parsed into values,
// tensor data is used in place (pointers into the mapping, aligned per general.alignment).
// Every length and offset read from the file is bounds-checked against the file size
// before use, so a corrupt or truncated file yields a kvtrim::Error naming the problem.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/ggml_type.h"

namespace kvtrim {

// GGUF metadata value types, numbered as in the format.
enum class GgufValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};

// "u8", "string", "array", ... ("unknown" for a value outside the enum).
const char* gguf_value_type_name(GgufValueType t);

// general.alignment when a file does not set it (the format's default).
inline constexpr uint64_t kGgufDefaultAlignment = 32;

struct GgufValue;
struct GgufArray {
  GgufValueType elem_type;
  std::vector<GgufValue> values;  // homogeneous; nested arrays allowed
};
struct GgufValue {
  GgufValueType type;
  std::variant<uint64_t, int64_t, double, bool, std::string, GgufArray> v;
  // Typed access; throws Error on a type mismatch (integers convert if in range).
  int64_t as_int() const;
  double as_float() const;
  bool as_bool() const;
  const std::string& as_string() const;
  const GgufArray& as_array() const;
  std::string to_string(size_t max_elems = 8) const;  // for `kvtrim inspect`
};

struct GgufTensor {
  std::string name;
  GgmlType type;
  std::vector<int64_t> ne;  // dims, ne[0] is the contiguous (fastest) dimension
  uint64_t offset;          // relative to the start of the data section
  const uint8_t* data;      // into the mapping
  size_t n_bytes;
  int64_t n_elements() const;
  int64_t n_rows() const { return n_elements() / ne.at(0); }  // product of ne[1..]
};

class GgufFile {
 public:
  // Opens and validates the file. Throws Error for: missing file, wrong magic, unsupported
  // version, truncated header/metadata/tensor table, absurd counts or string lengths,
  // unknown tensor types, tensors out of the file's bounds or misaligned.
  static std::unique_ptr<GgufFile> open(const std::string& path);
  // The same checks over bytes in memory (copied into an owned, 64-byte aligned buffer);
  // `name` stands for the path in messages. For the fuzz targets and tests.
  static std::unique_ptr<GgufFile> from_memory(const std::string& name, const void* data, size_t size);
  ~GgufFile();

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  size_t file_size() const { return size_; }

  const std::map<std::string, GgufValue>& metadata() const { return kv_; }
  const GgufValue* find(std::string_view key) const;  // nullptr if absent
  // Required typed getters: throw Error "<path>: missing metadata key '<key>'" if absent.
  int64_t get_int(std::string_view key) const;
  double get_float(std::string_view key) const;
  const std::string& get_string(std::string_view key) const;
  const GgufArray& get_array(std::string_view key) const;
  // Optional getters with defaults.
  int64_t get_int(std::string_view key, int64_t def) const;
  double get_float(std::string_view key, double def) const;
  std::string get_string(std::string_view key, const std::string& def) const;
  bool get_bool(std::string_view key, bool def) const;

  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* find_tensor(std::string_view name) const;  // nullptr if absent
  const GgufTensor& tensor(std::string_view name) const;       // throws if absent

  // Tells the OS that the mapped bytes [p, p + n) (inside this file's mapping) will probably not
  // be read again: the whole pages inside the range leave the process's resident set (they are
  // read back from the page cache if they are). For weights of which Model keeps a packed copy.
  // No effect on a file read by from_memory, or outside the mapping.
  void release_pages(const void* p, size_t n) const;

 private:
  GgufFile() = default;
  void parse();  // reads the header, metadata and tensor table of map_[0, size_)
  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = kGgufDefaultAlignment;
  int fd_ = -1;
  void* map_ = nullptr;       // the file's mapping (open) ...
  void* owned_ = nullptr;     // ... or the copy from from_memory (std::free)
  size_t size_ = 0;
  std::map<std::string, GgufValue> kv_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace kvtrim
