// Context and question apart (src/engine/context_question.h) on a tiny qwen2 model (ChatML):
// the chat prompt is cut where the last user message starts; the press compresses the context
// only, and every token of the question prefilled after it is still in every (layer, kv head);
// a query-aware press sees the question without keeping it; a short context or a press that
// cannot run is a note, the cache unchanged.
#include "engine/context_question.h"

#include <gtest/gtest.h>

#include <set>

#include "core/error.h"
#include "test_util.h"
#include "tiny_model.h"

namespace kvtrim {
namespace {

class ContextQuestionTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(test::temp_dir("context_question"));
    model_ = Model::load(test::write_tiny_model(test::tiny_spec(Arch::kQwen2, 2), *dir_)).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete dir_;
  }
  static std::vector<int32_t> tokens(int n, int salt = 0) { return test::tiny_tokens(n, salt); }
  static std::unique_ptr<Session> session(const std::string& press) {
    SessionParams p;
    p.n_ctx = 256;
    p.n_threads = 2;
    auto s = std::make_unique<Session>(*model_, p);
    PressSchedule sched;
    sched.after_prefill = false;
    s->set_press(make_press(press), sched);
    return s;
  }
  // Every (layer, kv head)'s stored positions.
  static std::set<int32_t> positions(const Session& s, int il, int ih) {
    std::vector<int32_t> pos;
    s.cache().read_head(il, ih, nullptr, nullptr, &pos);
    return {pos.begin(), pos.end()};
  }
  static Model* model_;
  static std::string* dir_;
};
Model* ContextQuestionTest::model_ = nullptr;
std::string* ContextQuestionTest::dir_ = nullptr;

TEST_F(ContextQuestionTest, ChatPromptIsCutWhereTheLastUserMessageStarts) {
  const std::vector<ChatMessage> msgs = {
      {"system", "be brief"}, {"user", "first"}, {"assistant", "ok"}, {"user", "DOC\n\nwhat is it?"}};
  const std::string whole = model_->chat_template().render(msgs, true);
  const ChatPromptSplit sp = split_chat_prompt(model_->chat_template(), msgs, true);
  EXPECT_EQ(sp.head + sp.tail, whole);
  EXPECT_EQ(sp.head.substr(sp.head.size() - 17), "<|im_start|>user\n");
  EXPECT_EQ(sp.tail, "DOC\n\nwhat is it?<|im_end|>\n<|im_start|>assistant\n");
  // `into`: the cut after a document at the start of the user message
  const ChatPromptSplit doc = split_chat_prompt(model_->chat_template(), msgs, true, 3);
  EXPECT_EQ(doc.head + doc.tail, whole);
  EXPECT_EQ(doc.tail, "\n\nwhat is it?<|im_end|>\n<|im_start|>assistant\n");
  // the two tokenized parts are the whole prompt's tokens
  const Tokenizer& tok = model_->tokenizer();
  const SplitPrompt p = tokenize_chat_split(tok, sp);
  std::vector<int32_t> joined = p.context;
  joined.insert(joined.end(), p.question.begin(), p.question.end());
  EXPECT_EQ(joined, tok.encode(whole, tok.add_bos(), true));
  EXPECT_THROW(split_chat_prompt(model_->chat_template(), {{"system", "x"}}, true), Error);
}

// The context is compressed, the question prefilled after it is whole in every (layer, kv head).
TEST_F(ContextQuestionTest, TheProtectedTailIsAllInTheCacheAfterThePress) {
  for (const char* press : {"snapkv:0.5", "knorm:0.5", "streamingllm:0.5", "tova:0.5", "kvzip:0.5",
                            "snapkv:0.5,query_aware=true"}) {
    SCOPED_TRACE(press);
    auto s = session(press);
    const std::vector<int32_t> ctx = tokens(80), question = tokens(12, 3);
    s->prefill(ctx);
    const ContextCompression cc = compress_context(*s, question);
    ASSERT_TRUE(cc.ran) << cc.note;
    EXPECT_EQ(cc.n_context, 80);
    EXPECT_EQ(cc.saw_question, std::string(press).find("query_aware") != std::string::npos);
    EXPECT_EQ(s->n_past(), 80);  // a query-aware press's look at the question left nothing behind
    GenerateParams gp;
    gp.max_new_tokens = 2;
    gp.sampling.temperature = 0;
    s->generate(question, gp);
    const auto& cfg = s->cache().config();
    int64_t context_kept = 0;
    for (int il = 0; il < cfg.n_layer; ++il)
      for (int ih = 0; ih < cfg.n_head_kv; ++ih) {
        const std::set<int32_t> pos = positions(*s, il, ih);
        for (int32_t p = 80; p < 92; ++p) EXPECT_TRUE(pos.count(p)) << "layer " << il << " head " << ih << " pos " << p;
        for (int32_t p : pos) context_kept += p < 80;
      }
    // the context was compressed: about half of its tokens gone over all heads
    EXPECT_LT(context_kept, 80 * cfg.n_layer * cfg.n_head_kv * 6 / 10);
    EXPECT_EQ(cc.stats.tokens_before, 80 * cfg.n_layer * cfg.n_head_kv);
    EXPECT_EQ(cc.stats.tokens_after, context_kept);
  }
}

TEST_F(ContextQuestionTest, AShortContextIsNotCompressed) {
  auto s = session("snapkv:0.5");
  s->prefill(tokens(20));
  const ContextCompression cc = compress_context(*s, tokens(5, 1));  // default min_tokens 32
  EXPECT_FALSE(cc.ran);
  EXPECT_NE(cc.note.find("fewer than the 32"), std::string::npos) << cc.note;
  EXPECT_EQ(total_tokens(s->cache()), 20 * s->cache().config().n_layer * s->cache().config().n_head_kv);
  ContextCompressOptions co;
  co.min_tokens = 0;
  EXPECT_TRUE(compress_context(*s, tokens(5, 1), co).ran);
}

// A press that cannot run on this context (here: query-aware without a question) is a note when
// asked (chat, serve), an error otherwise (run, eval).
TEST_F(ContextQuestionTest, APressThatCannotRunIsANoteOrAnError) {
  auto s = session("snapkv:0.5,query_aware=true");
  s->prefill(tokens(40));
  EXPECT_THROW(compress_context(*s, {}), Error);
  ContextCompressOptions co;
  co.skip_on_error = true;
  const ContextCompression cc = compress_context(*s, {}, co);
  EXPECT_FALSE(cc.ran);
  EXPECT_NE(cc.note.find("query-aware"), std::string::npos) << cc.note;
  EXPECT_EQ(total_tokens(s->cache()), 40 * s->cache().config().n_layer * s->cache().config().n_head_kv);
}

// A follow-up keeps the press's ratio of every position, not of what the earlier turn left.
TEST_F(ContextQuestionTest, AFollowUpKeepsTheRatioOfTheWholeConversation) {
  auto s = session("snapkv:0.5");
  s->prefill(tokens(64));
  ASSERT_TRUE(compress_context(*s, {}).ran);  // 32 per head
  s->prefill(tokens(36, 2));                  // 100 positions, 68 held per head
  ContextCompressOptions co;
  co.follow_up = true;
  const ContextCompression cc = compress_context(*s, {}, co);
  ASSERT_TRUE(cc.ran);
  const auto& cfg = s->cache().config();
  EXPECT_EQ(cc.stats.tokens_after, 50 * cfg.n_layer * cfg.n_head_kv);
}

}  // namespace
}  // namespace kvtrim
