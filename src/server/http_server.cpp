#include "server/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "kv/kv_type.h"
#include "model/model.h"
#include "server/api.h"
#include "server/metrics.h"
#include "server/scheduler.h"

namespace kvtrim::server {

using nlohmann::json;

namespace {

// The web page, with the cache-type choices of kv_type.h's table (each type by its canonical
// name, which the API accepts as its aliases) in place of the page's marker.
const std::string& index_page() {
  static const std::string page = [] {
    std::string html = kIndexHtml;
    const std::string marker =
        "<!-- kv cache types: filled in by the server from its table of storage types -->";
    std::string options;
    for (const KvTypeInfo& t : kv_types())
      options += strprintf("<option value=\"%s\">%s</option>", t.name, t.name);
    const size_t at = html.find(marker);
    if (at != std::string::npos) html.replace(at, marker.size(), options);
    return html;
  }();
  return page;
}

}  // namespace

struct HttpServer::Impl {
  Scheduler& sched;
  HttpOptions opt;
  httplib::Server svr;
  HttpCounters counters;
  std::atomic<uint64_t> next_id{0};
  std::atomic<bool> draining{false};
  int port = -1;
  int64_t started = 0;

  Impl(Scheduler& s, HttpOptions o) : sched(s), opt(std::move(o)) {}

  void send_error(httplib::Response& res, const std::string& endpoint, const ApiError& e) {
    res.status = e.status();
    if (e.status() == 503) res.set_header("Retry-After", "1");  // full, draining: another replica, or later
    res.set_content(error_body(e), "application/json");
    counters.count(endpoint, e.status());
  }

  std::string new_id(Endpoint ep) {
    return strprintf("%s-%llx%04llx", ep == Endpoint::kChat ? "chatcmpl" : "cmpl",
                     static_cast<unsigned long long>(started), static_cast<unsigned long long>(next_id++));
  }

  void completion(const httplib::Request& req, httplib::Response& res, Endpoint ep) {
    const std::string endpoint = ep == Endpoint::kChat ? "/v1/chat/completions" : "/v1/completions";
    std::shared_ptr<Job> job;
    CompletionRequest r;
    ConversationKey key;
    try {
      if (draining)
        throw ApiError(503, "this replica is draining (stopping): send the request to another one", {}, "draining");
      RequestLimits lim;
      lim.n_ctx = sched.options().n_ctx;
      lim.default_max_tokens = sched.options().default_max_tokens;
      r = parse_completion_request(req.body, ep, lim);
      key = resolve_conversation_key(r, req.get_header_value("X-Conversation-Id"));
      job = sched.submit(r);
    } catch (const ApiError& e) {
      return send_error(res, endpoint, e);
    } catch (const std::exception& e) {
      return send_error(res, endpoint, ApiError(500, e.what()));
    }
    const std::string id = new_id(ep);
    const int64_t created = static_cast<int64_t>(std::time(nullptr));
    const std::string model = opt.model_id;
    // the key served and this replica, in headers (a balancer or client reads them without the
    // body) and in the final event's kvtrim object
    res.set_header("X-Conversation-Id", key.key);
    if (!opt.replica_id.empty()) res.set_header("X-Kvtrim-Replica", opt.replica_id);
    const std::string replica = opt.replica_id;
    const auto label = [key, replica](JobEvent& e) {
      e.stats.conversation = key;
      e.stats.replica = replica;
    };

    if (!r.stream) {
      std::string text;
      JobEvent e;
      for (;;) {
        if (!job->next(&e, 1000)) continue;
        if (e.kind == JobEvent::Kind::kText) {
          text += e.text;
        } else if (e.kind == JobEvent::Kind::kDone) {
          label(e);
          res.set_content(completion_body(ep, id, created, model, text, e.finish_reason, e.stats), "application/json");
          counters.count(endpoint, 200);
          return;
        } else {
          return send_error(res, endpoint, ApiError(e.status, e.message));
        }
      }
    }
    // Streaming: the first event decides the status (an error before any text is a plain
    // error response); after that, events go out as SSE chunks.
    JobEvent first;
    while (!job->next(&first, 1000)) {
    }
    if (first.kind == JobEvent::Kind::kError) return send_error(res, endpoint, ApiError(first.status, first.message));
    counters.count(endpoint, 200);
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    // the first event, taken above to choose the status, goes out first
    auto pending = std::make_shared<std::optional<JobEvent>>(std::move(first));
    auto sent_first = std::make_shared<bool>(false);
    const bool include_usage = r.include_usage;
    res.set_chunked_content_provider(
        "text/event-stream",
        [job, pending, sent_first, ep, id, created, model, include_usage, label](size_t, httplib::DataSink& sink) {
          double last_write = now_seconds();
          for (;;) {
            JobEvent e;
            if (pending->has_value()) {
              e = std::move(**pending);
              pending->reset();
            } else if (!job->next(&e, 200)) {
              // nothing new: a comment line now and then finds a client that went away
              if (now_seconds() - last_write > 2) {
                if (!sink.write(": keep-alive\n\n", 14)) {
                  job->cancel();
                  return false;
                }
                last_write = now_seconds();
              }
              continue;
            }
            std::string out;
            bool end = false;
            if (e.kind == JobEvent::Kind::kText) {
              out = stream_chunk(ep, id, created, model, e.text, !*sent_first, "", nullptr);
              *sent_first = true;
            } else if (e.kind == JobEvent::Kind::kDone) {
              label(e);
              out = stream_chunk(ep, id, created, model, "", !*sent_first, e.finish_reason, &e.stats);
              if (include_usage) {  // OpenAI's separate usage chunk (empty choices)
                json u = {{"id", id}, {"object", ep == Endpoint::kChat ? "chat.completion.chunk" : "text_completion"},
                          {"created", created}, {"model", model}, {"choices", json::array()},
                          {"usage", usage_json(e.stats)}};
                out += "data: " + u.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
              }
              out += "data: [DONE]\n\n";
              end = true;
            } else {
              out = stream_error_event(ApiError(e.status, e.message)) + "data: [DONE]\n\n";
              end = true;
            }
            if (!sink.write(out.data(), out.size())) {
              job->cancel();
              return false;
            }
            last_write = now_seconds();
            if (end) {
              sink.done();
              return true;
            }
          }
        },
        [job](bool success) {
          if (!success) job->cancel();  // the connection ended before the stream did
        });
  }

