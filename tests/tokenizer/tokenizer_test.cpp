// Tokenizers on tiny hand-made vocabularies: BPE merge order, pre-tokenizer splits,
// SentencePiece scores and byte fallback, special tokens, unicode, empty strings and
// whitespace runs, metadata validation, chat templates.
#include "model/chat_options.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"

#include <gtest/gtest.h>

#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/tokenizer_pretok.h"
#include "model/tokenizer_unicode.h"
#include "model/tokenizer_vocab.h"
#include "test_util.h"
#include "tokenizer_test_util.h"

namespace kvtrim {
namespace {

// ----------------------------------------------------------------------------- helpers

using test::bl;
using test::error_of;

// A byte-level BPE vocabulary: the 256 byte characters (id = byte value), then extras.
VocabData bpe_vocab(const std::vector<std::string>& extra_raw,
                    const std::vector<std::string>& merges_raw, const std::string& pre = "gpt2") {
  VocabData v;
  v.model = "gpt2";
  v.pre = pre;
  for (int b = 0; b < 256; ++b) v.tokens.push_back(bl(std::string(1, static_cast<char>(b))));
  for (const auto& e : extra_raw) v.tokens.push_back(bl(e));
  for (const auto& m : merges_raw) {
    const size_t sp = m.find('|');
    v.merges.push_back(bl(m.substr(0, sp)) + " " + bl(m.substr(sp + 1)));
  }
  v.types.assign(v.tokens.size(), static_cast<int32_t>(TokenType::Normal));
  return v;
}

int32_t add_token(VocabData* v, const std::string& text, TokenType type, float score = 0.0f) {
  v->tokens.push_back(text);
  v->types.push_back(static_cast<int32_t>(type));
  if (!v->scores.empty() || score != 0.0f) {
    v->scores.resize(v->tokens.size() - 1, 0.0f);
    v->scores.push_back(score);
  }
  return static_cast<int32_t>(v->tokens.size() - 1);
}

std::vector<int32_t> ids_of(const Tokenizer& t, const std::vector<std::string>& raw_pieces) {
  std::vector<int32_t> out;
  for (const auto& p : raw_pieces) {
    const int32_t id = t.token_id(bl(p));
    EXPECT_GE(id, 0) << "no token for '" << p << "'";
    out.push_back(id);
  }
  return out;
}

std::vector<std::string> words(std::string_view text, tok::PreSplit mode) {
  std::string norm;
  std::vector<size_t> ends;
  tok::pre_tokenize(text, mode, &norm, &ends);
  std::vector<std::string> out;
  size_t b = 0;
  for (size_t e : ends) {
    out.push_back(norm.substr(b, e - b));
    b = e;
  }
  EXPECT_EQ(b, norm.size());
  return out;
}

using Words = std::vector<std::string>;

// ----------------------------------------------------------------------------- pre-tokenizers

TEST(PreTokenizer, Gpt2Splits) {
  using tok::PreSplit;
  EXPECT_EQ(words("Hello world's  test 123 foo!!", PreSplit::Gpt2),
            (Words{"Hello", " world", "'s", " ", " test", " 123", " foo", "!!"}));
  EXPECT_EQ(words("a  ", PreSplit::Gpt2), (Words{"a", "  "}));  // a final run is taken whole
  EXPECT_EQ(words("a   b", PreSplit::Gpt2), (Words{"a", "  ", " b"}));
  EXPECT_EQ(words("IT'S", PreSplit::Gpt2), (Words{"IT", "'", "S"}));  // case-sensitive contractions
  EXPECT_EQ(words("héllo wörld 你好", PreSplit::Gpt2), (Words{"héllo", " wörld", " 你好"}));
  EXPECT_EQ(words("x\n\ny", PreSplit::Gpt2), (Words{"x", "\n", "\n", "y"}));
  EXPECT_EQ(words("", PreSplit::Gpt2), (Words{}));
}

TEST(PreTokenizer, SmollmIsolatesEveryDigit) {
  using tok::PreSplit;
  EXPECT_EQ(words("abc 123", PreSplit::Smollm), (Words{"abc", " ", "1", "2", "3"}));
  EXPECT_EQ(words("x12y", PreSplit::Smollm), (Words{"x", "1", "2", "y"}));
  EXPECT_EQ(words("٣٤", PreSplit::Smollm), (Words{"٣", "٤"}));  // Arabic-Indic digits are \p{N}
}

TEST(PreTokenizer, Qwen2AndLlama3) {
  using tok::PreSplit;
  EXPECT_EQ(words("Hello\n\n  world", PreSplit::Qwen2), (Words{"Hello", "\n\n", " ", " world"}));
  EXPECT_EQ(words("abc123", PreSplit::Qwen2), (Words{"abc", "1", "2", "3"}));
  EXPECT_EQ(words("1234567", PreSplit::Llama3), (Words{"123", "456", "7"}));
  EXPECT_EQ(words("IT'S we'LL", PreSplit::Qwen2), (Words{"IT", "'S", " we", "'LL"}));
  EXPECT_EQ(words("x!!\n\ny", PreSplit::Qwen2), (Words{"x", "!!\n\n", "y"}));
  EXPECT_EQ(words("(hello", PreSplit::Qwen2), (Words{"(hello"}));
  EXPECT_EQ(words("\thello  ", PreSplit::Qwen2), (Words{"\thello", "  "}));
}

TEST(PreTokenizer, InvalidUtf8BecomesReplacementCharacter) {
  EXPECT_EQ(words("a\xff"
                  "b",
                  tok::PreSplit::Gpt2),
            (Words{"a", "\xEF\xBF\xBD", "b"}));
}

// ----------------------------------------------------------------------------- byte-level BPE

TEST(Bpe, MergesLowestRankFirst) {
  {
    auto t = make_tokenizer(bpe_vocab({"ab", "bc", "abc"}, {"b|c", "a|b", "a|bc"}));
    EXPECT_EQ(t->encode("abc", false, false), ids_of(*t, {"abc"}));
  }
  {
    auto t = make_tokenizer(bpe_vocab({"ab", "bc", "abc"}, {"b|c", "a|b"}));
    EXPECT_EQ(t->encode("abc", false, false), ids_of(*t, {"a", "bc"}));
  }
  {
    auto t = make_tokenizer(bpe_vocab({"ab", "bc", "abc"}, {"a|b", "b|c"}));
    EXPECT_EQ(t->encode("abc", false, false), ids_of(*t, {"ab", "c"}));
  }
}

TEST(Bpe, EqualRanksMergeLeftmostFirst) {
  auto t = make_tokenizer(bpe_vocab({"aa"}, {"a|a"}));
  EXPECT_EQ(t->encode("aaa", false, false), ids_of(*t, {"aa", "a"}));
  EXPECT_EQ(t->encode("aaaa", false, false), ids_of(*t, {"aa", "aa"}));
}

TEST(Bpe, DoesNotMergeAcrossWords) {
  auto t = make_tokenizer(bpe_vocab({"a ", " b"}, {"a| ", " |b"}));
  EXPECT_EQ(t->encode("a b", false, false), ids_of(*t, {"a", " b"}));
}

TEST(Bpe, UnicodeBytesRoundTrip) {
  auto t = make_tokenizer(bpe_vocab({"\xC3\xA9"}, {"\xC3|\xA9"}));
  const std::string text = "caf\xC3\xA9 \xF0\x9F\xA6\x99";  // "café 🦙"
  const auto ids = t->encode(text, false, false);
  EXPECT_EQ(t->decode(ids), text);
  EXPECT_EQ(ids[3], t->token_id(bl("\xC3\xA9")));
  EXPECT_EQ(t->token_to_piece(ids[3]), "\xC3\xA9");
}

TEST(Bpe, EmptyStringAndWhitespaceRuns) {
  VocabData v = bpe_vocab({"  ", "   "}, {" | ", "  | "});
  v.bos = add_token(&v, "<s>", TokenType::Control);
  v.add_bos = true;
  auto t = make_tokenizer(v);
  EXPECT_TRUE(t->encode("", false, false).empty());
  EXPECT_EQ(t->encode("", true, false), std::vector<int32_t>{v.bos});
  // "a" + 5 spaces + "b": words "a", "    " (4 spaces, merged pairwise from the left), " b"
  const std::string text = "a     b";
  const auto ids = t->encode(text, false, false);
  EXPECT_EQ(ids, ids_of(*t, {"a", "  ", "  ", " ", "b"}));
  EXPECT_EQ(t->decode(ids), text);
}

// Gemma 4 ("gemma4"): BPE merges over raw UTF-8 characters, "▁" for spaces, words cut only
// at newlines, a word of newlines taken whole, <0xXX> for a character without a token.
TEST(Bpe, Gemma4RawUtf8WithSpaceEscapeAndByteFallback) {
  VocabData v;
  v.model = "gemma4";
  static const char* kHex = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    add_token(&v, std::string{'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'}, TokenType::Byte);
  }
  const std::string sp = "\xe2\x96\x81";  // ▁
  const int32_t t_sp = add_token(&v, sp, TokenType::Normal);
  const int32_t t_h = add_token(&v, "h", TokenType::Normal);
  const int32_t t_i = add_token(&v, "i", TokenType::Normal);
  const int32_t t_hi = add_token(&v, "hi", TokenType::Normal);
  const int32_t t_sphi = add_token(&v, sp + "hi", TokenType::Normal);
  const int32_t t_nl = add_token(&v, "\n", TokenType::Normal);
  const int32_t t_nlnl = add_token(&v, "\n\n", TokenType::Normal);
  const int32_t t_e = add_token(&v, "\xc3\xa9", TokenType::Normal);  // é is a token, ü is not
  v.merges = {"h i", sp + " hi"};  // no "\n \n" merge: "\n\n" only as a whole word
  auto t = make_tokenizer(v);
  EXPECT_EQ(t->encode("hi hi", false, false), (std::vector<int32_t>{t_hi, t_sphi}));
  EXPECT_EQ(t->encode("ih \xc3\xa9", false, false), (std::vector<int32_t>{t_i, t_h, t_sp, t_e}));
  EXPECT_EQ(t->encode("h\n\nhi\n", false, false), (std::vector<int32_t>{t_h, t_nlnl, t_hi, t_nl}));
  EXPECT_EQ(t->encode("\xc3\xbc", false, false), (std::vector<int32_t>{0xC3, 0xBC}));  // byte fallback
  const std::string text = "hi \xc3\xbc\n\nhi h";
  EXPECT_EQ(t->decode(t->encode(text, false, false)), text);
  // A pre-tokenizer name is not needed (the model implies it); the byte-level one still is.
  v.model = "gpt2";
  EXPECT_NE(error_of([&] { make_tokenizer(v); }).find("tokenizer.ggml.pre = ''"), std::string::npos);
}

TEST(Bpe, LongWordIsNotQuadratic) {
  auto t = make_tokenizer(bpe_vocab({"aa", "aaaa"}, {"a|a", "aa|aa"}));
  const std::string text(200000, 'a');
  // CPU time (std::clock), not wall time: other jobs on a busy machine do not count against it
  const std::clock_t c0 = std::clock();
  const auto ids = t->encode(text, false, false);
  const double s = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
  EXPECT_EQ(ids.size(), text.size() / 4);
  EXPECT_LT(s, 1.0);
}

// ----------------------------------------------------------------------------- special tokens

TEST(SpecialTokens, ControlOnlyWithParseSpecialUserDefinedAlways) {
  VocabData v = bpe_vocab({}, {});
  const int32_t start = add_token(&v, "<|im_start|>", TokenType::Control);
  const int32_t end = add_token(&v, "<|im_end|>", TokenType::Control);
  const int32_t tool = add_token(&v, "<tool>", TokenType::UserDefined);
  auto t = make_tokenizer(v);
  const auto ids = t->encode("<|im_start|>user<tool>x<|im_end|>", false, true);
  ASSERT_EQ(ids.size(), 8u);
  EXPECT_EQ(ids[0], start);
  EXPECT_EQ(ids[5], tool);
  EXPECT_EQ(ids[7], end);
  const auto plain = t->encode("<|im_start|><tool>", false, false);
  EXPECT_EQ(plain.size(), 12u + 1u);  // 12 bytes of text, then the user-defined token
  EXPECT_EQ(plain.back(), tool);
  EXPECT_EQ(t->decode(ids), "<|im_start|>user<tool>x<|im_end|>");
  EXPECT_EQ(t->token_to_piece(start), "<|im_start|>");
}

TEST(SpecialTokens, LongestTokenFirst) {
  VocabData v = bpe_vocab({}, {});
  const int32_t a = add_token(&v, "<a>", TokenType::UserDefined);
  const int32_t ab = add_token(&v, "<a><b>", TokenType::UserDefined);
  const int32_t b = add_token(&v, "<b>", TokenType::UserDefined);
  auto t = make_tokenizer(v);
  EXPECT_EQ(t->encode("<a><b><a>", false, false), (std::vector<int32_t>{ab, a}));
  EXPECT_EQ(t->encode("<b><a><b>", false, false), (std::vector<int32_t>{b, ab}));
  EXPECT_EQ(t->encode("x<a>y", false, false), (std::vector<int32_t>{'x', a, 'y'}));
}

TEST(SpecialTokens, EndOfGeneration) {
  VocabData v = bpe_vocab({}, {});
  v.eos = add_token(&v, "<|endoftext|>", TokenType::Control);
  const int32_t im_end = add_token(&v, "<|im_end|>", TokenType::Control);
  const int32_t im_start = add_token(&v, "<|im_start|>", TokenType::Control);
  const int32_t s_close =
      add_token(&v, "</s>", TokenType::Normal);  // llama.cpp makes it control + EOG
  auto t = make_tokenizer(v);
  EXPECT_TRUE(t->is_eog(v.eos));
  EXPECT_TRUE(t->is_eog(im_end));
  EXPECT_TRUE(t->is_eog(s_close));
  EXPECT_FALSE(t->is_eog(im_start));
  EXPECT_FALSE(t->is_eog('a'));
  EXPECT_FALSE(t->is_eog(-1));
  EXPECT_EQ(t->encode("</s>", false, true), std::vector<int32_t>{s_close});
  EXPECT_EQ(t->token_id("<|im_end|>"), im_end);
  EXPECT_EQ(t->token_id("nope"), -1);
}

// ----------------------------------------------------------------------------- SentencePiece

VocabData spm_vocab() {
  VocabData v;
  v.model = "llama";
  v.unk = add_token(&v, "<unk>", TokenType::Unknown, -1000.0f);
  v.bos = add_token(&v, "<bos>", TokenType::Control, -1000.0f);
  v.eos = add_token(&v, "<eos>", TokenType::Control, -1000.0f);
  static const char* kHex = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    add_token(&v, std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">", TokenType::Byte, 0.0f);
  }
  for (const char* s : {"\xE2\x96\x81", "a", "b", "c"}) add_token(&v, s, TokenType::Normal, -5.0f);
  add_token(&v, "\n", TokenType::UserDefined, 0.0f);
  v.add_bos = true;
  return v;
}

