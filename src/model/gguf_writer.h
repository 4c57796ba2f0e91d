// Writes GGUF v3 files: used by tests to build tiny random models and by tools that emit
// GGUF artefacts. Keys are written in insertion order; tensors are aligned to `alignment`.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/ggml_type.h"
#include "model/gguf.h"

namespace kvtrim {

class GgufWriter {
 public:
  void set_u32(const std::string& key, uint32_t v);
  void set_i32(const std::string& key, int32_t v);
  void set_u64(const std::string& key, uint64_t v);
  void set_f32(const std::string& key, float v);
  void set_bool(const std::string& key, bool v);
  void set_string(const std::string& key, const std::string& v);
  void set_array_string(const std::string& key, const std::vector<std::string>& v);
  void set_array_f32(const std::string& key, const std::vector<float>& v);
  void set_array_i32(const std::string& key, const std::vector<int32_t>& v);
  // Any value, including the types without a setter above and nested arrays. Integers are
  // held as uint64_t (U8..U64) / int64_t (I8..I64), floats as double; write() checks ranges.
  void set_value(const std::string& key, const GgufValue& v);
  // Tensor with dims ne (ne[0] contiguous); data must hold exactly the tensor's bytes.
  void add_tensor(const std::string& name, GgmlType type, const std::vector<int64_t>& ne,
                  const void* data, size_t n_bytes);
  void write(const std::string& path, uint32_t alignment = 32) const;
  // write() to <path>.tmp, then rename over path, so readers never see a half-written file.
  // Throws Error naming `what` and the path when the rename fails (the temporary is removed).
  void write_atomic(const std::string& path, const char* what) const;

 private:
  struct Kv { std::string key; GgufValue value; };
  struct Tensor { std::string name; GgmlType type; std::vector<int64_t> ne; std::vector<uint8_t> bytes; };
  std::vector<Kv> kvs_;
  std::vector<Tensor> tensors_;
};

}  // namespace kvtrim