  void livez(httplib::Response& r, const char* endpoint) {
    r.set_content(json{{"status", "alive"}, {"draining", draining.load()}}.dump(), "application/json");
    counters.count(endpoint, 200);
  }

  json slots_json() const {
    const SchedulerStats st = sched.stats();
    const auto& hp = sched.model().hparams();
    json slots = json::array();
    size_t held = 0;
    for (const SlotView& v : st.slots) {
      held += v.bytes;
      json layers = json::array();
      for (size_t il = 0; il < v.layer_bytes.size(); ++il) {
        json tok = json::array(), hb = json::array();
        for (int ih = 0; ih < hp.n_head_kv; ++ih) {
          const size_t i = il * static_cast<size_t>(hp.n_head_kv) + static_cast<size_t>(ih);
          tok.push_back(i < v.head_tokens.size() ? v.head_tokens[i] : 0);
          hb.push_back(i < v.head_bytes.size() ? v.head_bytes[i] : 0);
        }
        layers.push_back({{"bytes", v.layer_bytes[il]}, {"tokens", tok}, {"head_bytes", hb}});
      }
      slots.push_back({{"id", v.id}, {"state", v.state}, {"n_past", v.n_past}, {"press", v.press},
                       {"kv_cache_type", v.kv_cache_type}, {"bytes", v.bytes}, {"bytes_dense", v.bytes_dense},
                       {"reserved", v.reserved}, {"layers", layers}});
    }
    return {{"model", opt.model_id},         {"n_layer", hp.n_layer},
            {"n_head_kv", hp.n_head_kv},     {"budget_bytes", sched.options().kv_budget},
            {"held_bytes", held},            {"default_press", sched.options().press},
            {"pressure_press", sched.options().pressure_press},
            {"queue_length", st.queue_length}, {"slots", slots}};
  }