TEST(Spm, HighestScoreFirst) {
  {
    VocabData v = spm_vocab();
    const int32_t ab = add_token(&v, "ab", TokenType::Normal, -1.0f);
    add_token(&v, "bc", TokenType::Normal, -3.0f);
    auto t = make_tokenizer(v);
    EXPECT_EQ(t->encode("abc", false, false), (std::vector<int32_t>{ab, t->token_id("c")}));
  }
  {
    VocabData v = spm_vocab();
    add_token(&v, "ab", TokenType::Normal, -3.0f);
    const int32_t bc = add_token(&v, "bc", TokenType::Normal, -1.0f);
    auto t = make_tokenizer(v);
    EXPECT_EQ(t->encode("abc", false, false), (std::vector<int32_t>{t->token_id("a"), bc}));
  }
  {
    VocabData v = spm_vocab();
    const int32_t aa = add_token(&v, "aa", TokenType::Normal, -1.0f);
    auto t = make_tokenizer(v);
    EXPECT_EQ(t->encode("aaa", false, false),
              (std::vector<int32_t>{aa, t->token_id("a")}));  // leftmost
  }
}

TEST(Spm, SpacesAndByteFallback) {
  VocabData v = spm_vocab();
  const int32_t sp_b = add_token(&v,
                                 "\xE2\x96\x81"
                                 "b",
                                 TokenType::Normal, -1.0f);
  auto t = make_tokenizer(v);
  const std::string text = "a b \xC3\xA9";
  const auto ids = t->encode(text, false, false);
  const int32_t space = t->token_id("\xE2\x96\x81");
  EXPECT_EQ(ids, (std::vector<int32_t>{t->token_id("a"), sp_b, space, t->token_id("<0xC3>"),
                                       t->token_id("<0xA9>")}));
  EXPECT_EQ(t->decode(ids), text);
  EXPECT_EQ(t->token_to_piece(sp_b), " b");
  EXPECT_EQ(t->token_to_piece(t->token_id("<0x41>")), "A");
  EXPECT_EQ(t->token_to_piece(v.bos), "<bos>");
  // add_bos follows the metadata flag
  EXPECT_EQ(t->encode("a", true, false).front(), v.bos);
  // user-defined "\n" splits the text even without parse_special; <bos> only with it
  const auto nl = t->encode("a\n<bos>", false, true);
  EXPECT_EQ(nl, (std::vector<int32_t>{t->token_id("a"), t->token_id("\n"), v.bos}));
  EXPECT_GT(t->encode("<bos>", false, false).size(), 1u);
  EXPECT_TRUE(t->encode("", false, false).empty());
}

