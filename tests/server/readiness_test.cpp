// Readiness, drain and the routing key over HTTP on a tiny qwen2 model: /health is 503 (with the
// reason and Retry-After) while draining, /livez and /health?live=1 stay 200, a completion sent to
// a draining server is a 503 a balancer retries elsewhere, and every completion echoes its
// conversation key and the replica id (headers and body).
#include <memory>
#include <nlohmann/json.hpp>

#include "tiny_server.h"

namespace kvtrim::server {
namespace {

using nlohmann::json;

class ReadinessTest : public test_server::TinyServerTest {
 protected:
  void SetUp() override {
    HttpOptions ho;
    ho.replica_id = "r7";
    start_server({}, ho, 1);
  }
  httplib::Result chat(const std::string& body, const httplib::Headers& h = {}) {
    return client_->Post("/v1/chat/completions", h, body, "application/json");
  }
};

const char* const kBody = R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"temperature":0})";

TEST_F(ReadinessTest, CompletionsEchoTheKeyAndTheReplica) {
  auto r = chat(kBody, {{"X-Conversation-Id", "conv-9"}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("X-Conversation-Id"), "conv-9");
  EXPECT_EQ(r->get_header_value("X-Kvtrim-Replica"), "r7");
  json j = json::parse(r->body);
  EXPECT_EQ(j["prompt_cache_key"], "conv-9");
  EXPECT_EQ(j["kvtrim"]["conversation_key_source"], "header");
  EXPECT_EQ(j["kvtrim"]["replica"], "r7");
  // no key: a derived one, the same for the next turn of the conversation
  r = chat(kBody);
  ASSERT_EQ(r->status, 200) << r->body;
  const std::string key = r->get_header_value("X-Conversation-Id");
  EXPECT_EQ(key.rfind("auto-", 0), 0u) << key;
  EXPECT_EQ(json::parse(r->body)["prompt_cache_key"], key);
  r = chat(R"({"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"yo"},)"
           R"({"role":"user","content":"more"}],"max_tokens":2,"stream":true})");
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("X-Conversation-Id"), key);
  EXPECT_NE(r->body.find("\"prompt_cache_key\":\"" + key + "\""), std::string::npos) << r->body;
  // a bad key: 400 naming it
  r = chat(kBody, {{"X-Conversation-Id", "two words"}});
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(json::parse(r->body)["error"]["param"], "X-Conversation-Id");
  r = chat(R"({"messages":[{"role":"user","content":"hi"}],"prompt_cache_key":"a"})", {{"X-Conversation-Id", "b"}});
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(json::parse(r->body)["error"]["param"], "prompt_cache_key");
}

TEST_F(ReadinessTest, DrainingIsNotReadyButLive) {
  auto r = client_->Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(json::parse(r->body)["status"], "ok");
  EXPECT_EQ(json::parse(r->body)["replica"], "r7");
  http_->drain();
  EXPECT_TRUE(http_->draining());
  r = client_->Get("/health");
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  json j = json::parse(r->body);
  EXPECT_EQ(j["status"], "draining");
  EXPECT_NE(j["reason"].get<std::string>().find("draining"), std::string::npos);
  EXPECT_EQ(client_->Get("/livez")->status, 200);
  EXPECT_EQ(client_->Get("/health?live=1")->status, 200);
  r = chat(kBody);
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "draining");
}

}  // namespace
}  // namespace kvtrim::server
