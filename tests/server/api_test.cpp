// The OpenAI wire format: every malformed or out-of-range field is a 400 naming it; the
// response JSON has the fields clients read.
#include "server/api.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "request_limits.h"

namespace kvtrim::server {
namespace {

using nlohmann::json;

using test_api::limits;

// The ApiError a body raises (status, param, message fragment).
void expect_bad(const std::string& body, Endpoint ep, int status, const std::string& param, const std::string& frag) {
  try {
    parse_completion_request(body, ep, limits());
    ADD_FAILURE() << "no error for " << body;
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), status) << body << ": " << e.what();
    EXPECT_EQ(e.param(), param) << body << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find(frag), std::string::npos) << body << ": " << e.what();
  }
}

TEST(Api, ParsesAChatRequest) {
  const auto r = parse_completion_request(
      R"({"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"}]}],
          "max_tokens":12,"temperature":0,"top_p":0.5,"seed":7,"stop":["\n\n","END"],"stream":true,
          "stream_options":{"include_usage":true},"kv_press":"snapkv:0.5","kv_cache_type":"q8_0","frequency_penalty":0})",
      Endpoint::kChat, limits());
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[1].content, "hi");
  EXPECT_EQ(*r.max_tokens, 12);
  EXPECT_EQ(r.sampling.temperature, 0.f);
  EXPECT_EQ(r.sampling.top_p, 0.5f);
  EXPECT_EQ(r.sampling.seed, 7u);
  EXPECT_TRUE(r.has_seed);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n\n", "END"}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  ASSERT_TRUE(r.cache.press.has_value());
  EXPECT_EQ(r.cache.press->rfind("snapkv", 0), 0u);  // canonical spec
  EXPECT_EQ(*r.cache.k, KvDtype::kQ8);
  EXPECT_EQ(*r.cache.v, KvDtype::kQ8);
}

TEST(Api, ChatTemplateKwargsReachTheTemplate) {
  const auto r = parse_completion_request(
      R"({"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"enable_thinking":false,"x":[1,"a"]}})",
      Endpoint::kChat, limits());
  EXPECT_EQ(r.chat.vars.dump(), R"({"enable_thinking":false,"x":[1,"a"]})");  // key order kept
  EXPECT_TRUE(r.chat.tools.is_null());
  expect_bad(R"({"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":[1]})", Endpoint::kChat, 400,
             "chat_template_kwargs", "must be an object");
  expect_bad(R"({"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"add_generation_prompt":false}})",
             Endpoint::kChat, 400, "chat_template_kwargs", "add_generation_prompt is set by the server");
}