TEST(Spm, TokensSpanningSpacesAndMalformedUtf8) {
  VocabData v = spm_vocab();
  const int32_t a_sp_b = add_token(&v,
                                   "a\xE2\x96\x81"
                                   "b",
                                   TokenType::Normal, -0.5f);
  add_token(&v, "ab", TokenType::Normal, -1.0f);
  add_token(&v,
            "\xE2\x96\x81"
            "b",
            TokenType::Normal, -2.0f);
  add_token(&v, "a\xE2\x96\x81", TokenType::Normal, -2.0f);
  auto t = make_tokenizer(v);
  EXPECT_EQ(t->encode("c a b", false, false),
            (std::vector<int32_t>{t->token_id("c"), t->token_id("\xE2\x96\x81"), a_sp_b}));
  // A 4-byte lead byte swallows the next three bytes, here half of a "▁" (as in llama.cpp).
  const auto ids = t->encode(
      "\xF0"
      "c b",
      false, false);
  const auto byte = [&](const char* hex) { return t->token_id(std::string("<0x") + hex + ">"); };
  EXPECT_EQ(ids, (std::vector<int32_t>{byte("F0"), byte("63"), byte("E2"), byte("96"), byte("81"),
                                       t->token_id("b")}));
  EXPECT_EQ(t->decode(ids),
            "\xF0"
            "c\xE2\x96\x81"
            "b");
}

