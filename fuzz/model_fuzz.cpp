// Fuzz target "model": the model loader on top of the GGUF reader. Seeds are tiny models of
// every supported architecture (fuzz/corpus/model, written by fuzz_make_seeds); mutations hit
// the hyper-parameters, tensor table and tokenizer metadata. A model that loads must also
// tokenize, render its chat template and run a short forward pass without a fault: the
// loader's checks are what stands between a corrupt file and out-of-bounds reads there.
#include <vector>

#include "fuzz_util.h"
#include "kv/kv_cache.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/tokenizer.h"

using namespace kvtrim;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<Model> m;
  try {
    m = Model::load(GgufFile::from_memory("fuzz.gguf", data, size));
  } catch (const Error& e) {
    fuzz::check_error_message(e);
    return 0;
  }
  const HParams& hp = m->hparams();
  // Keep each run small: a mutated file may declare a large (but consistent) model.
  if (static_cast<int64_t>(hp.n_layer) * hp.n_embd * hp.n_vocab > (int64_t{1} << 26)) return 0;
  try {
    const Tokenizer& tok = m->tokenizer();
    std::vector<int32_t> ids = tok.encode("Hello, fuzz!", /*add_bos=*/true, /*parse_special=*/true);
    for (int32_t id : ids)
      KVTRIM_FUZZ_ASSERT(id >= 0 && id < tok.n_vocab(), "token id %d outside [0, %d)", id, tok.n_vocab());
    (void)tok.decode(ids);
    (void)apply_chat_template(m->gguf(), {{"user", "hi"}}, true);
    if (ids.empty()) ids.push_back(0);
    if (ids.size() > 4) ids.resize(4);
    KvCacheConfig cc = m->cache_config(8);
    const KvDtype types[] = {KvDtype::kF16, KvDtype::kQ8, KvDtype::kQ4, KvDtype::kFP8};
    cc.dtype = types[size % 4];  // a cache type per input: NaN or huge activations reach the encoders
    cc.rotate_quantized = (size / 4) % 2 == 0;
    auto cache = make_kv_cache(cc);
    std::vector<float> logits(static_cast<size_t>(hp.n_vocab));
    m->forward(ids.data(), static_cast<int64_t>(ids.size()), 0, *cache, logits.data(), false, nullptr);
    m->forward(ids.data(), 1, cache->n_past(), *cache, logits.data(), false, nullptr);
  } catch (const Error& e) {
    fuzz::check_error_message(e);
  }
  return 0;
}
