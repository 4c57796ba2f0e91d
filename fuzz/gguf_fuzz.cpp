// Fuzz target "gguf": the GGUF reader over arbitrary bytes (GgufFile::from_memory, the same
// parser as a mapped file), then what `kvtrim inspect` does with a file that opened: every
// metadata value printed, every typed getter, and the first row of every tensor dequantized
// (reads the tensor's bytes: any bounds mistake in the table shows up under ASan).
#include <algorithm>
#include <vector>

#include "core/ggml_type.h"
#include "fuzz_util.h"
#include "model/gguf.h"
#include "ops/dequant.h"

using namespace kvtrim;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<GgufFile> f;
  try {
    f = GgufFile::from_memory("fuzz.gguf", data, size);
  } catch (const Error& e) {
    fuzz::check_error_message(e);
    return 0;
  }
  KVTRIM_FUZZ_ASSERT(f->file_size() == size, "file_size %zu != %zu", f->file_size(), size);
  for (const auto& [key, v] : f->metadata()) {
    (void)v.to_string();
    try {
      (void)f->get_int(key, 0);
    } catch (const Error& e) {
      fuzz::check_error_message(e);
    }
    try {
      (void)f->get_float(key, 0.0);
    } catch (const Error& e) {
      fuzz::check_error_message(e);
    }
    try {
      (void)f->get_string(key, "");
    } catch (const Error& e) {
      fuzz::check_error_message(e);
    }
  }
  std::vector<float> row;
  for (const GgufTensor& t : f->tensors()) {
    KVTRIM_FUZZ_ASSERT(t.data != nullptr, "tensor '%s' has no data", t.name.c_str());
    const int64_t n = std::min<int64_t>(t.ne[0], 1 << 16);  // the first row (or its first 64k)
    const auto tr = ggml_type_traits(static_cast<uint32_t>(t.type));
    if (!tr || n % tr->block_size != 0) continue;
    row.assign(static_cast<size_t>(n), 0.f);
    try {
      dequantize_row(t.type, t.data, row.data(), n);
    } catch (const Error& e) {  // a known type without a dequantizer (q2_K, ...)
      fuzz::check_error_message(e);
    }
  }
  return 0;
}
