// kvtrim serve: the OpenAI-compatible server (src/server/): slots with continuous batching, a
// KV memory budget enforced with compression, conversations that keep their cache, /metrics,
// and a web page showing the caches. Stops cleanly on SIGINT / SIGTERM.
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "cli.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/thread_pool.h"
#include "server/http_server.h"
#include "server/scheduler.h"

namespace kvtrim::cli {

namespace {

struct ServeOptions {
  CommonOptions common;
  std::string host = "127.0.0.1";
  int port = 8080;
  int parallel = 4;
  std::string kv_budget;
  std::string press, pressure_press;
  int64_t press_min_tokens = 32;
  PressOptions guard;  // --press-max-loss, --no-loss-estimate (its other fields unused)
  int queue = 64;
  int n_predict = 256;
  int http_threads = 0;
  std::string alias;
  std::string replica_id;
};

}  // namespace


namespace {

// The stop signals reach a watcher thread through a pipe: the handler (any thread may run it:
// threads a library started before main, OpenBLAS's, do not block them) only writes the signal's
// number. Installing a handler also undoes an inherited SIG_IGN: a shell script's `kvtrim serve &`
// starts with SIGINT ignored, and a stop signal must stop the server cleanly from any parent.
int g_stop_pipe[2] = {-1, -1};

extern "C" void on_stop_signal(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  [[maybe_unused]] const ssize_t w = write(g_stop_pipe[1], &b, 1);
  errno = saved;
}

// Installs on_stop_signal for SIGINT and SIGTERM while it lives; wait() returns the signal's number,
// or 0 after wake().
class StopSignals {
 public:
  StopSignals() {
    KVTRIM_CHECK(pipe(g_stop_pipe) == 0, "serve: cannot create the signal pipe: %s", std::strerror(errno));
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (int sig : {SIGINT, SIGTERM}) sigaction(sig, &sa, nullptr);
  }
  ~StopSignals() {
    struct sigaction sa {};
    sa.sa_handler = SIG_DFL;
    sigemptyset(&sa.sa_mask);
    for (int sig : {SIGINT, SIGTERM}) sigaction(sig, &sa, nullptr);
    close(g_stop_pipe[0]);
    close(g_stop_pipe[1]);
    g_stop_pipe[0] = g_stop_pipe[1] = -1;
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  // timeout_ms < 0: until a signal; else -1 when none came within it
  int wait(int timeout_ms = -1) {
    unsigned char b = 0;
    for (;;) {
      if (timeout_ms >= 0) {
        pollfd p{g_stop_pipe[0], POLLIN, 0};
        const int n = poll(&p, 1, timeout_ms);
        if (n < 0 && errno == EINTR) continue;
        if (n == 0) return -1;
      }
      const ssize_t r = read(g_stop_pipe[0], &b, 1);
      if (r == 1) return b;
      if (r < 0 && errno == EINTR) continue;
      return 0;
    }
  }
  void wake() { on_stop_signal(0); }
};

void serve(const ServeOptions& o) {
  StopSignals stop_signals;

  server::ServerOptions so;
  so.n_parallel = o.parallel;
  so.n_batch = o.common.batch;
  so.kv_budget = o.kv_budget.empty() ? 0 : parse_byte_size(o.kv_budget);
  if (so.kv_budget > 0) {  // the budget is what the caches may take: it must exist
    const char* source = nullptr;
    const size_t avail = available_memory_bytes(&source);
    KVTRIM_CHECK(avail == 0 || so.kv_budget <= avail,
                 "--kv-budget %s is more than the %s of memory available (%s); a budget the machine cannot "
                 "hold would end in the out-of-memory killer, not in 503s",
                 human_bytes(so.kv_budget).c_str(), human_bytes(avail).c_str(), source);
  }
  so.press = o.press;
  so.pressure_press = o.pressure_press;
  so.press_min_tokens = o.press_min_tokens;
  so.press_loss = loss_estimate_on(o.guard);
  so.press_max_loss = o.guard.max_loss;
  so.max_queue = o.queue;
  so.default_max_tokens = o.n_predict;
  const SessionParams sp = session_params(o.common);
  so.kv_k = sp.kv_dtype_k.value_or(sp.kv_dtype);
  so.kv_v = sp.kv_dtype_v.value_or(sp.kv_dtype);
  so.kv_rotate = sp.kv_rotate;
  so.kv_mem_limit = sp.kv_mem_limit;
  if (!so.press.empty()) make_press(so.press);  // a bad press fails before the model loads
  if (!so.pressure_press.empty()) make_press(so.pressure_press);
  auto model = load_model(o.common);
  so.n_ctx = o.common.ctx > 0 ? o.common.ctx : model->hparams().n_ctx_train;
  ThreadPool pool(o.common.threads);
  server::Scheduler sched(*model, pool, so);
  server::HttpOptions ho;
  ho.host = o.host;
  ho.port = o.port;
  ho.model_id = o.alias.empty() ? o.common.model : o.alias;
  ho.n_http_threads = o.http_threads;
  ho.replica_id = o.replica_id;
  server::HttpServer http(sched, ho);
  http.bind();
  if (o.replica_id.empty()) {  // default: host name and port, unique among replicas on loopback
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    ho.replica_id = strprintf("%s:%d", host, http.bound_port());
  }
  // (the id is known only once bound, for --port 0; the server object reads it from here)
  http.set_replica_id(ho.replica_id);
  std::fprintf(stderr,
               "kvtrim serve: http://%s:%d  (%d slots of %lld tokens, %d threads, kv %s, press %s, pressure press %s, "
               "kv budget %s)\n",
               o.host.c_str(), http.bound_port(), so.n_parallel, static_cast<long long>(so.n_ctx), pool.n_threads(),
               kv_tag(o.common, model->hparams()).c_str(), so.press.empty() ? "none" : so.press.c_str(),
               so.pressure_press.empty() ? "none" : so.pressure_press.c_str(),
               so.kv_budget ? human_bytes(so.kv_budget).c_str() : "none");
  // First stop signal: a drain, as a service manager's SIGTERM expects: /health answers 503 (a
  // balancer sends no new work here), new requests get a 503 with Retry-After (a balancer retries
  // them on another replica), the running and waiting ones run to their end; then no new
  // connections. A second signal ends them now with a 503 error event.
  std::thread watcher([&] {
    const auto name = [](int sig) { return sig == SIGINT ? "SIGINT" : "SIGTERM"; };
    const auto busy = [&] {
      const server::SchedulerStats st = sched.stats();
      int running = 0;
      for (const auto& v : st.slots) running += v.state == "prefill" || v.state == "decode" ? 1 : 0;
      return std::make_pair(running, st.queue_length);
    };
    int sig = stop_signals.wait();
    if (sig == 0) return;
    const auto [running, waiting] = busy();
    std::fprintf(stderr,
                 "kvtrim serve: signal %d (%s), draining: /health is 503, new requests get 503; %d running and %zu "
                 "waiting requests finish (signal again to end them now)\n",
                 sig, name(sig), running, waiting);
    http.drain();
    int again = -1;  // a second signal (0: serve() ended) during the drain
    for (;;) {  // until the admitted jobs are done
      const auto [r, w] = busy();
      if (r == 0 && w == 0) break;
      again = stop_signals.wait(100);
      if (again >= 0) break;
    }
    http.stop();
    sig = again >= 0 ? again : stop_signals.wait();
    if (sig == 0) return;
    std::fprintf(stderr, "kvtrim serve: signal %d (%s) again, ending the running requests\n", sig, name(sig));
    sched.stop();
  });
  http.serve();
  // serve() returned without a signal (cannot bind any more, or stopped): wake the watcher
  stop_signals.wake();
  watcher.join();
}

}  // namespace

void register_serve(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* c = app.add_subcommand("serve", "OpenAI-compatible HTTP server with compressed, budgeted KV caches");
  add_common_options(c, o->common);
  c->add_option("--host", o->host, "address to listen on")->capture_default_str();
  c->add_option("--port", o->port, "port (0 = any free port)")->capture_default_str()->check(CLI::Range(0, 65535));
  c->add_option("--parallel", o->parallel, "slots: conversations decoded together, batched (also -np)")
      ->capture_default_str()->check(CLI::Range(1, 256));
  c->add_option("--kv-budget", o->kv_budget,
                "bytes all slots' KV caches may hold together, e.g. 512MiB (default: no budget); requests are "
                "admitted only if their cache fits, compressing conversations under pressure");
  c->add_option("--press", o->press,
                "default kv_press of a request: PRESS[:opt=value,...][+PRESS...] (none by default); it compresses the "
                "conversation before the last user turn, never the turn being answered (kv_press_protect)")
      ->transform([](std::string s) { return s == "none" ? std::string() : s; });
  c->add_option("--press-min-tokens", o->press_min_tokens,
                "a context (the conversation before the protected turn) of fewer tokens is not compressed (32: the "
                "observation window of snapkv, pyramidkv, think, spark, ojakv)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  add_press_guard_options(c, o->guard);
  c->add_option("--pressure-press", o->pressure_press,
                "press that compresses idle, then running, conversations when the budget is short (e.g. snapkv:0.5)");
  c->add_option("--queue", o->queue, "requests that may wait for a slot or for memory (more get a 503)")
      ->capture_default_str()->check(CLI::Range(0, 1 << 20));
  c->add_option("-n,--n-predict", o->n_predict, "max_tokens of a request that gives none")
      ->capture_default_str()->check(CLI::Range(1, 1 << 20));
  c->add_option("--http-threads", o->http_threads, "HTTP worker threads (0 = 2 x slots + 8; a stream holds one)")
      ->capture_default_str()->check(CLI::Range(0, 4096));
  c->add_option("--alias", o->alias, "model name reported by /v1/models (default: -m)");
  c->add_option("--replica-id", o->replica_id,
                "this replica's name behind a load balancer, echoed in the X-Kvtrim-Replica header and the kvtrim "
                "object of every completion (default: HOSTNAME:PORT)");
  c->callback([o] { serve(*o); });
}

}  // namespace kvtrim::cli
