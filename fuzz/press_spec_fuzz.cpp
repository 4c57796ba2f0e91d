// Fuzz target "press_spec": the press-string parser (`--press`, the server's kv_press field;
// grammar in src/press/press.h) over arbitrary text. A spec that parses is then used the way
// `kvtrim run` uses it, on a tiny model of the seeds (fuzz/corpus/model): prefill, compress,
// decode. Option values the parser accepts must be ones the press can run with (or that it
// refuses with an Error when it meets the model), never a fault.
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "engine/press_runner.h"
#include "engine/session.h"
#include "fuzz_util.h"
#include "model/model.h"
#include "press/press.h"

using namespace kvtrim;

namespace {

const std::vector<std::unique_ptr<Model>>& models() {
  static std::vector<std::unique_ptr<Model>> all = [] {
    std::vector<std::unique_ptr<Model>> v;
    for (const char* m : {"tiny_llama.gguf", "tiny_qwen2.gguf", "tiny_gemma3.gguf"})
      v.push_back(Model::load(std::string(KVTRIM_SOURCE_DIR) + "/fuzz/corpus/model/" + m));
    return v;
  }();
  return all;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)models();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 4096) return 0;  // press strings are short; keep each run fast
  const std::string spec(reinterpret_cast<const char*>(data), size);
  std::unique_ptr<Press> press;
  try {
    press = make_press(spec);
  } catch (const Error& e) {
    fuzz::check_error_message(e);
    return 0;
  }
  KVTRIM_FUZZ_ASSERT(press != nullptr, "make_press returned nothing for an accepted spec");
  const Model& m = *models()[size % models().size()];
  try {
    SessionParams sp;
    sp.n_ctx = 64;
    sp.n_threads = 1;
    sp.n_batch = 16;
    Session s(m, sp);
    s.set_press(std::move(press));
    std::vector<int32_t> prompt(40);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 7 + size) % 250);
    s.prefill(prompt);
    s.compress();
    for (int32_t t : {3, 5, 7}) s.decode(t);
  } catch (const Error& e) {
    fuzz::check_error_message(e);
  }
  return 0;
}
