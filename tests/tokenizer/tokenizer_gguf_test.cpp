// Tokenizer::from_gguf and apply_chat_template on tiny GGUF files written by the test:
// a working vocabulary, and metadata that is missing or malformed.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "../common/test_util.h"
#include "core/error.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "model/tokenizer_unicode.h"
#include "tokenizer_test_util.h"

namespace kvtrim {
namespace {

using test::bl;
using test::error_of;

// A byte-level BPE vocabulary: 256 byte tokens, "he", "hel", "hello", two control tokens.
// skip: a key left out (a test writes its own value instead); pre: tokenizer.ggml.pre.
void write_bpe(GgufWriter* w, const std::string& skip = "", const std::string& pre = "smollm") {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(bl(std::string(1, static_cast<char>(b))));
  for (const char* t : {"he", "hel", "hell", "hello"}) tokens.push_back(t);
  tokens.push_back("<|im_start|>");
  tokens.push_back("<|im_end|>");
  std::vector<int32_t> types(tokens.size(), 1);
  types[260] = types[261] = 3;
  const auto keep = [&](const char* key) { return skip != key; };
  w->set_string("general.architecture", "llama");
  w->set_string("tokenizer.ggml.model", "gpt2");
  if (keep("tokenizer.ggml.pre")) w->set_string("tokenizer.ggml.pre", pre);
  if (keep("tokenizer.ggml.tokens")) w->set_array_string("tokenizer.ggml.tokens", tokens);
  if (keep("tokenizer.ggml.token_type")) w->set_array_i32("tokenizer.ggml.token_type", types);
  if (keep("tokenizer.ggml.merges"))
    w->set_array_string("tokenizer.ggml.merges", {"h e", "he l", "hel l", "hell o"});
  w->set_u32("tokenizer.ggml.bos_token_id", 260);
  if (keep("tokenizer.ggml.eos_token_id")) w->set_u32("tokenizer.ggml.eos_token_id", 261);
  if (keep("tokenizer.ggml.add_bos_token")) w->set_bool("tokenizer.ggml.add_bos_token", false);
}

std::unique_ptr<GgufFile> write_and_open(const GgufWriter& w, const std::string& name) {
  const std::string path = test::temp_dir("tokenizer_gguf") + "/" + name + ".gguf";
  w.write(path);
  return GgufFile::open(path);
}

TEST(TokenizerGguf, LoadsVocabularyAndMerges) {
  GgufWriter w;
  write_bpe(&w);
  auto f = write_and_open(w, "ok");
  auto t = Tokenizer::from_gguf(*f);
  EXPECT_EQ(t->n_vocab(), 262);
  EXPECT_EQ(t->bos(), 260);
  EXPECT_EQ(t->eos(), 261);
  EXPECT_FALSE(t->add_bos());
  EXPECT_TRUE(t->is_eog(261));
  const auto ids = t->encode("<|im_start|>hello 42", true, true);
  EXPECT_EQ(ids, (std::vector<int32_t>{260, 259, ' ', '4', '2'}));
  EXPECT_EQ(t->decode(ids), "<|im_start|>hello 42");
}

// Without tokenizer.ggml.add_bos_token, llama.cpp adds BOS for the pre-tokenizers it marks
// add_bos (llama3 and its aliases, tekken) and not for the others.
TEST(TokenizerGguf, BosDefaultFollowsThePreTokenizer) {
  const std::vector<std::pair<std::string, bool>> cases = {
      {"tekken", true}, {"llama-bpe", true}, {"qwen2", false}, {"smollm", false}, {"gpt-4o", false}};
  for (const auto& [pre, want] : cases) {
    GgufWriter w;
    write_bpe(&w, "tokenizer.ggml.add_bos_token", pre);
    auto t = Tokenizer::from_gguf(*write_and_open(w, "bos_" + pre));
    EXPECT_EQ(t->add_bos(), want) << pre;
    EXPECT_EQ(t->encode("hello", true, false).front() == 260, want) << pre;
  }
  GgufWriter w;  // the key wins over the default
  write_bpe(&w, "", "tekken");
  EXPECT_FALSE(Tokenizer::from_gguf(*write_and_open(w, "bos_key"))->add_bos());
}

TEST(TokenizerGguf, MissingOrMalformedMetadataIsAnError) {
  const auto build = [](const std::function<void(GgufWriter*)>& edit, const std::string& key) {
    GgufWriter w;
    write_bpe(&w, key);
    edit(&w);
    return w;
  };
  {
    GgufWriter w;
    w.set_string("tokenizer.ggml.model", "gpt2");
    auto f = write_and_open(w, "no_tokens");
    const std::string e = error_of([&] { Tokenizer::from_gguf(*f); });
    EXPECT_NE(e.find("tokenizer.ggml.tokens"), std::string::npos) << e;
    EXPECT_NE(e.find("no_tokens.gguf"), std::string::npos) << e;
  }
  {
    auto f = write_and_open(build(
                                [](GgufWriter* w) {
                                  w->set_array_i32("tokenizer.ggml.tokens", {1, 2});
                                },
                                "tokenizer.ggml.tokens"),
                            "int_tokens");
    EXPECT_NE(error_of([&] { Tokenizer::from_gguf(*f); }).find("tokenizer.ggml.tokens"),
              std::string::npos);
  }
  {
    auto f = write_and_open(build([](GgufWriter*) {}, "tokenizer.ggml.merges"), "no_merges");
    EXPECT_NE(error_of([&] { Tokenizer::from_gguf(*f); }).find("tokenizer.ggml.merges"),
              std::string::npos);
  }
  {
    auto f = write_and_open(
        build([](GgufWriter* w) { w->set_array_string("tokenizer.ggml.merges", {"h zz"}); },
              "tokenizer.ggml.merges"),
        "bad_merge");
    EXPECT_NE(error_of([&] { Tokenizer::from_gguf(*f); }).find("'zz' is not in the vocabulary"),
              std::string::npos);
  }
  {
    auto f =
        write_and_open(build([](GgufWriter* w) { w->set_u32("tokenizer.ggml.eos_token_id", 9999); },
                             "tokenizer.ggml.eos_token_id"),
                       "bad_eos");
    EXPECT_NE(
        error_of([&] { Tokenizer::from_gguf(*f); }).find("eos_token_id = 9999 is out of range"),
        std::string::npos);
  }
  {
    auto f =
        write_and_open(build([](GgufWriter* w) { w->set_string("tokenizer.ggml.pre", "mystery"); },
                             "tokenizer.ggml.pre"),
                       "bad_pre");
    EXPECT_NE(error_of([&] { Tokenizer::from_gguf(*f); }).find("'mystery'"), std::string::npos);
  }
  {
    auto f = write_and_open(
        build([](GgufWriter* w) { w->set_array_i32("tokenizer.ggml.token_type", {1}); },
              "tokenizer.ggml.token_type"),
        "short_types");
    EXPECT_NE(error_of([&] { Tokenizer::from_gguf(*f); }).find("token_type has 1 entries"),
              std::string::npos);
  }
}

TEST(TokenizerGguf, ChatTemplateFromMetadata) {
  GgufWriter w;
  write_bpe(&w);
  w.set_string(
      "tokenizer.chat_template",
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
      "'<|im_start|>system\nBe helpful<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + "
      "message['role'] + "
      "'\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}");
  auto f = write_and_open(w, "chatml");
  // the file's own Jinja template, as it is: it has no generation prompt, so none is added
  EXPECT_EQ(apply_chat_template(*f, {{"user", "hi"}}, true),
            "<|im_start|>system\nBe "
            "helpful<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n");
  GgufWriter g;
  g.set_string("general.architecture", "gemma3");
  auto fg = write_and_open(g, "gemma");
  EXPECT_EQ(apply_chat_template(*fg, {{"system", "S"}, {"user", "U"}}, false),
            "<start_of_turn>user\nS\n\nU<end_of_turn>\n");
  GgufWriter u;
  u.set_string("general.architecture", "mamba");
  auto fu = write_and_open(u, "unknown");
  EXPECT_NE(error_of([&] {
              apply_chat_template(*fu, {{"user", "x"}}, false);
            }).find("'mamba'"),
            std::string::npos);
}

}  // namespace
}  // namespace kvtrim