TEST(Api, OpenAiDefaultsAndCompletionPrompts) {
  auto r = parse_completion_request(R"({"prompt":"abc"})", Endpoint::kCompletion, limits());
  EXPECT_EQ(r.prompt, "abc");
  EXPECT_FALSE(r.max_tokens.has_value());
  EXPECT_EQ(r.sampling.temperature, 1.f);
  EXPECT_EQ(r.sampling.top_p, 1.f);
  EXPECT_EQ(r.sampling.top_k, 0);
  EXPECT_FALSE(r.cache.press.has_value());
  r = parse_completion_request(R"({"prompt":[1,2,3],"kv_press":"none"})", Endpoint::kCompletion, limits());
  EXPECT_TRUE(r.has_prompt_tokens);
  EXPECT_EQ(r.prompt_tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(*r.cache.press, "");
}

TEST(Api, EveryBadFieldIsA400NamingIt) {
  const Endpoint C = Endpoint::kChat, P = Endpoint::kCompletion;
  expect_bad("{\"messages\": [", C, 400, "", "malformed JSON");
  expect_bad("", C, 400, "", "malformed JSON");
  expect_bad("5e0555", C, 400, "", "malformed JSON");  // a number past double (found by fuzz/http_request)
  expect_bad("{\"messages\": [], \"max_tokens\": 1e999}", C, 400, "", "malformed JSON");
  expect_bad("[1,2]", C, 400, "", "JSON object");
  expect_bad("{}", C, 400, "messages", "required");
  expect_bad(R"({"messages":[]})", C, 400, "messages", "non-empty");
  expect_bad(R"({"messages":"hi"})", C, 400, "messages", "non-empty array");
  expect_bad(R"({"messages":[{"role":"robot","content":"x"}]})", C, 400, "messages[0].role", "robot");
  expect_bad(R"({"messages":[{"role":"user"}]})", C, 400, "messages[0].content", "required");
  expect_bad(R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})", C, 400, "messages[0].content", "text");
  expect_bad(R"({"messages":[{"role":"user","content":5}]})", C, 400, "messages[0].content", "string");
  const std::string m = R"("messages":[{"role":"user","content":"x"}])";
  expect_bad("{" + m + R"(,"max_tokens":"ten"})", C, 400, "max_tokens", "integer");
  expect_bad("{" + m + R"(,"max_tokens":0})", C, 400, "max_tokens", "[1,");
  expect_bad("{" + m + R"(,"max_tokens":1000000000})", C, 400, "max_tokens", "context of 256");
  expect_bad("{" + m + R"(,"max_tokens":18446744073709551615})", C, 400, "max_tokens", "out of range");
  expect_bad("{" + m + R"(,"max_tokens":2.5})", C, 400, "max_tokens", "integer");
  expect_bad("{" + m + R"(,"temperature":-1})", C, 400, "temperature", "[0, 2]");
  expect_bad("{" + m + R"(,"temperature":"hot"})", C, 400, "temperature", "number");
  expect_bad("{" + m + R"(,"top_p":0})", C, 400, "top_p", "(0, 1]");
  expect_bad("{" + m + R"(,"n":2})", C, 400, "n", "");
  expect_bad("{" + m + R"(,"stop":[1]})", C, 400, "stop", "strings");
  expect_bad("{" + m + R"(,"stop":["a","b","c","d","e"]})", C, 400, "stop", "at most 4");
  expect_bad("{" + m + R"(,"stop":""})", C, 400, "stop", "empty");
  expect_bad("{" + m + R"(,"stream":"yes"})", C, 400, "stream", "true or false");
  expect_bad("{" + m + R"(,"kv_press":"nosuchpress:0.5"})", C, 400, "kv_press", "nosuchpress");
  expect_bad("{" + m + R"(,"kv_press":"snapkv:ratio=2"})", C, 400, "kv_press", "ratio");
  expect_bad("{" + m + R"(,"kv_press":"snapkv:colour=red"})", C, 400, "kv_press", "colour");
  expect_bad("{" + m + R"(,"kv_press":7})", C, 400, "kv_press", "string");
  expect_bad("{" + m + R"(,"kv_cache_type":"q3"})", C, 400, "kv_cache_type", "q3");
  expect_bad("{" + m + R"(,"kv_press_max_loss":-0.1})", C, 400, "kv_press_max_loss", "[0, 1]");
  expect_bad("{" + m + R"(,"kv_press_max_loss":1.5})", C, 400, "kv_press_max_loss", "[0, 1]");
  expect_bad("{" + m + R"(,"kv_press_max_loss":"0.1"})", C, 400, "kv_press_max_loss", "number");
  expect_bad("{" + m + R"(,"tools":[{}]})", C, 400, "tools", "not supported");
  expect_bad(R"({"prompt":5})", P, 400, "prompt", "string or an array");
  expect_bad(R"({"prompt":[1,-2]})", P, 400, "prompt", "non-negative");
  expect_bad(R"({"prompt":["a","b"]})", P, 400, "prompt", "one prompt");
}

TEST(Api, ErrorBodyIsAnOpenAiErrorObject) {
  const json j = json::parse(error_body(ApiError(400, "bad thing", "max_tokens")));
  EXPECT_EQ(j["error"]["message"], "bad thing");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "max_tokens");
  const json k = json::parse(error_body(ApiError(503, "full", "", "kv_budget_exceeded")));
  EXPECT_EQ(k["error"]["code"], "kv_budget_exceeded");
  EXPECT_TRUE(k["error"]["param"].is_null());
}

