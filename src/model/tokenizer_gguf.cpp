// Tokenizer::from_gguf: reads tokenizer.ggml.* from a GGUF file into a VocabData and builds
// the tokenizer (make_tokenizer validates it). Keys as written by llama.cpp's converters:
// model, pre, tokens, scores, token_type, merges, {bos,eos,eot,eom,unknown}_token_id,
// add_bos_token, add_space_prefix.
#include "core/error.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "model/tokenizer_pretok.h"
#include "model/tokenizer_vocab.h"

namespace kvtrim {

namespace {

const GgufArray* find_array(const GgufFile& f, const char* key, GgufValueType elem, bool required) {
  const GgufValue* v = f.find(key);
  if (v == nullptr) {
    KVTRIM_CHECK(!required, "%s: missing metadata key '%s' (the file has no tokenizer vocabulary)",
                 f.path().c_str(), key);
    return nullptr;
  }
  KVTRIM_CHECK(v->type == GgufValueType::ARRAY, "%s: metadata key '%s' is not an array",
               f.path().c_str(), key);
  const GgufArray& a = v->as_array();
  KVTRIM_CHECK(a.elem_type == elem || a.values.empty(),
               "%s: metadata key '%s' is an array of type %u, expected %u", f.path().c_str(), key,
               static_cast<unsigned>(a.elem_type), static_cast<unsigned>(elem));
  return &a;
}

int32_t token_id_key(const GgufFile& f, const char* key) {
  const GgufValue* v = f.find(key);
  if (v == nullptr) return -1;
  const int64_t id = v->as_int();
  KVTRIM_CHECK(id >= 0 && id < (int64_t(1) << 31),
               "%s: metadata key '%s' = %lld is not a valid token id", f.path().c_str(), key,
               static_cast<long long>(id));
  return static_cast<int32_t>(id);
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const GgufFile& f) {
  VocabData v;
  v.source = f.path();
  v.model = f.get_string("tokenizer.ggml.model");
  v.pre = f.get_string("tokenizer.ggml.pre", "");

  const GgufArray* tokens = find_array(f, "tokenizer.ggml.tokens", GgufValueType::STRING, true);
  v.tokens.reserve(tokens->values.size());
  for (const GgufValue& t : tokens->values) v.tokens.push_back(t.as_string());

  if (const GgufArray* scores = find_array(f, "tokenizer.ggml.scores", GgufValueType::F32, false)) {
    v.scores.reserve(scores->values.size());
    for (const GgufValue& s : scores->values) v.scores.push_back(static_cast<float>(s.as_float()));
  }
  if (const GgufArray* types =
          find_array(f, "tokenizer.ggml.token_type", GgufValueType::I32, false)) {
    v.types.reserve(types->values.size());
    for (const GgufValue& t : types->values) v.types.push_back(static_cast<int32_t>(t.as_int()));
  }
  if (v.model == "gpt2" || v.model == "gemma4") {
    const GgufArray* merges = find_array(f, "tokenizer.ggml.merges", GgufValueType::STRING, true);
    v.merges.reserve(merges->values.size());
    for (const GgufValue& m : merges->values) v.merges.push_back(m.as_string());
  }
  v.bos = token_id_key(f, "tokenizer.ggml.bos_token_id");
  v.eos = token_id_key(f, "tokenizer.ggml.eos_token_id");
  v.eot = token_id_key(f, "tokenizer.ggml.eot_token_id");
  v.eom = token_id_key(f, "tokenizer.ggml.eom_token_id");
  v.unk = token_id_key(f, "tokenizer.ggml.unknown_token_id");
  // llama.cpp's defaults: SentencePiece vocabularies add BOS (if they have one) and a space
  // prefix unless the metadata says otherwise; so do BPE vocabularies whose pre-tokenizer
  // llama.cpp marks add_bos (llama3, tekken).
  const bool spm = v.model == "llama";
  tok::PreTokenizer pre;
  const bool pre_bos = !spm && tok::pre_tokenizer_by_name(v.pre, &pre) && pre.add_bos;
  v.add_bos = f.get_bool("tokenizer.ggml.add_bos_token", (spm || pre_bos) && v.bos >= 0);
  v.add_space_prefix = spm && f.get_bool("tokenizer.ggml.add_space_prefix", true);
  return make_tokenizer(std::move(v));
}

}  // namespace kvtrim
