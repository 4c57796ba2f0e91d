// The routing key (prompt_cache_key / X-Conversation-Id): taken from the header or the body,
// checked (400 naming it), and derived from a conversation's first messages when absent, the
// same for every later turn of the conversation and different for another conversation.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "request_limits.h"
#include "server/api.h"

namespace kvtrim::server {
namespace {

using nlohmann::json;

using test_api::limits;

CompletionRequest chat_request(const std::string& messages, const std::string& extra = "") {
  return parse_completion_request("{\"messages\":" + messages + extra + "}", Endpoint::kChat, limits());
}

const std::string kTurn1 = R"([{"role":"system","content":"be brief"},{"role":"user","content":"hi"}])";
const std::string kTurn2 =
    R"([{"role":"system","content":"be brief"},{"role":"user","content":"hi"},{"role":"assistant","content":"hello"},)"
    R"({"role":"user","content":"and then?"}])";

// The 400 a key raises (param and message fragment), from the body or the header.
void expect_bad_key(const std::string& extra, const std::string& header, const std::string& param,
                    const std::string& frag) {
  try {
    const CompletionRequest r = chat_request(kTurn1, extra);
    resolve_conversation_key(r, header);
    ADD_FAILURE() << "no error for body key " << extra << " header " << header;
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400) << e.what();
    EXPECT_EQ(e.param(), param) << e.what();
    EXPECT_NE(std::string(e.what()).find(frag), std::string::npos) << e.what();
  }
}

TEST(ConversationKey, HeaderAndBodyMeanTheSame) {
  const CompletionRequest body = chat_request(kTurn1, R"(,"prompt_cache_key":"user-42:conv_7")");
  EXPECT_EQ(body.prompt_cache_key, "user-42:conv_7");
  ConversationKey k = resolve_conversation_key(body, "");
  EXPECT_EQ(k.key, "user-42:conv_7");
  EXPECT_EQ(k.source, "body");
  k = resolve_conversation_key(chat_request(kTurn1), "user-42:conv_7");
  EXPECT_EQ(k.key, "user-42:conv_7");
  EXPECT_EQ(k.source, "header");
  k = resolve_conversation_key(body, "user-42:conv_7");  // both, equal: fine
  EXPECT_EQ(k.source, "header");
}

TEST(ConversationKey, BadKeysAre400s) {
  expect_bad_key(R"(,"prompt_cache_key":"")", "", "prompt_cache_key", "must not be empty");
  expect_bad_key(R"(,"prompt_cache_key":7)", "", "prompt_cache_key", "must be a string");
  expect_bad_key(R"(,"prompt_cache_key":"a b")", "", "prompt_cache_key", "0x20");
  expect_bad_key(R"(,"prompt_cache_key":"caf\u00e9")", "", "prompt_cache_key", "only letters");
  expect_bad_key(",\"prompt_cache_key\":\"" + std::string(kMaxConversationKey + 1, 'k') + "\"", "", "prompt_cache_key",
                 "at most 128");
  expect_bad_key("", "x\"y", "X-Conversation-Id", "0x22");
  expect_bad_key("", std::string(300, 'k'), "X-Conversation-Id", "300 characters");
  expect_bad_key(R"(,"prompt_cache_key":"one")", "two", "prompt_cache_key", "different conversations");
  // the longest allowed key passes
  const std::string longest(kMaxConversationKey, 'k');
  EXPECT_EQ(resolve_conversation_key(chat_request(kTurn1), longest).key, longest);
}

TEST(ConversationKey, DerivedKeyFollowsTheConversation) {
  const ConversationKey k1 = resolve_conversation_key(chat_request(kTurn1), "");
  EXPECT_EQ(k1.source, "derived");
  EXPECT_EQ(k1.key.rfind("auto-", 0), 0u);
  EXPECT_EQ(k1.key.size(), 5u + 16u);
  // a later turn of the same conversation: the same key (the system + first user message)
  EXPECT_EQ(resolve_conversation_key(chat_request(kTurn2), "").key, k1.key);
  // another first question, another system prompt: another key
  EXPECT_NE(resolve_conversation_key(chat_request(R"([{"role":"system","content":"be brief"},{"role":"user","content":"yo"}])"), "")
                .key,
            k1.key);
  EXPECT_NE(resolve_conversation_key(chat_request(R"([{"role":"system","content":"be long"},{"role":"user","content":"hi"}])"), "")
                .key,
            k1.key);
  // text moved between the system and the user message: another key
  EXPECT_NE(resolve_conversation_key(chat_request(R"([{"role":"system","content":"be brief h"},{"role":"user","content":"i"}])"), "")
                .key,
            k1.key);
  // completions: the prompt's start; a prompt that extends it keeps the key
  const std::string start(64, 'a');
  const auto comp = [](const std::string& p) {
    return parse_completion_request(json{{"prompt", p}}.dump(), Endpoint::kCompletion, limits());
  };
  EXPECT_EQ(resolve_conversation_key(comp(start), "").key, resolve_conversation_key(comp(start + " more"), "").key);
  EXPECT_NE(resolve_conversation_key(comp(start), "").key, resolve_conversation_key(comp("b" + start), "").key);
  // the derived key is the same as a client sending it back: it is a valid key
  EXPECT_EQ(resolve_conversation_key(chat_request(kTurn2), k1.key).source, "header");
}

TEST(ConversationKey, EchoedInTheResponse) {
  CompletionStats st;
  st.conversation = {"conv-1", "header"};
  st.replica = "r1";
  const json j = json::parse(completion_body(Endpoint::kChat, "id", 0, "m", "hi", "stop", st));
  EXPECT_EQ(j["prompt_cache_key"], "conv-1");
  EXPECT_EQ(j["kvtrim"]["conversation_key"], "conv-1");
  EXPECT_EQ(j["kvtrim"]["conversation_key_source"], "header");
  EXPECT_EQ(j["kvtrim"]["replica"], "r1");
  EXPECT_TRUE(j["usage"]["prompt_tokens_details"].contains("cached_tokens"));
  const std::string chunk = stream_chunk(Endpoint::kChat, "id", 0, "m", "", false, "stop", &st);
  EXPECT_NE(chunk.find("\"prompt_cache_key\":\"conv-1\""), std::string::npos) << chunk;
  // no key (a request served before the HTTP side labelled it): no field
  EXPECT_FALSE(json::parse(completion_body(Endpoint::kChat, "id", 0, "m", "hi", "stop", CompletionStats{}))
                   .contains("prompt_cache_key"));
}

}  // namespace
}  // namespace kvtrim::server