TEST(Api, CompletionAndChunkJson) {
  CompletionStats st;
  st.prompt_tokens = 5;
  st.completion_tokens = 3;
  st.kv_bytes = 100;
  st.slot = 1;
  json c = json::parse(completion_body(Endpoint::kChat, "id1", 7, "m", "hey", "stop", st));
  EXPECT_EQ(c["object"], "chat.completion");
  EXPECT_EQ(c["choices"][0]["message"]["content"], "hey");
  EXPECT_EQ(c["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(c["usage"]["total_tokens"], 8);
  EXPECT_EQ(c["kvtrim"]["slot"], 1);
  // invalid UTF-8 in model text is replaced, never an exception
  c = json::parse(completion_body(Endpoint::kCompletion, "id2", 7, "m", "a\xF0\x9F", "length", st));
  EXPECT_EQ(c["object"], "text_completion");
  const std::string ev = stream_chunk(Endpoint::kChat, "id1", 7, "m", "he", true, "", nullptr);
  ASSERT_EQ(ev.rfind("data: ", 0), 0u);
  ASSERT_EQ(ev.substr(ev.size() - 2), "\n\n");
  const json d = json::parse(ev.substr(6));
  EXPECT_EQ(d["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(d["choices"][0]["delta"]["content"], "he");
  EXPECT_TRUE(d["choices"][0]["finish_reason"].is_null());
  const json last = json::parse(stream_chunk(Endpoint::kChat, "id1", 7, "m", "", false, "length", &st).substr(6));
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(last["usage"]["completion_tokens"], 3);
}

// kv_press_max_loss reaches the request; the compression object reports the loss estimate and,
// with a guard, every attempt.
TEST(Api, LossGuardFieldsAndCompressionJson) {
  const auto r = parse_completion_request(
      R"({"messages":[{"role":"user","content":"x"}],"kv_press":"snapkv:0.5","kv_press_max_loss":0.25})",
      Endpoint::kChat, limits());
  ASSERT_TRUE(r.cache.max_loss.has_value());
  EXPECT_DOUBLE_EQ(*r.cache.max_loss, 0.25);
  EXPECT_FALSE(parse_completion_request(R"({"messages":[{"role":"user","content":"x"}]})", Endpoint::kChat, limits())
                   .cache.max_loss.has_value());

  CompletionStats st;
  st.compression.requested = true;
  st.compression.applied = true;
  st.compression.press = "snapkv:ratio=0.5";
  st.compression.context_tokens = 100;
  st.compression.protected_tokens = 12;
  // no guard: the estimate, no attempts
  PressLoss l;
  l.measured = true;
  l.n_queries = 32;
  l.rel_err = 0.2;
  l.rel_err_max = 0.4;
  l.max_layer = 1;
  l.evicted_mass = 0.3;
  l.tokens_removed = 50;
  st.compression.loss = l;
  st.compression.attempts = {CompressAttempt{"snapkv:ratio=0.5", 0.5, l, true}};
  json c = kvtrim_json(st)["compression"];
  EXPECT_EQ(c["protected_tokens"], 12);
  EXPECT_DOUBLE_EQ(c["loss"]["estimate"].get<double>(), 0.2);
  EXPECT_DOUBLE_EQ(c["loss"]["max_layer_estimate"].get<double>(), 0.4);
  EXPECT_EQ(c["loss"]["max_layer"], 1);
  EXPECT_EQ(c["loss"]["window_queries"], 32);
  EXPECT_EQ(c["loss"]["queries"], "window");
  EXPECT_DOUBLE_EQ(c["loss"]["evicted_attention_mass"].get<double>(), 0.3);
  EXPECT_FALSE(c.contains("attempts"));
  EXPECT_FALSE(c.contains("max_loss"));
  // a guard that refused the press and kept half its ratio
  PressLoss l2 = l;
  l2.rel_err = 0.1;
  st.compression.max_loss = 0.15;
  st.compression.loss = l2;
  st.compression.attempts = {CompressAttempt{"snapkv:ratio=0.5", 0.5, l, false},
                             CompressAttempt{"snapkv:ratio=0.25", 0.25, l2, true}};
  c = kvtrim_json(st)["compression"];
  EXPECT_DOUBLE_EQ(c["max_loss"].get<double>(), 0.15);
  ASSERT_EQ(c["attempts"].size(), 2u);
  EXPECT_EQ(c["attempts"][0]["press"], "snapkv:ratio=0.5");
  EXPECT_EQ(c["attempts"][0]["accepted"], false);
  EXPECT_DOUBLE_EQ(c["attempts"][1]["ratio"].get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(c["attempts"][1]["loss"]["estimate"].get<double>(), 0.1);
  EXPECT_EQ(c["attempts"][1]["accepted"], true);
  // not measured (--no-loss-estimate): no loss object
  st.compression.loss = PressLoss{};
  st.compression.max_loss = 1;
  st.compression.attempts.clear();
  EXPECT_FALSE(kvtrim_json(st)["compression"].contains("loss"));
}

}  // namespace
}  // namespace kvtrim::server
