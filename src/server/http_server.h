// kvtrim serve's HTTP front: the OpenAI-compatible routes (POST /v1/chat/completions,
// /v1/completions with SSE streaming; GET /v1/models), /health (readiness: 503 while draining or
// full) and /livez (liveness), /metrics (Prometheus),
// /v1/kvtrim/slots (the caches, per layer and head) and the web page at /. Requests become
// scheduler jobs; an HTTP thread only waits on its job's events, so a slow or vanished client
// never holds up the others (a stream whose client is gone cancels its job).
#pragma once
#include <memory>
#include <string>

namespace kvtrim::server {

class Scheduler;

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8080;           // 0 = any free port (bound_port() tells which)
  std::string model_id;      // "model" reported by /v1/models and in responses
  int n_http_threads = 0;    // 0 = 2 * slots + 8 (each streaming client holds one)
  size_t max_body = 8 << 20;  // request bodies past this get a 413
  int write_timeout_s = 10;   // a client that does not read its stream for this long is dropped
  std::string replica_id;     // echoed in X-Kvtrim-Replica and the kvtrim object ("" = none)
};

class HttpServer {
 public:
  HttpServer(Scheduler& sched, HttpOptions opt);
  ~HttpServer();
  // Binds (throws Error naming host:port if it cannot) ...
  void bind();
  int bound_port() const;
  // ... and serves until stop() (from another thread or a signal watcher).
  void serve();
  void stop();
  // Draining (the first SIGTERM): /health answers 503 so that a balancer sends no new work here,
  // and new completion requests get a 503 with Retry-After (a balancer retries them on another
  // replica); requests already admitted run to their end. /livez still answers 200.
  void drain();
  void set_replica_id(const std::string& id);
  bool draining() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The page served at / (src/server/web/index.html, embedded at build time).
extern const char* const kIndexHtml;

}  // namespace kvtrim::server