TEST(Spm, SpacePrefixAfterSpecialTokens) {
  VocabData v = spm_vocab();
  v.add_space_prefix = true;
  const int32_t sp_a = add_token(&v,
                                 "\xE2\x96\x81"
                                 "a",
                                 TokenType::Normal, -1.0f);
  auto t = make_tokenizer(v);
  EXPECT_EQ(t->encode("a", false, false), std::vector<int32_t>{sp_a});
  EXPECT_EQ(t->encode("<bos>a", false, true), (std::vector<int32_t>{v.bos, sp_a}));
}

// ----------------------------------------------------------------------------- validation

TEST(Validation, BadMetadataGivesClearErrors) {
  {
    VocabData v;
    v.model = "gpt2";
    EXPECT_NE(error_of([&] { make_tokenizer(v); }).find("no tokens"), std::string::npos);
  }
  EXPECT_NE(error_of([] {
              make_tokenizer(bpe_vocab({}, {"a|zz"}));
            }).find("'zz' is not in the vocabulary"),
            std::string::npos);
  EXPECT_NE(error_of([] { make_tokenizer(bpe_vocab({}, {"a|b"})); }).find("merged token"),
            std::string::npos);
  {
    VocabData v = bpe_vocab({}, {});
    v.merges.push_back("ab");
    EXPECT_NE(error_of([&] { make_tokenizer(v); }).find("no space separator"), std::string::npos);
  }
  {
    VocabData v = bpe_vocab({}, {});
    v.bos = 1000;
    EXPECT_NE(error_of([&] { make_tokenizer(v); }).find("bos_token_id = 1000 is out of range"),
              std::string::npos);
  }
  {
    VocabData v = bpe_vocab({}, {});
    v.types.resize(10);
    EXPECT_NE(error_of([&] { make_tokenizer(v); }).find("token_type has 10 entries"),
              std::string::npos);
  }
  {
    VocabData v = bpe_vocab({}, {});
    v.tokens.push_back(v.tokens[5]);
    v.types.push_back(1);
    EXPECT_NE(error_of([&] { make_tokenizer(v); }).find("duplicates token 5"), std::string::npos);
  }
  {
    VocabData v = bpe_vocab({}, {});
    v.model = "bert";
    EXPECT_NE(error_of([&] { make_tokenizer(v); }).find("unsupported tokenizer model"),
              std::string::npos);
  }
  EXPECT_NE(error_of([] { make_tokenizer(bpe_vocab({}, {}, "klingon")); }).find("pre-tokenizer"),
            std::string::npos);
  {
    auto t = make_tokenizer(bpe_vocab({}, {}));
    EXPECT_NE(error_of([&] { t->token_to_piece(256); }).find("out of range"), std::string::npos);
    EXPECT_NE(error_of([&] { t->decode({-1}); }).find("out of range"), std::string::npos);
  }
}