  void routes() {
    svr.Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& r) { completion(q, r, Endpoint::kChat); });
    svr.Post("/chat/completions", [this](const httplib::Request& q, httplib::Response& r) { completion(q, r, Endpoint::kChat); });
    svr.Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& r) { completion(q, r, Endpoint::kCompletion); });
    svr.Post("/completions", [this](const httplib::Request& q, httplib::Response& r) { completion(q, r, Endpoint::kCompletion); });
    svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& r) {
      r.set_content(models_body(opt.model_id, started, sched.options().n_ctx), "application/json");
      counters.count("/v1/models", 200);
    });
    // Readiness: 200 while a new conversation would be taken; 503 with the reason while draining
    // or full (a balancer's health check then sends new work elsewhere). Liveness (the process
    // serves at all): /livez or /health?live=1, 200 even while draining or full.
    svr.Get("/health", [this](const httplib::Request& q, httplib::Response& r) {
      if (q.has_param("live")) return livez(r, "/health");
      const SchedulerStats st = sched.stats();
      int idle = 0;
      for (const SlotView& v : st.slots) idle += v.state == "idle" || v.state == "empty";
      std::string reason;
      const bool draining_now = draining;
      const bool ready = !draining_now && sched.can_admit_new(&reason);
      if (draining_now) reason = "draining: the server is stopping; running requests finish";
      json body = {{"status", ready ? "ok" : draining_now ? "draining" : "full"},
                   {"slots_idle", idle},
                   {"slots_processing", static_cast<int>(st.slots.size()) - idle},
                   {"queue_length", st.queue_length},
                   {"kv_bytes_reserved_active", st.kv_bytes_reserved_active},
                   {"kv_budget_bytes", sched.options().kv_budget}};
      if (!opt.replica_id.empty()) body["replica"] = opt.replica_id;
      if (!ready) {
        body["reason"] = reason;
        r.status = 503;
        r.set_header("Retry-After", "1");
      }
      r.set_content(body.dump(), "application/json");
      counters.count("/health", r.status);
    });
    svr.Get("/livez", [this](const httplib::Request&, httplib::Response& r) { livez(r, "/livez"); });
    svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& r) {
      r.set_content(render_metrics(sched.stats(), sched.options(), counters.snapshot()), "text/plain; version=0.0.4");
      counters.count("/metrics", 200);
    });
    svr.Get("/v1/kvtrim/slots", [this](const httplib::Request&, httplib::Response& r) {
      r.set_content(slots_json().dump(), "application/json");
      counters.count("/v1/kvtrim/slots", 200);
    });
    svr.Get("/", [this](const httplib::Request&, httplib::Response& r) {
      r.set_content(index_page(), "text/html; charset=utf-8");
      counters.count("/", 200);
    });
    // Anything else, and errors httplib produces itself (413, 400 of a broken request line):
    // an OpenAI error object instead of an empty body.
    svr.set_error_handler([this](const httplib::Request& q, httplib::Response& r) {
      if (!r.body.empty()) return;
      std::string msg;
      if (r.status == 404) msg = strprintf("no route for %s %s", q.method.c_str(), q.path.c_str());
      else if (r.status == 413) msg = strprintf("the request body exceeds %zu bytes", opt.max_body);
      else if (r.status == 405) msg = strprintf("method %s not allowed on %s", q.method.c_str(), q.path.c_str());
      else msg = strprintf("HTTP error %d", r.status);
      r.set_content(error_body(r.status, msg), "application/json");
      counters.count("other", r.status);
    });
    svr.set_exception_handler([this](const httplib::Request&, httplib::Response& r, std::exception_ptr ep) {
      std::string msg = "internal error";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        msg = e.what();
      } catch (...) {
      }
      r.status = 500;
      r.set_content(error_body(500, msg), "application/json");
      counters.count("exception", 500);
    });
  }
};

HttpServer::HttpServer(Scheduler& sched, HttpOptions opt) : impl_(std::make_unique<Impl>(sched, std::move(opt))) {
  Impl& m = *impl_;
  m.started = static_cast<int64_t>(std::time(nullptr));
  const int n_threads = m.opt.n_http_threads > 0 ? m.opt.n_http_threads : 2 * sched.options().n_parallel + 8;
  m.svr.new_task_queue = [n_threads] { return new httplib::ThreadPool(static_cast<size_t>(n_threads)); };
  m.svr.set_payload_max_length(m.opt.max_body);
  m.svr.set_write_timeout(m.opt.write_timeout_s, 0);
  m.svr.set_read_timeout(10, 0);
  // SO_REUSEADDR only: cpp-httplib's default adds SO_REUSEPORT, under which a second server bound
  // to a port in use succeeds and the kernel splits the connections between the two processes
  // (each with its own conversations) instead of the second one failing to start.
  m.svr.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, reinterpret_cast<const void*>(&yes), sizeof(yes));
  });
  m.routes();
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::bind() {
  Impl& m = *impl_;
  if (m.opt.port == 0) {
    m.port = m.svr.bind_to_any_port(m.opt.host);
    KVTRIM_CHECK(m.port > 0, "cannot bind %s on any port", m.opt.host.c_str());
  } else {
    KVTRIM_CHECK(m.opt.port > 0 && m.opt.port < 65536, "--port must be in [1, 65535] (got %d)", m.opt.port);
    KVTRIM_CHECK(m.svr.bind_to_port(m.opt.host, m.opt.port), "cannot bind %s:%d (in use, or not an address of this machine)",
                 m.opt.host.c_str(), m.opt.port);
    m.port = m.opt.port;
  }
}

int HttpServer::bound_port() const { return impl_->port; }

void HttpServer::serve() { impl_->svr.listen_after_bind(); }

void HttpServer::drain() { impl_->draining = true; }

void HttpServer::set_replica_id(const std::string& id) { impl_->opt.replica_id = id; }  // before serve()

bool HttpServer::draining() const { return impl_->draining; }

void HttpServer::stop() {
  if (impl_->svr.is_running()) impl_->svr.stop();
}

}  // namespace kvtrim::server
