#include "server/metrics.h"

#include "core/error.h"
#include "core/memory.h"

namespace kvtrim::server {

void HttpCounters::count(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> lk(mu_);
  ++n_[{endpoint, status}];
}

std::map<std::pair<std::string, int>, int64_t> HttpCounters::snapshot() const {
  std::lock_guard<std::mutex> lk(mu_);
  return n_;
}

namespace {
void metric(std::string& out, const char* name, const char* type, const char* help) {
  out += strprintf("# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}
void sample(std::string& out, const char* name, double v, const std::string& labels = {}) {
  out += name;
  if (!labels.empty()) out += "{" + labels + "}";
  out += strprintf(" %.17g\n", v);
}
// A metric with one unlabelled sample.
void single(std::string& out, const char* name, const char* type, const char* help, double v) {
  metric(out, name, type, help);
  sample(out, name, v);
}
}  // namespace

std::string render_metrics(const SchedulerStats& st, const ServerOptions& opt,
                           const std::map<std::pair<std::string, int>, int64_t>& http) {
  std::string o;
  metric(o, "kvtrim_http_requests_total", "counter", "HTTP requests by endpoint and status code");
  for (const auto& [k, n] : http)
    sample(o, "kvtrim_http_requests_total", static_cast<double>(n),
           strprintf("endpoint=\"%s\",code=\"%d\"", k.first.c_str(), k.second));
  metric(o, "kvtrim_jobs_total", "counter", "completion jobs by outcome");
  sample(o, "kvtrim_jobs_total", static_cast<double>(st.jobs_done), "outcome=\"done\"");
  sample(o, "kvtrim_jobs_total", static_cast<double>(st.jobs_cancelled), "outcome=\"cancelled\"");
  sample(o, "kvtrim_jobs_total", static_cast<double>(st.jobs_failed), "outcome=\"failed\"");
  sample(o, "kvtrim_jobs_total", static_cast<double>(st.rejected_budget), "outcome=\"rejected_kv_budget\"");
  sample(o, "kvtrim_jobs_total", static_cast<double>(st.rejected_queue), "outcome=\"rejected_queue_full\"");
  single(o, "kvtrim_prompt_tokens_total", "counter", "prompt tokens of admitted jobs",
         static_cast<double>(st.prompt_tokens));
  single(o, "kvtrim_prompt_tokens_cached_total", "counter", "prompt tokens reused from a slot's cache (not prefilled)",
         static_cast<double>(st.cached_prompt_tokens));
  single(o, "kvtrim_prefill_tokens_total", "counter", "tokens prefilled",
         static_cast<double>(st.prefill_tokens));
  single(o, "kvtrim_decode_tokens_total", "counter", "tokens decoded (all slots)",
         static_cast<double>(st.decode_tokens));
  single(o, "kvtrim_decode_tokens_batched_total", "counter", "decoded tokens that shared a forward pass with others",
         static_cast<double>(st.batched_decode_tokens));
  single(o, "kvtrim_prefill_seconds_total", "counter", "step time spent on prefill tokens (steps split by token share)",
         st.prefill_seconds);
  single(o, "kvtrim_decode_seconds_total", "counter", "step time spent on decode tokens (steps split by token share)",
         st.decode_seconds);
  single(o, "kvtrim_steps_total", "counter", "batched forward steps",
         static_cast<double>(st.steps));
  single(o, "kvtrim_prefill_tokens_per_second", "gauge", "prefill throughput over the last 10 s",
         st.recent_prefill_tps);
  single(o, "kvtrim_decode_tokens_per_second", "gauge", "decode throughput, all slots, over the last 10 s",
         st.recent_decode_tps);
  single(o, "kvtrim_queue_length", "gauge", "jobs waiting for a slot or for memory",
         static_cast<double>(st.queue_length));

  size_t dense = 0;
  int busy = 0;
  metric(o, "kvtrim_kv_bytes", "gauge", "KV cache bytes held per slot (exact, KvCache::bytes)");
  for (const SlotView& v : st.slots) {
    sample(o, "kvtrim_kv_bytes", static_cast<double>(v.bytes), strprintf("slot=\"%d\"", v.id));
    dense += v.bytes_dense;
    busy += v.state == "prefill" || v.state == "decode";
  }
  metric(o, "kvtrim_kv_tokens", "gauge", "positions in each slot's conversation");
  for (const SlotView& v : st.slots) sample(o, "kvtrim_kv_tokens", v.n_past, strprintf("slot=\"%d\"", v.id));
  single(o, "kvtrim_kv_bytes_total", "gauge",
         "KV cache bytes held by all slots (basis matrices shared by several slots counted once)",
         static_cast<double>(st.kv_bytes_held));
  single(o, "kvtrim_kv_bases_bytes", "gauge",
         "of the total: bases, rotations and dictionaries (each shared matrix once; a slot's kvtrim_kv_bytes counts the ones it uses)",
         static_cast<double>(st.kv_bases_held));
  single(o, "kvtrim_kv_bytes_uncompressed", "gauge", "bytes the same positions would take uncompressed at each slot's cache types",
         static_cast<double>(dense));
  single(o, "kvtrim_kv_bytes_saved", "gauge", "uncompressed minus held bytes (what compression saves now)",
         dense > st.kv_bytes_held ? static_cast<double>(dense - st.kv_bytes_held) : 0.0);
  single(o, "kvtrim_kv_bytes_reserved", "gauge", "bytes reserved by admitted jobs (held + room for their remaining tokens)",
         static_cast<double>(st.kv_bytes_reserved));
  single(o, "kvtrim_kv_bytes_reserved_active", "gauge",
         "of those, the slots running a job (what /health's readiness compares with the budget)",
         static_cast<double>(st.kv_bytes_reserved_active));
  single(o, "kvtrim_kv_budget_bytes", "gauge", "the --kv-budget (0 = none)",
         static_cast<double>(opt.kv_budget));
  single(o, "kvtrim_slots_busy", "gauge", "slots running a job",
         busy);
  single(o, "kvtrim_slots", "gauge", "slots (--parallel)",
         opt.n_parallel);
  single(o, "kvtrim_pressure_compressions_total", "counter", "conversations compressed by the pressure press",
         static_cast<double>(st.pressure_compressions));
  single(o, "kvtrim_pressure_bytes_freed_total", "counter", "bytes freed by pressure compressions",
         static_cast<double>(st.bytes_freed_by_pressure));
  single(o, "kvtrim_evictions_total", "counter", "idle conversations dropped to make room",
         static_cast<double>(st.evictions));
  single(o, "kvtrim_process_resident_bytes", "gauge", "resident set size of the server process",
         static_cast<double>(process_rss_bytes()));
  return o;
}

}  // namespace kvtrim::server