// ----------------------------------------------------------------------------- chat templates

const std::vector<ChatMessage> kUserOnly = {{"user", "Hi"}};
const std::vector<ChatMessage> kSystemUser = {
    {"system", " Be brief. "}, {"user", " Hi \n"}, {"assistant", "Hello"}};

TEST(ChatTemplate, JinjaTemplateRendersWithDefaultSystemPrompt) {
  const std::string smol =
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
      "'<|im_start|>system\nYou are SmolLM<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + "
      "message['role'] + '\n' + "
      "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
      "'<|im_start|>assistant\n' }}{% endif %}";
  const ChatTemplate t = ChatTemplate::from_jinja(smol, "smol");
  EXPECT_TRUE(t.is_jinja());
  EXPECT_EQ(t.render(kUserOnly, true),
            "<|im_start|>system\nYou are "
            "SmolLM<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(t.render(kSystemUser, false),
            "<|im_start|>system\n Be brief. <|im_end|>\n<|im_start|>user\n Hi \n<|im_end|>\n"
            "<|im_start|>assistant\nHello<|im_end|>\n");
  // extra variables reach the template (chat_template_kwargs)
  ChatOptions opt;
  opt.vars["who"] = "kvtrim";
  EXPECT_EQ(ChatTemplate::from_jinja("{{ who }}:{{ messages | length }}", "v").render(kUserOnly, false, opt), "kvtrim:1");
}

