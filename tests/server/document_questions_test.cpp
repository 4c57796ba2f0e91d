// One document, many questions over HTTP on a tiny qwen2 model: the second question over a
// document reuses the compressed document from the slot's cache and does not press it again
// (the report says `reused`, the cache holds what the first compression left — a composition,
// which has no single budget, would otherwise compress the document further with every
// question), and its answer is the one a fresh server gives to that question alone.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tiny_server.h"

namespace kvtrim::server {
namespace {

using nlohmann::json;

class DocumentQuestionsTest : public test_server::TinyServerTest {
 protected:
  void start() {
    ServerOptions so;
    so.n_parallel = 1;
    start_server(so, {}, 1);
  }
  // The document (40 tokens) then a question (5 tokens, the protected tail), greedy.
  json ask(const std::string& press, int question) {
    std::vector<int32_t> p;
    for (int i = 0; i < 40; ++i) p.push_back((i * 31 + 7) % 250);
    for (int i = 0; i < 5; ++i) p.push_back((question * 13 + i * 7 + 100) % 250);
    const json body = {{"prompt", p},
                       {"max_tokens", 4},
                       {"temperature", 0},
                       {"kv_press", press},
                       {"kv_press_protect", 5}};
    auto r = client_->Post("/v1/completions", body.dump(), "application/json");
    EXPECT_TRUE(r);
    if (!r) return json();
    EXPECT_EQ(r->status, 200) << r->body;
    return json::parse(r->body);
  }
};

TEST_F(DocumentQuestionsTest, TheSecondQuestionReusesTheCompressedDocument) {
  for (const char* press : {"snapkv:0.5", "kvcompose:0.5", "kvzip:0.5", "snapkv:0.25+knorm:0.25"}) {
    SCOPED_TRACE(press);
    start();
    const json a = ask(press, 1);
    const json& ca = a["kvtrim"]["compression"];
    ASSERT_TRUE(ca["applied"].get<bool>()) << a.dump();
    EXPECT_FALSE(ca.contains("reused"));
    const json b = ask(press, 2);
    const json& cb = b["kvtrim"]["compression"];
    EXPECT_EQ(b["usage"]["prompt_tokens_details"]["cached_tokens"], 40);
    EXPECT_TRUE(cb.value("reused", false)) << b.dump();
    EXPECT_TRUE(cb["applied"].get<bool>());
    EXPECT_EQ(cb["compressed_tokens_after"], ca["compressed_tokens_after"]);
    EXPECT_EQ(cb["kv_bytes_after"], ca["kv_bytes_after"]);
    EXPECT_EQ(b["kvtrim"]["kv_bytes"], a["kvtrim"]["kv_bytes"])
        << "the document was compressed again";
    TearDown();
    // the same question alone, on a fresh server: the same answer
    start();
    const json fresh = ask(press, 2);
    EXPECT_FALSE(fresh["kvtrim"]["compression"].contains("reused"));
    EXPECT_EQ(fresh["choices"][0]["text"], b["choices"][0]["text"]);
    EXPECT_EQ(fresh["kvtrim"]["kv_bytes"], b["kvtrim"]["kv_bytes"]);
    TearDown();
  }
}

// A context that grew (the conversation went on) or another guard limit is compressed again.
TEST_F(DocumentQuestionsTest, AnotherContextOrGuardIsCompressedAgain) {
  start();
  ASSERT_TRUE(ask("snapkv:0.5", 1)["kvtrim"]["compression"]["applied"].get<bool>());
  std::vector<int32_t> p;
  for (int i = 0; i < 40; ++i) p.push_back((i * 31 + 7) % 250);
  for (int i = 0; i < 10; ++i) p.push_back(60 + i);  // the context now has 10 more tokens
  for (int i = 0; i < 5; ++i) p.push_back(200 + i);
  json body = {{"prompt", p},
               {"max_tokens", 2},
               {"temperature", 0},
               {"kv_press", "snapkv:0.5"},
               {"kv_press_protect", 5}};
  auto r = client_->Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json c = json::parse(r->body)["kvtrim"]["compression"];
  EXPECT_TRUE(c["applied"].get<bool>());
  EXPECT_FALSE(c.contains("reused")) << c.dump();
  // the same context again, with a guard limit the first compression did not have
  body["kv_press_max_loss"] = 0.99;
  r = client_->Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  c = json::parse(r->body)["kvtrim"]["compression"];
  EXPECT_FALSE(c.contains("reused")) << c.dump();
  EXPECT_EQ(c["max_loss"], 0.99);
}

}  // namespace
}  // namespace kvtrim::server
