// Fuzz target "tokenizer": encode arbitrary bytes with the real tokenizers (SmolLM2 and Qwen2
// byte-level BPE with their pre-tokenizers, Gemma 3's SentencePiece-style BPE with byte
// fallback), read from models/ when installed, else from the tiny model seeds in
// fuzz/corpus/model. Input: byte 0 picks the tokenizer, byte 1's low bits the flags
// (add_bos, parse_special), the rest is the text.
//
// Properties: every id is inside the vocabulary; with parse_special off, decoding gives back
// the text exactly when it is valid UTF-8 made of bytes the vocabulary can write (for the
// SentencePiece vocabulary, with U+2581 read as the space it encodes); invalid UTF-8 must not
// fault (it becomes U+FFFD, as in llama.cpp).
#include <array>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "model/tokenizer_unicode.h"

using namespace kvtrim;

namespace {

struct Loaded {
  std::string name;
  bool spm = false;  // SentencePiece-style ("llama" model): spaces are U+2581
  std::unique_ptr<Tokenizer> tok;
  // Bytes the vocabulary can write: a byte-level BPE vocabulary may lack bytes its training
  // text never had (SmolLM2 has no token for 0x04, 0x06, 0xc0, 0xf1..0xff, ...), which encode
  // drops, as llama.cpp does.
  std::array<bool, 256> writable{};
};

// Byte b's own token: GPT-2's byte-level character (printable bytes as themselves, the others
// mapped in order to U+0100..), or SentencePiece's byte fallback <0xXX>.
bool byte_has_token(const Tokenizer& tok, bool spm, int b) {
  if (spm) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    return tok.token_id(hex) >= 0 || tok.token_id(std::string(1, static_cast<char>(b))) >= 0;
  }
  std::string s;
  tok::utf8_append(tok::byte_to_cpt(static_cast<uint8_t>(b)), &s);
  return tok.token_id(s) >= 0;
}

std::vector<Loaded>& tokenizers() {
  static std::vector<Loaded> all = [] {
    std::vector<Loaded> v;
    auto add = [&](const std::string& path) {
      std::error_code ec;
      if (!std::filesystem::is_regular_file(path, ec)) return;
      auto f = GgufFile::open(path);
      Loaded l;
      l.name = path;
      l.spm = f->get_string("tokenizer.ggml.model", "") == "llama";
      l.tok = Tokenizer::from_gguf(*f);
      for (int b = 0; b < 256; ++b) l.writable[b] = byte_has_token(*l.tok, l.spm, b);
      v.push_back(std::move(l));
    };
    for (const char* m : {"smollm2.gguf", "qwen2.5-coder-1.5b.gguf", "gemma3-270m.gguf"})
      add(fuzz::models_dir() + "/" + m);
    if (v.empty()) {  // no models installed: the tiny seeds' byte-level BPE
      for (const char* m : {"tiny_llama.gguf", "tiny_qwen2.gguf", "tiny_gemma3.gguf"})
        add(std::string(KVTRIM_SOURCE_DIR) + "/fuzz/corpus/model/" + m);
    }
    if (v.empty()) {
      std::fprintf(stderr, "fuzz_tokenizer: no tokenizer found (models/ or fuzz/corpus/model)\n");
      std::abort();
    }
    return v;
  }();
  return all;
}

// Strict UTF-8 (no overlong forms, no surrogates, at most U+10FFFF).
bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 2, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 3, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 4, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    const uint32_t min_cp = n == 2 ? 0x80 : n == 3 ? 0x800 : 0x10000;
    if (cp < min_cp || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

std::string spaces_for_u2581(std::string_view s) {
  static constexpr std::string_view kLower = "\xE2\x96\x81";
  std::string out;
  for (size_t i = 0; i < s.size();) {
    if (s.substr(i, kLower.size()) == kLower) {
      out += ' ';
      i += kLower.size();
    } else {
      out += s[i++];
    }
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)tokenizers();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  auto& all = tokenizers();
  const Loaded& l = all[data[0] % all.size()];
  const bool add_bos = data[1] & 1, parse_special = data[1] & 2;
  const std::string_view text(reinterpret_cast<const char*>(data + 2), size - 2);
  std::vector<int32_t> ids;
  try {
    ids = l.tok->encode(text, add_bos, parse_special);
  } catch (const Error& e) {
    fuzz::check_error_message(e);
    return 0;
  }
  const int32_t n_vocab = l.tok->n_vocab();
  for (int32_t id : ids)
    KVTRIM_FUZZ_ASSERT(id >= 0 && id < n_vocab, "%s: token id %d outside [0, %d)", l.name.c_str(), id, n_vocab);
  if (add_bos && l.tok->add_bos() && l.tok->bos() >= 0) {
    KVTRIM_FUZZ_ASSERT(!ids.empty() && ids[0] == l.tok->bos(), "%s: BOS missing", l.name.c_str());
    ids.erase(ids.begin());
  }
  const std::string back = l.tok->decode(ids);
  bool writable = true;
  for (char c : text) writable = writable && l.writable[static_cast<unsigned char>(c)];
  if (!parse_special && writable && valid_utf8(text)) {
    const std::string want = l.spm ? spaces_for_u2581(text) : std::string(text);
    KVTRIM_FUZZ_ASSERT(back == want, "%s: decode(encode(text)) != text (%zu vs %zu bytes)", l.name.c_str(),
                       back.size(), want.size());
  }
  return 0;
}