TEST(ChatTemplate, BuiltinChatMLAndGemma) {
  EXPECT_EQ(ChatTemplate::builtin("chatml").render(kUserOnly, false), "<|im_start|>user\nHi<|im_end|>\n");
  EXPECT_EQ(ChatTemplate::builtin("gemma").render(kSystemUser, true),
            "<start_of_turn>user\nBe "
            "brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n"
            "<start_of_turn>model\n");
  EXPECT_EQ(ChatTemplate::builtin("gemma").render(kUserOnly, false), "<start_of_turn>user\nHi<end_of_turn>\n");
}

TEST(ChatTemplate, BadTemplateOrRoleIsAnError) {
  // a template that does not parse: the error names it and the way out
  const std::string parse_err = error_of([] { ChatTemplate::from_jinja("{% if x %}open", "t.jinja").render(kUserOnly, false); });
  EXPECT_NE(parse_err.find("does not parse"), std::string::npos) << parse_err;
  EXPECT_NE(parse_err.find("t.jinja:1"), std::string::npos) << parse_err;
  EXPECT_NE(parse_err.find("--chat-template"), std::string::npos) << parse_err;
  // raise_exception's message, named
  const std::string raised = error_of([] {
    ChatTemplate::from_jinja("{{ raise_exception('System role not supported') }}", "g").render(kUserOnly, false);
  });
  EXPECT_EQ(raised, "g: System role not supported");
  EXPECT_NE(error_of([] { ChatTemplate::builtin("gemma").render({{"robot", "x"}}, false); }).find("role 'robot'"),
            std::string::npos);
  EXPECT_NE(error_of([] { ChatTemplate::builtin("llama9"); }).find("'llama9'"), std::string::npos);
}

}  // namespace
}  // namespace kvtrim
