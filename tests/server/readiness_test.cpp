// Readiness, drain and the routing key over HTTP on a tiny qwen2 model: /health is 503 (with the
// reason and Retry-After) while draining, /livez and /health?live=1 stay 200, a completion sent to
// a draining server is a 503 a balancer retries elsewhere, and every completion echoes its
// conversation key and the replica id (headers and body).
#include <httplib.h>
#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/thread_pool.h"
#include "server/http_server.h"
#include "server/scheduler.h"
#include "test_util.h"
#include "tiny_model.h"

namespace kvtrim::server {
namespace {

using nlohmann::json;

class ReadinessTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(test::temp_dir("readiness"));
    model_ = Model::load(test::write_tiny_model(test::tiny_spec(Arch::kQwen2, 5), *dir_)).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete dir_;
  }
  void SetUp() override {
    ServerOptions so;
    so.n_ctx = 256;
    pool_ = std::make_unique<ThreadPool>(1);
    sched_ = std::make_unique<Scheduler>(*model_, *pool_, so);
    HttpOptions ho;
    ho.port = 0;
    ho.model_id = "tiny";
    ho.replica_id = "r7";
    http_ = std::make_unique<HttpServer>(*sched_, ho);
    http_->bind();
    thread_ = std::thread([this] { http_->serve(); });
    client_ = std::make_unique<httplib::Client>("127.0.0.1", http_->bound_port());
    client_->set_read_timeout(300, 0);  // a hang, not a slow machine
  }
  void TearDown() override {
    http_->stop();
    thread_.join();
    http_.reset();
    sched_.reset();
  }
  httplib::Result chat(const std::string& body, const httplib::Headers& h = {}) {
    return client_->Post("/v1/chat/completions", h, body, "application/json");
  }

  static Model* model_;
  static std::string* dir_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<Scheduler> sched_;
  std::unique_ptr<HttpServer> http_;
  std::unique_ptr<httplib::Client> client_;
  std::thread thread_;
};
Model* ReadinessTest::model_ = nullptr;
std::string* ReadinessTest::dir_ = nullptr;

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
