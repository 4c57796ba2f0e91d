// A kvtrim serve on a tiny qwen2 model (ChatML template) for the HTTP tests: the model written
// once per test suite, an HttpServer over a Scheduler started on a free loopback port, and
// httplib's client talking to it.
#pragma once
#include <httplib.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>

#include "core/thread_pool.h"
#include "server/http_server.h"
#include "server/scheduler.h"
#include "test_util.h"
#include "tiny_model.h"

namespace kvtrim::server::test_server {

class TinyServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(test::temp_dir("server"));
    model_ = Model::load(test::write_tiny_model(test::tiny_spec(Arch::kQwen2, 5), *dir_)).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete dir_;
  }
  // Starts the server (n_ctx 256, model id "tiny") with `threads` pool threads; returns when it
  // listens (bind() has run: connections queue until serve() takes them).
  void start_server(ServerOptions so, HttpOptions ho, int threads) {
    so.n_ctx = 256;
    pool_ = std::make_unique<ThreadPool>(threads);
    sched_ = std::make_unique<Scheduler>(*model_, *pool_, so);
    ho.port = 0;
    ho.model_id = "tiny";
    http_ = std::make_unique<HttpServer>(*sched_, ho);
    http_->bind();
    thread_ = std::thread([this] { http_->serve(); });
    client_ = std::make_unique<httplib::Client>("127.0.0.1", http_->bound_port());
    client_->set_read_timeout(300, 0);  // a hang, not a slow machine
  }
  void TearDown() override {
    if (http_) http_->stop();
    if (thread_.joinable()) thread_.join();
    http_.reset();
    sched_.reset();
  }

  static inline Model* model_ = nullptr;
  static inline std::string* dir_ = nullptr;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<Scheduler> sched_;
  std::unique_ptr<HttpServer> http_;
  std::unique_ptr<httplib::Client> client_;
  std::thread thread_;
};

}  // namespace kvtrim::server::test_server
